"""Speculative edits: copy drafting, batch sizing, and the rewrite loop over a fake target."""

from __future__ import annotations

import doctest
import random
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kode.backends.base import FinishReason
from kode.backends.llama.rewrite import Rewrite, decode_rewrite
from kode.backends.speculative import CostCurve, TokenTree, edits
from kode.backends.speculative.edits import (
    EDIT_CURVE_MS,
    CopyDrafter,
    EditSizer,
    Proposal,
    Substitution,
    batch_len,
    expected_run,
)
from kode.backends.steppers import Prefilled, Probs

CURVE = CostCurve(EDIT_CURVE_MS)


def test_doctests() -> None:
    result = doctest.testmod(edits)
    assert result.attempted > 0
    assert result.failed == 0


# -- CopyDrafter ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=40), st.integers(0, 45), st.integers(0, 12))
def test_output_that_copies_the_draft_is_proposed_the_rest(
    draft: list[int], cut: int, max_len: int
) -> None:
    d = CopyDrafter(draft)
    cut = min(cut, len(draft))
    for i in range(cut + 1):  # read one token at a time, as a rewrite does
        p = d.propose(draft[:i], max_len)
        assert p == Proposal(tuple(draft[i : i + max_len]), i, i)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=30),
    st.lists(st.integers(0, 8), max_size=30),
    st.integers(1, 10),
)
def test_proposals_are_draft_text_and_incremental_reading_is_exact(
    draft: list[int], output: list[int], max_len: int
) -> None:
    """Whatever the output, reading it in pieces gives what reading it at once gives;
    without learning, a proposal is the draft's own text from its start."""
    for learn in (True, False):
        whole = CopyDrafter(draft, learn=learn, trust=1)
        final = whole.propose(output, max_len)
        assert len(final.tokens) <= max_len
        if not learn:
            assert list(final.tokens) in ([], draft[final.start : final.start + max_len])
        pieces = CopyDrafter(draft, learn=learn, trust=1)
        for i in range(len(output) + 1):
            step = pieces.propose(output[:i], max_len)
        assert step == final


def test_an_insertion_rejoins_the_draft_after_it() -> None:
    draft = [1, 2, 3, 4, 5, 6, 7, 8]
    d = CopyDrafter(draft, min_n=1, max_n=3)
    assert d.propose([1, 2, 3, 90, 91], 4).tokens == ()  # new text: nothing to propose
    assert d.propose([1, 2, 3, 90, 91, 4], 4) == Proposal((5, 6, 7, 8), 4, 1)


def test_a_deletion_rejoins_further_on() -> None:
    d = CopyDrafter([1, 2, 3, 4, 5, 6, 7, 8], min_n=1, max_n=3)
    assert d.propose([1, 2, 6], 4) == Proposal((7, 8), 6, 1)


def test_rejoin_prefers_the_first_occurrence_at_or_after_where_the_output_left() -> None:
    # "9 1" occurs at 0 and at 5; the output left the draft at 4: continue after 5.
    draft = [9, 1, 2, 3, 4, 9, 1, 7, 8, 9, 1, 5]
    d = CopyDrafter(draft, min_n=1, max_n=2)
    assert d.propose([9, 1, 2, 3, 50, 9, 1], 3) == Proposal((7, 8, 9), 7, 2)
    # None after it: the latest before (an edit that repeats an earlier line).
    d = CopyDrafter([4, 5, 6, 1, 2, 3], min_n=1, max_n=2)
    assert d.propose([4, 5, 6, 1, 2, 3, 4, 5], 2) == Proposal((6, 1), 2, 2)


def test_a_guessed_rejoin_that_fails_keeps_the_anchor() -> None:
    """A one-token rejoin that is wrong does not move the place the edit began: the next
    rejoin still searches from there."""
    draft = [1, 2, 3, 7, 4, 5, 6, 7, 8, 9]
    d = CopyDrafter(draft, min_n=1, max_n=2, trust=2)
    d.propose([1, 2, 50], 1)  # left at 2
    d.propose([1, 2, 50, 7], 1)  # "7" after the anchor: rejoins at 4
    assert d.cursor == 4
    p = d.propose([1, 2, 50, 7, 60, 3], 2)  # wrong guess; "3" is at the anchor
    assert p == Proposal((7, 4), 3, 1)


def test_a_rename_is_learned_and_drafted_at_its_next_uses() -> None:
    old, new = 40, (41, 42)  # the identifier is one token before, two after
    line = [old, 1, 2, 3, 10]
    draft = line * 4
    expected = [*new, 1, 2, 3, 10] * 4
    d = CopyDrafter(draft, min_n=1, max_n=4)
    d.propose(expected[:8], 50)
    assert d.substitutions == [Substitution((old,), new)]
    p = d.propose(expected[:10], 50)
    assert list(p.tokens) == expected[10:]
    off = CopyDrafter(draft, min_n=1, max_n=4, learn=False)
    assert list(off.propose(expected[:10], 50).tokens) == draft[8:]


def test_an_output_that_is_not_an_extension_is_read_again() -> None:
    d = CopyDrafter([1, 2, 3, 4], min_n=1, max_n=2)
    d.propose([1, 2, 3], 2)
    assert d.propose([1, 2], 2) == Proposal((3, 4), 2, 2)


def test_no_draft_proposes_nothing() -> None:
    d = CopyDrafter([])
    assert d.propose([], 4).tokens == ()
    assert d.propose([1, 2], 4).tokens == ()


# -- sizing -----------------------------------------------------------------------------


def test_expected_run_matches_a_simulation() -> None:
    rng = random.Random(0)
    first, rest, k, n = 0.7, 0.9, 6, 20_000
    total = 0
    for _ in range(n):
        got = 1
        if rng.random() < first:
            got += 1
            while got - 1 < k and rng.random() < rest:
                got += 1
        total += got
    assert abs(total / n - expected_run(first, rest, k)) < 0.05


def test_batch_len_edges() -> None:
    assert batch_len(CURVE, 0.99, 0.99, 0) == 0
    assert batch_len(CURVE, 0.0, 0.99, 50) == 0
    flat = CostCurve({1: 10.0, 64: 10.5})  # a GPU: rows are nearly free
    assert batch_len(flat, 0.99, 0.99, 50) == 50
    # On this CPU 8 rows cost 5.2 steps: a run of 7 is rarely worth a batch of 8.
    assert batch_len(CURVE, 0.99, 0.99, 7) == 3


def test_sizer_never_drafts_past_max_batch() -> None:
    s = EditSizer(CostCurve({1: 10.0, 256: 10.5}), max_batch=16)
    assert s.size(Proposal(tuple(range(100)), 0, 50)) == 15


# -- the rewrite loop over a fake target -----------------------------------------------


class FakeTarget:
    """A ``steppers.Target`` whose greedy choice after any history is ``next_token``."""

    trees = False
    rng = np.random.default_rng(0)
    near_tie = 1.0

    def __init__(
        self,
        next_token: Callable[[Sequence[int]], int],
        margins: Callable[[Sequence[int]], float] | None = None,
    ) -> None:
        self.tokens: list[int] = []
        self.next_token, self.margins = next_token, margins
        self.rows: list[list[int]] = []
        self.batches: list[int] = []

    def prefill(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Prefilled:
        self.tokens = list(prompt)
        self.rows = [list(prompt)]
        return Prefilled(0)

    def evaluate(self, tree: TokenTree) -> None:
        assert tree.n_branches == 1
        self.batches.append(tree.n_rows)
        self.rows = [[*self.tokens, *tree.tokens[: i + 1]] for i in range(tree.n_rows)]

    def pick(self, row: int) -> int:
        return self.next_token(self.rows[row])

    def margin(self, row: int) -> float:
        return self.margins(self.rows[row]) if self.margins else float("inf")

    def probs(self, rows: int) -> Probs:
        raise NotImplementedError

    def commit(self, tree: TokenTree, accepted: int, branch: int) -> None:
        self.tokens.extend(tree.tokens[: accepted + 1])

    def release(self) -> None:
        return None

    def synchronize(self) -> None:
        return None


PROMPT = [100, 101, 102]
STOP = 99


def rewriting(target_text: Sequence[int]) -> Callable[[Sequence[int]], int]:
    """A "model" that writes ``target_text`` after the prompt, then a stop token; where
    its history strays from that text it writes a function of the history."""

    def next_token(history: Sequence[int]) -> int:
        out = list(history[len(PROMPT) :])
        if out == list(target_text[: len(out)]):
            return target_text[len(out)] if len(out) < len(target_text) else STOP
        return (sum(out) * 7 + len(out)) % 50

    return next_token


def run(
    target: FakeTarget,
    draft: Sequence[int],
    *,
    max_tokens: int = 500,
    stop_texts: Sequence[str] = (),
    cancelled: Callable[[], bool] = lambda: False,
    learn: bool = True,
) -> Rewrite:
    return decode_rewrite(
        target,
        PROMPT,
        draft,
        CURVE,
        max_tokens=max_tokens,
        is_stop=lambda t: t == STOP,
        piece=lambda t: f"<{t}>".encode(),
        stop_texts=stop_texts,
        cancelled=cancelled,
        learn=learn,
    )


def renamed_region(seed: int) -> tuple[list[int], list[int]]:
    """A region (tokens) and its rewrite: one identifier renamed at each use, a line
    dropped and a line added."""
    rng = random.Random(seed)
    lines = [[rng.randrange(10, 500) for _ in range(rng.randrange(4, 12))] for _ in range(20)]
    for line in lines[::3]:
        line.insert(rng.randrange(len(line)), 5)  # the identifier
    region = [t for line in lines for t in (*line, 1)]
    new_lines = [list(line) for line in lines]
    del new_lines[7]
    new_lines.insert(12, [rng.randrange(10, 500) for _ in range(6)])
    rewrite = []
    for line in new_lines:
        for t in (*line, 1):
            rewrite.extend((6, 7) if t == 5 else (t,))
    return region, rewrite


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("learn", [True, False])
def test_drafted_rewrite_equals_plain_and_is_cheaper(seed: int, learn: bool) -> None:
    region, expected = renamed_region(seed)
    plain_target = FakeTarget(rewriting(expected))
    plain = run(plain_target, [])
    assert plain.tokens == expected and plain.finish is FinishReason.END
    assert set(plain_target.batches) == {1}
    target = FakeTarget(rewriting(expected))
    drafted = run(target, region, learn=learn)
    assert drafted.tokens == plain.tokens and drafted.text == plain.text
    assert drafted.batches == target.batches and plain.batches == plain_target.batches
    spec = drafted.speculation
    assert spec.accepted > len(expected) // 2
    assert (spec.accepted + spec.steps) / spec.steps > 4  # mean tokens per batch
    # On the CPU curve: about 2x plain with the rename learned, 1.5x without (7 renames,
    # a deleted and an inserted line in 180 tokens).
    cost = sum(CURVE.cost(n) for n in target.batches)
    assert cost < len(plain_target.batches) / (1.8 if learn else 1.4)


def test_learning_saves_batches_on_a_rename() -> None:
    region, expected = renamed_region(0)
    with_learning, without = FakeTarget(rewriting(expected)), FakeTarget(rewriting(expected))
    run(with_learning, region, learn=True)
    run(without, region, learn=False)
    assert len(with_learning.batches) < len(without.batches)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(10, 20), max_size=60),
    st.lists(st.integers(10, 20), max_size=60),
    st.integers(1, 80),
)
def test_any_draft_gives_plain_output(
    draft: list[int], expected: list[int], max_tokens: int
) -> None:
    plain = run(FakeTarget(rewriting(expected)), [], max_tokens=max_tokens)
    drafted = run(FakeTarget(rewriting(expected)), draft, max_tokens=max_tokens)
    assert drafted.tokens == plain.tokens
    assert len(drafted.tokens) <= max_tokens
    assert drafted.finish == plain.finish


def test_max_tokens_and_stop_text_cut_where_plain_decoding_does() -> None:
    region, expected = renamed_region(1)
    out = run(FakeTarget(rewriting(expected)), region, max_tokens=37)
    assert out.tokens == expected[:37] and out.finish is FinishReason.LENGTH
    stop = f"<{expected[20]}><{expected[21]}>"
    first = next(i for i in range(len(expected)) if f"<{expected[i]}><{expected[i + 1]}>" == stop)
    out = run(FakeTarget(rewriting(expected)), region, stop_texts=(stop,))
    assert out.tokens == expected[: first + 2] and out.finish is FinishReason.END
    assert out.text == "".join(f"<{t}>" for t in expected[:first])


def test_a_cancel_stops_between_batches() -> None:
    region, expected = renamed_region(2)
    target = FakeTarget(rewriting(expected))
    calls = 0

    def cancelled() -> bool:
        nonlocal calls
        calls += 1
        return calls > 2  # two batches, then the cancel

    out = run(target, region, cancelled=cancelled)
    assert out.finish is FinishReason.CANCELLED
    assert len(target.batches) == 2
    assert out.tokens == expected[: len(out.tokens)]


def test_near_ties_are_left_to_one_row_steps() -> None:
    """A pick whose top two logits are close is never taken from a verify batch."""
    region, expected = renamed_region(3)
    tie_at = {30, 31, 75}
    target = FakeTarget(
        rewriting(expected), margins=lambda h: 0.1 if len(h) - len(PROMPT) in tie_at else 5.0
    )
    steps: list[tuple[int, int]] = []  # (rows, output length before the batch)
    evaluate = target.evaluate

    def recording(tree: TokenTree) -> None:
        steps.append((tree.n_rows, len(target.tokens) - len(PROMPT)))
        evaluate(tree)

    target.evaluate = recording  # type: ignore[method-assign]
    out = run(target, region)
    assert out.tokens == expected
    assert out.speculation.near_ties >= 1
    for at in tie_at:  # output token `at` was picked after a one-row step of the one before
        assert (1, at - 1) in steps
