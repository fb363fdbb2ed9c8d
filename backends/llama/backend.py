"""The local backend: llama.cpp through llama-cpp-python, one context, one worker thread.

Every blocking llama.cpp call runs on the backend's single worker thread, so one
context is never used by two generations at once and the event loop never blocks.
The worker checks the generation's cancel flag before each decode step (and
llama.cpp's abort callback checks it inside a long prompt evaluation), so a
cancelled generation stops within one step. The KV cache of sequence 0 is kept
between generations and reused for the longest common token prefix: typing one
character re-evaluates only the tokens after the edit.
"""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import numpy.typing as npt
from kode.backends.base import (
    FinishReason,
    GenerationRequest,
    Sampling,
    SpeculationMethod,
)
from kode.backends.errors import BackendError, ContextOverflow
from kode.backends.llama.runtime import LlamaContext, LlamaModel, PrefillAborted, llama_thread
from kode.backends.llama.steppers import (
    DraftModelStepper,
    LookaheadStepper,
    NgramStepper,
    PlainStepper,
    calibrate,
)
from kode.backends.speculative import CostCurve, Lookahead
from kode.backends.worker import (
    BackendCounters,
    Job,
    NgramLearning,
    Stepper,
    WorkerGeneration,
    WorkerRun,
    run_job,
)


class Sampler:
    """Picks the next token from logits: argmax when greedy, else temperature + top-p."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self._rng = np.random.default_rng(sampling.seed)

    def __call__(self, logits: npt.NDArray[np.float32]) -> int:
        s = self.sampling
        if s.greedy:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / s.temperature
        z -= z.max()
        p = np.exp(z)
        p /= p.sum()
        if s.top_p < 1.0:
            order = np.argsort(-p)
            cum = np.cumsum(p[order])
            keep = order[: int(np.searchsorted(cum, s.top_p) + 1)]
            q = np.zeros_like(p)
            q[keep] = p[keep]
            p = q / q.sum()
        return int(self._rng.choice(len(p), p=p))


class LlamaBackend:
    """Local generation with llama.cpp; construct with ``await LlamaBackend.load(path)``."""

    def __init__(
        self,
        model: LlamaModel,
        context: LlamaContext,
        executor: ThreadPoolExecutor,
        *,
        curve: CostCurve,
        draft: tuple[LlamaModel, LlamaContext] | None = None,
    ) -> None:
        self._model = model
        self._ctx = context
        self._executor = executor
        self._draft = draft
        self._lock = asyncio.Lock()
        self.counters = BackendCounters()
        self._closed = False
        self.curve = curve
        self.learning = NgramLearning(curve)

    @classmethod
    async def load(
        cls,
        path: Path,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_seq_max: int = 8,
        draft_path: Path | None = None,
        curve: CostCurve | None = None,
        kv_memory_mb: int = 0,
    ) -> LlamaBackend:
        """Load ``path`` (and a draft model for ``speculation=draft``), then measure the
        target's batch-cost curve on this machine unless ``curve`` is given."""
        executor = llama_thread()
        loop = asyncio.get_running_loop()
        opened: list[LlamaModel | LlamaContext] = []

        def build() -> LlamaBackend:
            model = LlamaModel(path)
            opened.append(model)
            ctx = LlamaContext(
                model,
                n_ctx=n_ctx,
                n_seq_max=n_seq_max,
                n_threads=n_threads,
                kv_memory_bytes=kv_memory_mb << 20,
            )
            opened.append(ctx)
            draft = None
            if draft_path is not None:
                dmodel = LlamaModel(draft_path)
                opened.append(dmodel)
                dctx = LlamaContext(dmodel, n_ctx=n_ctx, n_seq_max=1, n_threads=n_threads)
                opened.append(dctx)
                draft = (dmodel, dctx)
            measured = curve if curve is not None else calibrate(ctx)
            return cls(model, ctx, executor, curve=measured, draft=draft)

        try:
            return await loop.run_in_executor(executor, build)
        except BaseException:
            for thing in reversed(opened):
                thing.close()
            raise

    # -- Backend protocol -------------------------------------------------------------

    @property
    def name(self) -> str:
        return "llama.cpp"

    @property
    def model_name(self) -> str:
        return self._model.path.name

    @property
    def model(self) -> LlamaModel:
        return self._model

    def count_tokens(self, text: str) -> int:
        return len(self._model.tokenize(text))

    def cached_prefix(self, prompt: str) -> tuple[int, int]:
        """How much of ``prompt`` the context (sequence 0, its moved suffix, or a saved
        state) already holds; read from the event loop while the worker may be running."""
        tokens = self._model.tokenize(prompt)
        return self._ctx.reach(tokens), len(tokens)

    @property
    def kv_memory(self) -> dict[str, int]:
        """What the saved-state memory holds (``kode/stats``)."""
        return self._ctx.memory.as_dict()

    async def generate(self, request: GenerationRequest) -> WorkerGeneration:
        if self._closed:
            raise BackendError("backend is closed")
        if request.max_tokens < 1:
            raise BackendError("max_tokens must be at least 1")
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

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._lock:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._free)

    def _free(self) -> None:
        if self._draft is not None:
            self._draft[1].close()
            self._draft[0].close()
        self._ctx.close()
        self._model.close()

    async def logit_gaps(self, prompt: str, tokens: Sequence[int]) -> list[float]:
        """Top-2 logit gap of plain decoding before each of ``tokens`` after ``prompt``.

        For judging a divergence between two greedy runs: a gap below ~1e-3 is a true tie
        that batched kernels may flip.
        """
        async with self._lock:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, self._gaps, prompt, list(tokens))

    def _gaps(self, prompt: str, tokens: list[int]) -> list[float]:
        ctx = self._ctx
        ctx.prefill(self._model.tokenize(prompt), lambda: False)
        gaps = []
        plain = PlainStepper(ctx, lambda i: int(np.argmax(ctx.logits(i))))
        logits = ctx.logits(-1)
        for token in tokens:
            top2 = np.partition(logits, -2)[-2:]
            gaps.append(float(abs(top2[1] - top2[0])))
            plain.step(token)
            logits = ctx.logits(0)
        return gaps

    # -- worker thread ------------------------------------------------------------------

    def _run(self, job: Job) -> None:
        run_job(job, _Run(self, job))


class _Run(WorkerRun):
    """One generation, executed on the worker thread."""

    def __init__(self, backend: LlamaBackend, job: Job) -> None:
        super().__init__(job)
        self.backend = backend
        self.ctx = backend._ctx
        self.model = backend._model
        self.sampler = Sampler(job.request.sampling)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.calls_at_start = self.ctx.decode_calls

    def execute(self) -> None:
        req, stats, ctx = self.job.request, self.stats, self.ctx
        prompt = self.model.tokenize(req.prompt)
        stats.prompt_tokens = len(prompt)
        if len(prompt) + req.max_tokens + 1 > ctx.n_ctx:
            raise ContextOverflow(
                f"prompt ({len(prompt)} tokens) + max_tokens ({req.max_tokens}) exceeds the "
                f"context window ({ctx.n_ctx})"
            )
        try:
            stats.reused_prompt_tokens = ctx.prefill(
                prompt, self.job.cancelled, max_drift=req.moved_kv_drift
            )
            stats.moved_prompt_tokens = 0 if ctx.last_move is None else ctx.last_move.length
        except PrefillAborted as aborted:
            stats.reused_prompt_tokens = aborted.reused
            stats.evaluated_prompt_tokens = max(0, len(ctx.tokens) - aborted.reused)
            self.finish(FinishReason.CANCELLED)
            return
        stats.evaluated_prompt_tokens = len(prompt) - stats.reused_prompt_tokens
        stats.prefill_ms = self.elapsed_ms()
        stepper = self._stepper(req)
        self.decode(self.sampler(ctx.logits(-1)), stepper, self.model.is_stop)

    def _stepper(self, req: GenerationRequest) -> Stepper:
        ctx, backend, method = self.ctx, self.backend, req.speculation

        def pick(row: int) -> int:
            return self.sampler(ctx.logits(row))

        if method is SpeculationMethod.NONE:
            return PlainStepper(ctx, pick)
        learning = backend.learning
        sources = [self.model.tokenize(text, special=False) for text in req.draft_sources if text]
        if method is SpeculationMethod.LOOKAHEAD:
            la = Lookahead(window=3, ngram=3, pool_size=8, max_verify=2)
            for src in (*sources, *learning.history):
                la.add_source(src)
            return LookaheadStepper(ctx, pick, la)
        if method is SpeculationMethod.DRAFT:
            if backend._draft is None:
                raise BackendError(
                    "speculation 'draft' needs a draft model (setting draftModel) loaded "
                    "with the target"
                )
            return DraftModelStepper(ctx, pick, backend._draft[1])
        auto = method is SpeculationMethod.AUTO
        return NgramStepper(
            ctx,
            pick,
            learning.drafter_for(sources),
            learning.policy_for(auto),
            allow_plain=auto,
            method=str(method),
            tracker=learning.costs if auto else None,
        )

    def text_of(self, token: int) -> str:
        return self.decoder.decode(self.model.piece(token))

    def text_tail(self) -> str:
        return self.decoder.decode(b"", final=True)

    def account(self) -> None:
        self.stats.total_ms = self.elapsed_ms()
        self.backend.counters.record(self.stats, self.ctx.decode_calls - self.calls_at_start)
        self.backend.learning.remember(self.generated)


LlamaGeneration = WorkerGeneration  # the name callers used before the split
