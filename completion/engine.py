"""The completion engine: from a document and a cursor to shown text, editor-agnostic.

One request: gather context, render the FIM prompt, stream tokens from the backend,
apply the stop rules as text grows, and trim the result. Latest wins: a new request
for a document cancels that document's in-flight generation, and a result computed
for an older document version is dropped rather than drawn over newer text.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from kode.backends.base import Backend, GenerationRequest, PrefillRate, Sampling
from kode.backends.errors import DocumentError, Superseded
from kode.backends.latest import Latest
from kode.completion import syntax
from kode.completion.clock import Clock, SystemClock
from kode.completion.documents import Document, DocumentStore, Position, Range, with_selected
from kode.completion.partials import PartialPacer
from kode.completion.preparation import Preparation
from kode.completion.project import ProjectContext
from kode.completion.retrieval import Retrieved
from kode.completion.settings import DEFAULT, BackendKind, Settings
from kode.completion.stops import StopRules
from kode.completion.suggestion import Completion, PartialCallback, Suggestion, describe_failure
from kode.completion.templates import FimTemplate
from kode.completion.windows import Choice, Windows
from kode.completion.workspace import WorkspaceIndex

log = logging.getLogger("kode.completion")

BackendFactory = Callable[[Settings], Awaitable[Backend]]

# After a request is cancelled, how long to wait for the edit (or new request) that
# may keep its suggestion alive before stopping the generation.
_CANCEL_GRACE_S = 0.1
# How long closing waits for background work to end (a stopped generation's last step,
# a re-index waiting for the user's pause) before it cancels what is left.
CLOSE_WAIT_S = 2.0


class CompletionEngine:
    """Completions over a ``DocumentStore``, one backend, latest-wins per document."""

    def __init__(
        self,
        backend_factory: BackendFactory,
        settings: Settings = DEFAULT,
        documents: DocumentStore | None = None,
        prefill_rate: PrefillRate | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.documents = documents if documents is not None else DocumentStore()
        self.rate = prefill_rate if prefill_rate is not None else PrefillRate()
        self.short_answers = 0  # requests answered from a shorter window (budget)
        self.kept_snippets = 0  # kept their prepared project context (no re-evaluation)
        self.cursor_moves = 0  # `kode/didMoveCursor` notifications received
        self._factory = backend_factory
        self._settings = settings
        self._live: dict[str, Suggestion] = {}
        self._tickets: Latest[str, object] = Latest()  # the current request per document
        self.typed_ahead_hits = 0
        # The last non-empty answer (`kode/stats` `lastCompletion`), not background work.
        self.last_answer: Completion | None = None
        self._background: set[asyncio.Future[None]] = set()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.windows = Windows(lambda: self._settings, self.documents, self.rate)
        self.preparation = Preparation(self)
        self.project = ProjectContext(
            lambda: self._settings, self.documents, self._spawn, self.clock
        )
        self._requests = 0  # requests (``complete``) not answered yet

    @property
    def settings(self) -> Settings:
        return self._settings

    def update_settings(self, settings: Settings) -> None:
        self._settings = settings

    async def backend(self) -> Backend:
        return await self._factory(self._settings)

    def template(self) -> FimTemplate:
        return self.windows.template()

    async def complete(
        self,
        uri: str,
        position: Position,
        *,
        on_partial: PartialCallback | None = None,
        max_tokens: int | None = None,
        selected: tuple[Range, str] | None = None,
    ) -> Completion:
        """Complete at ``position`` in ``uri``.

        ``selected`` is the item the editor's completion list has selected (LSP's
        ``selectedCompletionInfo``: the range it replaces and its text). The editor shows
        only suggestions that extend it, so the completion is made for the text as if
        that item were accepted (see ``with_selected``); the answer continues after it.

        If the user typed into the live suggestion for this document (the document is the
        suggestion's text before and after, with a prefix of the suggestion in between and
        the cursor right after it), the answer comes from that suggestion, without a new
        generation; a generation still running behind it keeps running and extends it.
        Otherwise the live suggestion is cancelled and a new one started.

        Raises ``Superseded`` when a newer request for the document, or an edit, made
        the result stale; ``DocumentError`` for an unknown document or a position
        outside it (or a selected item whose range does not hold the position).
        """
        started = time.perf_counter()
        began = self.clock.now()  # the time budget counts from here (``timeBudgetMs``)
        doc = self.documents.get(uri)
        offset = doc.offset_at(position)  # validates the position before any work
        version = doc.version
        ticket = object()
        self._tickets.claim(uri, ticket)
        self.preparation.touch(uri, version, offset)
        if selected is not None:
            doc, offset = with_selected(doc, position, *selected)
        self._requests += 1  # background preparation waits until it is answered
        try:
            # What this keystroke makes obsolete is told to stop, never waited for: the
            # backend runs the next generation once it has stopped (its worker, or the
            # shared engine's scheduler in the slot the previous one leaves), so this
            # keystroke's generation is queued at once, not after the engine's step.
            self.preparation.stop()
            self._leave_others(uri)
            live = self._live.get(uri)
            if live is not None:
                live.wake()  # older requests waiting on it re-check their ticket
                typed = live.typed_into(doc.text)
                if typed is not None and offset == live.start + len(typed):
                    answer = await self._answer(
                        live, doc, ticket, version, typed, on_partial, started, began
                    )
                    if answer is not None:
                        self.typed_ahead_hits += 1
                        return answer
                    # Typed past what the suggestion had so far, and it went another way.
                self._retire(uri)
            backend = await self.backend()
            if not self._tickets.holds(uri, ticket):
                raise Superseded(uri)
            live = await self._start(uri, doc, offset, backend, max_tokens)
            if not self._tickets.holds(uri, ticket):
                self._retire(uri)
                raise Superseded(uri)
            answer = await self._answer(live, doc, ticket, version, "", on_partial, started, began)
            assert answer is not None  # nothing typed: nothing to disagree with
            return answer
        finally:
            self._requests -= 1
            self.preparation.schedule()  # the full window for the next keystroke, when quiet

    async def _start(
        self,
        uri: str,
        doc: Document,
        offset: int,
        backend: Backend,
        max_tokens: int | None,
        *,
        yields: bool = False,
    ) -> Suggestion:
        retrieved = await self.retrieve(uri, doc.text, offset, backend)
        choice = self.windows.for_request(uri, doc, offset, backend, retrieved)
        if not yields:  # a keystroke's window, not a prefetch's
            self.short_answers += choice.short
            self.kept_snippets += choice.kind == "full, prepared snippets"
        live = await self._launch(uri, doc, offset, backend, choice, max_tokens, yields=yields)
        live.short = choice.short
        return live

    async def _launch(
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
    ) -> Suggestion:
        """Start a generation from ``choice``'s window: a suggestion, or ``background``
        preparation (never shown). ``yields``: a suggestion no one asked for yet (a
        prefetch), which a shared engine runs after other windows' keys, like background."""
        settings, ctx = self._settings, choice.ctx
        template = self.template()
        heal = self.windows.heal(ctx, backend)
        prompt = self.windows.prompt(uri, ctx, heal)
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
        names = await self.project.names(backend, doc, offset, ctx.line_prefix.removesuffix(heal))
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
        live.task.add_done_callback(lambda _t: self.rate.observe(generation.stats))
        self.project.generation_started()
        live.task.add_done_callback(self.project.generation_ended)
        if not background:  # a background one is never a document's suggestion
            self._live[uri] = live
        return live

    async def _answer(
        self,
        live: Suggestion,
        doc: Document,
        ticket: object,
        version: int,
        typed: str,
        on_partial: PartialCallback | None,
        started: float,
        began: float,
    ) -> Completion | None:
        """Wait for ``live`` to finish (or the time budget), then answer from it; None if
        it finished with text that does not start with ``typed`` (the user typed past
        what it had generated, and it went another way).

        ``doc`` is the text the answer is for: the document, or its copy with the
        selected completion item in it (``with_selected``)."""
        uri = doc.uri
        stored = self.documents.get(uri)
        budget_ms = self._settings.time_budget_ms
        deadline = None if budget_ms == 0 else began + budget_ms / 1000.0
        continuing = bool(typed) or live.started_before(started)
        pacer = (
            None
            if on_partial is None or live.rules.mid_line
            else PartialPacer(typed, started, continuing=continuing)
        )
        live.waiters += 1

        def current() -> bool:
            return self._tickets.holds(uri, ticket) and stored.version == version

        try:
            while not live.done.is_set():
                live.arm()
                if not current():
                    raise Superseded(uri)
                visible = live.visible()
                if typed and not (visible.startswith(typed) or typed.startswith(visible)):
                    return None  # it went another way than what was typed
                if pacer is not None and on_partial is not None:
                    partial = pacer.next(visible, time.perf_counter())
                    if partial is not None:
                        on_partial(partial)
                left = None if deadline is None else deadline - self.clock.now()
                if left is not None and left <= 0:
                    break  # answer with what is ready; the generation goes on
                await live.wait_change(left, self.clock)
        except asyncio.CancelledError:
            # The client gave up on this request. Clients send the cancel before or after
            # the edit that caused it, so decide a moment later: keep generating only if
            # the user typed into the suggestion or asked for it again.
            if self._live.get(uri) is live:
                self._spawn(self._drop_if_abandoned(uri, live))
            raise
        finally:
            live.waiters -= 1
        if not current():
            raise Superseded(uri)
        if live.error is not None:
            # Told once, to this request; the next one starts a fresh generation.
            if self._live.get(uri) is live:
                del self._live[uri]
            raise live.error
        text = live.final() if live.done.is_set() else live.visible().rstrip()
        if typed and live.done.is_set() and not text.startswith(typed):
            return None
        answer = text[len(typed) :] if text.startswith(typed) else ""
        live.answered = True
        completion = Completion(
            text=answer,
            uri=uri,
            version=version,
            position=doc.position_at(live.start + len(typed)),
            stats=live.generation.stats,
            model=live.model,
            backend=live.backend,
            total_ms=(time.perf_counter() - started) * 1000.0,
            single_line=live.rules.single_line,
            from_cache=bool(typed) or live.started_before(started),
            generated=live.raw,
        )
        if answer:
            self.last_answer = completion
        return completion

    def document_opened(self, uri: str) -> None:
        """Read a newly opened document into the model's cache before the first
        keystroke (setting ``readAhead``), so that keystroke evaluates only what is
        after the cursor instead of the whole file (seconds on a small CPU)."""
        if not self._settings.read_ahead or self._settings.backend is not BackendKind.LOCAL:
            return
        self._spawn(self.preparation.read_ahead(uri, self.documents.get(uri).version))

    def document_changed(self, uri: str) -> None:
        """After an edit: keep the live suggestion if the user typed into it, else stop it.

        If the user typed (or accepted) the whole finished suggestion, prefetch the next
        completion at the new cursor.
        """
        doc = self.documents.get(uri)
        self.preparation.touch(uri, None, None)
        self.preparation.stop()
        self.project.document_edited(uri)
        live = self._live.get(uri)
        if live is None:
            return
        typed = live.typed_into(doc.text)
        if typed is None:
            self._tickets.release(uri)
            self._spawn(self._drop(uri))
            return
        live.wake()
        if live.done.is_set() and typed and typed == live.final() and self._settings.prefetch:
            self._spawn(self._prefetch(uri, live.start + len(typed)))

    # -- project context ---------------------------------------------------------------

    @property
    def workspace(self) -> WorkspaceIndex | None:
        return self.project.index

    def open_workspace(self, roots: list[Path]) -> None:
        self.project.open(roots)

    def files_changed(self, changes: list[tuple[str, bool]]) -> None:
        self.project.files_changed(changes)

    async def retrieve(
        self, uri: str, text: str, offset: int, backend: Backend | None = None
    ) -> tuple[Retrieved, ...]:
        counter = None if backend is None else self.windows.count_tokens(backend)
        return await self.project.retrieve(uri, text, offset, counter)

    async def _drop_if_abandoned(self, uri: str, live: Suggestion) -> None:
        await self.clock.sleep(_CANCEL_GRACE_S)
        if self._live.get(uri) is not live or live.done.is_set() or live.waiters:
            return
        if uri in self.documents and live.kept_alive(self.documents.get(uri).text):
            return
        await self._drop(uri)

    async def _prefetch(self, uri: str, offset: int) -> None:
        if uri not in self.documents or self._live.get(uri) is None:
            return
        await self._drop(uri)
        doc = self.documents.get(uri)
        if offset > len(doc.text):
            return
        try:
            await self._start(uri, doc, offset, await self.backend(), None, yields=True)
            self.preparation.prefetches += 1
        except Exception as exc:  # a prefetch is best effort; the next request will retry
            log.debug("prefetch failed: %s", describe_failure(exc))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _drop(self, uri: str) -> None:
        live = self._live.pop(uri, None)
        if live is not None:
            live.wake()
            await live.cancel()

    def _retire(self, uri: str) -> None:
        """``_drop`` without waiting: the suggestion is forgotten now and its generation
        told to stop; it ends in the background (``aclose`` waits for it)."""
        live = self._live.pop(uri, None)
        if live is not None:
            live.wake()
            self._spawn(live.cancel())

    async def cancel(self, uri: str) -> None:
        """Abandon the in-flight completion of ``uri`` (if any)."""
        self._tickets.release(uri)
        await self._drop(uri)

    def document_closed(self, uri: str) -> None:
        """Forget what was kept for ``uri`` (its KV states age out of the backend), and
        stop preparing it: nothing will be asked there."""
        self.preparation.forget(uri)
        self.windows.forget(uri)

    async def aclose(self) -> None:
        # The start-up timing and any preparation end as cancelled, not cut off by the
        # backend closing under them (which a shared engine's window reports as a failure).
        # The index's build and updates are stopped, never waited for (their threads may
        # be in a read), and its child exits. Bounded: what does not end in CLOSE_WAIT_S
        # is cancelled.
        self.project.close()
        await self.preparation.aclose()
        for uri in list(self._live):
            await self.cancel(uri)
        if self._background:
            done, late = await asyncio.wait(set(self._background), timeout=CLOSE_WAIT_S)
            for task in late:
                task.cancel()
            for task in done:
                if not task.cancelled() and (failure := task.exception()) is not None:
                    log.debug("background work failed: %s", describe_failure(failure))

    # -- background work ---------------------------------------------------------------

    def _busy(self) -> bool:
        """Whether a request is being answered or a suggestion (not background work)
        is being generated."""
        return self._requests > 0 or any(not live.done.is_set() for live in self._live.values())

    def cursor_moved(self, uri: str, position: Position) -> None:
        """The cursor settled at ``position`` (``kode/didMoveCursor``): stop suggestions
        still being made elsewhere, and prepare the prompt a keystroke there will need,
        at the lowest priority."""
        self.cursor_moves += 1
        if uri not in self.documents:
            return
        doc = self.documents.get(uri)
        try:
            offset = doc.offset_at(position)
        except DocumentError:
            return
        self.preparation.aim(uri, doc, offset)
        self._leave_others(uri, doc.text, offset)
        self.preparation.schedule()

    def _leave_others(self, uri: str, text: str | None = None, offset: int = 0) -> None:
        """The user works in ``uri`` now (at ``offset`` of ``text``, if given): stop the
        suggestions still being generated for other documents, or for another place of
        this one, that no request waits for. The engine runs one generation at a time,
        so one left behind (a long suggestion going on after its answer) would make the
        first keystroke here wait for it."""
        for other, live in list(self._live.items()):
            if live.done.is_set() or live.waiters:
                continue
            if other == uri:
                if text is None:
                    continue  # a request for this document decides itself (typed-ahead)
                if live.on_line_of(text, offset):
                    # The cursor is on its line: the user types into it, or it was made
                    # with the editor's selected completion item (``with_selected``).
                    continue
            if self._live.get(other) is live:
                self._retire(other)

    async def warm_up(self) -> None:
        """Load the model and learn the prefill speed (``Preparation.warm_up``)."""
        await self.preparation.warm_up()
