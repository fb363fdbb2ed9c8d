"""The typing replay's pure parts (``kode bench latency --scenario typing``): its places,
the text it opens, its configurations and its figures. No model, no server."""

from __future__ import annotations

import math

from kode.bench import typing_replay as typing
from kode.bench.latency import Keystroke

TEXT = "".join(
    f"    value_{i} = compute_something({i}, other)\n" if i % 3 else f"# note {i}\n"
    for i in range(300)
)


def test_places_are_code_lines_spread_over_the_files_and_seeded() -> None:
    texts = [TEXT, TEXT.replace("value", "item")]
    places = typing.plan(texts, 6, seed=3, keys=8, max_chars=60)
    assert [p.file for p in places] == [0, 1, 0, 1, 0, 1]
    for p in places:
        line = texts[p.file].splitlines()[p.line]
        assert line.strip() == p.body and not p.body.startswith("#")
        assert 30 <= p.line < 270  # the files' second to ninth tenth
        assert p.indent == 4
    assert places == typing.plan(texts, 6, seed=3, keys=8, max_chars=60)
    assert places != typing.plan(texts, 6, seed=4, keys=8, max_chars=60)


def test_the_opened_text_lacks_the_line_after_its_indentation() -> None:
    place = typing.plan([TEXT], 1, seed=0, keys=8, max_chars=60)[0]
    lines = typing.cut(TEXT, place).splitlines(keepends=True)
    assert lines[place.line] == "    \n"
    assert len(lines) == len(TEXT.splitlines())


def test_configurations_compare_engines_a_generic_client_and_variants() -> None:
    labels = [c.label for c in typing.configs(["inProcess", "shared"], [(("firstAnswerMs", 0),)])]
    assert labels == [
        "kode client, inProcess",
        "kode client, shared",
        "generic client, shared",
        "kode client, shared, firstAnswerMs=0",
    ]


def key(i: int, sent: float, answered: float | None, outcome: str = "shown") -> Keystroke:
    k = Keystroke("p", i, "x", sent=sent)
    k.answered, k.outcome = answered, outcome
    k.next_key = sent + 0.12
    return k


def test_figures_count_keys_in_time_and_the_last_keys_wait() -> None:
    place = typing.Place(0, 0, 0, "abcdefghij")
    fast = typing.PlaceResult(place, first_ms=900.0, keys=[key(0, 0.0, 0.05), key(1, 0.12, 0.13)])
    slow = typing.PlaceResult(
        place, first_ms=3000.0, keys=[key(0, 0.0, None, "cancelled"), key(1, 0.12, 0.62)]
    )
    slow.keys[-1].next_key = None  # the last key: nothing comes after it
    f = typing.figures([fast, slow])
    assert f.keys == 4 and f.before_next == 3  # the cancelled key was never answered
    assert f.first_p50 is not None and 900.0 <= f.first_p50 <= 3000.0
    assert f.last_p50 is not None and 10.0 <= f.last_p50 <= 500.0
    assert f.first_max == 3000.0
    never = typing.figures([typing.PlaceResult(place, first_ms=None)])
    assert never.first_max is not None and math.isinf(never.first_max)
