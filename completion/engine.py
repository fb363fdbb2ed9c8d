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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from backends.base import (
    Backend,
    Generation,
    GenerationRequest,
    GenerationStats,
    Sampling,
)
from backends.errors import SettingsError
from completion import context as ctxmod
from completion.documents import DocumentStore, Position
from completion.settings import DEFAULT, Settings
from completion.stops import StopRules
from completion.templates import TEMPLATES, FimTemplate, render

log = logging.getLogger("kode.completion")

BackendFactory = Callable[[Settings], Awaitable[Backend]]
PartialCallback = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished completion, valid for ``uri`` at ``version``."""

    text: str
    uri: str
    version: int
    position: Position
    stats: GenerationStats
    model: str
    backend: str
    total_ms: float
    single_line: bool


class Superseded(Exception):
    """A newer request for the same document took over (or the document changed)."""


class CompletionEngine:
    """Completions over a ``DocumentStore``, one backend, latest-wins per document."""

    def __init__(
        self,
        backend_factory: BackendFactory,
        settings: Settings = DEFAULT,
        documents: DocumentStore | None = None,
    ) -> None:
        self.documents = documents if documents is not None else DocumentStore()
        self._factory = backend_factory
        self._settings = settings
        self._anchors: dict[str, int] = {}
        self._running: dict[str, Generation] = {}
        self._tickets: dict[str, object] = {}
        self._counter: Callable[[str], int] | None = None
        self._counter_owner: Backend | None = None
        self._background: set[asyncio.Future[None]] = set()

    @property
    def settings(self) -> Settings:
        return self._settings

    def update_settings(self, settings: Settings) -> None:
        self._settings = settings

    async def backend(self) -> Backend:
        return await self._factory(self._settings)

    def _count_tokens(self, backend: Backend) -> Callable[[str], int]:
        """Token counts of context lines, cached: per keystroke only one line changes."""
        if self._counter is None or self._counter_owner is not backend:
            self._counter = lru_cache(maxsize=16384)(backend.count_tokens)
            self._counter_owner = backend
        return self._counter

    def template(self) -> FimTemplate:
        try:
            return TEMPLATES[self._settings.template]
        except KeyError:
            raise SettingsError(
                f"unknown template {self._settings.template!r}; known: {', '.join(TEMPLATES)}"
            ) from None

    async def complete(
        self,
        uri: str,
        position: Position,
        *,
        on_partial: PartialCallback | None = None,
        max_tokens: int | None = None,
    ) -> Completion:
        """Complete at ``position`` in ``uri``.

        Raises ``Superseded`` when a newer request for the document, or an edit,
        made the result stale; ``DocumentError`` for an unknown document or a
        position outside it.
        """
        started = time.perf_counter()
        settings = self._settings
        doc = self.documents.get(uri)
        offset = doc.offset_at(position)  # validates the position before any work
        version = doc.version
        ticket = object()
        self._tickets[uri] = ticket
        previous = self._running.pop(uri, None)
        if previous is not None:
            await previous.cancel()

        backend = await self.backend()
        if self._tickets.get(uri) is not ticket:
            raise Superseded(uri)
        template = self.template()
        budget = ctxmod.Budget(
            settings.prefix_tokens, settings.suffix_tokens, settings.snippet_tokens
        )
        ctx = ctxmod.gather(
            doc,
            offset,
            self._count_tokens(backend),
            budget,
            others=self.documents.others(uri) if settings.snippet_tokens else (),
            anchor=self._anchors.get(uri),
        )
        self._anchors[uri] = ctx.prefix_start_line
        prompt = render(
            template,
            ctx.prefix,
            ctx.suffix,
            path=ctx.path,
            repo=_repo_name(uri),
            snippets=ctx.snippets,
        )
        if settings.log_prompts:
            log.debug("prompt for %s:%s:\n%s", uri, version, prompt)
        rules = StopRules.build(
            ctx.line_prefix,
            ctx.line_suffix,
            ctx.suffix,
            mode=settings.multiline,
            stop_texts=template.stop_texts,
            max_lines=settings.max_lines,
        )
        request = GenerationRequest(
            prompt=prompt,
            max_tokens=max_tokens or settings.max_tokens,
            sampling=Sampling(settings.temperature, settings.top_p, settings.seed),
            speculation=settings.speculation,
            draft_sources=(ctx.suffix, *(s.text for s in ctx.snippets)),
        )
        generation = await backend.generate(request)
        self._running[uri] = generation
        text, shown = "", 0
        try:
            async for chunk in generation:
                if self._tickets.get(uri) is not ticket or doc.version != version:
                    break  # stale: stop generating, drop the result
                text += chunk.text
                cut = rules.scan(text)
                if on_partial is not None and cut.keep > shown and "\n" in text[shown : cut.keep]:
                    # A line completed: show the suggestion so far (each call extends the last).
                    shown = cut.keep
                    on_partial(text[: cut.keep].rstrip())
                if cut.stop:
                    break
        finally:
            await generation.cancel()
            if self._running.get(uri) is generation:
                del self._running[uri]
        if self._tickets.get(uri) is not ticket or doc.version != version:
            raise Superseded(uri)
        return Completion(
            text=rules.finish(text),
            uri=uri,
            version=version,
            position=position,
            stats=generation.stats,
            model=backend.model_name,
            backend=backend.name,
            total_ms=(time.perf_counter() - started) * 1000.0,
            single_line=rules.single_line,
        )

    def document_changed(self, uri: str) -> None:
        """An edit made the in-flight completion of ``uri`` stale: stop it now."""
        generation = self._running.get(uri)
        if generation is not None:
            self._tickets.pop(uri, None)
            task = asyncio.ensure_future(generation.cancel())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def cancel(self, uri: str) -> None:
        """Abandon the in-flight completion of ``uri`` (if any)."""
        self._tickets.pop(uri, None)
        generation = self._running.pop(uri, None)
        if generation is not None:
            await generation.cancel()

    async def aclose(self) -> None:
        for uri in list(self._running):
            await self.cancel(uri)


def _repo_name(uri: str) -> str:
    """The repository name shown to the model: the folder holding the file."""
    parent = Path(ctxmod.uri_to_path(uri)).parent.name
    return parent or "workspace"


class BackendPool:
    """Loads the local backend a settings object asks for, once, and swaps it on change."""

    def __init__(self, loader: Callable[[Settings], Awaitable[Backend]]) -> None:
        self._loader = loader
        self._key: tuple[object, ...] | None = None
        self._backend: Backend | None = None
        self._lock = asyncio.Lock()

    async def get(self, settings: Settings) -> Backend:
        key = (
            settings.backend,
            settings.model,
            settings.draft_model,
            settings.context_size,
            settings.threads,
        )
        async with self._lock:
            if self._backend is not None and key == self._key:
                return self._backend
            if self._backend is not None:
                await self._backend.aclose()
                self._backend = None
            self._backend = await self._loader(settings)
            self._key = key
            return self._backend

    @property
    def current(self) -> Backend | None:
        return self._backend

    async def aclose(self) -> None:
        async with self._lock:
            if self._backend is not None:
                await self._backend.aclose()
                self._backend = None
