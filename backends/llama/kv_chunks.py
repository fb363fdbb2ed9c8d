"""A window assembled from chunks evaluated alone (issue #29: full context at every place).

Most of what a place's full window holds was read before, at other positions. A chunk
of whole lines evaluated alone at position 0 keeps its KV entries in host memory
(``ChunkStore``); a window is then assembled from them (``assemble``): each chunk's
entries restored into a scratch sequence, shifted to the chunk's place in the window
(``llama_memory_seq_add``; llama.cpp rotates the keys again) and shared with the slot's
own sequence, except its first ``k`` tokens (the seam), which are evaluated again inside
the window, so that they see what precedes them (EPIC's recomputation of each chunk's
first tokens). The template's head and the lines at the cursor are evaluated as usual.

Measured (``kode bench latency --scenario windows --assembly``, 1.5B, 32-line chunks):
seams of 32 tokens scored the exact first lines of the window evaluated whole, 20/40
on ``argparse.py`` and ``tarfile.py`` and 9/40 held out on ``pydoc.py`` and
``doctest.py``, evaluating 19-20% of its tokens; no seams scored 18/40 and 8/40 at 8%.
A chunk restored and shifted gives next-token logits within 0.33 of the chunk evaluated
at its place (0.5B), what evaluating the same tokens at other absolute positions gives
anyway.

Chunk entries are exact for the chunk alone and approximate in a window (they did not
see the chunks before them). A slot holding an assembled window keeps them as its
window's entries: the next keystrokes there reuse them as they would evaluated ones.
"""

from __future__ import annotations

import ctypes
import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import llama_cpp
from kode.backends.errors import BackendError, ContextOverflow
from kode.backends.llama.runtime import LlamaContext, Row, Slot


@dataclass(frozen=True, slots=True)
class Plan:
    """Where a prompt's parts are, as token indices: ``[0, header)`` is evaluated whole
    (the template's head, the same for every place of a file), ``chunks`` come from the
    store, ``[tail, end)`` (the cursor's line, the suffix) is evaluated as usual."""

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
    ``recompute_lines`` more) in chunks of ``chunk_lines`` lines from the prefix's
    first line; None if the prompt has no ``<|fim_prefix|>...<|fim_suffix|>``.

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


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk's KV entries, evaluated alone at positions ``0..len(tokens) - 1``."""

    tokens: tuple[int, ...]
    data: ctypes.Array[ctypes.c_uint8]

    @property
    def nbytes(self) -> int:
        return len(self.data)


class ChunkStore:
    """Evaluated chunks by their tokens, least recently used dropped first, within
    ``budget`` bytes (the 1.5B's entries take 28 KB a token, about 290 MB for 1,000
    lines of Python; the 0.5B's 12 KB)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._chunks: OrderedDict[tuple[int, ...], Chunk] = OrderedDict()
        self.used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._chunks)

    def __contains__(self, tokens: Sequence[int]) -> bool:
        return tuple(tokens) in self._chunks

    def get(self, tokens: Sequence[int]) -> Chunk | None:
        chunk = self._chunks.get(tuple(tokens))
        if chunk is None:
            self.misses += 1
            return None
        self.hits += 1
        self._chunks.move_to_end(chunk.tokens)
        return chunk

    def add(self, chunk: Chunk) -> None:
        """Keep ``chunk`` (not if it alone exceeds the budget)."""
        if chunk.nbytes > self.budget:
            return
        old = self._chunks.pop(chunk.tokens, None)
        if old is not None:
            self.used -= old.nbytes
        self._chunks[chunk.tokens] = chunk
        self.used += chunk.nbytes
        while self.used > self.budget:
            _, dropped = self._chunks.popitem(last=False)
            self.used -= dropped.nbytes
            self.evictions += 1

    def as_dict(self) -> dict[str, int]:
        return {
            "chunks": len(self._chunks),
            "bytes": self.used,
            "budgetBytes": self.budget,
            "tokens": sum(len(t) for t in self._chunks),
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
        }


def _evaluate(ctx: LlamaContext, seq: int, tokens: Sequence[int], a: int, b: int) -> None:
    """Evaluate ``tokens[a:b]`` at their positions in sequence ``seq`` (a context id)."""
    for p in range(a, b, ctx.n_batch):
        q = min(b, p + ctx.n_batch)
        ctx.decode([Row(tokens[i], i, (seq,)) for i in range(p, q)])


def evaluate(slot: Slot, tokens: Sequence[int]) -> Chunk | None:
    """``tokens`` evaluated alone at position 0 in the slot's scratch sequence 1, their
    entries copied out (None if llama.cpp could not). The slot's own sequence is not
    touched; call between its generations."""
    ctx, seq = slot.ctx, slot.seq(1)
    llama_cpp.llama_memory_seq_rm(ctx.mem, seq, -1, -1)
    try:
        _evaluate(ctx, seq, tokens, 0, len(tokens))
        size = llama_cpp.llama_state_seq_get_size(ctx.ctx, seq)
        data = (ctypes.c_uint8 * size)()
        if size <= 0 or llama_cpp.llama_state_seq_get_data(ctx.ctx, data, size, seq) != size:
            return None
    finally:
        llama_cpp.llama_memory_seq_rm(ctx.mem, seq, -1, -1)
    return Chunk(tuple(tokens), data)


def assemble(slot: Slot, tokens: Sequence[int], found: Plan, store: ChunkStore, k: int) -> int:
    """Make ``slot`` hold ``tokens[:found.tail]``: the head evaluated, every chunk from
    ``store`` (evaluated now if it is not there), its first ``k`` tokens evaluated again
    in place. Returns the prompt tokens evaluated for the window; the generation then
    evaluates ``tokens[found.tail:]`` as usual."""
    ctx, mem = slot.ctx, slot.ctx.mem
    own, scratch = slot.seq(0), slot.seq(1)
    slot.truncate(0)
    slot.clear_scratch()
    evaluated = found.header
    chunks = []
    for a, b in found.chunks:
        chunk = store.get(tokens[a:b])
        if chunk is None:
            chunk = evaluate(slot, tokens[a:b])
            if chunk is None:
                raise BackendError("llama.cpp could not copy a chunk's KV entries")
            store.add(chunk)
            evaluated += b - a
        chunks.append(chunk)
    try:
        _evaluate(ctx, own, tokens, 0, found.header)
        for (a, b), chunk in zip(found.chunks, chunks, strict=True):
            seam = min(k, b - a)
            if seam < b - a:
                if not llama_cpp.llama_state_seq_set_data(
                    ctx.ctx, chunk.data, chunk.nbytes, scratch
                ):
                    raise ContextOverflow("no room in the KV cache for a chunk")
                llama_cpp.llama_memory_seq_add(mem, scratch, 0, -1, a)
                llama_cpp.llama_memory_seq_cp(mem, scratch, own, a + seam, b)
                llama_cpp.llama_memory_seq_rm(mem, scratch, -1, -1)
            if seam:
                # A sequence's new positions must follow its last one: the seam is
                # evaluated in the scratch sequence holding the window up to the chunk.
                llama_cpp.llama_memory_seq_cp(mem, own, scratch, 0, a)
                _evaluate(ctx, scratch, tokens, a, a + seam)
                llama_cpp.llama_memory_seq_cp(mem, scratch, own, a, a + seam)
                llama_cpp.llama_memory_seq_rm(mem, scratch, -1, -1)
                evaluated += seam
    except BaseException:
        slot.truncate(0)  # hold nothing rather than half a window
        slot.clear_scratch()
        raise
    slot.tokens = list(tokens[: found.tail])
    slot.prompt_len = 0  # nothing to move: the generation evaluates the tail
    return evaluated
