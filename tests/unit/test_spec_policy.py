"""Adaptive speculation policy: cost curve, acceptance estimates, choices, recovery."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kode.backends.speculative.policy import (
    AcceptanceStats,
    AdaptivePolicy,
    CostCurve,
    expected_tokens,
)

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
    assert falling.cost(16) == pytest.approx(2.5)  # never extrapolated downward
    with pytest.raises(ValueError, match="1-row"):
        CostCurve({2: 10})
    with pytest.raises(ValueError, match="costs > 0"):
        CostCurve({1: 10, 2: 0})
    with pytest.raises(ValueError, match="rows must be"):
        EXPENSIVE.cost(0)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.integers(2, 64), st.floats(1, 1000), max_size=6), st.floats(1, 100))
def test_cost_curve_passes_through_its_points(points: dict[int, float], base: float) -> None:
    c = CostCurve({1: base, **points})
    for n, ms in points.items():
        assert c.cost(n) == pytest.approx(ms / base)
    xs = sorted({1, *points})
    for a, b in itertools.pairwise(xs):  # between two points: between their costs
        mid = (a + b) // 2
        lo, hi = sorted((c.cost(a), c.cost(b)))
        assert lo - 1e-9 <= c.cost(mid) <= hi + 1e-9


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
    pol = AdaptivePolicy(EXPENSIVE, ["ngram"], prior_accept=0.2)
    assert pol.draft_len("ngram") == 0
    assert pol.choose({"ngram": 8}) == ("none", 0)
    assert pol.expected_speedup("ngram", 1) == pytest.approx(1.2 / 1.4)


def test_good_acceptance_drafts_a_few_tokens() -> None:
    pol = AdaptivePolicy(EXPENSIVE, ["ngram"], prior_accept=0.9)
    assert 3 <= pol.draft_len("ngram") <= 5
    assert pol.expected_speedup("ngram", 3) == pytest.approx(expected_tokens(0.9, 3) / 2.0)
    method, k = pol.choose({"ngram": 8})
    assert method == "ngram"
    assert 3 <= k <= 5
    assert pol.choose({"ngram": 2}) == ("ngram", 2)  # capped by what is on offer
    # cheap batches pay for long drafts
    assert AdaptivePolicy(CHEAP, ["ngram"], prior_accept=0.9).draft_len("ngram") == 8


def test_observations_move_the_estimate_and_the_decision() -> None:
    pol = AdaptivePolicy(EXPENSIVE, ["ngram"], prior_accept=0.6)
    start = pol.stats["ngram"].estimate
    for _ in range(30):
        pol.observe("ngram", drafted=4, accepted=4)
    assert pol.stats["ngram"].estimate > start
    assert 3 <= pol.draft_len("ngram") <= 5
    for _ in range(30):
        pol.observe("ngram", drafted=4, accepted=0)
    assert pol.stats["ngram"].estimate < 0.3
    assert pol.draft_len("ngram") == 0


def test_choose_prefers_the_better_method() -> None:
    pol = AdaptivePolicy(EXPENSIVE, ["ngram", "lookahead"], prior_accept=0.6)
    for _ in range(20):
        pol.observe("ngram", drafted=3, accepted=3)
        pol.observe("lookahead", drafted=3, accepted=0)
    assert pol.choose({"ngram": 4, "lookahead": 4})[0] == "ngram"
    assert pol.choose({"ngram": 0, "lookahead": 4}) == ("none", 0)  # lookahead too weak
    assert pol.choose({}) == ("none", 0)
    assert pol.choose({"none": 3}) == ("none", 0)
    with pytest.raises(ValueError, match="unknown method"):
        pol.choose({"draft": 3})
    with pytest.raises(ValueError, match="unknown method"):
        pol.observe("draft", 1, 1)
    with pytest.raises(ValueError, match="plain decoding"):
        AdaptivePolicy(EXPENSIVE, ["none"])


def test_match_quality_raises_or_lowers_this_step() -> None:
    pol = AdaptivePolicy(EXPENSIVE, ["ngram"], prior_accept=0.6)
    assert pol.draft_len("ngram", match_quality=0.0) == 0
    assert pol.draft_len("ngram", match_quality=1.0) >= pol.draft_len("ngram") > 0
    assert pol.draft_len("ngram", match_quality=0.5) == pol.draft_len("ngram")
    assert pol.choose({"ngram": 4}, match_quality={"ngram": 0.0}) == ("none", 0)
    assert pol.expected_speedup("ngram", 2, match_quality=1.0) > pol.expected_speedup("ngram", 2)


def test_a_failing_method_gets_its_chance_back() -> None:
    pol = AdaptivePolicy(EXPENSIVE, ["ngram"], prior_accept=0.6, probe_every=1000)
    for _ in range(40):
        pol.observe("ngram", drafted=2, accepted=0)
    assert pol.draft_len("ngram") == 0
    steps = 0
    while pol.draft_len("ngram") == 0:  # plain steps: the failures fade
        pol.observe("none", 0, 0)
        steps += 1
        assert steps < 200
    assert steps > 10


def test_probe_with_one_token_when_cheap() -> None:
    curve = CostCurve({1: 1, 2: 1.3, 4: 2.0, 8: 4.5})  # cost(2) ~1.3: a probe is cheap
    pol = AdaptivePolicy(curve, ["ngram"], prior_accept=0.05, probe_every=8)
    choices = []
    for _ in range(20):
        method, k = pol.choose({"ngram": 4})
        choices.append((method, k))
        pol.observe(method, k, 0)
    assert choices.count(("ngram", 1)) == 2  # steps 8 and 17 (after 8 idle steps each)
    assert choices[8] == ("ngram", 1)
    assert all(c in (("none", 0), ("ngram", 1)) for c in choices)
    # no probe when a 2-row batch is dear, or when the method has nothing to offer
    dear_curve = CostCurve({1: 1, 2: 2.0, 4: 3.0})
    dear = AdaptivePolicy(dear_curve, ["ngram"], prior_accept=0.05, probe_every=1)
    dear.observe("none", 0, 0)
    assert dear.choose({"ngram": 4}) == ("none", 0)
    assert pol.choose({"ngram": 0}) == ("none", 0)
