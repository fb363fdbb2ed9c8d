"""The real-file latency scenario's pure parts (``kode bench latency --scenario places``)."""

from __future__ import annotations

import itertools

import pytest
from kode.bench.latency import Keystroke
from kode.bench.places import (
    DEFAULT_FILES,
    Place,
    Segment,
    blank,
    first_key_ms,
    key_times,
    next_shown_ms,
    plan_places,
    windows_for,
)


def test_places_open_jump_switch_and_come_back() -> None:
    texts = [f.read_text() for f in DEFAULT_FILES]
    places = plan_places(texts, seed=0, max_chars=60)
    assert [p.kind for p in places] == ["open", "jump", "switch", "back"]
    open_, jump, switch, back = places
    assert open_.file == jump.file == back.file == 0 and switch.file == 1
    assert jump.line - open_.line >= 200  # a real jump
    assert 0 < back.line - jump.line <= 25  # back near where the user was
    assert len(texts[0].splitlines()) >= 1500  # large files nobody here wrote
    for p in places:
        line = texts[p.file].splitlines()[p.line]
        assert line.strip() == p.body and len(line) - len(line.lstrip()) == p.indent
    assert plan_places(texts, seed=0, max_chars=60) == places  # seeded


def test_blank_removes_only_the_lines_to_type() -> None:
    text = "a = 1\n    b = 2\nc = 3\n"
    places = [Place(0, 1, 4, "b = 2", "open"), Place(1, 0, 0, "x", "switch")]
    assert blank(text, places, 0) == "a = 1\n    \nc = 3\n"


def test_first_key_waits_for_the_first_suggestion_shown_while_typing() -> None:
    keys = [Keystroke("s", i, "x", sent=float(i)) for i in range(3)]
    keys[0].outcome, keys[0].answered = "cancelled", 0.5
    keys[1].outcome, keys[1].answered = "shown", 2.5
    keys[2].partial = 2.2
    assert first_key_ms(Segment(Place(0, 0, 0, "xxx", "open"), keys)) == 2200.0
    assert first_key_ms(Segment(Place(0, 0, 0, "", "open"), [])) == float("inf")


def test_a_key_waits_for_the_next_suggestion_shown_on_its_line() -> None:
    keys = [Keystroke("s", i, "x", sent=float(i)) for i in range(4)]
    keys[0].outcome, keys[0].answered = "cancelled", 0.5  # superseded: nothing shown
    keys[1].partial = 2.5  # its partial came after the next key was typed
    keys[2].outcome, keys[2].answered = "empty", 2.2  # an empty answer shows nothing
    keys[3].outcome, keys[3].answered = "shown", 3.1
    waits = [next_shown_ms(keys, i) for i in range(4)]
    assert waits == pytest.approx([2500.0, 1500.0, 1100.0, 100.0])
    assert next_shown_ms(keys[:1], 0) == float("inf")


def test_windows_for_the_measured_speed() -> None:
    full, prepared, unprepared = windows_for(95.0, 1000.0, 2.5)
    assert (full.prefix_tokens, full.suffix_tokens) == (1024, 64)
    assert prepared.prefix_tokens + prepared.suffix_tokens <= 237
    assert unprepared.prefix_tokens + unprepared.suffix_tokens <= 95
    full, longer, shorter, unprepared = windows_for(40.0, 1000.0, 2.5, 1.5)
    assert longer.label == "prepared in 2.5 s (100 tokens)"
    assert shorter.prefix_tokens + shorter.suffix_tokens <= 60 < longer.prefix_tokens


def test_word_pauses_follow_the_keys_that_end_a_word() -> None:
    """``--word-pause``: a person stops after ``self.`` and ``= ``, not inside a name or
    between two separators, and not after the line's last key."""
    times = key_times("self.x = 1)", 100, 1000)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps == [100, 100, 100, 100, 1100, 100, 100, 100, 1100, 100]
    assert key_times("ab", 120) == [0.0, 120.0]
