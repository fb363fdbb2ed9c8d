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
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

import llama_cpp
from kode.backends.errors import BackendError, ContextOverflow, PrefillAborted
from kode.backends.kv_reuse import CHUNK_EVERY, CHUNK_SEAM, chunk_boundary
from kode.backends.llama.runtime import LlamaContext, LlamaModel, Row, Slot
from kode.backends.steppers import drain_steps, never


@dataclass(frozen=True, slots=True)
class Plan:
    """Where a prompt's parts are, as token indices: ``[0, header)`` is evaluated whole
    (the template's head, the same for every place of a file), ``chunks`` come from the
    store, ``[tail, end)`` (the cursor's line, the suffix) is evaluated as usual."""

    header: int
    chunks: tuple[tuple[int, int], ...]
    tail: int


def line_starts(tokens: Sequence[int], piece: Callable[[int], bytes], a: int, b: int) -> list[int]:
    """``a`` and every index in ``(a, b)`` that follows a token holding a newline."""
    return [a] + [i + 1 for i in range(a, b - 1) if b"\n" in piece(tokens[i])]


def line_text(tokens: Sequence[int], piece: Callable[[int], bytes], i: int, end: int) -> str:
    """The text of the line starting at token ``i`` (up to its newline, before ``end``)."""
    out = bytearray()
    for j in range(i, end):
        bit = piece(tokens[j])
        out += bit
        if b"\n" in bit:
            break
    return out.split(b"\n", 1)[0].decode("utf-8", "replace")


def plan(
    tokens: Sequence[int],
    piece: Callable[[int], bytes],
    prefix_token: int,
    suffix_token: int,
    chunk_lines: int = 0,
    recompute_lines: int = 0,
    *,
    every: int = 0,
    forced: frozenset[int] = frozenset(),
) -> Plan | None:
    """Split a PSM prompt: the whole lines before the cursor's line (less
    ``recompute_lines`` more) in chunks; None if the prompt has no
    ``<|fim_prefix|>...<|fim_suffix|>``.

    ``chunk_lines``: chunks of that many lines from the prefix's first line (the
    benchmark's fixed chunks). ``every``: chunks that start where the text says so
    (``kv_reuse.chunk_boundary``), over the whole prompt after its first line (the
    repository's name): other files' snippets and the prefix; a line that starts with a
    token of ``forced`` (``<|file_sep|>``, ``<|fim_prefix|>``) starts a chunk too.

    >>> text = {1: b"a\\n", 2: b"b", 3: b"\\n"}
    >>> plan([9, 7, 1, 1, 2, 3, 2, 8, 5], text.get, 7, 8, chunk_lines=2)
    Plan(header=2, chunks=((2, 4), (4, 6)), tail=6)
    >>> plan([9, 7, 1, 1, 2, 3, 2, 8, 5], text.get, 7, 8, 2, recompute_lines=1)
    Plan(header=2, chunks=((2, 4),), tail=4)
    >>> text = {1: b"x\\n", 2: b"import sys\\n", 6: b"r\\n", 3: b"b", 7: b"", 8: b""}
    >>> plan([6, 7, 1, 2, 1, 1, 2, 1, 3, 8, 5], text.get, 7, 8, every=4, forced={7})
    Plan(header=1, chunks=((1, 3), (3, 6), (6, 8)), tail=8)
    """
    try:
        start = list(tokens).index(prefix_token) + 1
        end = list(tokens).index(suffix_token, start)
    except ValueError:
        return None
    if every <= 0:
        starts = line_starts(tokens, piece, start, end)
        cut = max(0, len(starts) - 1 - recompute_lines)
        tail = starts[cut]
        bounds = [starts[i] for i in range(0, cut, chunk_lines)] + [tail]
        chunks = tuple((a, b) for a, b in itertools.pairwise(bounds) if b > a)
        return Plan(start, chunks, tail)
    first = next((i + 1 for i in range(start - 1) if b"\n" in piece(tokens[i])), start - 1)
    starts = line_starts(tokens, piece, first, end)
    cut = max(0, len(starts) - 1 - recompute_lines)
    tail = starts[cut]
    bounds = [first]
    for i in starts[1:cut]:
        if tokens[i] in forced or chunk_boundary(line_text(tokens, piece, i, end), every):
            bounds.append(i)
    bounds.append(tail)
    chunks = tuple((a, b) for a, b in itertools.pairwise(bounds) if b > a)
    return Plan(first, chunks, tail)


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
    ``budget`` bytes (the 1.5B's entries take 28 KB a token, about 240 MB for 1,000
    lines of the standard library; the 0.5B's 12 KB, about 100 MB). ``find`` also finds
    a chunk that ends with the tokens asked for: the first chunk of a window, which
    starts wherever the window does, is the end of a chunk read whole."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._chunks: OrderedDict[tuple[int, ...], Chunk] = OrderedDict()
        self._ends: dict[tuple[int, ...], set[tuple[int, ...]]] = {}  # last tokens -> keys
        self._starts: dict[tuple[int, ...], set[tuple[int, ...]]] = {}  # first tokens -> keys
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

    def find(
        self, tokens: Sequence[int], skip: int, *, count: bool = True
    ) -> tuple[Chunk, int] | None:
        """A chunk holding ``tokens[skip:]``, and where in it they start: ``tokens``
        itself; else a chunk ending with ``tokens[skip:]`` (a window's first chunk
        starts inside a stored one); else a chunk starting with ``tokens`` (a window's
        last chunk ends at the cursor's line, inside a stored one: the entries of a
        chunk's first tokens are those of those tokens alone). None if there is none
        (fewer than ``_END`` tokens are not looked for: cheaper evaluated than restored).
        ``count=False`` only looks (another thread may ask while this one works)."""
        want = tuple(tokens)
        rest = want[skip:]
        if not rest:
            return None
        chunk, at = self._chunks.get(want), skip
        if chunk is None and len(rest) >= _END:
            for key in list(self._ends.get(rest[-_END:], ())):
                if len(key) >= len(rest) and key[len(key) - len(rest) :] == rest:
                    chunk, at = self._chunks.get(key), len(key) - len(rest)
                    break
        if chunk is None and len(rest) >= _END:
            for key in list(self._starts.get(want[:_END], ())):
                if len(key) > len(want) and key[: len(want)] == want:
                    chunk, at = self._chunks.get(key), skip
                    break
        if count:
            if chunk is None:
                self.misses += 1
            else:
                self.hits += 1
                self._chunks.move_to_end(chunk.tokens)
        if chunk is None:
            return None
        return chunk, at

    def add(self, chunk: Chunk) -> None:
        """Keep ``chunk`` (not if it alone exceeds the budget)."""
        if chunk.nbytes > self.budget:
            return
        self._drop(chunk.tokens)
        self._chunks[chunk.tokens] = chunk
        self._ends.setdefault(chunk.tokens[-_END:], set()).add(chunk.tokens)
        self._starts.setdefault(chunk.tokens[:_END], set()).add(chunk.tokens)
        self.used += chunk.nbytes
        while self.used > self.budget:
            self._drop(next(iter(self._chunks)))
            self.evictions += 1

    def _drop(self, key: tuple[int, ...]) -> None:
        old = self._chunks.pop(key, None)
        if old is None:
            return
        self.used -= old.nbytes
        for index, part in ((self._ends, key[-_END:]), (self._starts, key[:_END])):
            keys = index.get(part)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[part]

    def as_dict(self) -> dict[str, int]:
        return {
            "chunks": len(self._chunks),
            "bytes": self.used,
            "budgetBytes": self.budget,
            "tokens": sum(len(t) for t in list(self._chunks)),
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
        }


# ``ChunkStore.find`` looks a chunk's end up by this many last tokens.
_END = 4


def _evaluate(
    ctx: LlamaContext,
    seq: int,
    tokens: Sequence[int],
    a: int,
    b: int,
    abort: Callable[[], bool] = never,
) -> Generator[None, None, None]:
    """Evaluate ``tokens[a:b]`` at their positions in sequence ``seq`` (a context id),
    pausing between batches, which are micro-batches while another slot generates (it
    steps there), as a prompt's are. ``abort()`` turning true stops a batch midway
    (llama.cpp's abort callback) and raises ``PrefillAborted``."""
    p = a
    while p < b:
        if p > a:
            yield
        if abort():
            raise PrefillAborted(0)
        q = min(b, p + (ctx.n_batch if ctx.busy <= 1 else ctx.n_ubatch))
        try:
            ctx.decode([Row(tokens[i], i, (seq,)) for i in range(p, q)], abort)
        except BackendError:
            if abort():
                raise PrefillAborted(0) from None
            raise
        p = q


def evaluate(slot: Slot, tokens: Sequence[int]) -> Chunk | None:
    """``evaluate_steps`` in one go."""
    return drain_steps(evaluate_steps(slot, tokens, never))


def evaluate_steps(
    slot: Slot, tokens: Sequence[int], abort: Callable[[], bool]
) -> Generator[None, None, Chunk | None]:
    """``tokens`` evaluated alone at position 0 in the slot's scratch sequence 1, their
    entries copied out (None if llama.cpp could not). The slot's own sequence is not
    touched; call between its generations."""
    ctx, seq = slot.ctx, slot.seq(1)
    llama_cpp.llama_memory_seq_rm(ctx.mem, seq, -1, -1)
    try:
        yield from _evaluate(ctx, seq, tokens, 0, len(tokens), abort)
        size = llama_cpp.llama_state_seq_get_size(ctx.ctx, seq)
        data = (ctypes.c_uint8 * size)()
        if size <= 0 or llama_cpp.llama_state_seq_get_data(ctx.ctx, data, size, seq) != size:
            return None
    finally:
        llama_cpp.llama_memory_seq_rm(ctx.mem, seq, -1, -1)
    return Chunk(tuple(tokens), data)


def text_chunks(
    tokens: Sequence[int], piece: Callable[[int], bytes], every: int = CHUNK_EVERY
) -> list[tuple[int, int]]:
    """A text's chunks (its first line starting one, its end ending one).

    >>> text_chunks([1, 2, 1, 2, 1], {1: b"x\\n", 2: b"import sys\\n"}.get, every=4)
    [(0, 1), (1, 3), (3, 5)]
    """
    starts = line_starts(tokens, piece, 0, len(tokens))
    bounds = [0]
    bounds += [
        i for i in starts[1:] if chunk_boundary(line_text(tokens, piece, i, len(tokens)), every)
    ]
    bounds.append(len(tokens))
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def read_steps(
    slot: Slot,
    tokens: Sequence[int],
    piece: Callable[[int], bytes],
    store: ChunkStore,
    abort: Callable[[], bool],
    every: int = CHUNK_EVERY,
) -> Generator[None, None, int]:
    """Read a text (``tokens``, its first line starting a chunk, its end ending one) into
    ``store``: each chunk that is not there evaluated alone, pausing between chunks (a
    generation in another slot steps there); returns the tokens evaluated. Stops early,
    keeping what it read, once ``abort()`` turns true. The slot's own sequence is not
    touched."""
    evaluated = 0
    for a, b in text_chunks(tokens, piece, every):
        if tokens[a:b] in store:
            continue
        if evaluated:
            yield
        try:
            chunk = yield from evaluate_steps(slot, tokens[a:b], abort)
        except PrefillAborted:
            break
        if chunk is None:
            raise BackendError("llama.cpp could not copy a chunk's KV entries")
        store.add(chunk)
        evaluated += b - a
    return evaluated


def cost(
    tokens: Sequence[int], found: Plan, store: ChunkStore, k: int, held: int = 0
) -> tuple[int, int]:
    """What assembling ``tokens[:found.tail]`` from ``store`` evaluates, beside the
    ``held`` leading tokens the slot holds already, and how many chunks it takes from the
    store: the head, each stored chunk's first ``k`` tokens, every chunk not stored."""
    evaluated, taken = max(0, found.header - held), 0
    for a, b in found.chunks:
        if b <= held:
            continue
        if store.find(tokens[a:b], min(k, b - a), count=False) is None:
            evaluated += b - a
        else:
            evaluated += min(k, b - a)
            taken += 1
    return evaluated, taken


def assemble_steps(
    slot: Slot,
    tokens: Sequence[int],
    found: Plan,
    store: ChunkStore,
    k: int,
    abort: Callable[[], bool],
    held: int = 0,
) -> Generator[None, None, int]:
    """Make ``slot`` hold ``tokens[:found.tail]``, keeping the chunks within its first
    ``held`` tokens (which it holds exactly): the head evaluated, every other chunk from
    ``store`` with its first ``k`` tokens evaluated again in place, or evaluated in
    place if it is not there. A generator that pauses between chunks and returns the
    tokens not evaluated; the generation then evaluates ``tokens[found.tail:]`` as
    usual. On ``abort()`` it keeps the chunks done and raises ``PrefillAborted``."""
    ctx, mem = slot.ctx, slot.ctx.mem
    own, scratch = slot.seq(0), slot.seq(1)
    keep = (
        held
        if held < found.header
        else max([found.header] + [b for _, b in found.chunks if b <= held])
    )
    slot.truncate(keep)
    slot.clear_scratch()
    taken = keep
    done = keep
    try:
        if keep < found.header:
            yield from _evaluate(ctx, own, tokens, keep, found.header, abort)
            done = found.header
        for a, b in found.chunks:
            if b <= keep:
                continue
            yield
            if abort():
                raise PrefillAborted(taken)
            seam = min(k, b - a)
            hit = store.find(tokens[a:b], seam)
            if hit is None:
                seam = b - a
            else:
                chunk, at = hit
                if not llama_cpp.llama_state_seq_set_data(
                    ctx.ctx, chunk.data, chunk.nbytes, scratch
                ):
                    raise ContextOverflow("no room in the KV cache for a chunk")
                llama_cpp.llama_memory_seq_add(mem, scratch, 0, -1, a + seam - at)
                llama_cpp.llama_memory_seq_cp(mem, scratch, own, a + seam, b)
                llama_cpp.llama_memory_seq_rm(mem, scratch, -1, -1)
            # A sequence's new positions must follow its last one: the seam is
            # evaluated in the scratch sequence holding the window up to the chunk.
            llama_cpp.llama_memory_seq_cp(mem, own, scratch, 0, a)
            yield from _evaluate(ctx, scratch, tokens, a, a + seam, abort)
            llama_cpp.llama_memory_seq_cp(mem, scratch, own, a, a + seam)
            llama_cpp.llama_memory_seq_rm(mem, scratch, -1, -1)
            done, taken = b, taken + b - a - seam
    except PrefillAborted:
        _keep_done(slot, tokens, done)
        raise PrefillAborted(taken) from None
    except BaseException:
        _keep_done(slot, tokens, done)
        raise
    slot.tokens = list(tokens[: found.tail])
    slot.prompt_len = 0  # nothing to move: the generation evaluates the tail
    slot.stale_from, slot.drift = None, 0
    return taken


def _keep_done(slot: Slot, tokens: Sequence[int], done: int) -> None:
    """After a failure or a cancel: keep only what is whole, the chunks done."""
    mem, own = slot.ctx.mem, slot.seq(0)
    llama_cpp.llama_memory_seq_rm(mem, own, done, -1)
    slot.clear_scratch()
    slot.tokens = list(tokens[:done])
    slot.prompt_len = 0
    slot.stale_from, slot.drift = None, 0


def assemble(slot: Slot, tokens: Sequence[int], found: Plan, store: ChunkStore, k: int) -> int:
    """``assemble_steps`` in one go, reading every chunk that is not stored first (the
    benchmark's assembly); returns the prompt tokens evaluated for the window."""
    evaluated = found.header
    for a, b in found.chunks:
        if tokens[a:b] not in store:
            chunk = evaluate(slot, tokens[a:b])
            if chunk is None:
                raise BackendError("llama.cpp could not copy a chunk's KV entries")
            store.add(chunk)
            evaluated += b - a
    seams = sum(min(k, b - a) for a, b in found.chunks)
    drain_steps(assemble_steps(slot, tokens, found, store, k, lambda: False))
    return evaluated + seams


class Assembler:
    """One engine's chunk store and its rule: a prompt whose window the slot does not
    hold is assembled from stored chunks when that evaluates at least ``MIN_GAIN``
    fewer tokens than evaluating it (``prefill_steps``), and a text is read into the
    store in the background (``read_steps``). The model's own FIM markers split the
    prompt (none: no assembly)."""

    def __init__(
        self, model: LlamaModel, budget: int, *, k: int = CHUNK_SEAM, every: int = CHUNK_EVERY
    ) -> None:
        self.model, self.k, self.every = model, k, every
        self.store = ChunkStore(budget)
        vocab = model.vocab
        self.prefix_token = int(llama_cpp.llama_vocab_fim_pre(vocab))
        self.suffix_token = int(llama_cpp.llama_vocab_fim_suf(vocab))
        sep = int(llama_cpp.llama_vocab_fim_sep(vocab))
        self.forced = frozenset(t for t in (self.prefix_token, sep) if t >= 0)
        self.assembled = 0  # prompts assembled
        self.read_tokens = 0  # tokens read into the store

    @property
    def usable(self) -> bool:
        return self.prefix_token >= 0 and self.suffix_token >= 0 and self.store.budget > 0

    def plan(self, tokens: Sequence[int]) -> Plan | None:
        if not self.usable:
            return None
        return plan(
            tokens,
            self.model.piece,
            self.prefix_token,
            self.suffix_token,
            every=self.every,
            forced=self.forced,
        )

    def left(self, tokens: Sequence[int], held: int) -> int | None:
        """Prompt tokens an assembled window still evaluates, the slot holding ``held``
        of them; None where assembling would not take a chunk from the store. Safe to
        call from another thread while the engine works (it only looks)."""
        found = self.plan(tokens)
        if found is None or held >= found.tail:
            return None
        try:
            evaluated, taken = cost(tokens, found, self.store, self.k, held)
        except RuntimeError:  # the store changed under this look
            return None
        return evaluated + len(tokens) - found.tail if taken else None

    def prefill_steps(
        self, slot: Slot, tokens: Sequence[int], held: int, abort: Callable[[], bool]
    ) -> Generator[None, None, int]:
        """Assemble the window of ``tokens`` in ``slot`` (which holds ``held`` of them
        exactly) if that pays; returns the prompt tokens taken without evaluation
        (0: nothing was done, the slot is as it was)."""
        found = self.plan(tokens)
        if found is None or held >= found.tail:
            return 0
        evaluated, taken = cost(tokens, found, self.store, self.k, held)
        if not taken or evaluated > found.tail - held - MIN_GAIN:
            return 0
        kept = yield from assemble_steps(slot, tokens, found, self.store, self.k, abort, held)
        self.assembled += 1
        return kept

    def read_steps(
        self, slot: Slot, tokens: Sequence[int], abort: Callable[[], bool]
    ) -> Generator[None, None, int]:
        read = yield from read_steps(slot, tokens, self.model.piece, self.store, abort, self.every)
        self.read_tokens += read
        return read

    def note_read(self, tokens: Sequence[int]) -> None:
        """A text was read into the store this one mirrors (a window's picture of the
        shared engine's store: chunks without their entries)."""
        for a, b in text_chunks(tokens, self.model.piece, self.every):
            self.store.add(Chunk(tuple(tokens[a:b]), (ctypes.c_uint8 * 0)()))

    def as_dict(self) -> dict[str, int]:
        return {**self.store.as_dict(), "assembled": self.assembled, "readTokens": self.read_tokens}


# Assembly must save at least this many evaluated tokens (restoring chunks costs a little).
MIN_GAIN = 32
