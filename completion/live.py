"""The live suggestions of an engine's documents and the generations that make them.

One owner for what the request path (``CompletionEngine``) and background preparation
(``Preparation``) both start and stop, with its rules in one place:

1. A document has at most one live suggestion: installing one retires the one there
   (its generation is told to stop and ends in the background), never leaves it running.
2. A request claims its document (a ticket, latest wins); a suggestion nobody asked for
   (a prefetch) is installed only if, once its generation started, no request is being
   answered, no request claims the document and no other suggestion took its place;
   otherwise it is stopped and ``Superseded`` raised.
3. Background generations (preparation, reading ahead) are never a document's
   suggestion.
4. Work spawned here (a retired generation's end, a dropped suggestion) is tracked, and
   ``aclose`` waits for it a bounded time, then cancels what is left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from kode.backends.base import Backend, GenerationRequest, PrefillRate, Sampling
from kode.backends.errors import Superseded
from kode.backends.latest import Latest
from kode.completion import syntax
from kode.completion.clock import Clock
from kode.completion.documents import Document
from kode.completion.project.context import ProjectContext
from kode.completion.project.retrieval import Retrieved
from kode.completion.settings import Settings
from kode.completion.stops import StopRules
from kode.completion.suggestion import Suggestion, describe_failure
from kode.completion.windows import Choice, Windows

log = logging.getLogger("kode.completion")


class Background:
    """Tasks an engine started and does not wait for (rule 4)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def __bool__(self) -> bool:
        return bool(self._tasks)

    def pending(self) -> list[asyncio.Future[None]]:
        return list(self._tasks)

    async def aclose(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for the tasks, then cancel the rest."""
        if not self._tasks:
            return
        done, late = await asyncio.wait(set(self._tasks), timeout=wait_s)
        for task in late:
            task.cancel()
        for task in done:
            if not task.cancelled() and (failure := task.exception()) is not None:
                log.debug("background work failed: %s", describe_failure(failure))


class LiveSuggestions:
    """The rules of the module docstring for one engine."""

    def __init__(
        self,
        settings: Callable[[], Settings],
        windows: Windows,
        project: ProjectContext,
        rate: PrefillRate,
        clock: Clock,
        background: Background,
    ) -> None:
        self._settings = settings
        self._windows = windows
        self._project = project
        self._rate = rate
        self._clock = clock
        self._background = background
        self._live: dict[str, Suggestion] = {}
        self._tickets: Latest[str, object] = Latest()  # the current request per document
        self._requests = 0  # requests not answered yet
        self._begun = 0  # requests begun, ever (rule 2 compares before and after)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background (rule 4)."""
        self._background.spawn(coro)

    # -- reading -----------------------------------------------------------------------

    def get(self, uri: str) -> Suggestion | None:
        return self._live.get(uri)

    def __iter__(self) -> Iterator[tuple[str, Suggestion]]:
        return iter(list(self._live.items()))

    def __len__(self) -> int:
        return len(self._live)

    def asked(self, uri: str) -> bool:
        """Whether ``uri`` has a suggestion, or a request claims it."""
        return uri in self._live or uri in self._tickets

    def busy(self) -> bool:
        """Whether a request is being answered or a suggestion (not background work) is
        being generated."""
        return self._requests > 0 or any(not live.done.is_set() for live in self._live.values())

    # -- requests ----------------------------------------------------------------------

    def begin_request(self, uri: str, ticket: object) -> None:
        """A request for ``uri`` starts: it claims the document (latest wins)."""
        self._tickets.claim(uri, ticket)
        self._requests += 1
        self._begun += 1

    def end_request(self) -> None:
        self._requests -= 1

    def holds(self, uri: str, ticket: object) -> bool:
        return self._tickets.holds(uri, ticket)

    def release(self, uri: str) -> None:
        """No request claims ``uri`` any more."""
        self._tickets.release(uri)

    # -- starting ----------------------------------------------------------------------

    async def retrieve(
        self, uri: str, text: str, offset: int, backend: Backend | None = None
    ) -> tuple[Retrieved, ...]:
        counter = None if backend is None else self._windows.count_tokens(backend)
        return await self._project.retrieve(uri, text, offset, counter)

    async def start(
        self,
        uri: str,
        doc: Document,
        offset: int,
        backend: Backend,
        max_tokens: int | None,
        *,
        yields: bool = False,
    ) -> tuple[Suggestion, Choice]:
        """A document's suggestion from the window a request there gets; ``yields``: a
        prefetch (rule 2), which a shared engine runs after other windows' keys."""
        since = self._mark(uri)
        retrieved = await self.retrieve(uri, doc.text, offset, backend)
        choice = self._windows.for_request(uri, doc, offset, backend, retrieved)
        live = await self.launch(
            uri, doc, offset, backend, choice, max_tokens, yields=yields, since=since
        )
        live.short = choice.short
        return live, choice

    async def launch(
        self,
        uri: str,
        doc: Document,
        offset: int,
        backend: Backend,
        choice: Choice,
        max_tokens: int | None,
        *,
        background: bool = False,
        yields: bool = False,
        since: tuple[int, object, Suggestion | None] | None = None,
    ) -> Suggestion:
        """Start a generation from ``choice``'s window: a suggestion (installed by rules
        1-2), or ``background`` preparation (rule 3, never shown). ``since``: for a
        prefetch, the state it was decided in (``_mark``; default: now)."""
        if since is None:
            since = self._mark(uri)
        settings, ctx = self._settings(), choice.ctx
        template = self._windows.template()
        heal = self._windows.heal(ctx, backend)
        prompt = self._windows.prompt(uri, ctx, heal)
        if settings.log_prompts:
            log.debug("prompt for %s:%s:\n%s", uri, doc.version, prompt)
        rules = StopRules.build(
            ctx.line_prefix,
            ctx.line_suffix,
            ctx.suffix,
            mode=settings.multiline,
            stop_texts=template.stop_texts,
            max_lines=settings.max_lines,
            structural=settings.structural_stops,
            prefix=ctx.prefix,
        )
        line = ctx.line_prefix.removesuffix(heal)
        names = await self._project.names(backend, doc, offset, line)
        request = GenerationRequest(
            prompt=prompt,
            max_tokens=max_tokens or settings.max_tokens,
            sampling=Sampling(settings.temperature, settings.top_p, settings.seed),
            speculation=settings.speculation,
            draft_sources=(ctx.suffix, *(s.text for s in ctx.snippets)),
            moved_kv_drift=settings.moved_suffix_drift,
            background=background or yields,
            document=uri,
            assemble=choice.assemble,
            heal=heal,
            names=names,
        )
        generation = await backend.generate(request)
        if yields and (self._requests > 0 or self._mark(uri) != since):
            # Rule 2: a request or another suggestion came while this one started.
            await generation.cancel()
            raise Superseded(uri)
        before, after = doc.text[:offset], doc.text[offset:]
        live = Suggestion(
            uri=uri,
            start=offset,
            before=before,
            after=after,
            rules=rules,
            fits=(syntax.checker if rules.mid_line else syntax.lazy_checker)(
                doc.language_id, before, after, tree_sitter=settings.structural_stops
            ),
            generation=generation,
            model=backend.model_name,
            backend=backend.name,
            heal=heal,
        )
        live.task = asyncio.ensure_future(live.pump())
        live.task.add_done_callback(lambda _t: self._rate.observe(generation.stats))
        self._project.generation_started()
        live.task.add_done_callback(self._project.generation_ended)
        if not background:
            self.retire(uri)  # rule 1
            self._live[uri] = live
        return live

    def _mark(self, uri: str) -> tuple[int, object, Suggestion | None]:
        """What rule 2 compares: the requests begun, ``uri``'s claim and suggestion."""
        return (self._begun, self._tickets.current(uri), self._live.get(uri))

    # -- stopping ----------------------------------------------------------------------

    async def drop(self, uri: str) -> None:
        """Forget ``uri``'s suggestion and wait for its generation to end."""
        live = self._live.pop(uri, None)
        if live is not None:
            live.wake()
            await live.cancel()

    def retire(self, uri: str) -> None:
        """``drop`` without waiting: the suggestion is forgotten now and its generation
        told to stop; it ends in the background (``Background.aclose`` waits for it)."""
        live = self._live.pop(uri, None)
        if live is not None:
            live.wake()
            self._background.spawn(live.cancel())

    def discard(self, uri: str, live: Suggestion) -> None:
        """Forget ``live`` if it is still ``uri``'s suggestion (it failed)."""
        if self._live.get(uri) is live:
            del self._live[uri]
