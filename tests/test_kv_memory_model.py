"""Saved KV states on the real 0.5B (``LlamaContext`` with a ``KvMemory``): a prompt
evaluated, replaced by another, and brought back gives the same next-token logits as
before, and only its last token is evaluated again."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import numpy as np
import pytest
from kode.backends import models
from kode.backends.llama.runtime import LlamaContext, LlamaModel, llama_thread

pytestmark = [pytest.mark.model]

SOURCE = Path(argparse.__file__).read_text()  # real material nobody here wrote


def fim(text: str) -> str:
    return f"<|fim_prefix|>{text}<|fim_suffix|>\n<|fim_middle|>"


def _check() -> None:
    model = LlamaModel(models.resolve("small"))
    ctx = LlamaContext(model, n_ctx=2048, n_seq_max=2, kv_memory_bytes=128 << 20)
    try:
        a = model.tokenize(fim(SOURCE[:1500]))
        b = model.tokenize(fim(SOURCE[5000:6500]))
        ctx.prefill(a, lambda: False)
        ctx.truncate(len(a) - 1)
        ctx.prefill(a, lambda: False)  # the same single-row evaluation as after a restore
        fresh = ctx.logits(-1).copy()
        assert ctx.prefill(b, lambda: False) <= 16  # b shares only the FIM header with a
        assert ctx.memory.saves == 1  # a was kept when b took sequence 0
        reused = ctx.prefill(a, lambda: False)
        assert ctx.memory.restores == 1
        assert reused == len(a) - 1  # everything but the last token came back
        restored = ctx.logits(-1)
        # Same entries, same kernel for the last row: equal within kernel noise.
        assert float(np.max(np.abs(fresh - restored))) <= 1e-3
        assert int(np.argmax(fresh)) == int(np.argmax(restored))
        assert ctx.memory.used <= ctx.memory.budget
    finally:
        ctx.close()
        model.close()


async def test_a_restored_prompt_gives_the_logits_of_a_fresh_evaluation() -> None:
    await asyncio.get_running_loop().run_in_executor(llama_thread(), _check)
