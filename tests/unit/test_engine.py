"""The completion engine with a scripted backend: latest-wins, staleness, typed-ahead reuse,
time budget, partial results and prefetch. No model."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from fakes.completion import (
    URI,
    ColdCacheBackend,
    ScriptedBackend,
    SlowToStopBackend,
    SteppedBackend,
    engine_for,
)
from fakes.timing import settled, until
from kode.backends.base import (
    FinishReason,
)
from kode.backends.errors import DocumentError, Superseded
from kode.completion.clock import ManualClock
from kode.completion.documents import Position, Range
from kode.completion.engine import CompletionEngine
from kode.completion.preparation import READ_AHEAD_DELAY_S


def type_text(engine: CompletionEngine, version: int, at: Position, text: str) -> None:
    engine.documents.change(URI, version, [(text, Range(at, at))])
    engine.document_changed(URI)


async def test_completion_streams_partials_and_applies_stop_rules() -> None:
    backend = ScriptedBackend(["total = 0\n", "    for x in xs:\n", "        total += x\n", "def"])
    engine = engine_for(backend)
    engine.documents.open(URI, "def f(xs):\n    \n", 1)
    partials: list[str] = []
    result = await engine.complete(URI, Position(1, 4), on_partial=partials.append)
    assert result.text == "total = 0\n    for x in xs:\n        total += x"
    assert partials and all(b.startswith(a) for a, b in itertools.pairwise(partials))
    assert backend.generations[0].cancelled  # the stop rule stopped the generation


async def test_latest_request_wins_and_the_old_generation_is_cancelled() -> None:
    backend = ScriptedBackend(["x"] * 50, delay=0.02)
    engine = engine_for(backend, multiline="always")
    engine.documents.open(URI, "a = ", 1)
    first = asyncio.ensure_future(engine.complete(URI, Position(0, 4)))
    await until(lambda: backend.generations and backend.generations[0].stats.completion_tokens)
    engine.documents.change(URI, 2, [("a = 1\nb = ", None)])
    engine.document_changed(URI)
    second = asyncio.ensure_future(engine.complete(URI, Position(1, 4)))
    with pytest.raises(Superseded):
        await first
    assert (await second).text
    assert backend.generations[0].stats.finish_reason is FinishReason.CANCELLED
    assert backend.generations[0].stats.completion_tokens < 50


async def test_typed_ahead_answers_from_the_live_suggestion_without_generating() -> None:
    backend = ScriptedBackend(["return ", "a ", "+ ", "b"])
    engine = engine_for(backend)
    engine.documents.open(URI, "def add(a, b):\n    \n", 1)
    first = await engine.complete(URI, Position(1, 4))
    assert first.text == "return a + b"
    type_text(engine, 2, Position(1, 4), "ret")
    second = await engine.complete(URI, Position(1, 7))
    assert second.text == "urn a + b"
    assert second.from_cache
    assert len(backend.requests) == 1  # no new generation
    # Typing something else drops it and generates anew.
    type_text(engine, 3, Position(1, 7), "X")
    await engine.complete(URI, Position(1, 8))
    assert len(backend.requests) == 2


async def test_a_selected_completion_item_is_completed_as_if_accepted() -> None:
    # `if n|` with `number` selected in the editor's completion list: the prompt holds
    # `if number`, the answer continues after it, the stored document is unchanged.
    backend = ScriptedBackend([" > 1:"])
    engine = engine_for(backend)
    engine.documents.open(URI, "def f(number):\n    if n\n", 1)
    item = Range(Position(1, 7), Position(1, 8))
    result = await engine.complete(URI, Position(1, 8), selected=(item, "number"))
    assert result.text == " > 1:"
    assert result.position == Position(1, 13)  # after `number`, where the answer goes
    assert "if number" in backend.requests[0].prompt
    assert "if n\n" in engine.documents.get(URI).text
    # Accepting the item makes the document what the suggestion was made for: answered
    # from it, without a new generation.
    engine.documents.change(URI, 2, [("number", item)])
    engine.document_changed(URI)
    after = await engine.complete(URI, Position(1, 13))
    assert (after.text, after.from_cache, len(backend.requests)) == (" > 1:", True, 1)
    # Without the item, `if n` is a different text: a new generation.
    type_text(engine, 3, Position(1, 13), "\n    if n")
    await engine.complete(URI, Position(2, 8))
    assert len(backend.requests) == 2


async def test_a_selected_item_that_does_not_hold_the_cursor_is_refused() -> None:
    engine = engine_for(ScriptedBackend(["x"]))
    engine.documents.open(URI, "if n\n", 1)
    elsewhere = Range(Position(0, 0), Position(0, 2))
    with pytest.raises(DocumentError, match="does not hold the cursor"):
        await engine.complete(URI, Position(0, 4), selected=(elsewhere, "if"))


async def test_typing_into_a_running_suggestion_keeps_it_running() -> None:
    backend = ScriptedBackend(["value", " = ", "compute", "(", ")"], delay=0.05)
    engine = engine_for(backend)
    engine.documents.open(URI, "x = 1\n", 1)
    pending = asyncio.ensure_future(engine.complete(URI, Position(1, 0)))
    await until(lambda: backend.generations and backend.generations[0].stats.completion_tokens)
    type_text(engine, 2, Position(1, 0), "va")
    with pytest.raises(Superseded):
        await pending  # answered for the old version: dropped
    result = await engine.complete(URI, Position(1, 2))
    assert result.text == "lue = compute()"
    assert len(backend.requests) == 1
    assert backend.generations[0].stats.finish_reason is FinishReason.END


async def test_time_budget_returns_what_is_ready_and_keeps_generating() -> None:
    backend = SteppedBackend(["a\n", "b\n", "c\n", "d"])
    clock = ManualClock()
    engine = engine_for(backend, clock=clock, timeBudgetMs=150, multiline="always")
    engine.documents.open(URI, "", 1)
    early = asyncio.ensure_future(engine.complete(URI, Position(0, 0)))
    await until(lambda: backend.requests)  # asked at time 0
    await clock.advance(0.1)
    backend.release()  # "a\n" within the budget
    await clock.advance(0.1)  # 200 ms: past the 150 ms budget
    assert (await early).text == "a"
    for _ in range(3):
        backend.release()  # the generation goes on behind the answer
    later = await engine.complete(URI, Position(0, 0))
    assert later.text == "a\nb\nc\nd"
    assert len(backend.requests) == 1


async def test_accepting_a_suggestion_prefetches_the_next() -> None:
    backend = ScriptedBackend(["pass"])
    engine = engine_for(backend)
    engine.documents.open(URI, "def f():\n    \n", 1)
    result = await engine.complete(URI, Position(1, 4))
    assert result.text == "pass"
    type_text(engine, 2, Position(1, 4), "pass")  # accept
    await until(lambda: engine.preparation.prefetches)
    assert engine.preparation.prefetches == 1
    assert len(backend.requests) == 2
    nxt = await engine.complete(URI, Position(1, 8))
    assert nxt.from_cache
    await engine.aclose()


async def test_typing_before_the_suggestion_has_text_does_not_answer_empty() -> None:
    # Found in Neovim in a terminal: right after an accept, the prefetched suggestion had
    # no text yet, so whatever was typed counted as typed into it; when it finished with
    # other text, the request was answered with nothing. A new generation answers it.
    backend = SteppedBackend(["\n", "    return 1"])
    engine = engine_for(backend)
    engine.documents.open(URI, "def f():\n    x = 1\n", 1)
    pending = asyncio.ensure_future(engine.complete(URI, Position(2, 0)))
    await until(lambda: backend.generations)  # asked; nothing generated yet
    type_text(engine, 2, Position(2, 0), "print(")
    for _ in range(4):
        backend.release()  # every piece of both generations may come now
    with pytest.raises(Superseded):
        await pending
    result = await engine.complete(URI, Position(2, 6))
    assert result.text, "answered with nothing"
    assert len(backend.requests) == 2


async def test_cancelled_request_stops_its_generation_unless_typed_into() -> None:
    backend = ScriptedBackend(["y"] * 100, delay=0.02)
    engine = engine_for(backend, multiline="always")
    engine.documents.open(URI, "", 1)
    task = asyncio.ensure_future(engine.complete(URI, Position(0, 0)))
    await until(lambda: backend.generations and backend.generations[0].stats.completion_tokens)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stats = await backend.generations[0].wait()
    assert stats.finish_reason is FinishReason.CANCELLED


async def test_cancel_before_the_edit_still_keeps_a_typed_into_suggestion() -> None:
    """Some clients send $/cancelRequest before the didChange that caused it."""
    backend = ScriptedBackend(["value", " = ", "compute", "(", ")"], delay=0.05)
    engine = engine_for(backend)
    engine.documents.open(URI, "x = 1\n", 1)
    task = asyncio.ensure_future(engine.complete(URI, Position(1, 0)))
    await until(lambda: backend.generations and backend.generations[0].stats.completion_tokens)
    task.cancel()  # the cancel comes first ...
    with pytest.raises(asyncio.CancelledError):
        await task
    type_text(engine, 2, Position(1, 0), "va")  # ... then the edit
    result = await engine.complete(URI, Position(1, 2))
    assert result.text == "lue = compute()"
    assert len(backend.requests) == 1


async def test_read_ahead_evaluates_a_new_document_and_yields_to_the_first_request() -> None:
    backend = ScriptedBackend(["x"] * 40, delay=0.02)
    clock = ManualClock()
    engine = engine_for(backend, clock=clock)
    text = "def f(a):\n    return a\n\n\ndef g(b):\n    \n"
    engine.documents.open(URI, text, 1)
    engine.document_opened(URI)
    await until(lambda: clock.sleepers)  # the read-ahead waits its delay
    await clock.advance(READ_AHEAD_DELAY_S)
    await until(lambda: engine.preparation.read_aheads == 1)
    (warm,) = backend.requests
    assert warm.max_tokens == 1
    assert "def g(b):\n    \n<|fim_suffix|><|fim_middle|>" in warm.prompt  # cursor at the end
    result = await engine.complete(URI, Position(5, 4))
    assert result.text
    assert backend.generations[0].cancelled or backend.generations[0].stats.completion_tokens == 1
    # The real request's prompt starts like the read-ahead's: its cache entries are reused.
    real = backend.requests[1].prompt
    head = real.split("<|fim_prefix|>")[0] + "<|fim_prefix|>def f(a):"
    assert warm.prompt.startswith(head)


async def test_read_ahead_is_skipped_when_off_too_big_or_already_requested() -> None:
    backend = ScriptedBackend(["x"], delay=0.01)
    engine = engine_for(backend, clock=ManualClock(), readAhead=False)
    engine.documents.open(URI, "a = 1\n", 1)
    engine.document_opened(URI)
    assert not engine.background  # nothing waits to read ahead
    assert backend.requests == []
    # A document longer than the prefix window: its anchor depends on the cursor.
    clock = ManualClock()
    engine = engine_for(backend, clock=clock, prefixTokens=8)
    engine.documents.open(URI, "".join(f"x{i} = {i}\n" for i in range(50)), 1)
    engine.document_opened(URI)
    await until(lambda: clock.sleepers)  # the read-ahead waits its delay
    await clock.advance(READ_AHEAD_DELAY_S)
    await settled(engine)
    assert backend.requests == []
    # The user asked before the delay was over: nothing to read ahead.
    clock = ManualClock()
    engine = engine_for(backend, clock=clock)
    engine.documents.open(URI, "a = 1\nb = ", 1)
    engine.document_opened(URI)
    await engine.complete(URI, Position(1, 4))
    await until(lambda: clock.sleepers)
    await clock.advance(READ_AHEAD_DELAY_S)
    await settled(engine)
    assert len(backend.requests) == 1 and engine.preparation.read_aheads == 0


async def test_partials_grow_by_lines_and_stop_once_the_document_changes() -> None:
    lines = ["a = 1\n", "    b = 2\n", "    c = 3\n", "    d = 4\n", "    e = 5\n"]
    backend = ScriptedBackend(lines * 4, delay=0.03)
    engine = engine_for(backend, multiline="always", maxLines=64)
    engine.documents.open(URI, "def f():\n    \n", 1)
    partials: list[tuple[int, str]] = []

    def on_partial(text: str) -> None:
        partials.append((engine.documents.get(URI).version, text))

    request = asyncio.ensure_future(engine.complete(URI, Position(1, 4), on_partial=on_partial))
    await until(lambda: len(partials) >= 2)
    type_text(engine, 2, Position(1, 4), "#")  # not what was suggested: the answer is stale
    with pytest.raises(Superseded):
        await request
    await asyncio.wait_for(backend.generations[0].wait(), 10)  # no partial can come after
    # Every partial extends the one before, and none was sent for the old version after
    # the edit made it stale.
    assert all(
        b.startswith(a) and len(b) > len(a) for (_, a), (_, b) in itertools.pairwise(partials)
    )
    assert {version for version, _ in partials} == {1}
    assert all(text.endswith(("1", "2", "3", "4", "5")) for _, text in partials)  # whole lines


async def test_working_elsewhere_stops_a_suggestion_no_one_waits_for() -> None:
    """A suggestion that goes on after its answer (here: the time budget answered it)
    would hold the engine, which runs one generation at a time, from the keystroke in
    another document or at another place; typing into it keeps it."""
    other = "file:///p/other.py"
    for elsewhere in ("request", "cursor", "cursor in it"):
        backend = ScriptedBackend(["x = 1\n"] * 200, delay=0.02)
        engine = engine_for(backend, multiline="always", maxLines=400, timeBudgetMs=50)
        engine.documents.open(URI, "a = 0\n", 1)
        engine.documents.open(other, "b = 0\n", 1)
        first = await engine.complete(URI, Position(1, 0))
        assert first.text and not backend.generations[0].cancelled  # it goes on
        if elsewhere == "request":
            await engine.complete(other, Position(1, 0))
        elif elsewhere == "cursor":
            engine.cursor_moved(URI, Position(0, 0))
        else:
            engine.cursor_moved(URI, Position(1, 0))
        kept = elsewhere == "cursor in it"
        assert (engine.live.get(URI) is not None) == kept, elsewhere  # decided at once
        if not kept:
            await until(lambda: backend.generations[0].cancelled)  # noqa: B023 - awaited here
        assert backend.generations[0].cancelled == (not kept), elsewhere
        await engine.aclose()


async def test_closing_ends_the_start_up_timing_as_cancelled() -> None:
    """The window's shutdown cancels its start-up timing rather than closing the backend
    under it (a shared engine's window then reported a failure to the user, #15)."""
    backend = ColdCacheBackend(["x"] * 1000, delay=0.05)
    engine = engine_for(backend, firstAnswerMs=1000)
    warm = asyncio.ensure_future(engine.warm_up())
    await until(lambda: backend.generations)
    async with asyncio.timeout(10):
        await engine.aclose()
        await warm  # ends quietly: no error to tell
    assert backend.requests[0].background and backend.generations[0].cancelled


async def test_a_key_that_contradicts_the_suggestion_does_not_wait_for_it_to_stop() -> None:
    """The next generation is asked for at once; the contradicted one stops meanwhile."""
    backend = SlowToStopBackend(["abc"] * 40)
    engine = engine_for(backend, multiline="always")
    engine.documents.open(URI, "x = ", 1)
    first = asyncio.ensure_future(engine.complete(URI, Position(0, 4)))
    await until(lambda: backend.generations and len(engine.live))
    type_text(engine, 2, Position(0, 4), "z")  # not what the suggestion says
    second = asyncio.ensure_future(engine.complete(URI, Position(0, 5)))
    await until(lambda: len(backend.requests) >= 2)  # before: waited for "stopped", forever
    assert backend.events == ["generate 0", "generate 1"]  # not stopped yet
    backend.stopped.set()
    with pytest.raises(Superseded):
        await first
    assert (await second).text.startswith("abc")
    await engine.aclose()
    assert backend.events.count("stopped") >= 1


async def test_background_preparation_waits_while_a_request_is_answered() -> None:
    """Busy from a request's start, not only once its generation runs: between the
    contradicted suggestion and the new one, preparation must not take the model."""
    engine = engine_for(ScriptedBackend(["a"]))
    engine.live.begin_request(URI, object())
    assert engine.live.busy()
    engine.live.end_request()
    assert not engine.live.busy()
