"""Adaptive speculation policy: cost curve, acceptance estimates, choices, recovery."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kode.backends.base import SpeculationMethod
from kode.backends.speculative.policy import (
    AcceptanceStats,
    AdaptivePolicy,
    CostCurve,
    CostTracker,
    expected_tokens,
)

NGRAM, NONE = SpeculationMethod.NGRAM, SpeculationMethod.NONE

EXPENSIVE = CostCurve({1: 1, 2: 1.4, 4: 2.0, 8: 4.5})  # the shipped Q4_K_M on 2 cores
CHEAP = CostCurve({1: 90, 2: 100, 4: 110, 8: 130, 16: 170})  # GPU-like


def test_cost_curve_interpolates_and_extrapolates() -> None:
    c = CostCurve({1: 90, 2: 120, 4: 165, 8: 380, 16: 600})
    assert c.cost(1) == 1.0
    assert c.cost(2) == pytest.approx(120 / 90)
    assert c.cost(3) == pytest.approx((120 + 165) / 2 / 90)
    assert c.cost(6) == pytest.approx((165 + 380) / 2 / 90)
    assert c.cost(16) == pytest.approx(600 / 90)
    assert c.cost(24) == pytest.approx((600 + 220) / 90)  # last slope: 220 ms per 8 rows
    assert EXPENSIVE.cost(3) == pytest.approx(1.7)


def test_cost_curve_edge_cases() -> None:
    assert CostCurve({1: 50}).cost(4) == 4.0  # nothing measured: every row a full step
    falling = CostCurve({1: 10, 4: 30, 8: 25})  # noisy measurements
    assert falling.ms_by_rows == {1: 10, 4: 30, 8: 30}  # 8 rows never cheaper than 4
    assert falling.cost(16) == pytest.approx(3.0)  # nor extrapolated downward
    assert CostCurve({1: 10, 2: 9}).cost(2) == 1.0  # nor cheaper than one row
    with pytest.raises(ValueError, match="1-row"):
        CostCurve({2: 10})
    with pytest.raises(ValueError, match="costs > 0"):
        CostCurve({1: 10, 2: 0})
    with pytest.raises(ValueError, match="rows must be"):
        EXPENSIVE.cost(0)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.integers(2, 64), st.floats(1, 1000), max_size=6), st.floats(1, 100))
def test_cost_curve_is_monotone_through_its_raised_points(
    points: dict[int, float], base: float
) -> None:
    c = CostCurve({1: base, **points})
    for n in points:  # each point raised to the largest measurement at fewer rows
        floor = max([base, *(ms for m, ms in points.items() if m <= n)])
        assert c.cost(n) == pytest.approx(floor / base)
    for a, b in itertools.pairwise(range(1, 70)):
        assert c.cost(a) <= c.cost(b) + 1e-9


def test_expected_tokens() -> None:
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 4) == 5.0


def test_acceptance_stats_counts_chain_outcomes() -> None:
    s = AcceptanceStats(prior=0.5, prior_weight=2.0, decay=1.0)
    assert s.estimate == 0.5
    s.observe(drafted=3, accepted=3)  # 3 successes, no miss
    assert s.estimate == pytest.approx((3 + 1) / (3 + 2))
    s.observe(drafted=3, accepted=0)  # 1 miss
    assert s.estimate == pytest.approx((3 + 1) / (4 + 2))
    s.observe(drafted=0, accepted=0)  # nothing drafted: nothing learnt
    assert s.estimate == pytest.approx((3 + 1) / (4 + 2))
    with pytest.raises(ValueError, match="accepted"):
        s.observe(drafted=2, accepted=3)


def test_acceptance_stats_relax_to_the_prior() -> None:
    s = AcceptanceStats(prior=0.6, prior_weight=4.0, decay=0.9)
    for _ in range(30):
        s.observe(drafted=4, accepted=0)
    low = s.estimate
    assert low < 0.2
    for _ in range(60):
        s.relax()
    assert low < s.estimate
    assert s.estimate == pytest.approx(0.6, abs=0.02)


def test_expensive_batches_and_poor_acceptance_mean_plain_decoding() -> None:
    pol = AdaptivePolicy(EXPENSIVE, [NGRAM], prior_accept=0.2)
    assert pol.draft_len(NGRAM) == 0
    assert pol.draft_len(NGRAM, limit=8) == 0
    # one token at 0.2 acceptance: 1.2 tokens for a 1.4-step batch, a loss
    assert (
        AdaptivePolicy(EXPENSIVE, [NGRAM], prior_accept=0.2, min_gain=0.0).draft_len(NGRAM, limit=1)
        == 1
    )


def test_good_acceptance_drafts_a_few_tokens() -> None:
    pol = AdaptivePolicy(EXPENSIVE, [NGRAM], prior_accept=0.9)
    assert pol.draft_len(NGRAM) == 3  # E(3) / cost(4) = 3.44 / 2.0 beats every other k
    assert pol.draft_len(NGRAM, limit=2) == 2  # capped by the candidate's length
    assert pol.draft_len(NGRAM, limit=0) == 0
    # cheap batches pay for long drafts
    assert AdaptivePolicy(CHEAP, [NGRAM], prior_accept=0.9).draft_len(NGRAM) == 8
    assert AdaptivePolicy(CHEAP, [NGRAM], prior_accept=0.9, max_draft=5).draft_len(NGRAM) == 5


def test_observations_move_the_estimate_and_the_decision() -> None:
    pol = AdaptivePolicy(EXPENSIVE, [NGRAM], prior_accept=0.6)
    start = pol.stats[NGRAM].estimate
    for _ in range(30):
        pol.observe(NGRAM, drafted=4, accepted=4)
    assert pol.stats[NGRAM].estimate > start
    assert 3 <= pol.draft_len(NGRAM) <= 5
    for _ in range(30):
        pol.observe(NGRAM, drafted=4, accepted=0)
    assert pol.stats[NGRAM].estimate < 0.3
    assert pol.draft_len(NGRAM) == 0


def test_unknown_and_plain_methods_are_refused() -> None:
    pol = AdaptivePolicy(EXPENSIVE, [NGRAM])
    with pytest.raises(ValueError, match="unknown method"):
        pol.draft_len(SpeculationMethod.DRAFT)
    with pytest.raises(ValueError, match="unknown method"):
        pol.observe(SpeculationMethod.LOOKAHEAD, 1, 1)
    pol.observe(NONE, 0, 0)  # a plain step is always a valid observation
    with pytest.raises(ValueError, match="not drafting methods"):
        AdaptivePolicy(EXPENSIVE, [NONE])
    with pytest.raises(ValueError, match="not drafting methods"):
        AdaptivePolicy(EXPENSIVE, [SpeculationMethod.AUTO])


def test_a_failing_method_gets_its_chance_back() -> None:
    pol = AdaptivePolicy(EXPENSIVE, [NGRAM], prior_accept=0.6)
    for _ in range(40):
        pol.observe(NGRAM, drafted=2, accepted=0)
    assert pol.draft_len(NGRAM) == 0
    steps = 0
    while pol.draft_len(NGRAM) == 0:  # plain steps: the failures fade
        pol.observe(NONE, 0, 0)
        steps += 1
        assert steps < 200
    assert steps > 10


def test_cost_tracker_follows_the_machine_and_stays_monotone() -> None:
    tracker = CostTracker({1: 30.0, 2: 40.0, 4: 60.0}, alpha=0.5)
    assert not tracker.dirty
    tracker.record(2, 20.0)  # a noisy fast 2-row batch: 30 ms by the moving average
    assert tracker.dirty
    curve = tracker.curve()
    assert not tracker.dirty
    assert curve.ms_by_rows == {1: 30.0, 2: 30.0, 4: 60.0}
    tracker.record(4, 140.0)  # cores contended: multi-row batches got dearer
    assert tracker.curve().cost(4) == pytest.approx(100.0 / 30.0)


def test_a_fixed_curve_is_never_updated_by_timed_calls() -> None:
    from kode.backends.speculative import CostTracker

    tracker = CostTracker(CostCurve({1: 1.0, 4: 1.3}, fixed=True).ms_by_rows, fixed=True)
    tracker.record(4, 50.0)  # a load spike
    assert tracker.curve().cost(4) == pytest.approx(1.3)
    learning = CostTracker({1: 1.0, 4: 1.3})
    learning.record(4, 50.0)
    assert learning.curve().cost(4) > 1.3
