"""The assembled-window measurement (``bench/assembly.py``) on the real 0.5B: with seams
longer than every chunk, an assembled window is the whole window evaluated in context
(next-token logits of a fresh evaluation, within kernel noise); with no seams only the
template's head and the cursor's lines are evaluated, and the chunks' entries (which did
not see what came before them) change the logits."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import numpy as np
import pytest
from kode.backends import models
from kode.backends.llama.runtime import LlamaContext, LlamaModel, llama_thread
from kode.bench.assembly import Assembler, plan

pytestmark = [pytest.mark.model]

SOURCE = Path(argparse.__file__).read_text()  # real material nobody here wrote


def _check() -> None:
    model = LlamaModel(models.resolve("small"))
    ctx = LlamaContext(model, n_ctx=2048, n_seq_max=2, n_slots=2)
    try:
        lines = SOURCE.splitlines(keepends=True)[400:470]
        tokens = model.tokenize(
            "<|fim_prefix|>"
            + "".join(lines[:60])
            + "<|fim_suffix|>"
            + "".join(lines[61:])
            + "<|fim_middle|>"
        )
        found = plan(
            tokens,
            model.piece,
            model.tokenize("<|fim_prefix|>")[0],
            model.tokenize("<|fim_suffix|>")[0],
            chunk_lines=16,
        )
        assert found is not None and len(found.chunks) == 4  # 60 lines: 16+16+16+12

        def logits(k: int | None) -> tuple[np.ndarray, int]:
            assembler = Assembler(ctx.slots[1].seq(0), 16, 0, k)
            slot = ctx.slots[0]
            assembler(slot, tokens)
            slot.prefill(tokens, lambda: False)
            return ctx.logits(-1).copy(), assembler.evaluated[0]

        whole, n_whole = logits(None)
        context, n_context = logits(10_000)
        alone, n_alone = logits(0)
        assert n_whole == n_context == len(tokens)
        assert n_alone == found.header + len(tokens) - found.tail
        # The same entries by other batches: equal within kernel noise (the whole prompt
        # in batches of 100 rows instead of 512 moves logits by up to 0.5 here).
        assert float(np.max(np.abs(whole - context))) <= 1.0
        assert int(np.argmax(whole)) == int(np.argmax(context))
        # Chunks that did not see what precedes them (4.1 here): more than noise.
        assert float(np.max(np.abs(whole - alone))) >= 2.0
    finally:
        ctx.close()
        model.close()


async def test_an_assembled_window_with_whole_seams_is_the_window_evaluated_whole() -> None:
    await asyncio.get_running_loop().run_in_executor(llama_thread(), _check)
