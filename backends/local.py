"""One local backend over any engine: llama.cpp (``backends/llama``) or torch (``backends/torch``).

``LocalBackend`` is the ``Backend`` protocol for a model running in this process: one
worker thread runs every blocking engine call (so one KV cache is never used by two
generations at once and the event loop never blocks), a lock queues generations, and
the worker checks the generation's cancel flag before each step, so a cancelled
generation stops within one step. The cache is kept between generations and reused for
the longest common token prefix: typing one character re-evaluates only the tokens
after the edit. What differs between engines is behind ``Engine`` (model-wide: tokens,
text, targets, draft models) and ``steppers.Target`` (one generation's KV cache and
sampler); the decoding methods are written once, in ``backends/steppers.py``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from kode.backends.base import FinishReason, GenerationRequest, Sampling, SpeculationMethod
from kode.backends.errors import BackendError, ContextOverflow, PrefillAborted
from kode.backends.healing import HealIndex
from kode.backends.speculative import CostCurve
from kode.backends.steppers import (
    DraftModel,
    DraftModelStepper,
    NgramStepper,
    PlainStepper,
    Stepper,
    Target,
    heal,
)
from kode.backends.worker import (
    BackendCounters,
    Job,
    NgramLearning,
    WorkerGeneration,
    WorkerRun,
    run_job,
)

T = TypeVar("T", bound=Target)


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

    def target(self, sampling: Sampling) -> T: ...

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
    ) -> None:
        self.engine = engine
        self.curve = curve
        self.draft_options = draft_options
        self.counters = BackendCounters()
        self.learning = NgramLearning(curve)
        self._executor = executor
        self._owns_executor = owns_executor
        self._lock = asyncio.Lock()
        self._closed = False
        self._heal_index: HealIndex | None = None  # built on first use, on the worker

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

    async def generate(self, request: GenerationRequest) -> WorkerGeneration:
        if self._closed:
            raise BackendError("backend is closed")
        if request.max_tokens < 1:
            raise BackendError("max_tokens must be at least 1")
        if request.heal and not self.engine.heals:
            raise BackendError(f"the {self.engine.name} engine cannot heal tokens")
        method = request.speculation
        refusal = REMOTE_ONLY if method is SpeculationMethod.REMOTE else self.engine.refuse(method)
        if refusal is not None:
            raise BackendError(refusal)
        await self._lock.acquire()
        loop = asyncio.get_running_loop()
        job = Job(request, loop)
        try:
            done = loop.run_in_executor(self._executor, self._run, job)
        except BaseException:
            self._lock.release()
            raise

        def finished(_fut: asyncio.Future[None]) -> None:
            self._lock.release()

        done.add_done_callback(finished)
        return WorkerGeneration(job, done)

    async def health(self, timeout_s: float = 1.0) -> bool:
        return not self._closed

    @property
    def engine_info(self) -> dict[str, Any]:
        """This process runs the model (``EngineReport``)."""
        return {"kind": "inProcess", "pid": os.getpid()}

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._lock:
            await asyncio.get_running_loop().run_in_executor(self._executor, self.engine.close)
        if self._owns_executor:
            self._executor.shutdown(wait=True)

    async def logit_gaps(self, prompt: str, tokens: Sequence[int]) -> list[float]:
        """Top-2 logit gap of plain decoding before each of ``tokens`` after ``prompt``.

        For judging a divergence between two greedy runs: a gap below ~1e-3 is a true tie
        that batched kernels may flip.
        """
        async with self._lock:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._executor, self.engine.logit_gaps, prompt, list(tokens)
            )

    # -- worker thread ------------------------------------------------------------------

    def _run(self, job: Job) -> None:
        run_job(job, LocalRun(self, job))


class LocalRun(WorkerRun, Generic[T]):
    """One generation, executed on the worker thread."""

    def __init__(self, backend: LocalBackend[T], job: Job) -> None:
        super().__init__(job)
        self.backend = backend
        self.engine = backend.engine
        self.target = self.engine.target(job.request.sampling)
        self.text = self.engine.text_stream()
        self.calls_at_start = self.engine.calls

    def execute(self) -> None:
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
        try:
            done = self.target.prefill(prompt, self.job.cancelled, req.moved_kv_drift)
        except PrefillAborted as aborted:
            stats.reused_prompt_tokens = aborted.reused
            stats.evaluated_prompt_tokens = max(0, len(self.target.tokens) - aborted.reused)
            self.finish(FinishReason.CANCELLED)
            return
        stats.reused_prompt_tokens, stats.moved_prompt_tokens = done.reused, done.moved
        stats.evaluated_prompt_tokens = len(prompt) - done.reused
        stats.prefill_ms = self.elapsed_ms()
        if req.heal:
            index = self.backend.heal_index()
            first = heal(self.target, index, req.heal.encode(), req.max_tokens, self.job.cancelled)
        else:
            first = [self.target.pick(-1)]
        self.decode(first, self._stepper(req), engine.is_stop)

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
        self.backend.counters.record(self.stats, self.engine.calls - self.calls_at_start)
        self.backend.learning.remember(self.generated)
