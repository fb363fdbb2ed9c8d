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
from kode.backends.llama.library import llama_thread
from kode.backends.llama.runtime import LlamaContext, LlamaModel, Row

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


async def test_a_window_read_in_the_background_is_assembled_through_the_backend() -> None:
    """The engine's path: a region of a real file read into the store (a
    ``read_chunks`` request), then a window over it generated with ``assemble``: most of
    its prefix is taken from the store, and a window's own estimate of that (the shared
    engine's mirror, from the tokenizer alone) agrees with the engine's."""
    from kode.backends.base import GenerationRequest, SpeculationMethod
    from kode.backends.llama.backend import LlamaBackend
    from kode.backends.llama.kv_chunks import Assembler
    from kode.completion.reading import regions

    path = models.resolve("small")
    lines = SOURCE.splitlines(keepends=True)
    # The regions a window reading near line 500 would ask for first.
    near = regions(lines, near=[500])
    read = sorted(near[:3])
    start, end = read[0][0], read[-1][1]
    assert end - start >= 250
    prompt = (
        "<|fim_prefix|>"
        + "".join(lines[start + 40 : end - 20])
        + "<|fim_suffix|>"
        + "".join(lines[end - 19 : end])
        + "<|fim_middle|>"
    )
    backend = await LlamaBackend.load(path, n_ctx=4096, chunk_memory_mb=64, kv_memory_mb=0)
    mirror = Assembler(LlamaModel(path, vocab_only=True), 64 << 20)
    try:
        assert backend.assembled_prefix(prompt)[0] == 0  # nothing read yet
        for a, b in read:
            text = "".join(lines[a:b])
            request = GenerationRequest(
                text, 1, speculation=SpeculationMethod.NONE, background=True, read_chunks=True
            )
            stats = await (await backend.generate(request)).wait()
            assert stats.completion_tokens == 0 and stats.evaluated_prompt_tokens > 0
            mirror.note_read(backend.model.tokenize(text, special=False))
        store = backend.chunk_store
        assert store is not None and store["chunks"] >= 3 and store["readTokens"] > 0
        taken, total = backend.assembled_prefix(prompt)
        assert taken > total // 2
        tokens = backend.model.tokenize(prompt)
        assert mirror.left(tokens, 0) == total - taken
        request = GenerationRequest(prompt, 8, speculation=SpeculationMethod.NONE, assemble=True)
        generation = await backend.generate(request)
        async for _ in generation:
            pass
        stats = generation.stats
        assert stats.assembled_prompt_tokens == taken
        assert stats.evaluated_prompt_tokens == total - taken
        assert stats.completion_tokens > 0
        assert backend.chunk_store is not None and backend.chunk_store["assembled"] == 1
        # The window is the slot's now: the next keystroke there reuses it as usual.
        assert backend.cached_prefix(prompt)[0] >= total - 2
    finally:
        mirror.model.close()
        await backend.aclose()
