"""Background work for the next keystroke: reading a newly opened document ahead,
learning the prefill speed, preparing the window at the resting cursor, and making the
suggestion there before it is asked for.

The rules (``next_round`` decides each round of the preparation loop, purely):

1. Work waits for a quiet moment: ``PREPARE_QUIET_S`` without a request or an edit, and
   no suggestion being generated or request being answered (``busy``).
2. It prepares only the active document's announced cursor (``kode/didMoveCursor``, or
   where the last request was), and stops once that document changed or the cursor went.
3. The first place after start-up learns the prefill speed first (once a round): without
   it the full window would be chosen, and a keystroke before it is ready would answer
   from a short one, losing that work.
4. Then, round by round, the window ``Windows.to_prepare`` names: one a reading pause can
   evaluate, then the full one. Each is a one-token background generation that any
   request or edit cancels; what it evaluated stays cached (``kvMemoryMb``).
5. Once a window a keystroke there would answer from is ready, the suggestion at a cursor
   resting at the end of a line is made (``prefetch``), again from the full window if the
   first came from a short one that no request was answered from.
6. Once the full window at the cursor is ready and the suggestion there made, the
   document is read into the engine's chunk store (``chunkMemoryMb``), a region a round
   (``completion/reading.py``), so that the full window at the next place is assembled.

A newly opened document is read ahead (``readAhead``) after ``READ_AHEAD_DELAY_S`` (tabs
flicked past are not), only when it all fits the prefix window and nothing else runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kode.backends.base import (
    PREFILL_PROBE,
    Backend,
    ChunkAssembly,
    FinishReason,
    Generation,
    GenerationRequest,
    PrefillRate,
    PrefillSpeed,
    PromptCache,
    SpeculationMethod,
)
from kode.backends.errors import Superseded
from kode.completion import context as ctxmod
from kode.completion.clock import Clock
from kode.completion.documents import Document, DocumentStore, file_name
from kode.completion.live import LiveSuggestions
from kode.completion.project.context import ProjectContext
from kode.completion.reading import Reader, fits
from kode.completion.settings import BackendKind, Settings
from kode.completion.suggestion import Suggestion, describe_failure
from kode.completion.windows import Choice, Windows

log = logging.getLogger("kode.completion")

# Background preparation starts only after this long without a request or an edit.
PREPARE_QUIET_S = 0.25
# A document opened and left within this long (tabs flicked past) is not read ahead.
READ_AHEAD_DELAY_S = 0.3


class Step(enum.Enum):
    WAIT = "wait"  # not quiet yet: look again after ``Round.wait_s``
    STOP = "stop"  # nothing to prepare (a request or an edit schedules the next round)
    TIME = "time"  # learn the prefill speed first
    PREPARE = "prepare"  # evaluate the next window at the cursor


@dataclass(frozen=True, slots=True)
class Round:
    step: Step
    wait_s: float = 0.0


def next_round(
    *,
    now: float,
    last_activity: float,
    busy: bool,
    target_current: bool,
    speed_needed: bool,
    timed: bool,
) -> Round:
    """Rules 1-3 of the module docstring. ``target_current``: the active document is
    open, at the version and with the cursor it was announced with; ``speed_needed``:
    the budget is on and the prefill speed unknown; ``timed``: this loop tried already.

    >>> next_round(now=1.0, last_activity=0.9, busy=False, target_current=True,
    ...            speed_needed=False, timed=False)
    Round(step=<Step.WAIT: 'wait'>, wait_s=0.15)
    >>> next_round(now=2.0, last_activity=0.9, busy=False, target_current=True,
    ...            speed_needed=True, timed=False).step
    <Step.TIME: 'time'>
    >>> next_round(now=2.0, last_activity=0.9, busy=False, target_current=False,
    ...            speed_needed=False, timed=False).step
    <Step.STOP: 'stop'>
    """
    idle = now - last_activity
    if busy or idle < PREPARE_QUIET_S:
        return Round(Step.WAIT, round(max(0.05, PREPARE_QUIET_S - idle), 6))
    if not target_current:
        return Round(Step.STOP)
    if speed_needed and not timed:
        return Round(Step.TIME)
    return Round(Step.PREPARE)


class Preparation:
    """The background work of one ``CompletionEngine`` (the rules above), through the
    parts it shares with the engine: the live suggestions (whose rules start and stop
    its generations), the documents, windows, project context and prefill rate."""

    def __init__(
        self,
        live: LiveSuggestions,
        documents: DocumentStore,
        windows: Windows,
        project: ProjectContext,
        rate: PrefillRate,
        clock: Clock,
        settings: Callable[[], Settings],
        backend: Callable[[], Awaitable[Backend]],
    ) -> None:
        self.live = live
        self.documents = documents
        self.windows = windows
        self.project = project
        self.rate = rate
        self.clock = clock
        self._settings = settings
        self._backend = backend
        self._spawn = live.spawn
        self.cursor: dict[str, tuple[int, int]] = {}  # uri -> (version, offset) to prepare
        self.active: str | None = None  # the document the user works in
        self.last_activity = float("-inf")
        self.task: asyncio.Task[None] | None = None
        self.calibration: Generation | None = None  # the start-up timing, while it runs
        self._timing = asyncio.Lock()  # one start-up timing at a time
        self.running: Suggestion | None = None  # the background generation, if any
        self.prepared = 0  # preparations that finished
        self.assembled = 0  # of them, windows assembled from stored chunks
        self.reader = Reader()
        self.reading: Generation | None = None  # a region being read, if any
        self.prefetches = 0  # suggestions made before they were asked for
        self.read_aheads = 0

    @property
    def preparing(self) -> bool:
        """Whether preparation has work under way or scheduled."""
        return self.task is not None and not self.task.done()

    def touch(self, uri: str, version: int | None, offset: int | None) -> None:
        """A request or an edit: background work waits for the next quiet moment."""
        self.last_activity = self.clock.now()
        if version is not None and offset is not None and uri in self.documents:
            self.aim(uri, self.documents.get(uri), offset, version)

    def aim(self, uri: str, doc: Document, offset: int, version: int | None = None) -> None:
        """The user works at ``offset`` of ``doc`` (of ``version``, if not its current):
        the place to prepare, and a place visited (reading starts near it). A region
        being read is stopped when the place changes: the loop turns to the new place
        (reading on, it waited for the region's end: a jump's first key 2.1 s instead
        of 0.7 s in the places replay)."""
        place = (doc.version if version is None else version, offset)
        if self.reading is not None and (self.cursor.get(uri) != place or self.active != uri):
            self._spawn(self.reading.cancel())
        self.cursor[uri] = place
        self.active = uri
        self.reader.visit(uri, doc.text.count("\n", 0, offset))

    def forget(self, uri: str) -> None:
        """``uri`` was closed: stop preparing it."""
        self.cursor.pop(uri, None)
        self.reader.forget(uri)
        if self.running is not None and self.running.uri == uri:
            self.stop()
        if self.active == uri:
            self.active = None
            if self.reading is not None:  # only the active document is read
                self._spawn(self.reading.cancel())

    def stop(self) -> None:
        """Stop the start-up timing and any preparation without waiting for them to
        end (what they evaluated stays)."""
        if self.calibration is not None:
            self._spawn(self.calibration.cancel())
        if self.reading is not None:
            self._spawn(self.reading.cancel())
        running, self.running = self.running, None
        if running is not None:
            self._spawn(running.cancel())

    async def aclose(self) -> None:
        """Stop everything and wait for it to end."""
        if self.calibration is not None:
            await self.calibration.cancel()
        if self.reading is not None:
            await self.reading.cancel()
        running, self.running = self.running, None
        if running is not None:
            await running.cancel()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _finish(self, live: Suggestion) -> None:
        """Wait for a background generation to end, then forget it."""
        await live.done.wait()
        if self.running is live:
            self.running = None

    # -- the preparation loop ------------------------------------------------------------

    def schedule(self) -> None:
        settings = self._settings()
        if not settings.enabled or settings.backend is not BackendKind.LOCAL:
            return
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._loop())

    def _target(self) -> tuple[str, Document, int] | None:
        uri = self.active
        target = None if uri is None else self.cursor.get(uri)
        if uri is None or target is None or uri not in self.documents:
            return None
        doc = self.documents.get(uri)
        version, offset = target
        if doc.version != version or offset > len(doc.text):
            return None
        return uri, doc, offset

    async def _loop(self) -> None:
        clock = self.clock
        timed = False
        try:
            while True:
                found = self._target()
                plan = next_round(
                    now=clock.now(),
                    last_activity=self.last_activity,
                    busy=self.live.busy(),
                    target_current=found is not None,
                    speed_needed=self.rate.value is None and bool(self._settings().first_answer_ms),
                    timed=timed,
                )
                if plan.step is Step.WAIT:
                    await clock.sleep(plan.wait_s)
                    continue
                if plan.step is Step.STOP or found is None:
                    return
                uri, doc, offset = found
                backend = await self._backend()
                if not isinstance(backend, PromptCache) or self.live.busy():
                    return
                if plan.step is Step.TIME:
                    timed = True
                    await self.warm_up()  # or waits for the timing under way
                    continue
                if not await self._prepare(uri, doc, offset, backend):
                    return
        except Exception as exc:  # best effort: the request does the work itself
            log.debug("preparation failed: %s", type(exc).__name__)

    async def _prepare(self, uri: str, doc: Document, offset: int, backend: Backend) -> bool:
        """One round of rules 4-5; whether to go on."""
        retrieved = await self.live.retrieve(uri, doc.text, offset, backend)
        choice = self.windows.to_prepare(uri, doc, offset, backend, retrieved)
        if choice is None:
            log.debug("prepared %s: its full window is evaluated", file_name(uri))
            await self.suggest_at_cursor(uri, doc, offset, backend)
            if self.live.busy():
                return True  # the suggestion is being made: read once it is
            return await self.read_next(uri, doc, backend)
        if self.running is not None:
            return False  # a read-ahead is running
        log.debug(
            "preparing %s: %s window, %d prompt tokens to evaluate",
            file_name(uri),
            choice.kind,
            choice.left,
        )
        live = await self.live.launch(uri, doc, offset, backend, choice, 1, background=True)
        self.running = live
        await self._finish(live)
        if live.generation.stats.finish_reason is FinishReason.CANCELLED:
            log.debug("preparing %s: stopped by a request or an edit", file_name(uri))
            return False  # a request or an edit came; it schedules the next round
        self.prepared += 1
        self.assembled += live.generation.stats.assembled_prompt_tokens > 0
        # A window a keystroke here would now answer from is ready: make that answer
        # while the user still reads (the full window follows).
        await self.suggest_at_cursor(uri, doc, offset, backend)
        return True

    async def suggest_at_cursor(
        self, uri: str, doc: Document, offset: int, backend: Backend
    ) -> None:
        """Rule 5: start the suggestion a keystroke at the resting cursor would ask for,
        as the document's live suggestion: a key that types into it is answered from it
        at once (typed-ahead), any other key or edit replaces it. Only at the end of a
        line's text, where a suggestion shows; once per place, again only to replace one
        made from a short window that no request was answered from (the editor never
        showed it) by the full window."""
        if not self._settings().prefetch or doc.text[offset:].split("\n", 1)[0].strip():
            return
        if self.live.busy():
            return  # a request is being answered or a suggestion made: it goes first
        live = self.live.get(uri)
        if live is not None and live.on_line_of(doc.text, offset):
            # One on this line: already suggested here, or shown (maybe made with the
            # editor's selected completion item), or in use. Remade only from a short
            # window that nothing showed, once the full one is ready.
            untouched = live.start == offset and live.typed_into(doc.text) == ""
            if not (untouched and live.short and live.done.is_set()):
                return
            if live.answered or live.waiters:
                return
            await self.live.drop(uri)
            live = None
        elif live is not None and not live.done.is_set():
            return  # a suggestion for another place is still being made
        # Checked again after the wait above: a request, an edit or a move may have come.
        if self.cursor.get(uri) != (doc.version, offset) or self.active != uri:
            return
        if self.live.busy() or self.live.get(uri) is not live:
            return
        try:
            # Installed only if nothing came while its generation started (``live``'s
            # rule 2): never in place of a request's suggestion.
            await self.live.start(uri, doc, offset, backend, None, yields=True)
        except Superseded:
            return
        self.prefetches += 1

    # -- reading into the chunk store -----------------------------------------------------

    async def read_next(self, uri: str, doc: Document, backend: Backend) -> bool:
        """Rule 6: read the next region of ``doc`` into the chunk store; whether to go on
        (False: nothing left to read, no room, no store)."""
        if not self._settings().chunk_memory_mb or not isinstance(backend, ChunkAssembly):
            return False
        found = self.reader.next(uri, doc.text)
        if found is None:
            return False
        region, mark = found
        if not fits(backend.chunk_store, backend.count_tokens(region)):
            log.debug("reading %s: the chunk store is full", file_name(uri))
            return False
        request = GenerationRequest(
            prompt=region,
            max_tokens=1,
            speculation=SpeculationMethod.NONE,
            background=True,
            document=uri,
            read_chunks=True,
        )
        self.reading = generation = await backend.generate(request)
        try:
            async for _ in generation:
                pass
        finally:
            self.reading = None
            await generation.cancel()
        stats = generation.stats
        if stats.finish_reason is FinishReason.CANCELLED:
            return True  # a request, an edit or a move came: the next round looks again
        self.reader.done(uri, mark, stats.evaluated_prompt_tokens)
        log.debug(
            "read %s: %d tokens into the chunk store", file_name(uri), stats.evaluated_prompt_tokens
        )
        return True

    # -- the prefill speed -----------------------------------------------------------------

    async def warm_up(self) -> None:
        """Load the model, then time a synthetic prompt (no user code) to learn this
        machine's prefill speed for ``firstAnswerMs``, unless the backend knows it (a
        shared engine measured it for an earlier window; there the synthetic prompt would
        be answered from its cache and time nothing)."""
        backend = await self._backend()
        if self.rate.value is not None or not isinstance(backend, PromptCache):
            return
        if isinstance(backend, PrefillSpeed) and backend.prefill_tokens_per_s:
            self.rate.value = backend.prefill_tokens_per_s
            return
        if not self._settings().first_answer_ms:
            return  # nothing needs the speed
        async with self._timing:  # one timing at a time; a second caller waits for it
            if self.rate.value is not None or self.live.busy():
                return
            request = GenerationRequest(
                prompt=PREFILL_PROBE,
                max_tokens=1,
                speculation=SpeculationMethod.NONE,
                background=True,
            )
            self.project.generation_started()  # the index build waits: it would slow it
            try:
                self.calibration = generation = await backend.generate(request)
                try:
                    async for _ in generation:
                        pass
                finally:
                    self.calibration = None
                    await generation.cancel()
            finally:
                self.project.generation_ended()
            self.rate.observe(generation.stats)

    # -- reading ahead ---------------------------------------------------------------------

    async def read_ahead(self, uri: str, version: int) -> None:
        """Start a one-token generation at the end of the document: the first request or
        edit elsewhere cancels it, and the prompt entries it evaluated by then stay in
        the cache for that request. Only when the whole document fits the prefix window
        (its anchor is then line 0, right for any cursor); never while another
        suggestion is being generated."""
        await self.clock.sleep(READ_AHEAD_DELAY_S)
        if uri not in self.documents or self.live.asked(uri):
            return
        doc = self.documents.get(uri)
        if doc.version != version:
            return
        try:
            backend = await self._backend()
            # Checked after the (possibly long) model load: never take the engine from a
            # suggestion that started meanwhile, nor from the document the user works in.
            if self.live.busy() or self.running is not None or self.live.asked(uri):
                return
            if self.active is not None and self.active != uri:
                return
            counter = self.windows.count_tokens(backend)
            budget = ctxmod.Budget(self._settings().prefix_tokens, 0, 0)
            ctx = ctxmod.gather(doc, len(doc.text), counter, budget, anchor=None)
            if ctx.prefix_start_line != 0:
                return
            end = len(doc.text)
            retrieved = await self.live.retrieve(uri, doc.text, end, backend)
            full = self.windows.full(uri, doc, end, backend, retrieved)
            live = await self.live.launch(
                uri, doc, end, backend, Choice(full, "full"), 1, background=True
            )
            self.running = live
            self.read_aheads += 1
            await self._finish(live)
        except Exception as exc:  # best effort; the first request will do the work
            log.debug("read-ahead failed: %s", describe_failure(exc))
