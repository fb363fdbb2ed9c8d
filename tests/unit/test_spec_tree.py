"""Token trees and draft verification: structure, exactness, greedy equivalence."""

from __future__ import annotations

import doctest
import importlib
import itertools
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kode.backends.speculative.draft import accept_reject, draft_chain, sample_index
from kode.backends.speculative.tree import TokenTree, accept_greedy, build_tree, verify

Target = Callable[[Sequence[int]], int]


def make_target(seed: int, vocab: int, order: int) -> Target:
    """A deterministic 'model': the next token is a fixed random function of the last
    ``order`` tokens (small vocabularies make drafts hit often)."""
    rng = np.random.default_rng(seed)
    table: dict[tuple[int, ...], int] = {}

    def f(prefix: Sequence[int]) -> int:
        key = tuple(prefix[-order:])
        if key not in table:
            table[key] = int(rng.integers(vocab))
        return table[key]

    return f


def greedy(f: Target, prefix: Sequence[int], n: int) -> list[int]:
    """Plain step-by-step decoding: n tokens after ``prefix``."""
    seq = list(prefix)
    for _ in range(n):
        seq.append(f(seq))
    return seq[len(prefix) :]


def path_tokens(tree: TokenTree, row: int) -> list[int]:
    """Tokens from the root to ``row``, both included."""
    out = []
    while row >= 0:
        out.append(tree.tokens[row])
        row = tree.parents[row]
    return out[::-1]


@pytest.mark.parametrize(
    "module",
    ["ngram", "tree", "lookahead", "draft", "policy"],
)
def test_docstring_examples(module: str) -> None:
    mod = importlib.import_module(f"kode.backends.speculative.{module}")
    result = doctest.testmod(mod)
    assert result.attempted > 0
    assert result.failed == 0


def test_build_tree_example() -> None:
    t = build_tree(4, [[5, 6, 7], [5, 8], [9]], max_rows=8)
    assert t.tokens == (4, 5, 6, 7, 8, 9)
    assert t.parents == (-1, 0, 1, 2, 1, 0)
    assert t.depths == (0, 1, 2, 3, 2, 1)
    assert t.branches == ((0, 1, 2), (0, 1), (0,), (0,), (1,), (2,))
    assert t.n_branches == 3
    assert t.branch_rows(0) == [0, 1, 2, 3]
    assert t.branch_rows(2) == [0, 5]
    assert t.children(0) == [1, 5]
    with pytest.raises(ValueError, match="branch"):
        t.branch_rows(3)


def test_empty_and_degenerate_trees() -> None:
    for t in (build_tree(3, [], 5), build_tree(3, [[], []], 5), build_tree(3, [[1, 2]], 1)):
        assert (t.tokens, t.parents, t.depths, t.branches, t.n_branches) == (
            (3,),
            (-1,),
            (0,),
            ((0,),),
            1,
        )
        v = verify(t, [8])
        assert (v.accepted_rows, v.accepted_tokens, v.next_token, v.branch) == ((), (), 8, 0)
    with pytest.raises(ValueError, match="max_rows"):
        build_tree(3, [], 0)
    with pytest.raises(ValueError, match="target tokens"):
        verify(build_tree(3, [[1]], 4), [1])


def test_prefix_candidate_adds_no_branch() -> None:
    t = build_tree(0, [[1, 2, 3], [1, 2], [1, 2, 3]], 10)
    assert t.n_rows == 4
    assert t.n_branches == 1


def test_verify_picks_lowest_branch_and_stops_at_first_miss() -> None:
    t = build_tree(0, [[1, 2, 3], [1, 2, 4], [5]], 10)  # rows 0 1 2 3 4 5: tokens 0 1 2 3 4 5
    v = verify(t, [1, 2, 9, 0, 0, 0])  # stops after row 2: its children hold 3 and 4, not 9
    assert v.accepted_rows == (1, 2)
    assert v.accepted_tokens == (1, 2)
    assert v.next_token == 9
    assert v.branch == 0
    v = verify(t, [1, 2, 4, 0, 7, 0])
    assert (v.accepted_tokens, v.next_token, v.branch) == ((1, 2, 4), 7, 1)
    v = verify(t, [5, 0, 0, 0, 0, 6])
    assert (v.accepted_tokens, v.next_token, v.branch) == ((5,), 6, 2)


candidates_st = st.lists(st.lists(st.integers(0, 3), max_size=6), max_size=6)


@settings(max_examples=300, deadline=None)
@given(root=st.integers(0, 3), candidates=candidates_st, max_rows=st.integers(1, 20))
def test_tree_structure(root: int, candidates: list[list[int]], max_rows: int) -> None:
    t = build_tree(root, candidates, max_rows)
    n = t.n_rows
    assert 1 <= n <= max_rows
    assert len(t.parents) == len(t.depths) == len(t.branches) == n
    assert (t.tokens[0], t.parents[0], t.depths[0]) == (root, -1, 0)
    for r in range(1, n):
        assert 0 <= t.parents[r] < r  # topological
        assert t.depths[r] == t.depths[t.parents[r]] + 1
    # a trie: no two children of one row hold the same token
    assert len({(t.parents[r], t.tokens[r]) for r in range(1, n)}) == n - 1
    # the rows are exactly the first max_rows - 1 distinct prefixes, in candidate order
    prefixes: list[tuple[int, ...]] = []
    for c in candidates:
        for k in range(1, len(c) + 1):
            if tuple(c[:k]) not in prefixes:
                prefixes.append(tuple(c[:k]))
    assert [tuple(path_tokens(t, r)[1:]) for r in range(1, n)] == prefixes[: max_rows - 1]
    # branches: every branch id used, the root on all, a row's set = union of its children's
    assert t.branches[0] == tuple(range(t.n_branches))
    for r in range(n):
        kids = t.children(r)
        if kids:
            assert set(t.branches[r]) == set().union(*(t.branches[k] for k in kids))
            assert all(
                set(t.branches[a]).isdisjoint(t.branches[b]) for a in kids for b in kids if a < b
            )
        else:
            assert len(t.branches[r]) == 1
        assert list(t.branches[r]) == sorted(t.branches[r])
    for b in range(t.n_branches):
        rows = t.branch_rows(b)
        assert rows[0] == 0  # root ...
        assert not t.children(rows[-1])  # ... to a leaf
        assert all(t.parents[y] == x for x, y in itertools.pairwise(rows))


@settings(max_examples=300, deadline=None)
@given(
    root=st.integers(0, 3),
    candidates=candidates_st,
    max_rows=st.integers(1, 20),
    seed=st.integers(0, 2**32 - 1),
    order=st.integers(1, 3),
)
def test_verification_is_greedy_decoding(
    root: int, candidates: list[list[int]], max_rows: int, seed: int, order: int
) -> None:
    """With target_tokens[i] = f(path to row i), root + accepted + next is exactly what
    step-by-step decoding with f produces, and the accepted length is the longest
    candidate prefix (as present in the tree) that agrees with it."""
    f = make_target(seed, vocab=3, order=order)
    prefix = [1, 2]
    t = build_tree(root, candidates, max_rows)
    targets = [f(prefix + path_tokens(t, r)) for r in range(t.n_rows)]
    v = verify(t, targets)
    a = len(v.accepted_tokens)
    assert [*v.accepted_tokens, v.next_token] == greedy(f, [*prefix, root], a + 1)
    assert v.accepted_tokens == tuple(t.tokens[r] for r in v.accepted_rows)
    assert [t.depths[r] for r in v.accepted_rows] == list(range(1, a + 1))
    assert set(v.accepted_rows) <= set(t.branch_rows(v.branch))
    assert all(not set(v.accepted_rows) <= set(t.branch_rows(b)) for b in range(v.branch))
    # longest agreeing prefix over the candidates, each cut to what the tree holds
    in_tree = {tuple(path_tokens(t, r)[1:]) for r in range(t.n_rows)}
    truth = greedy(f, [*prefix, root], 7)
    best = 0
    for c in candidates:
        k = 0
        while k < len(c) and tuple(c[: k + 1]) in in_tree and c[k] == truth[k]:
            k += 1
        best = max(best, k)
    assert a == best


def test_accept_greedy() -> None:
    assert accept_greedy([5, 6, 7], [5, 6, 7, 8]) == (3, 8)
    assert accept_greedy([5, 6, 7], [4, 6, 7, 8]) == (0, 4)
    assert accept_greedy([], [4]) == (0, 4)
    with pytest.raises(ValueError, match="target tokens"):
        accept_greedy([1, 2], [1, 2])


# --- draft model -------------------------------------------------------------------------


def test_draft_chain_stops_at_low_confidence_and_max_len() -> None:
    fed: list[int] = []

    def step(tok: int) -> tuple[int, float]:
        fed.append(tok)
        return tok + 1, 0.9 if tok < 13 else 0.2

    assert draft_chain(step, 10, max_len=2, p_min=0.5) == [11, 12]
    assert fed == [10, 11]  # the last drafted token is not fed
    fed.clear()
    assert draft_chain(step, 10, max_len=9, p_min=0.5) == [11, 12, 13]
    assert fed == [10, 11, 12, 13]
    assert draft_chain(step, 10, max_len=0, p_min=0.5) == []
    assert draft_chain(step, 13, max_len=3, p_min=0.5) == []


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    mask = expected > 0
    assert counts[~mask].sum() == 0, "a token with zero probability was produced"
    return float((((counts - expected) ** 2)[mask] / expected[mask]).sum())


RuleFn = Callable[[Sequence[int], np.ndarray, np.ndarray, np.random.Generator], tuple[int, int]]


def first_token_counts(rule: RuleFn, q: np.ndarray, p: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Histogram of the first output token over n speculative steps with sampled drafts."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(q.shape[1])
    for _ in range(n):
        draft = [int(rng.choice(q.shape[1], p=q[i])) for i in range(q.shape[0])]
        accepted, nxt = rule(draft, q, p, rng)
        counts[draft[0] if accepted > 0 else nxt] += 1
    return counts


def always_accept(
    draft: Sequence[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator
) -> tuple[int, int]:
    """A deliberately wrong rule: trust the draft."""
    return len(draft), sample_index(p[len(draft)], rng)


Q = np.array([[0.5, 0.3, 0.1, 0.1, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]])
P = np.array([[0.1, 0.2, 0.3, 0.2, 0.2], [0.5, 0.1, 0.1, 0.1, 0.2], [0.2] * 5])
CHI2_DF4_999 = 18.47  # chi-square critical value, 4 degrees of freedom, p = 0.001


def test_accept_reject_first_token_follows_target() -> None:
    counts = first_token_counts(accept_reject, Q, P, n=20_000, seed=1)
    assert chi_square(counts, P[0]) < CHI2_DF4_999


def test_chi_square_check_detects_a_wrong_rule() -> None:
    counts = first_token_counts(always_accept, Q, P, n=20_000, seed=1)
    with pytest.raises(AssertionError):  # draft token 4 has q = 0 but the target wants it
        assert chi_square(counts, P[0]) < CHI2_DF4_999


def test_accept_reject_edge_cases() -> None:
    rng = np.random.default_rng(0)
    same = np.array([[0.25, 0.75]])
    for _ in range(50):  # q == p: always accepted
        assert accept_reject([1], same, np.vstack([same, [[1.0, 0.0]]]), rng) == (1, 0)
    assert accept_reject([], np.zeros((0, 2)), np.array([[0.0, 1.0]]), rng) == (0, 1)
    with pytest.raises(ValueError, match="need q"):
        accept_reject([0], same, same, rng)
    with pytest.raises(ValueError, match="vocabulary"):
        accept_reject([0], same, np.ones((2, 3)) / 3, rng)


def test_sample_index_never_picks_zero_weight() -> None:
    rng = np.random.default_rng(0)
    w = np.array([0.0, 2.0, 0.0, 1.0, 0.0])
    picks = [sample_index(w, rng) for _ in range(2000)]
    assert set(picks) == {1, 3}
    assert 0.6 < picks.count(1) / len(picks) < 0.73
