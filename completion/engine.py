"""The completion engine: from a document and a cursor to shown text, editor-agnostic.

One request: gather context, render the FIM prompt, stream tokens from the backend,
apply the stop rules as text grows, and trim the result. Latest wins: a new request
for a document cancels that document's in-flight generation, and a result computed
for an older document version is dropped rather than drawn over newer text.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from kode.backends.base import Backend, PrefillRate
from kode.backends.errors import DocumentError, Superseded
from kode.completion.clock import Clock, SystemClock
from kode.completion.documents import Document, DocumentStore, Position, Range, with_selected
from kode.completion.edits.next_edits import NextEdit, NextEdits
from kode.completion.live import Background, LiveSuggestions
from kode.completion.partials import PartialPacer
from kode.completion.preparation import Preparation
from kode.completion.project.context import ProjectContext
from kode.completion.project.retrieval import Retrieved
from kode.completion.project.workspace import WorkspaceIndex
from kode.completion.settings import DEFAULT, BackendKind, Settings
from kode.completion.suggestion import Completion, PartialCallback, Suggestion, describe_failure
from kode.completion.templates import FimTemplate
from kode.completion.windows import Windows

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
        self.typed_ahead_hits = 0
        # The last non-empty answer (`kode/stats` `lastCompletion`), not background work.
        self.last_answer: Completion | None = None
        self.background = Background()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.windows = Windows(lambda: self._settings, self.documents, self.rate)
        self.project = ProjectContext(
            lambda: self._settings, self.documents, self.background.spawn, self.clock
        )
        self.live = LiveSuggestions(
            lambda: self._settings,
            self.windows,
            self.project,
            self.rate,
            self.clock,
            self.background,
        )
        self.next_edits = NextEdits(self.documents, self.clock.now)
        self.preparation = Preparation(
            self.live,
            self.documents,
            self.windows,
            self.project,
            self.rate,
            self.clock,
            lambda: self._settings,
            self.backend,
        )

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
        started = self.clock.now()  # one clock: the time budget and the answer's total
        doc = self.documents.get(uri)
        offset = doc.offset_at(position)  # validates the position before any work
        version = doc.version
        ticket = object()
        live_table = self.live
        live_table.begin_request(uri, ticket)  # background preparation waits until answered
        self.preparation.touch(uri, version, offset)
        if selected is not None:
            doc, offset = with_selected(doc, position, *selected)
        try:
            # What this keystroke makes obsolete is told to stop, never waited for: the
            # backend runs the next generation once it has stopped (its worker, or the
            # shared engine's scheduler in the slot the previous one leaves), so this
            # keystroke's generation is queued at once, not after the engine's step.
            self.preparation.stop()
            self._leave_others(uri)
            live = live_table.get(uri)
            if live is not None:
                live.wake()  # older requests waiting on it re-check their ticket
                typed = live.typed_into(doc.text)
                if typed is not None and offset == live.start + len(typed):
                    answer = await self._answer(
                        live, doc, ticket, version, typed, on_partial, started, continuing=True
                    )
                    if answer is not None:
                        self.typed_ahead_hits += 1
                        return answer
                    # Typed past what the suggestion had so far, and it went another way.
                live_table.retire(uri)
            backend = await self.backend()
            if not live_table.holds(uri, ticket):
                raise Superseded(uri)
            live, choice = await live_table.start(uri, doc, offset, backend, max_tokens)
            self.short_answers += choice.short
            self.kept_snippets += choice.kind == "full, prepared snippets"
            if not live_table.holds(uri, ticket):
                live_table.retire(uri)
                raise Superseded(uri)
            answer = await self._answer(
                live, doc, ticket, version, "", on_partial, started, continuing=False
            )
            assert answer is not None  # nothing typed: nothing to disagree with
            return answer
        finally:
            live_table.end_request()
            self.preparation.schedule()  # the full window for the next keystroke, when quiet

    async def _answer(
        self,
        live: Suggestion,
        doc: Document,
        ticket: object,
        version: int,
        typed: str,
        on_partial: PartialCallback | None,
        started: float,
        *,
        continuing: bool,
    ) -> Completion | None:
        """Wait for ``live`` to finish (or the time budget), then answer from it; None if
        it finished with text that does not start with ``typed`` (the user typed past
        what it had generated, and it went another way).

        ``doc`` is the text the answer is for: the document, or its copy with the
        selected completion item in it (``with_selected``). ``started``: when the request
        came, on ``self.clock``; ``continuing``: ``live`` was there before it."""
        uri = doc.uri
        stored = self.documents.get(uri)
        budget_ms = self._settings.time_budget_ms
        deadline = None if budget_ms == 0 else started + budget_ms / 1000.0
        pacer = (
            None
            if on_partial is None or live.rules.mid_line
            else PartialPacer(typed, started, continuing=continuing)
        )
        live.waiters += 1

        def current() -> bool:
            return self.live.holds(uri, ticket) and stored.version == version

        try:
            while not live.done.is_set():
                live.arm()
                if not current():
                    raise Superseded(uri)
                visible = live.visible()
                if typed and not (visible.startswith(typed) or typed.startswith(visible)):
                    return None  # it went another way than what was typed
                if pacer is not None and on_partial is not None:
                    partial = pacer.next(visible, self.clock.now())
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
            if self.live.get(uri) is live:
                self.background.spawn(self._drop_if_abandoned(uri, live))
            raise
        finally:
            live.waiters -= 1
        if not current():
            raise Superseded(uri)
        if live.error is not None:
            # Told once, to this request; the next one starts a fresh generation.
            self.live.discard(uri, live)
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
            total_ms=(self.clock.now() - started) * 1000.0,
            single_line=live.rules.single_line,
            from_cache=continuing,
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
        self.background.spawn(self.preparation.read_ahead(uri, self.documents.get(uri).version))

    def apply_changes(
        self, uri: str, version: int, changes: list[tuple[str, Range | None]]
    ) -> None:
        """A ``didChange``: apply ``changes`` to ``uri`` (recorded in the edit history
        when ``nextEdits`` is on), then ``document_changed``."""
        record = None
        if self._settings.next_edits:

            def record(before: str, text: str, range_: Range | None) -> None:
                self.next_edits.changed(uri, before, text, range_, version)

        self.documents.change(uri, version, changes, record)
        self.document_changed(uri)

    def document_changed(self, uri: str) -> None:
        """After an edit: keep the live suggestion if the user typed into it, else stop it.

        If the user typed (or accepted) the whole finished suggestion, prefetch the next
        completion at the new cursor.
        """
        doc = self.documents.get(uri)
        self.preparation.touch(uri, None, None)
        self.preparation.stop()
        self.project.document_edited(uri)
        live = self.live.get(uri)
        if live is None:
            return
        typed = live.typed_into(doc.text)
        if typed is None:
            self.live.release(uri)
            self.background.spawn(self.live.drop(uri))
            return
        live.wake()
        if live.done.is_set() and typed and typed == live.final() and self._settings.prefetch:
            self.background.spawn(self._prefetch(uri, live.start + len(typed)))

    # -- next edits --------------------------------------------------------------------

    async def next_edit(
        self, uri: str, position: Position, version: int | None = None
    ) -> NextEdit | None:
        """The next edit for a cursor at ``position`` of ``uri`` (``completion/edits``);
        None when ``nextEdits`` is off, there is none, or ``version`` (if given) is not the
        document's any more. Worked out in a thread (it reads the whole document).
        Raises ``DocumentError`` for a document that is not open or a position outside it."""
        if not self._settings.next_edits:
            return None
        doc = self.documents.get(uri)
        if version is not None and version != doc.version:
            return None  # the editor has moved on: nothing stale is proposed
        edit = await asyncio.to_thread(self.next_edits.predict, uri, position)
        if (
            edit is None
            or uri not in self.documents
            or self.documents.get(uri).version != edit.version
        ):
            return None
        return edit

    # -- project context ---------------------------------------------------------------

    @property
    def workspace(self) -> WorkspaceIndex | None:
        return self.project.index

    def open_workspace(self, roots: list[Path]) -> None:
        self.project.open(roots)

    def close_workspace(self) -> None:
        """The workspace index is no longer wanted (``workspaceIndex`` turned off)."""
        self.project.forget_index()

    def files_changed(self, changes: list[tuple[str, bool]]) -> None:
        self.project.files_changed(changes)

    async def retrieve(
        self, uri: str, text: str, offset: int, backend: Backend | None = None
    ) -> tuple[Retrieved, ...]:
        return await self.live.retrieve(uri, text, offset, backend)

    async def _drop_if_abandoned(self, uri: str, live: Suggestion) -> None:
        await self.clock.sleep(_CANCEL_GRACE_S)
        if self.live.get(uri) is not live or live.done.is_set() or live.waiters:
            return
        if uri in self.documents and live.kept_alive(self.documents.get(uri).text):
            return
        await self.live.drop(uri)

    async def _prefetch(self, uri: str, offset: int) -> None:
        if uri not in self.documents or self.live.get(uri) is None:
            return
        await self.live.drop(uri)
        doc = self.documents.get(uri)
        if offset > len(doc.text):
            return
        try:
            await self.live.start(uri, doc, offset, await self.backend(), None, yields=True)
            self.preparation.prefetches += 1
        except Superseded:
            pass  # a request or an edit came meanwhile: it decides
        except Exception as exc:  # a prefetch is best effort; the next request will retry
            log.debug("prefetch failed: %s", describe_failure(exc))

    async def cancel(self, uri: str) -> None:
        """Abandon the in-flight completion of ``uri`` (if any)."""
        self.live.release(uri)
        await self.live.drop(uri)

    def close_document(self, uri: str) -> None:
        """``uri`` was closed (or can no longer be trusted): stop its generation (it
        ends in the background), forget it and what was kept for it (its KV states age
        out of the backend), and stop preparing it. Synchronous, so that a reopening
        right after it (``didClose`` then ``didOpen`` in one read) finds it closed."""
        self.live.release(uri)
        self.live.retire(uri)
        self.documents.close(uri)
        self.next_edits.forget(uri)
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
        for uri, _live in self.live:
            await self.cancel(uri)
        await self.background.aclose(CLOSE_WAIT_S)

    # -- background work ---------------------------------------------------------------

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
        for other, live in self.live:
            if live.done.is_set() or live.waiters:
                continue
            if other == uri:
                if text is None:
                    continue  # a request for this document decides itself (typed-ahead)
                if live.on_line_of(text, offset):
                    # The cursor is on its line: the user types into it, or it was made
                    # with the editor's selected completion item (``with_selected``).
                    continue
            if self.live.get(other) is live:
                self.live.retire(other)

    async def warm_up(self) -> None:
        """Load the model and learn the prefill speed (``Preparation.warm_up``)."""
        await self.preparation.warm_up()
