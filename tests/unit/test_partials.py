"""Pacing of streamed partial suggestions (``completion/partials.py``): no model."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest
from fakes.completion import URI, ClockedBackend, ScriptedBackend, engine_for
from fakes.timing import until
from hypothesis import given
from hypothesis import strategies as st
from kode.completion.clock import ManualClock
from kode.completion.documents import Position
from kode.completion.partials import EVERY_S, PartialPacer


def test_a_completed_line_goes_out_at_once() -> None:
    pacer = PartialPacer("", 0.0, continuing=False)
    assert pacer.next("x = 1", 0.01) is None  # a fragment, too soon after the request
    assert pacer.next("x = 1\n", 0.02) == "x = 1"


def test_a_growing_line_goes_out_once_the_interval_passed() -> None:
    pacer = PartialPacer("", 0.0, continuing=False)
    assert pacer.next("self", 0.1) is None
    assert pacer.next("self.items", EVERY_S) == "self.items"
    assert pacer.next("self.items.app", EVERY_S + 0.1) is None
    assert pacer.next("self.items.append(", 2 * EVERY_S) == "self.items.append("


def test_after_the_first_line_only_whole_lines_go_out() -> None:
    pacer = PartialPacer("", 0.0, continuing=False)
    assert pacer.next("if x:\n", 0.1) == "if x:"
    assert pacer.next("if x:\n    raise Value", 1.0) is None  # a line cut in the middle
    assert pacer.next("if x:\n    raise ValueError()\n", 1.1) == "if x:\n    raise ValueError()"


def test_a_suggestion_already_ahead_of_the_typist_goes_out_at_once() -> None:
    pacer = PartialPacer("ret", 5.0, continuing=True)
    assert pacer.next("return self", 5.0) == "urn self"
    assert pacer.next("return self.x", 5.01) is None  # then paced again


def test_nothing_blank_nothing_repeated_nothing_that_went_another_way() -> None:
    pacer = PartialPacer("a", 0.0, continuing=True)
    assert pacer.next("a   ", 1.0) is None  # only whitespace after what was typed
    assert pacer.next("b = 1\n", 2.0) is None  # not what was typed
    assert pacer.next("a = 1  ", 3.0) == " = 1"
    assert pacer.next("a = 1   ", 4.0) is None  # the same text again


@given(
    st.lists(
        st.tuples(st.text(alphabet="ab \n", min_size=1, max_size=4), st.floats(0, 0.5)),
        max_size=30,
    ),
    st.booleans(),
)
def test_every_partial_extends_the_one_before(
    steps: list[tuple[str, float]], continuing: bool
) -> None:
    pacer = PartialPacer("", 0.0, continuing=continuing)
    visible, now, sent = "", 0.0, []
    for piece, pause in steps:
        visible += piece
        now += pause
        text = pacer.next(visible, now)
        if text is not None:
            sent.append(text)
    assert all(text.strip() for text in sent)
    assert all(b.startswith(a) and b != a for a, b in itertools.pairwise(sent))
    assert all(visible.startswith(text) for text in sent)
    # Once a line is complete, every partial ends where a line ended (its trailing
    # whitespace left out).
    assert all(
        "\n" not in text or visible[len(text) :].lstrip(" \t").startswith("\n") for text in sent
    )


async def test_a_slow_line_shows_its_first_words_before_it_completes() -> None:
    # One token every 0.1 s of the engine's clock: the line completes with the 6th, at
    # 0.6 s; its first words go out with the first token once EVERY_S has passed since
    # the request (the 3rd, at 0.3 s), on the clock the request started on.
    clock = ManualClock()
    pieces = ["self", ".", "items", ".", "append", "(x)\n", "z"]
    step = 0.1
    due = math.ceil(round(EVERY_S / step, 6))  # the token that goes out first
    assert due < 6, "EVERY_S changed: give the line more tokens"
    backend = ClockedBackend(pieces, clock, step)
    engine = engine_for(backend, clock=clock, multiline="never")
    engine.documents.open(URI, "def f(x):\n    \n", 1)
    partials: list[tuple[float, str]] = []
    request = asyncio.ensure_future(
        engine.complete(
            URI, Position(1, 4), on_partial=lambda text: partials.append((clock.now(), text))
        )
    )
    await until(lambda: clock.sleepers)  # the generation waits for its first token
    for _ in pieces:
        if request.done():
            break
        await clock.advance(step)
    result = await asyncio.wait_for(request, 10)  # a hang guard, not a measure
    assert result.text == "self.items.append(x)"
    assert partials, "no partial before the answer"
    first_at, first = partials[0]
    assert first_at == pytest.approx(due * step) and first == "".join(pieces[:due])
    # The answer's total is on the same clock as the pacing: the line ended at 0.6 s.
    assert result.total_ms == pytest.approx(6 * step * 1000.0)
    await engine.aclose()


async def test_a_fill_in_the_middle_of_a_line_sends_no_partial() -> None:
    # Its text is trimmed against the rest of the line only at the end: a partial `, 2)`
    # accepted in the real VS Code left `add(1, 2))`.
    backend = ScriptedBackend([",", " 2", ")", "\n"], delay=0.15)
    engine = engine_for(backend)
    engine.documents.open(URI, "total = add(1)\n", 1)
    partials: list[str] = []
    result = await engine.complete(URI, Position(0, 13), on_partial=partials.append)
    assert result.text.startswith(", 2") and partials == []
