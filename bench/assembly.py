"""What a full window assembled from chunks evaluated alone costs in quality (issue #29's
guard): ``kode bench latency --scenario windows --assembly K,...``.

For every place the full window is evaluated whole, then assembled
(``backends/llama/kv_chunks.py``) with seams of each ``K`` tokens: its chunks are evaluated
alone first, as a reading pause would (not counted: the user was reading), kept in a
``ChunkStore``, restored and shifted into the window. The engine's own generation (its
window, healing, stop rules) then answers from the slot holding the assembled window;
the exact first line and the prompt tokens evaluated for the place are recorded.

``--chunk-lines N``: chunks of N lines counted from the window's first line.
``--chunk-lines 0``: what the engine does (``kv_chunks.Assembler``, ``chunkMemoryMb``):
the three regions of the file nearest the place are read as the background reader reads
them (``completion/reading.py``), chunks starting where the text says so, and the window
is assembled from them, a window's first chunk from the end of a stored one; a chunk not
found is evaluated in place (counted).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kode.backends.llama import kv_chunks
from kode.backends.llama.runtime import Slot
from kode.backends.steppers import drain_steps
from kode.bench import report

# Lines per chunk: llama.vim keeps 64-line chunks; a window of ~1,000 prompt tokens holds
# about 100 lines of Python, so 32 gives a few seams per window.
CHUNK_LINES = 32
STORE_BYTES = 1 << 30


@dataclass(slots=True)
class Assembler:
    """Makes a slot hold a prompt's window assembled with seams of ``k`` tokens (``k``
    None: nothing, so the generation evaluates the whole prompt: full recompute), and
    counts the prompt tokens each window cost."""

    store: kv_chunks.ChunkStore
    chunk_lines: int = CHUNK_LINES
    recompute_lines: int = 0
    k: int | None = None
    evaluated: list[int] = field(default_factory=list)
    total: list[int] = field(default_factory=list)
    text: str = ""  # chunk_lines 0: the file the window is cut from, and the cursor's line
    line: int = 0

    def __call__(self, slot: Slot, tokens: Sequence[int]) -> None:
        slot.truncate(0)
        slot.clear_scratch()
        model = slot.ctx.model
        k, found = self.k, None
        self.total.append(len(tokens))
        if k is not None and not self.chunk_lines:
            self.evaluated.append(self._as_the_engine(slot, tokens, k))
            return
        if k is not None:
            found = kv_chunks.plan(
                tokens,
                model.piece,
                model.tokenize("<|fim_prefix|>")[0],
                model.tokenize("<|fim_suffix|>")[0],
                self.chunk_lines,
                self.recompute_lines,
            )
        if k is None or found is None:
            self.evaluated.append(len(tokens))
            return
        for a, b in found.chunks:  # read before: evaluated while the user read
            if tokens[a:b] not in self.store:
                chunk = kv_chunks.evaluate(slot, tokens[a:b])
                assert chunk is not None
                self.store.add(chunk)
        evaluated = kv_chunks.assemble(slot, tokens, found, self.store, k)
        self.evaluated.append(evaluated + len(tokens) - found.tail)

    def _as_the_engine(self, slot: Slot, tokens: Sequence[int], k: int) -> int:
        from kode.backends.kv_reuse import CHUNK_EVERY
        from kode.completion.reading import regions

        model = slot.ctx.model
        lines = self.text.splitlines(keepends=True)
        for a, b in regions(lines, [self.line])[:3]:  # read while the user read
            region = model.tokenize("".join(lines[a:b]), special=False)
            for x, y in kv_chunks.text_chunks(region, model.piece):
                if region[x:y] not in self.store:
                    chunk = kv_chunks.evaluate(slot, region[x:y])
                    assert chunk is not None
                    self.store.add(chunk)
        pre, suf = model.tokenize("<|fim_prefix|>")[0], model.tokenize("<|fim_suffix|>")[0]
        sep = model.tokenize("<|file_sep|>")[0]
        found = kv_chunks.plan(
            tokens, model.piece, pre, suf, every=CHUNK_EVERY, forced=frozenset({pre, sep})
        )
        if found is None:
            return len(tokens)
        evaluated, _ = kv_chunks.cost(tokens, found, self.store, k)
        drain_steps(kv_chunks.assemble_steps(slot, tokens, found, self.store, k, lambda: False))
        return evaluated + len(tokens) - found.tail


@contextlib.contextmanager
def assembling(assembler: Assembler) -> Iterator[None]:
    """While inside, every prompt a slot evaluates goes through ``assembler`` first."""
    original = Slot.prefill_steps

    def prefill_steps(
        self: Slot, tokens: Sequence[int], abort: Callable[[], bool], max_drift: int = 0
    ) -> Generator[None, None, int]:
        assembler(self, tokens)
        return original(self, tokens, abort, max_drift)

    Slot.prefill_steps = prefill_steps  # type: ignore[method-assign]
    try:
        yield
    finally:
        Slot.prefill_steps = original  # type: ignore[method-assign]


@dataclass(slots=True)
class Scores:
    hits: list[bool] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # the first line written, place by place
    evaluated: list[int] = field(default_factory=list)
    total: list[int] = field(default_factory=list)


async def assembly_quality(
    model: str,
    files: Sequence[Path],
    cases: Sequence[Any],
    ks: Sequence[int],
    chunk_lines: int,
    recompute_lines: int,
    overrides: Sequence[tuple[str, Any]] = (),
) -> tuple[dict[str, Scores], dict[str, int]]:
    """Exact first lines at ``cases`` from the full window evaluated whole and assembled
    with seams of each of ``ks`` tokens, place by place; and the prompt tokens each
    evaluated; what the chunk store held at the end."""
    from kode.backends import models
    from kode.backends.llama.backend import LlamaBackend
    from kode.bench.places import blank
    from kode.completion.documents import Position
    from kode.completion.engine import CompletionEngine
    from kode.completion.settings import parse

    texts = [f.read_text(encoding="utf-8") for f in files]
    backend = await LlamaBackend.load(await asyncio.to_thread(models.resolve, model))
    assembler = Assembler(kv_chunks.ChunkStore(STORE_BYTES), chunk_lines, recompute_lines)
    settings, problems = parse(
        {
            "model": model,
            "prefixTokens": 1024,
            "suffixTokens": 64,
            "snippetTokens": 0,
            "firstAnswerMs": 0,
            "readAhead": False,
            "maxTokens": 48,
            "multiline": "never",  # only the first line is scored
            "speculation": "none",  # plain decoding: the same text, sooner
            **dict(overrides),
        }
    )
    assert not problems, problems

    async def factory(_settings: object) -> LlamaBackend:
        return backend

    again = f", last {recompute_lines} lines evaluated" if recompute_lines else ""
    conditions: list[tuple[str, int | None]] = [("full, evaluated whole", None)]
    kind = f"{chunk_lines}-line chunks" if chunk_lines else "the engine's chunks"
    conditions += [(f"assembled, {kind}, k={k}{again}", k) for k in ks]
    rows = {label: Scores() for label, _ in conditions}
    # One engine a condition: an engine answers a place it answered before from its cache.
    engines = [CompletionEngine(factory, settings) for _ in conditions]
    bar = report.progress(len(cases) * len(conditions), "assembled windows")
    try:
        with assembling(assembler):
            for case in cases:
                uri = files[case.file].resolve().as_uri()
                for (label, k), engine in zip(conditions, engines, strict=True):
                    assembler.k = k
                    assembler.text = blank(texts[case.file], [case], case.file)
                    assembler.line = case.line
                    assembler.evaluated.clear()
                    assembler.total.clear()
                    engine.documents.open(uri, blank(texts[case.file], [case], case.file), 1)
                    result = await engine.complete(uri, Position(case.line, case.indent))
                    engine.close_document(uri)  # every condition from the same window
                    first = result.text.split("\n", 1)[0].rstrip()
                    row = rows[label]
                    row.hits.append(first == case.body)
                    row.lines.append(first)
                    row.evaluated.append(sum(assembler.evaluated))
                    row.total.append(sum(assembler.total))
                    bar.update(1)
    finally:
        bar.close()
        for engine in engines:
            await engine.aclose()
        await backend.aclose()
    return rows, assembler.store.as_dict()


def table_rows(rows: dict[str, Scores]) -> list[list[object]]:
    """window | exact line | prompt tokens evaluated per place | share of the prompt"""
    out: list[list[object]] = []
    for label, row in rows.items():
        n = max(1, len(row.hits))
        evaluated, total = sum(row.evaluated), max(1, sum(row.total))
        out.append(
            [
                label,
                f"{sum(row.hits)}/{len(row.hits)}",
                f"{evaluated / n:.0f}",
                f"{100 * evaluated / total:.0f}%",
            ]
        )
    return out
