"""The llama.cpp engine: one model, one context, on the process's llama.cpp thread.

``LlamaBackend`` is the generic ``LocalBackend`` over a ``LlamaEngine``. Every llama.cpp
call runs on ``llama_thread()``; llama.cpp's abort callback checks the cancel flag inside
a long prompt evaluation as well, so a cancel stops it mid-batch. The context has one
slot per generation that may run at once (``n_slots``; the shared engine has two): each
slot's KV entries are kept between generations and reused for the longest common token
prefix (and, with ``moved_kv_drift``, for a suffix that only moved after an edit), and
the plain steps of the generations that run together are decoded in one batch.
"""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from kode.backends.base import Sampling, SpeculationMethod
from kode.backends.defaults import CONTEXT_SIZE
from kode.backends.guided import Guide
from kode.backends.llama.kv_chunks import Assembler
from kode.backends.llama.library import llama_thread
from kode.backends.llama.runtime import LlamaContext, LlamaModel, Row
from kode.backends.llama.target import (
    LlamaDraft,
    LlamaTarget,
    LookaheadStepper,
    Sampler,
    calibrate,
)
from kode.backends.local import NO_DRAFT_MODEL, LocalBackend, TextStream
from kode.backends.speculative import CostCurve, Lookahead, build_tree
from kode.backends.steppers import Stepper


class Utf8Stream:
    """Token pieces (bytes) to text, holding back an incomplete UTF-8 sequence."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self.decoder.decode(self.model.piece(token))

    def flush(self) -> str:
        return self.decoder.decode(b"", final=True)


class LlamaEngine:
    """A ``LlamaModel`` and its context (and a draft model's), as ``LocalBackend`` drives them."""

    name = "llama.cpp"

    def __init__(
        self,
        model: LlamaModel,
        context: LlamaContext,
        draft: tuple[LlamaModel, LlamaContext] | None = None,
        assembler: Assembler | None = None,
    ) -> None:
        self.model, self.ctx, self._draft = model, context, draft
        self.assembler = assembler

    @property
    def model_name(self) -> str:
        return self.model.path.name

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    @property
    def calls(self) -> int:
        return self.ctx.decode_calls

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        return self.model.tokenize(text, special=special)

    def is_stop(self, token: int) -> bool:
        return self.model.is_stop(token)

    def text_stream(self) -> TextStream:
        return Utf8Stream(self.model)

    heals = True

    def pieces(self) -> list[bytes]:
        return [self.model.piece(token) for token in range(self.model.n_vocab)]

    def target(self, sampling: Sampling, guide: Guide | None = None) -> LlamaTarget:
        return LlamaTarget(self.ctx, Sampler(sampling), guide, self.assembler)

    @property
    def width(self) -> int:
        return len(self.ctx.slots)

    def step_together(self, steps: Sequence[tuple[LlamaTarget, int]]) -> list[int]:
        """One batch: a row per generation, its root at the end of its own slot's
        sequence. One row is exactly ``PlainStepper``'s step; several rows compute each
        row's logits with other kernels than one row alone (the noise of batched rows,
        docs/benchmarks.md), so a near tie may be picked differently."""
        rows = [Row(root, len(t.slot.tokens), (t.slot.base,), True) for t, root in steps]
        self.ctx.decode(rows)
        return [target.pick_batched(i, root) for i, (target, root) in enumerate(steps)]

    def refuse(self, method: SpeculationMethod) -> str | None:
        if method is SpeculationMethod.DRAFT and self._draft is None:
            return NO_DRAFT_MODEL
        return None

    def draft(self, target: LlamaTarget) -> LlamaDraft:
        assert self._draft is not None  # LocalBackend asks ``refuse`` first
        return LlamaDraft(self._draft[1])

    def lookahead(self, target: LlamaTarget, sources: Sequence[Sequence[int]]) -> Stepper:
        la = Lookahead(window=3, ngram=3, pool_size=8, max_verify=2)
        for src in sources:
            la.add_source(src)
        return LookaheadStepper(target, la)

    def logit_gaps(self, prompt: str, tokens: Sequence[int]) -> list[float]:
        target = self.target(Sampling())
        try:
            target.prefill(self.model.tokenize(prompt), lambda: False, 0)
            gaps = []
            logits = self.ctx.logits(-1)
            for token in tokens:
                top2 = np.partition(logits, -2)[-2:]
                gaps.append(float(abs(top2[1] - top2[0])))
                tree = build_tree(token, [], max_rows=1)
                target.evaluate(tree)
                target.commit(tree, 0, 0)
                logits = self.ctx.logits(0)
            return gaps
        finally:
            target.release()

    def close(self) -> None:
        if self._draft is not None:
            self._draft[1].close()
            self._draft[0].close()
        self.ctx.close()
        self.model.close()


class LlamaBackend(LocalBackend[LlamaTarget]):
    """Local generation with llama.cpp; construct with ``await LlamaBackend.load(path)``."""

    engine: LlamaEngine

    @property
    def model(self) -> LlamaModel:
        return self.engine.model

    def cached_prefix(self, prompt: str) -> tuple[int, int]:
        """How much of ``prompt`` the context (a slot, its moved suffix, or a saved
        state) already holds; read from the event loop while the worker may be running."""
        tokens = self.engine.model.tokenize(prompt)
        return self.engine.ctx.reach(tokens), len(tokens)

    def assembled_prefix(self, prompt: str) -> tuple[int, int]:
        """How many of ``prompt``'s tokens an assembled window would not evaluate (a
        slot's exact prefix, then chunks from the store; 0 where nothing would be taken
        from the store); read from the event loop while the worker may be running."""
        tokens = self.engine.model.tokenize(prompt)
        assembler = self.engine.assembler
        if assembler is None or not assembler.usable:
            return 0, len(tokens)
        left = assembler.left(tokens, self.engine.ctx.exact_reach(tokens))
        return (0 if left is None else len(tokens) - left), len(tokens)

    @property
    def kv_memory(self) -> dict[str, int]:
        """What the saved-state memory holds (``kode/stats``)."""
        return self.engine.ctx.memory.as_dict()

    @property
    def chunk_store(self) -> dict[str, int] | None:
        """What the chunk store holds (``kode/stats``); None without one."""
        assembler = self.engine.assembler
        return None if assembler is None else assembler.as_dict()

    @classmethod
    async def load(
        cls,
        path: Path,
        *,
        n_ctx: int = CONTEXT_SIZE,
        n_threads: int | None = None,
        n_seq_max: int = 8,
        n_slots: int = 1,
        draft_path: Path | None = None,
        curve: CostCurve | None = None,
        kv_memory_mb: int = 0,
        chunk_memory_mb: int = 0,
    ) -> LlamaBackend:
        """Load ``path`` (and a draft model for ``speculation=draft``), then measure the
        target's batch-cost curve on this machine unless ``curve`` is given.
        ``n_slots``: how many generations run at once, decoded in one batch (each slot
        has room for ``n_ctx`` tokens: the KV cache grows with them)."""
        executor = llama_thread()
        opened: list[LlamaModel | LlamaContext] = []

        def build() -> LlamaBackend:
            model = LlamaModel(path)
            opened.append(model)
            ctx = LlamaContext(
                model,
                n_ctx=n_ctx,
                n_seq_max=n_seq_max,
                n_slots=n_slots,
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
            assembler = Assembler(model, chunk_memory_mb << 20) if chunk_memory_mb else None
            engine = LlamaEngine(model, ctx, draft, assembler)
            return cls(engine, executor, curve=measured, owns_executor=False)

        try:
            return await asyncio.get_running_loop().run_in_executor(executor, build)
        except BaseException:
            for thing in reversed(opened):
                thing.close()
            raise
