"""What a full window assembled from separately evaluated chunks would cost in quality
(issue #29's guard), measured before anything is built on it.

Kode could keep the KV entries of a file's line-aligned chunks, evaluated while the user
reads, and assemble a place's full window from them (EPIC, CacheBlend, llama-server's
``--cache-reuse``): each chunk's entries shifted to their place, the first ``k`` tokens
of each chunk evaluated again inside the whole window (the seams), and the lines at the
cursor evaluated as usual. A chunk's entries never saw the chunks before it: that is the
approximation measured here.

``Assembler`` builds exactly those entries in a live slot. It evaluates each chunk alone,
in a scratch sequence, at the chunk's place in the window: with rotary positions,
attention inside a chunk depends only on distances, so these are the entries a chunk
evaluated alone at position 0 and then shifted (``llama_memory_seq_add``) would have,
without a shift's rounding. Then the engine's own generation (its window, healing, stop
rules) answers from the assembled window: the slot holds it as an evaluated prefix. The
chunks' entries are kept in the context's second slot between the conditions of one
place, so trying several ``k`` evaluates the chunks once.

Chunks are counted from the window's first line (a real chunk store would align them to
the file's lines, so a window's first chunk would be a later part of a stored one).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
from kode.backends.llama.runtime import LlamaContext, Row, Slot
from kode.bench import report

# Lines per chunk: llama.vim keeps 64-line chunks; a window of ~1,000 prompt tokens holds
# about 100 lines of Python, so 32 gives a few seams per window.
CHUNK_LINES = 32


@dataclass(frozen=True, slots=True)
class Plan:
    """Where a prompt's parts are, as token indices: ``[0, header)`` is evaluated whole
    (the template's head, the same for every place of a file), ``chunks`` are evaluated
    alone, ``[tail, end)`` (the cursor's line, the suffix) is evaluated as usual."""

    header: int
    chunks: tuple[tuple[int, int], ...]
    tail: int


def plan(
    tokens: Sequence[int],
    piece: Callable[[int], bytes],
    prefix_token: int,
    suffix_token: int,
    chunk_lines: int,
    recompute_lines: int = 0,
) -> Plan | None:
    """Split a PSM prompt: the prefix's whole lines before the cursor's line (less
    ``recompute_lines`` more) in chunks of ``chunk_lines`` lines; None if the prompt has
    no ``<|fim_prefix|>...<|fim_suffix|>``.

    >>> text = {1: b"a\\n", 2: b"b", 3: b"\\n"}
    >>> plan([9, 7, 1, 1, 2, 3, 2, 8, 5], text.get, 7, 8, chunk_lines=2)
    Plan(header=2, chunks=((2, 4), (4, 6)), tail=6)
    >>> plan([9, 7, 1, 1, 2, 3, 2, 8, 5], text.get, 7, 8, 2, recompute_lines=1)
    Plan(header=2, chunks=((2, 4),), tail=4)
    """
    try:
        start = list(tokens).index(prefix_token) + 1
        end = list(tokens).index(suffix_token, start)
    except ValueError:
        return None
    starts = [start] + [i + 1 for i in range(start, end - 1) if b"\n" in piece(tokens[i])]
    cut = max(0, len(starts) - 1 - recompute_lines)
    tail = starts[cut]
    bounds = [starts[i] for i in range(0, cut, chunk_lines)] + [tail]
    chunks = tuple((a, b) for a, b in itertools.pairwise(bounds) if b > a)
    return Plan(start, chunks, tail)


def _evaluate(ctx: LlamaContext, seq: int, tokens: Sequence[int], a: int, b: int) -> None:
    """Evaluate ``tokens[a:b]`` at their positions in sequence ``seq`` (context id)."""
    for p in range(a, b, ctx.n_batch):
        q = min(b, p + ctx.n_batch)
        ctx.decode([Row(tokens[i], i, (seq,)) for i in range(p, q)])


@dataclass(slots=True)
class Assembler:
    """Makes a slot hold a prompt's window assembled with seams of ``k`` tokens (``k``
    None: nothing, so the generation evaluates the whole prompt: full recompute), and
    counts the prompt tokens each window cost."""

    store: int  # context id of the sequence that keeps the chunks' entries
    chunk_lines: int = CHUNK_LINES
    recompute_lines: int = 0
    k: int | None = None
    evaluated: list[int] = field(default_factory=list)
    total: list[int] = field(default_factory=list)
    _key: tuple[int, ...] | None = None

    def __call__(self, slot: Slot, tokens: Sequence[int]) -> None:
        ctx, mem = slot.ctx, slot.ctx.mem
        slot.truncate(0)
        slot.clear_scratch()
        model = ctx.model
        found = None
        if self.k is not None:
            found = plan(
                tokens,
                model.piece,
                model.tokenize("<|fim_prefix|>")[0],
                model.tokenize("<|fim_suffix|>")[0],
                self.chunk_lines,
                self.recompute_lines,
            )
        self.total.append(len(tokens))
        if found is None:
            self.evaluated.append(len(tokens))
            return
        own, scratch = slot.seq(0), slot.seq(1)
        key = (self.chunk_lines, *tokens[: found.tail])
        if key != self._key:
            llama_cpp.llama_memory_seq_rm(mem, self.store, -1, -1)
            for a, b in found.chunks:
                llama_cpp.llama_memory_seq_rm(mem, scratch, -1, -1)
                _evaluate(ctx, scratch, tokens, a, b)
                llama_cpp.llama_memory_seq_cp(mem, scratch, self.store, a, b)
            llama_cpp.llama_memory_seq_rm(mem, scratch, -1, -1)
            self._key = key
        _evaluate(ctx, own, tokens, 0, found.header)
        evaluated = found.header
        for a, b in found.chunks:
            seam = min(self.k or 0, b - a)
            llama_cpp.llama_memory_seq_cp(mem, self.store, own, a + seam, b)
            if seam:
                # A sequence's new positions must follow its last one: the seam is
                # evaluated in the scratch sequence holding the window up to the chunk.
                llama_cpp.llama_memory_seq_cp(mem, own, scratch, 0, a)
                _evaluate(ctx, scratch, tokens, a, a + seam)
                llama_cpp.llama_memory_seq_cp(mem, scratch, own, a, a + seam)
                llama_cpp.llama_memory_seq_rm(mem, scratch, -1, -1)
                evaluated += seam
        slot.tokens = list(tokens[: found.tail])
        slot.prompt_len = 0  # nothing to move: the generation evaluates the tail
        self.evaluated.append(evaluated + len(tokens) - found.tail)


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
) -> dict[str, Scores]:
    """Exact first lines at ``cases`` from the full window evaluated whole and assembled
    with seams of each of ``ks`` tokens, place by place (the chunks evaluated once per
    place); and the prompt tokens each evaluated."""
    from kode.backends import models
    from kode.backends.llama.backend import LlamaBackend
    from kode.bench.places import blank
    from kode.completion.documents import Position
    from kode.completion.engine import CompletionEngine
    from kode.completion.settings import parse

    texts = [f.read_text(encoding="utf-8") for f in files]
    backend = await LlamaBackend.load(await asyncio.to_thread(models.resolve, model), n_slots=2)
    ctx = backend.engine.ctx
    store = ctx.slots[1]
    store.busy = True  # never claimed: its sequence keeps the chunks
    assembler = Assembler(store.seq(0), chunk_lines, recompute_lines)
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
            "speculation": "none",  # scratch sequences stay the assembler's
            **dict(overrides),
        }
    )
    assert not problems, problems

    async def factory(_settings: object) -> LlamaBackend:
        return backend

    again = f", last {recompute_lines} lines evaluated" if recompute_lines else ""
    conditions: list[tuple[str, int | None]] = [("full, evaluated whole", None)]
    conditions += [(f"assembled, {chunk_lines}-line chunks, k={k}{again}", k) for k in ks]
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
                    assembler.evaluated.clear()
                    assembler.total.clear()
                    engine.documents.open(uri, blank(texts[case.file], [case], case.file), 1)
                    result = await engine.complete(uri, Position(case.line, case.indent))
                    engine.documents.close(uri)
                    engine.document_closed(uri)  # every condition from the same window
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
    return rows


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
