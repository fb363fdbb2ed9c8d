"""Issue #51 bug 4: no generation is left that nobody cancels. A document's suggestion
replaced by another is stopped; a prefetch whose generation started while a request came
never takes the request's place; a closed document's generation is stopped."""

from __future__ import annotations

import asyncio

from fakes.completion import URI, GatedBackgroundBackend, ScriptedBackend, engine_for
from fakes.timing import settled, until
from kode.completion.documents import Position


async def test_a_suggestion_installed_retires_the_one_there() -> None:
    backend = ScriptedBackend(["a"] * 500)
    engine = engine_for(backend, readAhead=False, prefetch=False)
    engine.documents.open(URI, "x = ", 1)
    doc = engine.documents.get(URI)
    first, _ = await engine.live.start(URI, doc, 4, backend, None)
    second, _ = await engine.live.start(URI, doc, 4, backend, None)
    assert engine.live.get(URI) is second
    await until(lambda: backend.generations[0].cancelled)
    assert not backend.generations[1].cancelled
    await engine.aclose()
    assert first.done.is_set()


async def test_a_prefetch_that_started_during_a_request_is_stopped_not_installed() -> None:
    backend = GatedBackgroundBackend(["a"] * 20)
    engine = engine_for(backend, readAhead=False, prefetch=True, multiline="always")
    engine.documents.open(URI, "x = ", 1)
    doc = engine.documents.get(URI)
    engine.preparation.aim(URI, doc, 4)
    prefetch = asyncio.ensure_future(engine.preparation.suggest_at_cursor(URI, doc, 4, backend))
    await until(lambda: backend.waiting == 1)  # its generation is being started
    request = asyncio.ensure_future(engine.complete(URI, Position(0, 4)))
    await until(lambda: len(backend.generations) == 1)  # the request's, not gated
    backend.gate.set()
    answer = await request
    await prefetch
    assert answer.text.startswith("a")
    assert len(backend.generations) == 2
    mine, prefetched = backend.generations
    assert prefetched.cancelled  # stopped, never installed
    live = engine.live.get(URI)
    assert live is not None and live.generation is mine
    assert engine.preparation.prefetches == 0
    await engine.aclose()


async def test_closing_a_document_stops_its_generation_at_once() -> None:
    backend = ScriptedBackend(["a"] * 500)
    engine = engine_for(backend, readAhead=False, prefetch=False)
    engine.documents.open(URI, "x = ", 1)
    doc = engine.documents.get(URI)
    await engine.live.start(URI, doc, 4, backend, None)
    engine.close_document(URI)  # synchronous: nothing is awaited
    assert URI not in engine.documents
    assert engine.live.get(URI) is None
    await until(lambda: backend.generations[0].cancelled)
    await settled(engine)
    await engine.aclose()
