"""The decoding methods over a model-free ``Target``: every method equals plain decoding."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest
from kode.backends.base import SpeculationMethod
from kode.backends.speculative import AdaptivePolicy, CostCurve, NgramDrafter, TokenTree
from kode.backends.speculative.policy import CostTracker
from kode.backends.steppers import (
    Draft,
    DraftModelStepper,
    NgramStepper,
    PlainStepper,
    Prefilled,
    Probs,
    Stepper,
)

VOCAB = 16


def rule(history: Sequence[int]) -> int:
    """A toy greedy "model": a repeating pattern with a twist every seventh token."""
    n = len(history)
    return (history[-1] + 1) % 5 if n % 7 else (history[-1] * 3 + 2) % VOCAB


class RuleTarget:
    """A ``steppers.Target`` whose greedy choice after any history is ``rule``."""

    rng = np.random.default_rng(0)

    def __init__(self, trees: bool, next_token: Callable[[Sequence[int]], int] = rule) -> None:
        self.trees = trees
        self.tokens: list[int] = []
        self.next_token = next_token
        self.rows: list[list[int]] = []  # history after each row of the last batch
        self.batches: list[int] = []  # rows per batch
        self.margins: Callable[[Sequence[int]], float] | None = None  # None: never a tie
        self.near_tie = 1.0

    def prefill(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Prefilled:
        self.tokens = list(prompt)
        self.rows = [list(prompt)]
        return Prefilled(0)

    def evaluate(self, tree: TokenTree) -> None:
        assert self.trees or tree.n_branches == 1
        self.batches.append(tree.n_rows)
        paths: list[list[int]] = []
        for i, token in enumerate(tree.tokens):
            parent = tree.parents[i]
            paths.append([*(paths[parent] if parent >= 0 else []), token])
        self.rows = [[*self.tokens, *path] for path in paths]

    def pick(self, row: int) -> int:
        return self.next_token(self.rows[row])

    def margin(self, row: int) -> float:
        return self.margins(self.rows[row]) if self.margins else float("inf")

    def probs(self, rows: int) -> Probs:
        out = np.zeros((rows, VOCAB))
        for i in range(rows):
            out[i, self.pick(i)] = 1.0
        return out

    def commit(self, tree: TokenTree, accepted: int, branch: int) -> None:
        path = tree.branch_rows(branch)[: accepted + 1]
        self.tokens.extend(tree.tokens[r] for r in path)

    def synchronize(self) -> None:
        return None


def decode(stepper: Stepper, target: RuleTarget, prompt: list[int], n: int) -> list[int]:
    target.prefill(prompt, lambda: False, 0)
    out = [target.pick(-1)]
    while len(out) < n:
        new = stepper.step(out[-1])
        assert target.tokens == [*prompt, *out, *new[:-1]]  # the stepper contract
        out.extend(new)
    return out[:n]


PROMPT = [1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3]
CHEAP = CostCurve({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.3})
DEAR = CostCurve({1: 31.8, 2: 53.4, 4: 89.0, 8: 202.8})  # the 1.5B on two cores


def plain(n: int) -> list[int]:
    target = RuleTarget(trees=False)
    return decode(PlainStepper(target), target, PROMPT, n)


@pytest.mark.parametrize("trees", [True, False])
@pytest.mark.parametrize("method", [SpeculationMethod.NGRAM, SpeculationMethod.AUTO])
def test_ngram_equals_plain_and_drafts(trees: bool, method: SpeculationMethod) -> None:
    target = RuleTarget(trees)
    auto = method is SpeculationMethod.AUTO
    policy = AdaptivePolicy(CHEAP, [SpeculationMethod.NGRAM], prior_accept=0.8)
    stepper = NgramStepper(
        target, NgramDrafter(), policy, allow_plain=auto, method=method, tracker=None
    )
    assert decode(stepper, target, PROMPT, 40) == plain(40)
    assert stepper.stats.method is method
    assert stepper.stats.accepted > 10  # the pattern repeats: drafts pay
    assert max(target.batches) > 1
    assert stepper.stats.steps < 40


def test_cautious_auto_decodes_plainly() -> None:
    """Where drafting pays only at a high acceptance, ``auto`` decodes plainly even on a
    prompt that repeats itself (``ngram`` drafts there), and its timing does not move the
    curve; on a curve where drafts pay it drafts."""
    marginal = CostCurve({1: 1.0, 2: 1.5, 4: 2.2, 8: 4.5})  # break-even acceptance ~0.57

    def run(cautious_above: float, auto: bool = True) -> tuple[NgramStepper, RuleTarget]:
        policy = AdaptivePolicy(marginal, [SpeculationMethod.NGRAM], cautious_above=cautious_above)
        target = RuleTarget(trees=True)
        tracker = CostTracker(marginal.ms_by_rows)
        stepper = NgramStepper(target, NgramDrafter(), policy, allow_plain=auto, tracker=tracker)
        assert decode(stepper, target, PROMPT, 24) == plain(24)
        return stepper, target

    careful, target = run(cautious_above=0.35)
    assert careful.policy.cautious
    assert careful.stats.drafted == 0 and set(target.batches) == {1}
    assert careful.policy.curve is marginal and careful.stats.steps == 23
    forced, _ = run(cautious_above=0.35, auto=False)  # `ngram` drafts regardless
    assert forced.stats.drafted > 0
    bold, _ = run(cautious_above=1.0)  # never cautious: the prior 0.6 drafts
    assert bold.stats.drafted > 0


class NoisyTarget(RuleTarget):
    """Batches flip near ties, as llama.cpp's batch kernels may: where the top two are
    within 0.5 logits (every fifth position), a multi-row batch picks the runner-up."""

    def __init__(self, trees: bool) -> None:
        super().__init__(trees)
        self.margins = lambda history: 0.5 if len(history) % 5 == 0 else 5.0

    def pick(self, row: int) -> int:
        token = super().pick(row)
        if self.batches and self.batches[-1] > 1 and self.margin(row) < 1.0:
            return (token + 1) % VOCAB
        return token


@pytest.mark.parametrize("trees", [True, False])
def test_auto_leaves_near_ties_to_one_row_steps(trees: bool) -> None:
    """``auto`` never changes the text: a pick that is a near tie in a verify batch is
    redone in a one-row step. ``ngram`` (no guard) shows the noise model does flip."""

    def run(auto: bool) -> tuple[list[int], NgramStepper]:
        target = NoisyTarget(trees)
        policy = AdaptivePolicy(CHEAP, [SpeculationMethod.NGRAM], prior_accept=0.8)
        stepper = NgramStepper(target, NgramDrafter(), policy, allow_plain=auto, tracker=None)
        return decode(stepper, target, PROMPT, 40), stepper

    guarded, stepper = run(auto=True)
    assert guarded == plain(40)
    assert stepper.stats.near_ties > 0 and stepper.stats.accepted > 5
    unguarded, _ = run(auto=False)
    assert unguarded != plain(40)


def test_auto_keeps_its_cost_curve_current() -> None:
    target = RuleTarget(trees=True)
    tracker = CostTracker(CHEAP.ms_by_rows)
    policy = AdaptivePolicy(CHEAP, [SpeculationMethod.NGRAM], prior_accept=0.8)
    stepper = NgramStepper(target, NgramDrafter(), policy, allow_plain=True, tracker=tracker)
    decode(stepper, target, PROMPT, 30)
    assert policy.curve is not CHEAP  # rebuilt from the timed batches


class ChainDraft:
    """Drafts what ``rule`` would say, with every ``wrong``-th token off by one."""

    def __init__(self, wrong: int) -> None:
        self.wrong = wrong
        self.calls = 0

    def draft(self, history: list[int], max_draft: int, p_min: float) -> Draft:
        self.calls += 1
        out: list[int] = []
        for i in range(max_draft):
            token = rule([*history, *out])
            out.append((token + 1) % VOCAB if (self.calls + i) % self.wrong == 0 else token)
        return Draft(out)


@pytest.mark.parametrize("trees", [True, False])
def test_draft_model_equals_plain(trees: bool) -> None:
    target = RuleTarget(trees)
    stepper = DraftModelStepper(target, ChainDraft(wrong=3), max_draft=4)
    assert decode(stepper, target, PROMPT, 40) == plain(40)
    assert 0 < stepper.stats.accepted < stepper.stats.drafted
