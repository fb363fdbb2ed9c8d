"""Prompt-lookup drafting: ordering, distinctness, sources, incremental indexing."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kode.backends.speculative import ngram
from kode.backends.speculative.ngram import NgramDrafter, index_ngrams, merge_distinct


def reference_propose(
    context: Sequence[int],
    sources: Sequence[Sequence[int]],
    min_n: int,
    max_n: int,
    max_len: int,
    max_candidates: int,
) -> list[list[int]]:
    """The spec, by brute force: scan every position, no index."""
    kept: list[list[int]] = []

    def offer(cand: list[int]) -> None:
        for i, k in enumerate(kept):
            if k[: len(cand)] == cand:  # cand is a prefix of (or equal to) k
                return
            if cand[: len(k)] == k:  # k is a prefix of cand: keep the longer
                kept[i] = cand
                return
        if len(kept) < max_candidates:
            kept.append(cand)

    ctx = list(context)
    length = len(ctx)
    for n in range(max_n, min_n - 1, -1):
        if n > length:
            continue
        gram = ctx[length - n :]
        seqs = [(ctx, True)] + [(list(s), False) for s in reversed(sources)]
        for toks, is_ctx in seqs:
            for p in range(len(toks) - n, -1, -1):
                if is_ctx and p == length - n:
                    continue
                if toks[p : p + n] == gram and toks[p + n : p + n + max_len]:
                    offer(toks[p + n : p + n + max_len])
    return kept


def test_longest_match_first_then_most_recent() -> None:
    #          0  1  2  3  4  5  6  7  8  9 10 11
    context = [1, 2, 3, 9, 5, 2, 3, 8, 6, 1, 2, 3]
    d = NgramDrafter(min_n=1, max_n=3)
    # "1 2 3" (n=3) at 0 -> [9, 5]; "2 3" (n=2) at 5 -> [8, 6], at 1 -> [9, 5] (dup);
    # "3" (n=1) at 6 -> [8, 6] (dup), at 2 -> dup
    assert d.propose(context, max_len=2, max_candidates=3) == [[9, 5], [8, 6]]
    assert d.propose(context, max_len=2, max_candidates=1) == [[9, 5]]


def test_excludes_trailing_occurrence_and_empty_when_no_match() -> None:
    d = NgramDrafter(min_n=2, max_n=3)
    assert d.propose([1, 2, 3, 4], max_len=4) == []
    assert d.propose([], max_len=4) == []
    assert d.propose([1], max_len=4) == []
    assert d.propose([5, 6, 5, 6], max_len=4) == [[5, 6]]  # overlap with the trailing one is fine


def test_prefix_candidates_are_not_distinct_and_longer_wins() -> None:
    d = NgramDrafter(min_n=1, max_n=1)
    # "4" at 3 -> [7, 4] (cut by the context end); at 0 -> [7, 8, 4]: both distinct
    assert d.propose([4, 7, 8, 4, 7, 4], max_len=3, max_candidates=2) == [[7, 4], [7, 8, 4]]
    # "4" at 5 -> [7, 4]; at 2 -> [7, 9, 4]; at 0 -> [7, 4, 7] extends [7, 4] and takes its rank
    context = [4, 7, 4, 7, 9, 4, 7, 4]
    assert d.propose(context, max_len=3, max_candidates=2) == [[7, 4, 7], [7, 9, 4]]
    kept = [[1, 2]]
    merge_distinct(kept, [1, 2], 4)
    merge_distinct(kept, [1, 2, 3], 4)
    merge_distinct(kept, [1], 4)
    assert kept == [[1, 2, 3]]


def test_sources_after_context_newest_source_first() -> None:
    d = NgramDrafter(min_n=2, max_n=2)
    d.add_source([1, 2, 10, 11])
    d.add_source([0, 1, 2, 20, 21])
    assert d.propose([5, 1, 2], max_len=2, max_candidates=3) == [[20, 21], [10, 11]]
    assert d.propose([1, 2, 30, 1, 2], max_len=2, max_candidates=3) == [
        [30, 1],
        [20, 21],
        [10, 11],
    ]
    d.clear_sources()
    assert d.propose([5, 1, 2], max_len=2, max_candidates=3) == []


def test_source_occurrence_at_its_end_gives_nothing() -> None:
    d = NgramDrafter(min_n=2, max_n=2)
    d.add_source([7, 1, 2])
    assert d.propose([1, 2], max_len=3) == []


def test_max_len_and_max_candidates_respected() -> None:
    context = [1, 2, 3, 4, 5, 6, 1, 2, 7, 7, 7, 1, 2]
    d = NgramDrafter(min_n=2, max_n=2)
    assert d.propose(context, max_len=3, max_candidates=5) == [[7, 7, 7], [3, 4, 5]]
    assert d.propose(context, max_len=0) == []
    assert d.propose(context, max_len=3, max_candidates=0) == []


def test_context_is_indexed_incrementally(monkeypatch: pytest.MonkeyPatch) -> None:
    starts: list[int] = []
    real = ngram.index_ngrams

    def spy(index: ngram.NgramIndex, tokens: Sequence[int], start: int, lo: int, hi: int) -> None:
        starts.append(start)
        real(index, tokens, start, lo, hi)

    monkeypatch.setattr(ngram, "index_ngrams", spy)
    d = NgramDrafter()
    context = list(range(100))
    d.propose(context, 4)
    context += [1, 2]
    d.propose(context, 4)
    d.propose(context, 4)  # unchanged: nothing to index
    assert starts == [0, 100]
    context[95] = 77  # an edit near the end: cut back to the common prefix, index the rest
    d.propose(context, 4)
    assert starts == [0, 100, 95]
    d.propose(context[:50], 4)  # shrunk: only cut back
    assert starts == [0, 100, 95]
    d.propose([5, *context], 4)  # nothing shared: rebuilt
    assert starts == [0, 100, 95, 0]


def test_index_ngrams_example() -> None:
    idx: ngram.NgramIndex = {}
    index_ngrams(idx, [5, 6, 5], 0, 1, 2)
    index_ngrams(idx, [5, 6, 5, 6], 3, 1, 2)
    assert idx == {(5,): [0, 2], (6,): [1, 3], (5, 6): [0, 2], (6, 5): [1]}


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(min_n=0)
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(min_n=3, max_n=2)


tokens = st.lists(st.integers(0, 3), max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 40), tokens), min_size=1, max_size=6),
    sources=st.lists(tokens, max_size=2),
    min_n=st.integers(1, 3),
    extra_n=st.integers(0, 2),
    max_len=st.integers(1, 5),
    max_candidates=st.integers(1, 4),
)
def test_matches_brute_force_reference(
    steps: list[tuple[int, list[int]]],
    sources: list[list[int]],
    min_n: int,
    extra_n: int,
    max_len: int,
    max_candidates: int,
) -> None:
    """Through appends, cuts and replacements, the indexed drafter equals the brute-force
    spec. Each step keeps the first ``keep`` tokens of the context and appends ``toks``."""
    max_n = min_n + extra_n
    d = NgramDrafter(min_n, max_n, max_scan=10_000)
    for s in sources:
        d.add_source(s)
    context: list[int] = []
    for keep, toks in steps:
        context = context[:keep] + toks
        got = d.propose(tuple(context), max_len, max_candidates)
        assert got == reference_propose(context, sources, min_n, max_n, max_len, max_candidates)
        assert len(got) <= max_candidates
        assert all(1 <= len(c) <= max_len for c in got)
        for i, a in enumerate(got):
            for j, b in enumerate(got):
                assert i == j or a != b[: len(a)]


def test_max_scan_bounds_work_on_a_long_run() -> None:
    context = [1] + [7] * 50
    # "7 7" latest occurrences give [7], [7, 7], [7, 7, 7], [7, 7, 7, 7], ...
    assert NgramDrafter(2, 2, max_scan=3).propose(context, 4, max_candidates=2) == [[7, 7, 7]]
    assert NgramDrafter(2, 2).propose(context, 4, max_candidates=2) == [[7, 7, 7, 7]]
