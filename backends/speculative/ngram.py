"""Prompt-lookup drafting: guess what follows by finding the latest tokens earlier on.

Code repeats itself: an identifier, a call pattern or a whole line written above (or in the
suffix after the cursor, or in another open file) is often what comes next. Matching the
last ``n`` tokens against earlier text and proposing what followed there costs no model at
all; the target verifies the guess in one batch (see ``tree.py``).

Every indexed sequence keeps a hash index ``n-gram -> start positions`` for each ``n`` in
``[min_n, max_n]``, so a lookup costs ``max_n - min_n + 1`` dict probes plus the slices of
the continuations it returns, independent of the context length. The context is indexed
incrementally: a call that only appends tokens indexes just the new ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kode.backends.kv_reuse import common_prefix

# n-gram (a tuple of n tokens) -> start positions of its occurrences, increasing
NgramIndex = dict[tuple[int, ...], list[int]]


def index_ngrams(
    index: NgramIndex, tokens: Sequence[int], start: int, min_n: int, max_n: int
) -> None:
    """Add to ``index`` every n-gram of ``tokens`` (``min_n <= n <= max_n``) that ends at or
    after position ``start``; positions stay increasing when called with growing ``start``.

    Example:
        >>> idx: NgramIndex = {}
        >>> index_ngrams(idx, [5, 6, 5, 6], 0, 2, 2)
        >>> idx
        {(5, 6): [0, 2], (6, 5): [1]}
    """
    for end in range(max(start, min_n - 1), len(tokens)):  # end: index of the gram's last token
        for n in range(min_n, min(max_n, end + 1) + 1):
            p = end - n + 1
            gram = tuple(tokens[p : end + 1])
            positions = index.get(gram)
            if positions is None:
                index[gram] = [p]
            else:
                positions.append(p)


def unindex_ngrams(
    index: NgramIndex, tokens: Sequence[int], start: int, min_n: int, max_n: int
) -> None:
    """Undo ``index_ngrams``: remove from ``index`` the n-grams of ``tokens`` that end at
    or after ``start`` (the index must hold exactly the n-grams of ``tokens``).

    Example:
        >>> idx: NgramIndex = {}
        >>> index_ngrams(idx, [5, 6, 5, 6], 0, 2, 2)
        >>> unindex_ngrams(idx, [5, 6, 5, 6], 2, 2, 2)
        >>> idx
        {(5, 6): [0]}
    """
    for end in range(len(tokens) - 1, max(start, min_n - 1) - 1, -1):  # latest first
        for n in range(min_n, min(max_n, end + 1) + 1):
            gram = tuple(tokens[end - n + 1 : end + 1])
            positions = index[gram]
            positions.pop()  # the latest occurrence: the one ending at `end`
            if not positions:
                del index[gram]


def merge_distinct(kept: list[list[int]], candidate: list[int], limit: int) -> None:
    """Add ``candidate`` to ``kept`` unless it is a prefix of a kept one; a kept candidate
    that is a prefix of ``candidate`` is replaced by it in place (its rank is kept). No
    kept candidate is ever a prefix of another, and at most ``limit`` are kept.

    Example:
        >>> kept = [[1, 2]]
        >>> merge_distinct(kept, [1], 3)  # prefix of [1, 2]: skipped
        >>> merge_distinct(kept, [1, 2, 3], 3)  # extends [1, 2]: replaces it
        >>> merge_distinct(kept, [4], 3)
        >>> kept
        [[1, 2, 3], [4]]
    """
    n = len(candidate)
    for i, k in enumerate(kept):
        if len(k) >= n:
            if k[:n] == candidate:
                return
        elif candidate[: len(k)] == k:
            kept[i] = candidate
            return
    if len(kept) < limit:
        kept.append(candidate)


@dataclass(slots=True)
class _Indexed:
    """A token sequence and its n-gram index."""

    tokens: list[int]
    index: NgramIndex


def _extend_back(a: Sequence[int], i: int, b: Sequence[int], j: int, limit: int) -> int:
    """How many tokens before ``a[i]`` and ``b[j]`` are equal (at most ``limit``)."""
    m = 0
    while m < limit and i - m > 0 and j - m > 0 and a[i - m - 1] == b[j - m - 1]:
        m += 1
    return m


class NgramDrafter:
    """Prompt-lookup drafting over several token sources, longest match first.

    Sources are searched in this order for each ``n`` (longest first): the context itself
    (most recent occurrence first), then the static sources, the most recently added first
    (within one source, the latest occurrence first).

    Example:
        >>> d = NgramDrafter(min_n=1, max_n=2)
        >>> d.add_source([7, 8, 9, 10])
        >>> d.propose([1, 2, 3, 9, 1, 2], max_len=3)  # "1 2" occurred at 0: then "3 9 1"
        [[3, 9, 1]]
        >>> d.propose([1, 2, 3, 9, 1, 2, 8], max_len=2, max_candidates=2)  # "8" -> suffix
        [[9, 10]]

    Speed, measured with ``time.perf_counter`` around 1000 calls on a 4096-token context
    of random ids (vocabulary 500) that grows by one token between calls, defaults
    ``min_n=2, max_n=4``, ``max_len=8``, on the 2-core dev machine: about 15-20 µs per call
    (45 µs on a context that is one token repeated: ``max_scan`` bounds it). The first
    call indexes the whole context (about 13 ms for 4096 tokens); a context edited 96
    tokens before its end is cut back and reindexed in about 0.6 ms.
    """

    def __init__(self, min_n: int = 2, max_n: int = 4, max_scan: int = 64) -> None:
        """``max_scan`` caps the occurrences examined per call (bounds pathological
        contexts such as long runs of one token)."""
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n=} {max_n=}")
        if max_scan < 1:
            raise ValueError(f"max_scan must be >= 1, got {max_scan}")
        self.min_n = min_n
        self.max_n = max_n
        self.max_scan = max_scan
        self._ctx = _Indexed([], {})
        self._sources: list[_Indexed] = []

    def add_source(self, tokens: Sequence[int]) -> None:
        """Index a static source (the suffix, another open document, an earlier completion)."""
        src = _Indexed(list(tokens), {})
        index_ngrams(src.index, src.tokens, 0, self.min_n, self.max_n)
        self._sources.append(src)

    def clear_sources(self) -> None:
        """Forget every static source."""
        self._sources.clear()

    def reset(self) -> None:
        """Forget the indexed context (sources are kept)."""
        self._ctx = _Indexed([], {})

    def propose(
        self, context: Sequence[int], max_len: int, max_candidates: int = 1
    ) -> list[list[int]]:
        """``propose_matched`` without the match length."""
        return self.propose_matched(context, max_len, max_candidates)[0]

    def propose_matched(
        self, context: Sequence[int], max_len: int, max_candidates: int = 1, max_match: int = 32
    ) -> tuple[list[list[int]], int]:
        """Candidate continuations of ``context`` (prompt + tokens generated so far).

        For n from max_n down to min_n: the earlier occurrences of ``context[-n:]`` in the
        context itself (not the trailing one) and in the sources; the tokens that followed
        each occurrence (up to ``max_len``, non-empty) are candidates. Returns up to
        ``max_candidates`` distinct ones (see ``merge_distinct``), longest ``n`` first, then
        most recent occurrence first. ``context`` may grow by appends between calls (only
        the new tokens are indexed) or be replaced (then the index is cut back to the
        common prefix and the rest indexed).

        Also returns how long a match the first candidate stands on: the tokens before the
        cursor that equal those before its occurrence (``n``, extended backwards up to
        ``max_match``): 3 for a common idiom, dozens for a copied line.

        Shapes: context [L] -> (up to max_candidates lists of 1..max_len tokens, match).

        Example:
            >>> NgramDrafter(2, 3).propose_matched([4, 5, 6, 7, 4, 5, 6], 2, max_candidates=2)
            ([[7, 4]], 3)

            Only one: "5 6" also occurs only at 1, with the same continuation.
            >>> NgramDrafter(2, 2).propose_matched([1, 2, 3, 4, 9, 2, 3, 4], 1)  # "3 4", "2" before
            ([[9]], 3)
        """
        if max_len <= 0 or max_candidates <= 0:
            return [], 0
        ctx = self._sync(context)
        length = len(ctx)
        out: list[list[int]] = []
        match = 0
        budget = self.max_scan
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            gram = tuple(ctx[length - n :])
            for src in (self._ctx, *reversed(self._sources)):
                positions = src.index.get(gram)
                if not positions:
                    continue
                tokens = src.tokens
                for p in reversed(positions):
                    cont = tokens[p + n : p + n + max_len]
                    if not cont:  # the context's trailing occurrence, or a source's end
                        continue
                    if not out:
                        match = n + _extend_back(tokens, p, ctx, length - n, max_match - n)
                    merge_distinct(out, cont, max_candidates)
                    budget -= 1
                    if budget <= 0 or (
                        len(out) == max_candidates and all(len(c) == max_len for c in out)
                    ):
                        return out, match
        return out, match

    def _sync(self, context: Sequence[int]) -> list[int]:
        """Bring the context index up to date with ``context``; return the indexed tokens.

        Appended tokens are indexed; if ``context`` differs from the indexed tokens, the
        index is cut back to their common prefix first (an edit near the end of a prompt
        costs little), or rebuilt when they share nothing.
        """
        new = context if isinstance(context, list) else list(context)
        old = self._ctx.tokens
        m = len(old)
        if len(new) < m or new[:m] != old:
            m = common_prefix(old, new)
            if m == 0:
                self._ctx = _Indexed([], {})
                old = self._ctx.tokens
            else:
                unindex_ngrams(self._ctx.index, old, m, self.min_n, self.max_n)
                del old[m:]
        if len(new) > m:
            old.extend(new[m:])
            index_ngrams(self._ctx.index, old, m, self.min_n, self.max_n)
        return old
