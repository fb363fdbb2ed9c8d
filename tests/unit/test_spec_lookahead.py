"""Lookahead planner: batch layout, a simulated llama.cpp KV cache, lossless decoding."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kode.backends.speculative.lookahead import Lookahead, LookaheadPlan, LookaheadRow

Target = Callable[[Sequence[int]], int]


def make_target(seed: int, vocab: int, order: int) -> Target:
    """Deterministic 'model': next token = fixed random function of the last ``order`` tokens."""
    rng = np.random.default_rng(seed)
    table: dict[tuple[int, ...], int] = {}

    def f(prefix: Sequence[int]) -> int:
        key = tuple(prefix[-order:])
        if key not in table:
            table[key] = int(rng.integers(vocab))
        return table[key]

    return f


def cycle_target(pattern: Sequence[int]) -> Target:
    """Repeats ``pattern`` forever (its tokens distinct); starts it after any other token."""

    def f(prefix: Sequence[int]) -> int:
        if prefix and prefix[-1] in pattern:
            return pattern[(pattern.index(prefix[-1]) + 1) % len(pattern)]
        return pattern[0]

    return f


def greedy(f: Target, prefix: Sequence[int], n: int) -> list[int]:
    seq = list(prefix)
    for _ in range(n):
        seq.append(f(seq))
    return seq[len(prefix) :]


@dataclass
class KVCell:
    pos: int
    token: int
    seqs: set[int]


@dataclass
class FakeKV:
    """A unified KV cache with llama.cpp's masking: a batch row attends to the cells that
    hold its FIRST seq id at positions <= its own (``llama_kv_cache::set_input_kq_mask``)."""

    n_seqs: int
    cells: list[KVCell] = field(default_factory=list)

    def decode(self, rows: Sequence[LookaheadRow], n_past: int, f: Target) -> list[int]:
        """Add the rows as cells; return f(visible prefix) for rows that want logits."""
        new = [KVCell(n_past + r.depth, r.token, set(r.seq_ids)) for r in rows]
        self.cells.extend(new)
        out = []
        for row, cell in zip(rows, new, strict=True):
            seen = [c for c in self.cells if row.seq_ids[0] in c.seqs and c.pos <= cell.pos]
            # the planner's contract: the rows sharing ANY seq id are the same ones
            seen_any = [c for c in self.cells if c.seqs & cell.seqs and c.pos <= cell.pos]
            assert [id(c) for c in seen] == [id(c) for c in seen_any]
            seen.sort(key=lambda c: c.pos)
            assert [c.pos for c in seen] == list(range(cell.pos + 1)), "not one cell per position"
            out.append(f([c.token for c in seen]) if row.want_logits else -1)
        return out

    def seq_rm_from(self, pos: int) -> None:  # llama_memory_seq_rm(mem, -1, pos, -1)
        self.cells = [c for c in self.cells if c.pos < pos]

    def seq_keep(self, seq: int) -> None:  # llama_memory_seq_keep(mem, seq)
        for c in self.cells:
            c.seqs &= {seq}
        self.cells = [c for c in self.cells if c.seqs]

    def seq_cp_to_all(self, seq: int) -> None:  # llama_memory_seq_cp(mem, seq, s, -1, -1)
        for c in self.cells:
            if seq in c.seqs:
                c.seqs |= set(range(self.n_seqs))


def check_plan(plan: LookaheadPlan, la: Lookahead) -> None:
    """Layout invariants a llama.cpp batch needs."""
    rows = plan.rows
    assert len(rows) <= la.max_rows == (la.window + la.max_verify) * (la.ngram - 1)
    assert plan.n_seqs <= la.max_seqs
    assert rows[0].depth == 0
    assert rows[0].want_logits
    assert rows[0].seq_ids == tuple(range(plan.n_seqs))
    for r in rows:
        assert list(r.seq_ids) == sorted(set(r.seq_ids)), "own (lowest) seq id first, no dups"
        assert all(0 <= s < plan.n_seqs for s in r.seq_ids)
    for s in range(plan.n_seqs):
        depths = sorted(r.depth for r in rows if s in r.seq_ids)
        assert depths == list(range(len(depths))), f"seq {s} positions not contiguous"
    assert all(rows[i].want_logits for i in plan.last_level_rows)
    assert all(rows[t].want_logits for t in range(plan.tree.n_rows))
    assert [rows[t].token for t in range(plan.tree.n_rows)] == list(plan.tree.tokens)
    assert plan.logit_rows == tuple(i for i, r in enumerate(rows) if r.want_logits)


@dataclass
class Run:
    tokens: list[int]
    steps: int
    accepted: int  # verified draft tokens over the run


def run_lookahead(la: Lookahead, f: Target, context: Sequence[int], n_tokens: int) -> Run:
    """Decode n_tokens as a runtime would: plan, decode into the KV cache, update, then
    trim the KV cache with the documented recipe."""
    kv = FakeKV(la.max_seqs, [KVCell(p, t, set(range(la.max_seqs))) for p, t in enumerate(context)])
    la.reset(context)
    n_past = len(context)
    root = f(list(context))
    out: list[int] = []
    steps = accepted = 0
    while len(out) < n_tokens:
        plan = la.plan(root)
        check_plan(plan, la)
        res = la.update(plan, kv.decode(plan.rows, n_past, f))
        a = len(res.accepted_tokens)
        kept = {i for i, r in enumerate(plan.rows) if res.keep_seq in r.seq_ids and r.depth <= a}
        assert kept == set(res.kept_rows)
        assert [plan.rows[i].depth for i in res.accepted_rows] == list(range(1, a + 1))
        # the KV recipe: drop what is past the new tokens, then keep only keep_seq's copy
        n_keep = n_past + 1 + a
        kv.seq_rm_from(n_keep)
        if a:
            kv.seq_keep(res.keep_seq)
            kv.seq_cp_to_all(res.keep_seq)
        out += [root, *res.accepted_tokens]
        assert sorted(c.pos for c in kv.cells) == list(range(n_keep))
        assert [c.token for c in sorted(kv.cells, key=lambda c: c.pos)] == [*context, *out]
        assert all(c.seqs == set(range(la.max_seqs)) for c in kv.cells)
        n_past, root = n_keep, res.next_token
        steps += 1
        accepted += a
    return Run(out[:n_tokens], steps, accepted)


def test_plan_layout_example() -> None:
    """The module docstring's diagram: W=3, N=3, two verification n-grams."""
    la = Lookahead(window=3, ngram=3, pool_size=4, max_verify=2, history_max_n=0)
    la.reset([])
    la.add_source([9, 30, 31, 9, 20, 21])  # pool for 9: newest first [20, 21], [30, 31]
    plan = la.plan(9)
    got = [(r.token, r.depth, r.seq_ids, r.want_logits) for r in plan.rows[:5]]
    assert got == [
        (9, 0, (0, 1, 2, 3, 4), True),
        (20, 1, (3,), True),
        (21, 2, (3,), True),
        (30, 1, (4,), True),
        (31, 2, (4,), True),
    ]
    window = [(r.depth, r.seq_ids, r.want_logits) for r in plan.rows[5:]]
    assert window == [
        (1, (1, 2), False),  # x1
        (2, (2,), False),  # x2
        (1, (0,), True),  # y0
        (2, (1,), True),  # y1
        (3, (2,), True),  # y2
    ]
    assert plan.logit_rows == (0, 1, 2, 3, 4, 7, 8, 9)
    assert plan.last_level_rows == (7, 8, 9)
    assert plan.n_seqs == 5 == la.max_seqs
    assert plan.n_draft == 4


@pytest.mark.parametrize(
    ("window", "ngram", "max_verify"),
    [(1, 2, 0), (1, 2, 1), (2, 3, 1), (2, 3, 2), (3, 4, 3), (4, 3, 1), (1, 5, 2)],
)
def test_small_settings_are_lossless(window: int, ngram: int, max_verify: int) -> None:
    f = make_target(seed=7, vocab=4, order=2)
    la = Lookahead(window, ngram, pool_size=3, max_verify=max_verify, seed=1)
    context = [0, 1, 2, 3, 0, 1, 2]
    run = run_lookahead(la, f, context, 60)
    assert run.tokens == greedy(f, context, 60)
    assert max(len(p.rows) for p in [la.plan(0)]) <= (window + max_verify) * (ngram - 1)


@settings(max_examples=60, deadline=None)
@given(
    window=st.integers(1, 4),
    ngram=st.integers(2, 5),
    pool_size=st.integers(1, 4),
    max_verify=st.integers(0, 3),
    history_max_n=st.integers(0, 3),
    seed=st.integers(0, 1000),
    target_seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(2, 6),
    order=st.integers(1, 3),
    context=st.lists(st.integers(0, 5), max_size=20),
    n_tokens=st.integers(1, 40),
)
def test_lossless_for_any_window_and_pool(
    window: int,
    ngram: int,
    pool_size: int,
    max_verify: int,
    history_max_n: int,
    seed: int,
    target_seed: int,
    vocab: int,
    order: int,
    context: list[int],
    n_tokens: int,
) -> None:
    """Whatever the window and pool hold, the output is plain greedy decoding's."""
    f = make_target(target_seed, vocab, order)
    la = Lookahead(window, ngram, pool_size, max_verify, seed=seed, history_max_n=history_max_n)
    run = run_lookahead(la, f, context, n_tokens)
    assert run.tokens == greedy(f, context, n_tokens)


@pytest.mark.parametrize("history_max_n", [0, 3])
def test_repetitive_target_accepts_more_than_one_token_per_step(history_max_n: int) -> None:
    """A target that repeats a pattern unseen in the prompt: the Jacobi window has to
    discover the n-grams (history lookup may help once the output repeats)."""
    f = cycle_target([11, 12, 13, 14, 15, 16, 17])
    la = Lookahead(window=3, ngram=4, pool_size=4, max_verify=2, history_max_n=history_max_n)
    context = [1, 2, 3, 4, 5, 1, 2]
    run = run_lookahead(la, f, context, 120)
    assert run.tokens == greedy(f, context, 120)
    assert run.accepted / run.steps > 1.0, run


def test_repeated_code_in_prompt_is_used_from_the_first_step() -> None:
    pattern = [40, 41, 42, 43, 44, 45]
    f = cycle_target(pattern)
    la = Lookahead(window=2, ngram=4, pool_size=2, max_verify=1)
    context = [1, 2, *pattern, *pattern, 3]
    run = run_lookahead(la, f, context, 30)
    assert run.tokens == greedy(f, context, 30)
    assert run.accepted / run.steps > 2.0  # close to N - 1 = 3 drafts per step


def test_jacobi_window_finds_ngrams_the_history_lacks() -> None:
    """The prompt holds the pattern's tokens in a shuffled order (its n-grams are wrong)
    and the output is shorter than one cycle (it never repeats): only n-grams mined by
    the Jacobi window can be accepted."""
    pattern = list(range(100, 160))
    f = cycle_target(pattern)
    context = pattern[:]
    random.Random(0).shuffle(context)
    la = Lookahead(window=4, ngram=4, pool_size=4, max_verify=3, history_max_n=0)
    run = run_lookahead(la, f, context, 50)
    assert run.tokens == greedy(f, context, 50)
    assert run.accepted / run.steps > 0.3, run


def test_window_columns_feed_the_pool() -> None:
    la = Lookahead(window=2, ngram=3, pool_size=4, max_verify=1, history_max_n=0)
    la.reset([])  # nothing to draw from: the window starts as zeros
    plan = la.plan(5)
    assert plan.window == ((0, 0), (0, 0))
    targets = [-1] * len(plan.rows)
    targets[0] = 9
    targets[plan.last_level_rows[0]] = 21  # column 0: path 5 0 -> guess 21
    targets[plan.last_level_rows[1]] = 22  # column 1: path 5 0 0 -> guess 22
    res = la.update(plan, targets)
    assert (res.accepted_tokens, res.next_token, res.keep_seq) == ((), 9, 0)
    # one Jacobi iteration: level 0 <- level 1, level 1 <- the new guesses
    assert la.plan(9).window == ((0, 0), (21, 22))
    # the columns' n-grams: root 5 0 21 (column 0) and 0 0 22 (column 1)
    assert la.plan(5).tree.tokens == (5, 0, 21)
    assert la.plan(0).tree.tokens == (0, 0, 22)


def test_window_keeps_absolute_positions_after_acceptance() -> None:
    la = Lookahead(window=3, ngram=3, pool_size=4, max_verify=1, history_max_n=0)
    la.reset([])
    la.add_source([5, 6, 7])
    plan = la.plan(5)
    assert plan.tree.tokens == (5, 6, 7)
    targets = [-1] * len(plan.rows)
    targets[:3] = [6, 7, 8]  # both drafts confirmed, 8 is the bonus token
    for col, row in enumerate(plan.last_level_rows):
        targets[row] = 31 + col  # guesses for depths 2, 3, 4
    res = la.update(plan, targets)
    assert (res.accepted_tokens, res.next_token, res.keep_seq) == ((6, 7), 8, 3)
    window = la.plan(8).window
    # the new root sits at old depth 3: column 2's guesses move to column 0
    assert window[0][0] == 0
    assert window[1][0] == 33
    assert all(t in (5, 6, 7) for t in (*window[0][1:], *window[1][1:]))  # refilled


def test_advance_keeps_state_consistent() -> None:
    f = make_target(seed=3, vocab=3, order=2)
    context = [0, 1, 2, 0, 1]
    la = Lookahead(window=2, ngram=3, pool_size=2, max_verify=2)
    la.reset(context)
    expected = greedy(f, context, 40)
    hist = list(context)
    root = expected[0]
    out: list[int] = []
    while len(out) < 40:
        if len(out) % 3 == 0:  # a plain step between lookahead steps
            out.append(root)
            la.advance([root])
            hist.append(root)
            root = f(hist)
            continue
        plan = la.plan(root)
        targets = []
        for row in plan.rows:
            path = [
                r.token for r in plan.rows if r.depth < row.depth and row.seq_ids[0] in r.seq_ids
            ]
            targets.append(f([*hist, *path, row.token]))
        res = la.update(plan, targets)
        out += [root, *res.accepted_tokens]
        hist += [root, *res.accepted_tokens]
        root = res.next_token
    assert out[:40] == expected


def test_stale_plans_and_bad_arguments_are_rejected() -> None:
    la = Lookahead(window=2, ngram=3, pool_size=2, max_verify=1)
    la.reset([1, 2, 3])
    old = la.plan(4)
    new = la.plan(4)  # replanning drops the first plan
    with pytest.raises(ValueError, match="current"):
        la.update(old, [0] * len(old.rows))
    with pytest.raises(ValueError, match="target tokens"):
        la.update(new, [0])
    la.update(new, [0] * len(new.rows))
    with pytest.raises(ValueError, match="current"):
        la.update(new, [0] * len(new.rows))  # already consumed
    for bad in [(0, 3, 1, 1), (2, 1, 1, 1), (2, 3, 0, 1), (2, 3, 1, -1)]:
        with pytest.raises(ValueError, match="need"):
            Lookahead(*bad)


def test_window_starts_from_context_tokens_and_is_deterministic() -> None:
    context = [100, 101, 102, 103]
    a = Lookahead(window=3, ngram=4, pool_size=2, max_verify=0, seed=5)
    b = Lookahead(window=3, ngram=4, pool_size=2, max_verify=0, seed=5)
    a.reset(context)
    b.reset(context)
    pa, pb = a.plan(7), b.plan(7)
    assert pa.rows == pb.rows
    assert all(r.token in context for r in pa.rows[1:])
    assert len(pa.rows) == 3 * 3 == a.max_rows
