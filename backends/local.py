"""One local backend over any engine: llama.cpp (``backends/llama``) or torch (``backends/torch``).

``LocalBackend`` is the ``Backend`` protocol for a model running in this process: one
worker thread runs every blocking engine call (the event loop never blocks) and steps
up to ``Engine.width`` generations at once, each in its own part of the engine's KV
cache (a llama.cpp slot), taking the others in arrival order as places free up. Each
round it lets every generation do one unit of work (a prompt batch, a speculative
step) and then evaluates all plain decoding steps in one batch
(``Engine.step_together``): two generations decode in little more than the time of
one. The worker checks a generation's cancel flag before each step, so a cancelled
generation stops within one step. The cache is kept between generations and reused for
the longest common token prefix: typing one character re-evaluates only the tokens
after the edit. What differs between engines is behind ``Engine`` (model-wide: tokens,
text, targets, draft models) and ``steppers.Target`` (one generation's KV cache and
sampler); the decoding methods are written once, in ``backends/steppers.py``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from kode.backends.base import FinishReason, GenerationRequest, Sampling, SpeculationMethod
from kode.backends.errors import (
    BackendClosed,
    BackendError,
    ContextOverflow,
    PrefillAborted,
    describe,
)
from kode.backends.guided import Guide
from kode.backends.heal_index import HealIndex
from kode.backends.monitor import Monitor, VocabIndex
from kode.backends.speculative import CostCurve
from kode.backends.steppers import (
    ChunkTarget,
    DraftModel,
    DraftModelStepper,
    NgramStepper,
    PlainStepper,
    Prefilled,
    Stepper,
    Target,
    heal,
    never,
)
from kode.backends.worker import (
    BackendCounters,
    Live,
    NgramLearning,
    Steps,
    WorkerGeneration,
    WorkerJob,
    WorkerRun,
    fail,
)

T = TypeVar("T", bound=Target)

log = logging.getLogger("kode.backends")

# How long closing a backend waits for the generations it cancelled: each stops within
# one step, a prompt batch at most (seconds on a busy 2-core machine, for a large one).
CLOSE_WAIT_S = 2.0


class TextStream(Protocol):
    """Token ids in, text out, holding back an incomplete UTF-8 sequence."""

    def push(self, token: int) -> str: ...

    def flush(self) -> str:
        """What is still held back, once generation ends."""
        ...


NO_DRAFT_MODEL = (
    "speculation 'draft' needs a draft model (setting draftModel) loaded with the target"
)
REMOTE_ONLY = (
    "speculation 'remote' means the remote server's own; a local engine offers auto, none, "
    "ngram, lookahead (llama.cpp) and draft"
)


@dataclass(frozen=True, slots=True)
class DraftOptions:
    """How the draft model drafts: at most ``max_draft`` tokens, stopping when its top
    probability falls below ``p_min``."""

    max_draft: int = 4
    p_min: float = 0.6


class Engine(Protocol[T]):
    """What a local backend needs of an engine; every method but ``tokenize`` runs on the
    backend's worker thread."""

    @property
    def name(self) -> str:
        """Short engine name, e.g. ``"llama.cpp"``."""
        ...

    @property
    def model_name(self) -> str: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def calls(self) -> int:
        """Target calls so far, prompt batches included."""
        ...

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids (thread-safe); ``special`` parses ``<|fim_prefix|>`` and friends."""
        ...

    def is_stop(self, token: int) -> bool: ...

    def text_stream(self) -> TextStream: ...

    @property
    def heals(self) -> bool:
        """Whether ``pieces`` is available (token healing)."""
        ...

    def pieces(self) -> Sequence[bytes]:
        """What each token id spells (bytes; control tokens nothing), for token healing."""
        ...

    def target(self, sampling: Sampling, guide: Guide | None = None) -> T:
        """A generation's target; with ``guide`` it picks under the names monitor
        (given only where ``heals``: the monitor reads ``pieces``)."""
        ...

    @property
    def width(self) -> int:
        """How many generations the engine holds at once (llama.cpp: its slots)."""
        ...

    def step_together(self, steps: Sequence[tuple[T, int]]) -> list[int]:
        """One plain decoding step of several generations (at most ``width``), each root
        evaluated at the end of its target's cache, in one batch where the engine can;
        the token each target picks after its root (each cache then holds its root)."""
        ...

    def refuse(self, method: SpeculationMethod) -> str | None:
        """Why this engine cannot run ``method`` now (None: it can), for the user
        (``REMOTE`` is refused before the engine is asked)."""
        ...

    def draft(self, target: T) -> DraftModel:
        """The draft model, sampling with ``target``'s generator (unless ``refuse(DRAFT)``)."""
        ...

    def lookahead(self, target: T, sources: Sequence[Sequence[int]]) -> Stepper:
        """A lookahead stepper (unless ``refuse(LOOKAHEAD)``)."""
        ...

    def logit_gaps(self, prompt: str, tokens: Sequence[int]) -> list[float]: ...

    def close(self) -> None: ...


class LocalBackend(Generic[T]):
    """The ``Backend`` protocol over ``engine``, every engine call on ``executor``'s one thread.

    ``owns_executor``: shut the executor down on ``aclose`` (llama.cpp's thread is shared
    by the process, see ``llama_thread``; torch's is the backend's own).
    """

    def __init__(
        self,
        engine: Engine[T],
        executor: ThreadPoolExecutor,
        *,
        curve: CostCurve,
        draft_options: DraftOptions = DraftOptions(),
        owns_executor: bool,
        close_wait_s: float = CLOSE_WAIT_S,
    ) -> None:
        self.engine = engine
        self.curve = curve
        self.draft_options = draft_options
        self.counters = BackendCounters()
        self.learning = NgramLearning(curve)
        self._executor = executor
        self._owns_executor = owns_executor
        self.close_wait_s = close_wait_s
        self._inbox: deque[WorkerJob] = deque()  # arrived, not started yet (at most ``width`` run)
        self._inbox_lock = threading.Lock()
        self._serving = False  # ``_serve`` runs or is queued on the worker
        self._live = 0  # generations ``_serve`` steps now
        self._jobs: set[WorkerJob] = set()  # every generation not ended yet
        self._closed = False
        self._heal_index: HealIndex | None = None  # built on first use, on the worker
        self._vocab_index: VocabIndex | None = None  # the same, for the names monitor

    # -- Backend protocol -------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def progress(self) -> int:
        """``Progress``: target calls so far, prompt batches included (a live count)."""
        return self.engine.calls

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def width(self) -> int:
        """``Concurrent``: how many generations the worker steps at once."""
        return self.engine.width

    def crowded(self) -> bool:
        """Whether the worker steps more than one generation now (worker thread). Then
        ``auto`` decodes plainly, in the common batch, instead of speculating: a draft's
        rows pay only where the batch has compute to spare, and the other generation's
        row takes it (this machine's CPU decodes ``auto`` plainly anyway)."""
        return self._live > 1

    def count_tokens(self, text: str) -> int:
        return len(self.engine.tokenize(text))

    def last_token_chars(self, text: str) -> int:
        """``TokenHealing``: the characters of ``text``'s last token (0 when this engine
        cannot heal or the token does not end on a character boundary)."""
        if not self.engine.heals:
            return 0
        tokens = self.engine.tokenize(text, special=False)
        if not tokens:
            return 0
        stream = self.engine.text_stream()
        last = stream.push(tokens[-1]) + stream.flush()
        return len(last) if last and text.endswith(last) else 0

    def heal_index(self) -> HealIndex:
        """The vocabulary indexed for healing (worker thread: it reads every piece)."""
        if self._heal_index is None:
            self._heal_index = HealIndex(self.engine.pieces(), self.engine.is_stop)
        return self._heal_index

    def vocab_index(self) -> VocabIndex:
        """The vocabulary as the names monitor's trie (worker thread; built once, about
        0.3 s for Qwen2.5-Coder's 151k tokens)."""
        if self._vocab_index is None:
            self._vocab_index = VocabIndex(self.engine.pieces(), self.engine.is_stop)
        return self._vocab_index

    async def generate(self, request: GenerationRequest) -> WorkerGeneration:
        if self._closed:
            raise BackendClosed("backend is closed")
        if request.max_tokens < 1:
            raise BackendError("max_tokens must be at least 1")
        if request.heal and not self.engine.heals:
            raise BackendError(f"the {self.engine.name} engine cannot heal tokens")
        method = request.speculation
        refusal = REMOTE_ONLY if method is SpeculationMethod.REMOTE else self.engine.refuse(method)
        if refusal is not None:
            raise BackendError(refusal)
        loop = asyncio.get_running_loop()
        job = WorkerJob(request, loop)
        self._jobs.add(job)
        job.done.add_done_callback(lambda _done: self._jobs.discard(job))
        with self._inbox_lock:
            self._inbox.append(job)
            start = not self._serving
            self._serving = True
        if start:
            loop.run_in_executor(self._executor, self._serve)
        return WorkerGeneration(job)

    async def health(self, timeout_s: float = 1.0) -> bool:
        return not self._closed

    @property
    def engine_info(self) -> dict[str, Any]:
        """This process runs the model (``EngineReport``)."""
        return {"kind": "inProcess", "pid": os.getpid()}

    async def aclose(self) -> None:
        """Cancel the generations still running (each stops within one step) and wait
        for them at most ``close_wait_s``; then close the engine on the worker thread,
        after them. One stuck in a model call longer is not waited for: the worker closes
        the engine (and its own thread ends) once that call returns."""
        if self._closed:
            return
        self._closed = True
        jobs = list(self._jobs)
        for job in jobs:
            job.cancel_event.set()
        late: set[asyncio.Future[None]] = set()
        if jobs:
            _ended, late = await asyncio.wait([job.done for job in jobs], timeout=self.close_wait_s)
        closing = asyncio.get_running_loop().run_in_executor(self._executor, self.engine.close)
        if late:
            log.warning(
                "closing a %s backend left %d generation(s) to end in a model call; the "
                "engine closes after them",
                self.engine.name,
                len(late),
            )
            closing.add_done_callback(_report_close)
            if self._owns_executor:
                self._executor.shutdown(wait=False)  # its thread ends after the close
            return
        await closing
        if self._owns_executor:
            await asyncio.to_thread(self._executor.shutdown)

    async def logit_gaps(self, prompt: str, tokens: Sequence[int]) -> list[float]:
        """Top-2 logit gap of plain decoding before each of ``tokens`` after ``prompt``.

        For judging a divergence between two greedy runs: a gap below ~1e-3 is a true tie
        that batched kernels may flip. Runs on the worker between generations.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, self.engine.logit_gaps, prompt, list(tokens)
        )

    # -- worker thread ------------------------------------------------------------------

    def _serve(self) -> None:
        """Step every live generation until none is left (on the worker thread): each
        round, admit arrivals while fewer than ``width`` are live, let each generation
        that is not waiting for a plain step do its next unit of work, then evaluate the
        plain steps of all that wait in one batch."""
        live: list[Live[LocalRun[T]]] = []
        try:
            while True:
                with self._inbox_lock:
                    while self._inbox and len(live) < self.width:
                        admitted = self._admit(self._inbox.popleft())
                        if admitted is not None:
                            live.append(admitted)
                    self._live = len(live)
                    if not live:
                        self._serving = False
                        return
                for one in live:
                    if one.want is None:
                        self._advance(one)
                waiting = []
                for one in live:
                    if one.ended or one.want is None:
                        continue
                    if one.job.cancelled():
                        self._advance(one, None)  # it ends, cancelled, before the step
                    else:
                        waiting.append(one)
                if waiting:
                    self._step_together(waiting)
                live = [one for one in live if not one.ended]
        except BaseException as exc:  # a fault of this loop: no generation may hang
            with self._inbox_lock:
                for job in self._inbox:
                    fail(job, exc)
                self._inbox.clear()
                self._serving = False
            for one in live:
                if not one.ended:
                    one.advance(error=exc)
                    one.close()
            raise

    def _admit(self, job: WorkerJob) -> Live[LocalRun[T]] | None:
        """The job's run, or None when making it failed (its consumer got the error)."""
        try:
            return Live(job, LocalRun(self, job))
        except BaseException as exc:
            fail(job, exc)
            return None

    def _advance(
        self,
        one: Live[LocalRun[T]],
        value: int | None = None,
        error: BaseException | None = None,
    ) -> None:
        """``Live.advance``, counting the target calls it made as the run's own, and
        ``close`` once it ended."""
        before = self.engine.calls
        one.advance(value, error)
        one.job.stats.model_calls += self.engine.calls - before
        if one.ended:
            one.close()

    def _step_together(self, waiting: list[Live[LocalRun[T]]]) -> None:
        steps = []
        for one in waiting:
            assert one.want is not None
            steps.append((one.run.target, one.want.root))
        try:
            tokens = self.engine.step_together(steps)
        except BaseException as exc:
            for one in waiting:
                self._advance(one, error=exc)
            return
        for one, token in zip(waiting, tokens, strict=True):
            stats = one.job.stats
            stats.model_calls += 1
            stats.batched_steps += len(waiting) > 1
            self._advance(one, token)


def _report_close(closing: asyncio.Future[None]) -> None:
    """The engine's close, run after an ``aclose`` that did not wait for it."""
    error = None if closing.cancelled() else closing.exception()
    if error is not None:
        log.warning("closing the engine failed (%s)", describe(error))


class LocalRun(WorkerRun, Generic[T]):
    """One generation, executed on the worker thread."""

    def __init__(self, backend: LocalBackend[T], job: WorkerJob) -> None:
        super().__init__(job)
        self.backend = backend
        self.engine = backend.engine
        names = job.request.names
        self.guide: Guide | None = None
        if names is not None and names.members and self.engine.heals:
            self.guide = Guide(Monitor(backend.vocab_index(), names))
        self.target = self.engine.target(job.request.sampling, self.guide)
        self.text = self.engine.text_stream()

    def steps(self) -> Steps:
        """The whole generation, pausing between prompt batches and at every step (the
        worker's ``Live``); the target's place in the engine is released however it ends."""
        req, stats, engine = self.job.request, self.stats, self.engine
        prompt = engine.tokenize(req.prompt)
        stats.prompt_tokens = len(prompt)
        if not prompt:
            raise BackendError("empty prompt")
        if len(prompt) + req.max_tokens + 1 > engine.n_ctx:
            raise ContextOverflow(
                f"prompt ({len(prompt)} tokens) + max_tokens ({req.max_tokens}) exceeds the "
                f"context window ({engine.n_ctx})"
            )
        target, cancelled = self.target, self.job.cancelled
        engine_target: object = target  # llama.cpp's also keeps chunks (``ChunkTarget``)
        chunks = engine_target if isinstance(engine_target, ChunkTarget) else None
        try:
            if req.read_chunks:
                if chunks is not None:
                    stats.evaluated_prompt_tokens = yield from chunks.read_steps(prompt, cancelled)
                self.finish(FinishReason.CANCELLED if cancelled() else FinishReason.LENGTH)
                return
            assembled = 0
            try:
                if req.assemble and chunks is not None:
                    assembled = yield from chunks.assemble_steps(prompt, cancelled)
                done = yield from target.prefill_steps(prompt, cancelled, req.moved_kv_drift)
            except PrefillAborted as aborted:
                stats.reused_prompt_tokens = aborted.reused
                stats.evaluated_prompt_tokens = max(0, len(target.tokens) - aborted.reused)
                self.finish(FinishReason.CANCELLED)
                return
            if assembled:
                # The rest of the window was evaluated in place or moved (seams, head).
                done = Prefilled(assembled)
                stats.assembled_prompt_tokens = assembled
            stats.reused_prompt_tokens, stats.moved_prompt_tokens = done.reused, done.moved
            stats.evaluated_prompt_tokens = len(prompt) - done.reused
            stats.prefill_ms = self.elapsed_ms()
            if req.heal:
                index = self.backend.heal_index()
                text = req.heal.encode()
                first = heal(self.target, index, text, req.max_tokens, self.job.cancelled)
            else:
                first = [self.target.pick(-1)]
            stepper = self._stepper(req)
            share = self.backend.crowded if req.speculation is SpeculationMethod.AUTO else never
            yield from self.decode(first, stepper, engine.is_stop, share)
        finally:
            self.target.release()

    def _stepper(self, req: GenerationRequest) -> Stepper:
        method, engine, target = req.speculation, self.engine, self.target
        if method is SpeculationMethod.NONE:
            return PlainStepper(target)
        if method is SpeculationMethod.DRAFT:
            opts = self.backend.draft_options
            return DraftModelStepper(
                target, engine.draft(target), max_draft=opts.max_draft, p_min=opts.p_min
            )
        learning = self.backend.learning
        auto = method is SpeculationMethod.AUTO
        policy = learning.policy_for(auto)
        if auto and policy.cautious:
            # Drafting cannot pay on this machine (``AdaptivePolicy``): decode plainly, as
            # `none` does, without indexing draft sources first.
            return PlainStepper(target, method=SpeculationMethod.AUTO)
        sources = [engine.tokenize(text, special=False) for text in req.draft_sources if text]
        if method is SpeculationMethod.LOOKAHEAD:
            return engine.lookahead(target, [*sources, *learning.history])
        return NgramStepper(
            target,
            learning.drafter_for(sources),
            policy,
            allow_plain=auto,
            method=method,
            tracker=learning.costs if auto else None,
        )

    def text_of(self, token: int) -> str:
        return self.text.push(token)

    def text_tail(self) -> str:
        return self.text.flush()

    def account(self) -> None:
        self.stats.total_ms = self.elapsed_ms()
        if self.guide is not None:
            self.guide.record(self.stats)
        read = self.job.request.read_chunks
        self.backend.counters.record(self.stats, self.stats.model_calls, read=read)
        self.backend.learning.remember(self.generated)
