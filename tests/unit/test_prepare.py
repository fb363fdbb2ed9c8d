"""Every place fast, without a model: the latency budget picks a window that fits the
prefill speed (injected, never timed), the cursor notification prepares windows in the
background, and any request cancels that background work."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fakes.completion import (
    NO_READ_AHEAD,
    URI,
    CachingBackend,
    PrefillTimedBackend,
    ScriptedBackend,
    engine_for,
)
from fakes.timing import settled, until
from kode.backends.base import PREFILL_PROBE, PromptCache
from kode.completion.documents import Position, Range, file_name

# 400 lines of four "tokens" each (the scripted backend counts whitespace-separated words).
DOC = "".join(f"value_{i} = compute ( {i} )\n" for i in range(400))


def test_the_fake_declares_the_prompt_cache_protocol() -> None:
    assert isinstance(CachingBackend(["x"]), PromptCache)
    assert not isinstance(ScriptedBackend(["x"]), PromptCache)


async def test_a_slow_prefill_answers_from_a_window_that_fits_the_budget() -> None:
    backend = CachingBackend([" + 1"])
    # 100 tokens/s and 1,000 ms: at most 100 tokens may be evaluated for the answer.
    engine = engine_for(backend, rate=100.0, defaults=NO_READ_AHEAD, firstAnswerMs=1000)
    engine.documents.open(URI, DOC, 1)
    result = await engine.complete(URI, Position(390, 10))
    assert result.text
    prompt = backend.requests[-1].prompt.split()
    assert len(prompt) <= 100 + 10  # + the template's few header tokens
    assert engine.short_answers == 1
    # The next request at that place reuses the short window (its cache): still short,
    # and nearly nothing left to evaluate.
    await engine.complete(URI, Position(390, 12))
    cached, total = backend.cached_prefix(backend.requests[-1].prompt)
    assert total <= 110 and total - cached <= 30


async def test_a_fast_prefill_uses_the_full_window() -> None:
    backend = CachingBackend([" + 1"])
    engine = engine_for(backend, rate=100_000.0, defaults=NO_READ_AHEAD, firstAnswerMs=1000)
    engine.documents.open(URI, DOC, 1)
    await engine.complete(URI, Position(390, 10))
    assert len(backend.requests[-1].prompt.split()) > 900
    assert engine.short_answers == 0


async def test_budget_off_always_uses_the_full_window() -> None:
    backend = CachingBackend([" + 1"])
    engine = engine_for(backend, rate=10.0, defaults=NO_READ_AHEAD, firstAnswerMs=0)
    engine.documents.open(URI, DOC, 1)
    await engine.complete(URI, Position(390, 10))
    assert len(backend.requests[-1].prompt.split()) > 900


async def test_the_cursor_notification_prepares_a_short_then_the_full_window() -> None:
    backend = CachingBackend(["x"])
    engine = engine_for(backend, rate=100.0, defaults=NO_READ_AHEAD, firstAnswerMs=1000)
    engine.documents.open(URI, DOC, 1)
    engine.cursor_moved(URI, Position(390, 10))
    await until(lambda: engine.preparation.prepared >= 2)
    short, full = backend.requests[0], backend.requests[1]
    assert short.max_tokens == full.max_tokens == 1
    # 2.5 s of reading at 100 tokens/s: about 250 tokens first, then the whole window.
    assert len(short.prompt.split()) <= 250 + 10
    assert len(full.prompt.split()) > 900
    await settled(engine)
    assert len(backend.requests) == 2  # nothing left to prepare
    # The keystroke there now finds the full window evaluated: it uses it.
    await engine.complete(URI, Position(390, 10))
    assert backend.requests[-1].prompt == full.prompt
    assert engine.short_answers == 0
    assert backend.requests[-1].max_tokens > 1  # a real generation, not the prepared one
    await engine.aclose()


async def test_the_debug_log_says_which_window_in_sizes_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="kode.completion")
    backend = CachingBackend([" + 1"])
    engine = engine_for(backend, rate=100.0, defaults=NO_READ_AHEAD, firstAnswerMs=1000)
    engine.documents.open(URI, DOC, 1)
    engine.cursor_moved(URI, Position(390, 10))
    await until(lambda: engine.preparation.prepared >= 2 and not engine.preparation.preparing)
    await engine.complete(URI, Position(390, 10))
    await engine.complete(URI, Position(100, 10))  # a cold place: a new short window
    await engine.aclose()
    name = file_name(URI)
    assert f"preparing {name}: short, new window, " in caplog.text
    assert "prompt tokens to evaluate" in caplog.text
    assert f"prepared {name}: its full window is evaluated" in caplog.text
    assert f"window for {name}: full, 0 prompt tokens to evaluate" in caplog.text
    assert f"window for {name}: short, new, 100 prompt tokens to evaluate" in caplog.text
    assert "the full window would evaluate" in caplog.text
    assert "compute" not in caplog.text and "value_" not in caplog.text  # no code


async def test_the_first_place_after_start_up_learns_the_speed_before_its_window() -> None:
    # Seen through `kode -vv lsp`: a cursor announced right after start-up was prepared
    # with the full window (the speed still unknown), and the keystroke 4 s later
    # answered from a new short one, its evaluated work lost.
    backend = PrefillTimedBackend(["x"])

    engine = engine_for(backend, defaults=NO_READ_AHEAD, firstAnswerMs=1000)
    assert engine.rate.value is None
    engine.documents.open(URI, DOC, 1)
    engine.cursor_moved(URI, Position(390, 10))
    await until(lambda: engine.preparation.prepared >= 1)
    assert len(backend.requests) >= 2, [len(r.prompt.split()) for r in backend.requests]
    probe, first = backend.requests[0], backend.requests[1]
    assert probe.prompt == PREFILL_PROBE  # timed first, once
    assert sum(r.prompt == PREFILL_PROBE for r in backend.requests) == 1
    assert engine.rate.value == 100.0
    assert len(first.prompt.split()) <= 250 + 10  # a window ready within the pause
    await engine.aclose()


async def test_a_request_cancels_background_preparation() -> None:
    backend = CachingBackend(["x"] * 100, delay=0.05)  # preparation that would take 5 s
    engine = engine_for(backend, rate=100_000.0, defaults=NO_READ_AHEAD, firstAnswerMs=1000)
    engine.documents.open(URI, DOC, 1)
    engine.documents.open("file:///p/other.py", "def f():\n    ", 1)
    engine.cursor_moved(URI, Position(390, 10))
    await until(lambda: len(backend.generations) == 1)
    backend.pieces = ["y"]
    # A request in another document: the preparation stops at once.
    async with asyncio.timeout(2):
        await engine.complete("file:///p/other.py", Position(1, 4))
    assert backend.generations[0].cancelled
    await engine.aclose()


async def test_closing_the_document_stops_its_preparation() -> None:
    backend = CachingBackend(["x"] * 100, delay=0.05)  # preparation that would take 5 s
    engine = engine_for(backend, rate=100_000.0, defaults=NO_READ_AHEAD, firstAnswerMs=1000)
    engine.documents.open(URI, DOC, 1)
    engine.cursor_moved(URI, Position(390, 10))
    await until(lambda: len(backend.generations) == 1)
    await engine.cancel(URI)
    engine.close_document(URI)
    await until(lambda: backend.generations[0].cancelled)
    await engine.aclose()


async def test_a_tab_opened_meanwhile_is_not_read_ahead_over_the_active_file() -> None:
    backend = CachingBackend([" + 1"])
    engine = engine_for(backend, rate=100_000.0, defaults=NO_READ_AHEAD, readAhead=True)
    engine.documents.open(URI, DOC, 1)
    await engine.complete(URI, Position(390, 10))  # the user works in URI
    other = "file:///p/tab.py"
    engine.documents.open(other, "def g():\n    return 1\n", 1)
    engine.document_opened(other)
    await settled(engine)  # the read-ahead waited its delay and decided
    assert engine.preparation.read_aheads == 0
    assert all(r.prompt.count("def g") == 0 for r in backend.requests)
    await engine.aclose()


async def test_a_resting_cursor_at_the_end_of_a_line_gets_its_suggestion_before_a_key() -> None:
    backend = CachingBackend(["value", "_1", "\n"])
    engine = engine_for(
        backend, rate=100_000.0, defaults=NO_READ_AHEAD, firstAnswerMs=1000, multiline="never"
    )
    engine.documents.open(URI, DOC + "total = ", 1)
    engine.cursor_moved(URI, Position(400, 8))
    await until(lambda: engine.preparation.prefetches == 1)
    await until(lambda: not engine.live.busy())
    suggestions = [r for r in backend.requests if r.max_tokens > 1]
    assert len(suggestions) == 1 and suggestions[0].background  # yields to keystrokes
    # The first key types into it: answered from it, nothing new generated.
    engine.documents.change(URI, 2, [("v", Range(Position(400, 8), Position(400, 8)))])
    engine.document_changed(URI)
    result = await engine.complete(URI, Position(400, 9))
    assert result.text == "alue_1" and result.from_cache
    assert engine.typed_ahead_hits == 1
    assert [r for r in backend.requests if r.max_tokens > 1] == suggestions


async def test_the_suggestion_from_a_short_window_is_remade_from_the_full_one() -> None:
    backend = CachingBackend(["value", "_1", "\n"])
    engine = engine_for(
        backend, rate=100.0, defaults=NO_READ_AHEAD, firstAnswerMs=1000, multiline="never"
    )
    engine.documents.open(URI, DOC + "total = ", 1)
    engine.cursor_moved(URI, Position(400, 8))
    await until(lambda: engine.preparation.prefetches == 2, 10)
    await until(lambda: not engine.preparation.preparing)
    kinds = ["prepare" if r.max_tokens == 1 else "suggest" for r in backend.requests]
    assert kinds == ["prepare", "suggest", "prepare", "suggest"]
    short, full = backend.requests[1].prompt.split(), backend.requests[3].prompt.split()
    assert len(short) <= 250 + 10 < 900 < len(full)
    await engine.complete(URI, Position(400, 8))
    assert engine.typed_ahead_hits == 1 and engine.short_answers == 0
    assert len(backend.requests) == 4


async def test_no_suggestion_is_made_mid_line_or_with_prefetch_off() -> None:
    for settings, doc, at in (
        ({}, DOC, Position(390, 10)),  # text after the cursor: no ghost text shows there
        ({"prefetch": False}, DOC + "total = ", Position(400, 8)),
    ):
        backend = CachingBackend(["value", "\n"])
        engine = engine_for(
            backend, rate=100_000.0, defaults=NO_READ_AHEAD, firstAnswerMs=1000, **settings
        )
        engine.documents.open(URI, doc, 1)
        engine.cursor_moved(URI, at)
        await until(lambda: engine.preparation.prepared >= 1)  # noqa: B023 - awaited in the loop
        await settled(engine)
        assert engine.preparation.prefetches == 0
        assert all(r.max_tokens == 1 for r in backend.requests)
        await engine.aclose()


async def test_a_suggestion_made_with_the_selected_item_survives_the_cursors_rest() -> None:
    # VS Code asks with its suggest widget's item (`number` over `n`); the suggestion is
    # made for the text with the item in it, so it starts at another offset than the
    # cursor. The cursor's rest there must neither stop it nor replace it with one made
    # without the item (Tab then took an older, shorter suggestion in the real editor).
    backend = CachingBackend([" < 0:", "\n", "        return 0\n"], delay=0.05)
    engine = engine_for(backend, rate=100_000.0, defaults=NO_READ_AHEAD, firstAnswerMs=1000)
    engine.documents.open(URI, DOC + "if n", 1)
    item = (Range(Position(400, 3), Position(400, 4)), "number")
    result = await engine.complete(URI, Position(400, 4), selected=item)
    assert result.text.startswith(" < 0:")
    engine.cursor_moved(URI, Position(400, 4))
    await settled(engine)  # preparation waited for a quiet moment and decided
    assert engine.preparation.prefetches == 0
    assert [r.max_tokens > 1 for r in backend.requests].count(True) == 1
