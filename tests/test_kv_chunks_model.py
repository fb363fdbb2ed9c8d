"""Windows assembled from chunks (``backends/llama/kv_chunks.py``) on the real 0.5B.

- A chunk evaluated alone at position 0, copied out, restored and shifted gives the
  next-token logits of the chunk evaluated alone at its place, within kernel noise.
- With seams longer than every chunk, an assembled window is the whole window evaluated
  in context; with none, only the template's head and the cursor's lines are evaluated,
  and the chunks' entries (which did not see what precedes them) move the logits more
  than noise.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import numpy as np
import pytest
from kode.backends import models
from kode.backends.llama import kv_chunks
from kode.backends.llama.runtime import LlamaContext, LlamaModel, Row, llama_thread

pytestmark = [pytest.mark.model]

SOURCE = Path(argparse.__file__).read_text()  # real material nobody here wrote
LINES = SOURCE.splitlines(keepends=True)[400:470]


def _check() -> None:
    model = LlamaModel(models.resolve("small"))
    ctx = LlamaContext(model, n_ctx=2048, n_seq_max=2)
    slot = ctx.slots[0]
    try:
        # A chunk restored at another place.
        text = model.tokenize("".join(LINES[:30]), special=False)
        probe = text[:3]
        chunk = kv_chunks.evaluate(slot, text)
        assert chunk is not None and chunk.nbytes > 0
        at = 700
        ctx.decode([Row(t, at + i, (slot.seq(0),)) for i, t in enumerate(text)])
        ctx.decode(
            [Row(t, at + len(text) + i, (slot.seq(0),), i == 2) for i, t in enumerate(probe)]
        )
        in_place = ctx.logits(-1).copy()
        slot.truncate(0)
        store = kv_chunks.ChunkStore(64 << 20)
        store.add(chunk)
        tokens = [0] * at + text + probe  # only the chunk's span is read from the store
        found = kv_chunks.Plan(header=0, chunks=((at, at + len(text)),), tail=at + len(text))
        assert kv_chunks.assemble(slot, tokens, found, store, k=0) == 0
        assert store.hits == 1
        ctx.decode(
            [Row(t, at + len(text) + i, (slot.seq(0),), i == 2) for i, t in enumerate(probe)]
        )
        shifted = ctx.logits(-1).copy()
        assert float(np.max(np.abs(in_place - shifted))) <= 1.0
        assert int(np.argmax(in_place)) == int(np.argmax(shifted))

        # Whole windows against assembled ones.
        tokens = model.tokenize(
            "<|fim_prefix|>"
            + "".join(LINES[:60])
            + "<|fim_suffix|>"
            + "".join(LINES[61:])
            + "<|fim_middle|>"
        )
        found = kv_chunks.plan(
            tokens,
            model.piece,
            model.tokenize("<|fim_prefix|>")[0],
            model.tokenize("<|fim_suffix|>")[0],
            chunk_lines=16,
        )
        assert found is not None and len(found.chunks) == 4  # 60 lines: 16+16+16+12
        slot.truncate(0)
        slot.prefill(tokens, lambda: False)
        whole = ctx.logits(-1).copy()
        store = kv_chunks.ChunkStore(64 << 20)

        def assembled(k: int) -> tuple[np.ndarray, int]:
            n = kv_chunks.assemble(slot, tokens, found, store, k)
            assert slot.prefill(tokens, lambda: False) == found.tail
            return ctx.logits(-1).copy(), n

        alone, n_alone = assembled(0)  # evaluates the chunks into the store first
        assert n_alone == found.tail  # the head, and every chunk evaluated alone
        alone, n_alone = assembled(0)
        assert n_alone == found.header and len(store) == 4
        context, n_context = assembled(10_000)
        assert n_context == found.tail
        # The same entries by other batches: equal within kernel noise (the whole prompt
        # in batches of 100 rows instead of 512 moves logits by up to 0.5 here).
        assert float(np.max(np.abs(whole - context))) <= 1.0
        assert int(np.argmax(whole)) == int(np.argmax(context))
        # Chunks that did not see what precedes them (4.1 here): more than noise.
        assert float(np.max(np.abs(whole - alone))) >= 2.0
    finally:
        ctx.close()
        model.close()


async def test_windows_assembled_from_chunks_on_the_real_model() -> None:
    await asyncio.get_running_loop().run_in_executor(llama_thread(), _check)
