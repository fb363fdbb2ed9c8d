"""``kode bench latency``'s and ``kode bench engine``'s pure parts: the scripts typed
back, the accept proxy and summary, the engine bench's rounds and pairs. No model."""

from __future__ import annotations

import doctest
import math
from pathlib import Path

import pytest
from fakes.projects import SHAPES
from kode.bench import engine, engine_busy, harness, latency
from kode.bench.engine import ALONE, BUSY, TWO, Key, paired

# -- latency -------------------------------------------------------------------------------


def test_region_scripts_remove_what_is_typed_back() -> None:
    scripts = latency.region_scripts(Path("shapes.py"), SHAPES, 2, 0, 60)
    assert len(scripts) == 2
    for s in scripts:
        assert s.text[: s.offset] + s.typed + s.text[s.offset :] == SHAPES
        assert s.typed == s.typed.strip()
    assert scripts == latency.region_scripts(Path("shapes.py"), SHAPES, 2, 0, 60)


def test_accept_proxy_and_latency_summary() -> None:
    typed = "return x"
    keys = [
        latency.Keystroke("s", 0, "r", sent=0.0, next_key=0.12),
        latency.Keystroke("s", 1, "e", sent=0.12, next_key=0.24),
        latency.Keystroke("s", 2, "t", sent=0.24, next_key=None),
    ]
    keys[0].outcome, keys[0].answered = "cancelled", 0.13
    keys[1].outcome, keys[1].answered, keys[1].suggestion = "shown", 0.2, "turn x + 1"
    keys[1].stats = {"completionTokens": 5, "totalMs": 500.0, "ttftMs": 100.0}
    keys[2].outcome, keys[2].answered, keys[2].partial = "shown", 1.24, 0.74
    keys[2].suggestion = "urn y"
    latency.mark_matches(keys, typed)
    assert [k.matched for k in keys] == [None, True, False]
    assert keys[1].visible_ms == pytest.approx(80.0)
    assert keys[2].visible_ms == pytest.approx(500.0)  # the partial came first
    assert [k.before_next_key for k in keys] == [False, True, True]
    summary = latency.summarize(keys, {"cancelled": 4, "stepsAfterCancel": 2, "generations": 9})
    assert summary.shown == 2
    assert summary.answered_before_next == 2
    assert summary.ms_per_token == 100.0
    assert (summary.matched, summary.match_checked) == (1, 2)
    # Over all keys, the cancelled one counts as never answered.
    assert [latency.answer_ms(k) for k in keys] == [
        math.inf,
        pytest.approx(80.0),
        pytest.approx(500.0),
    ]
    assert summary.answer_p50 == pytest.approx(500.0)
    assert summary.answer_p95 == math.inf
    table = latency.render_table("all", summary, 120)
    assert "| decode steps after cancel (stepsAfterCancel / cancelled) | 2/4 = 0.50 |" in table
    assert "never (superseded before an answer)" in table


# -- kode bench engine: the interleaved keystroke rounds ----------------------------------


@pytest.mark.parametrize("module", [engine, engine_busy, latency])
def test_worked_examples(module: object) -> None:
    result = doctest.testmod(module)  # type: ignore[arg-type]
    assert result.attempted > 0 and result.failed == 0


def test_engine_bench_rounds_repeat_their_material_and_alternate_the_order() -> None:
    keys = engine.material(0, 3, "a", 6)
    assert keys == engine.material(0, 3, "a", 6)  # every condition of a round types these
    assert len(keys) == 6 and set(keys) <= set(engine.TYPED)
    assert keys != engine.material(0, 4, "a", 6) and keys != engine.material(0, 3, "c", 6)
    forwards = harness.round_order(engine.SHARED_CONDITIONS, 0)
    assert forwards == list(engine.SHARED_CONDITIONS)
    assert harness.round_order(engine.SHARED_CONDITIONS, 1) == forwards[::-1]


def test_engine_bench_pairs_each_round_with_its_own_alone_keys() -> None:
    keys = [
        # round 0: a slow machine (alone 1,000 ms); round 1: a quick one (alone 100 ms)
        *(Key(0, ALONE, w, i, 1000.0) for w in "ac" for i in range(3)),
        *(Key(0, TWO, w, i, 1800.0) for w in "ac" for i in range(3)),
        *(Key(0, BUSY, "a", i, 1100.0) for i in range(3)),
        *(Key(1, ALONE, w, i, 100.0) for w in "ac" for i in range(3)),
        *(Key(1, TWO, "a", i, 250.0) for i in range(3)),
        *(Key(1, TWO, "c", i, 150.0) for i in range(3)),
        # answered from the suggestion shown, in both conditions: no generation, left out
        Key(1, ALONE, "a", 3, 2.0, typed_ahead=True),
        Key(1, ALONE, "a", 4, 3.0, typed_ahead=True),
        Key(1, ALONE, "a", 5, 3.0, typed_ahead=True),
        Key(1, TWO, "a", 3, 2.0, typed_ahead=True),
    ]
    got = {(p.condition, p.window): p for p in paired(keys)}
    assert set(got) == {(BUSY, "a"), (TWO, "a"), (TWO, "c")}
    assert got[TWO, "a"].ratios == pytest.approx((1.8, 2.5))
    assert got[TWO, "c"].ratios == pytest.approx((1.8, 1.5))
    assert got[BUSY, "a"].ratios == pytest.approx((1.1,))  # round 1 had no busy keys
    # Pooled, round 1's quick alone keys would make round 0's slow ones look 9x slower.
    assert got[TWO, "a"].median == pytest.approx(2.15)
