"""The engine server over a real Unix socket, with an in-memory backend instead of a
model (issue #15): scheduling across windows, cancel on disconnect, status, versions,
the welcome's prefill speed, a silent engine. Fast; no engine process."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from fakes.shared_engine import (
    STEP_S,
    InLoopEngine,
    SlowBackend,
    request,
    text_of,
    window,
)
from kode.backends.base import (
    PREFILL_PROBE,
    Backend,
    FinishReason,
    GenerationRequest,
)
from kode.backends.daemon import protocol as wire
from kode.backends.daemon.connection import Connection
from kode.backends.daemon.paths import EngineLock, EnginePlace
from kode.backends.daemon.server import EngineServer
from kode.backends.errors import BackendClosed, ContextOverflow, EngineError, EngineSetupError


async def test_keystroke_of_another_window_goes_before_background_work(
    place: EnginePlace,
) -> None:
    engine = InLoopEngine(place, SlowBackend(delay=0.2))
    a, b = await window(place), await window(place)
    try:
        read_ahead = a.generate(request("a", background=True, n=1))
        await asyncio.sleep(0.05)  # it runs, no token yet
        key = b.generate(request("b", n=2))
        assert await asyncio.wait_for(text_of(key), STEP_S) == "b:0 b:1 "
        assert not read_ahead.done  # paused, then resumed after the keystroke
        assert await asyncio.wait_for(text_of(read_ahead), STEP_S) == "a:0 "
        assert engine.backend.started == ["a", "b", "a"]
        assert read_ahead.stats.finish_reason is FinishReason.LENGTH
    finally:
        await a.close()
        await b.close()
        await engine.stop()


async def test_a_closed_window_has_its_generation_cancelled(place: EnginePlace) -> None:
    engine = InLoopEngine(place, SlowBackend(delay=0.05))
    a, b = await window(place), await window(place)
    try:
        long = a.generate(request("a", n=1000))
        waiting = a.generate(request("a2", n=5))
        chunks = aiter(long)
        await asyncio.wait_for(anext(chunks), STEP_S)
        await a.close()
        with pytest.raises(BackendClosed, match="closed"):
            await text_of(waiting)
        assert await asyncio.wait_for(text_of(b.generate(request("b", n=2))), STEP_S)
        counters = engine.backend.counters
        assert counters.cancelled == 1 and counters.generations == 2
        assert engine.backend.started == ["a", "b"]  # a2 never ran
    finally:
        await b.close()
        await engine.stop()


async def test_cancel_errors_and_status(place: EnginePlace) -> None:
    engine = InLoopEngine(place, SlowBackend(delay=0.05))
    a = await window(place)
    try:
        generation = a.generate(request("a", n=1000))
        await asyncio.wait_for(anext(aiter(generation)), STEP_S)
        await asyncio.wait_for(generation.cancel(), STEP_S)
        assert generation.stats.finish_reason is FinishReason.CANCELLED
        with pytest.raises(ContextOverflow, match="exceeds the context window"):
            await text_of(a.generate(GenerationRequest(prompt="overflow", max_tokens=1)))
        status = await a.status()
        assert status["windows"] == 1 and status["model"] == "fake.gguf"
        assert status["counters"]["cancelled"] == 1
    finally:
        await a.close()
        await engine.stop()
    assert not place.socket.exists()
    assert engine.backend.closed


async def test_the_engine_refuses_a_folder_at_its_socket_path_in_one_sentence(
    place: EnginePlace,
) -> None:
    place.socket.mkdir()
    lock = EngineLock(place.lock)
    assert lock.acquire()

    async def load() -> Backend:
        raise AssertionError("no model is loaded for an engine that cannot listen")

    try:
        server = EngineServer(place, load, idle_s=60, time_prefill=False)
        with pytest.raises(EngineSetupError, match="is a folder, where the engine's socket"):
            await asyncio.wait_for(server.run(signals=False), STEP_S)
        assert place.socket.is_dir()  # left to the user
    finally:
        lock.release()


async def test_a_window_asking_for_another_engine_is_refused(place: EnginePlace) -> None:
    engine = InLoopEngine(place, SlowBackend())
    first = await window(place)  # the engine is up
    try:
        with pytest.raises(EngineSetupError, match="the window asked for kode-other"):
            await Connection.open(
                str(place.socket), fingerprint="kode-other", window=True, timeout_s=STEP_S
            )
    finally:
        await first.close()
        await engine.stop()


async def test_a_later_window_learns_the_prefill_speed(place: EnginePlace) -> None:
    engine = InLoopEngine(place, SlowBackend(delay=0.01))
    first = await window(place)
    try:
        assert first.welcome.prefill_tokens_per_s is None
        prompt = "x" * 200  # 200 "tokens" evaluated in 100 ms
        await text_of(first.generate(GenerationRequest(prompt=prompt, max_tokens=1)))
        second = await window(place)
        assert second.welcome.prefill_tokens_per_s == pytest.approx(2000.0)
        await second.close()
    finally:
        await first.close()
        await engine.stop()


async def test_the_first_window_is_welcomed_with_the_prefill_speed(place: EnginePlace) -> None:
    """The engine times a synthetic prompt before it welcomes anyone, so no window times
    one itself (behind other work, or cut short by its first keystroke, #15)."""
    engine = InLoopEngine(place, SlowBackend(delay=0.01), time_prefill=True)
    first = await window(place)
    try:
        # the fake evaluates a prompt of n characters in 100 ms
        rate = len(PREFILL_PROBE) / 0.1
        assert first.welcome.prefill_tokens_per_s == pytest.approx(rate)
        assert engine.backend.started == [""] and engine.server.served == 0
    finally:
        await first.close()
        await engine.stop()


async def test_a_window_closing_its_connection_does_not_blame_the_engine(
    place: EnginePlace,
) -> None:
    """A generation still waiting when the window closes (its shutdown, its settings
    changed) ends with words that say so, as ``BackendClosed``, which the language
    server answers empty and never shows (#34), and nothing is moved to a restarted
    engine (#15, fault 2)."""
    engine = InLoopEngine(place, SlowBackend(delay=5.0))
    conn = await window(place)
    lost: list[int] = []
    conn.on_lost = lambda generations: bool(lost.append(len(generations)))
    try:
        generation = conn.generate(request("w", n=2))
        await asyncio.sleep(0.1)  # sent and running: no token yet
        await asyncio.wait_for(conn.close(), STEP_S)
        with pytest.raises(BackendClosed, match="this window closed its connection") as raised:
            await asyncio.wait_for(text_of(generation), STEP_S)
        assert "pid" not in str(raised.value) and not lost
    finally:
        await engine.stop()


async def test_a_silent_engine_is_given_up_with_a_clear_error(tmp_path: Path) -> None:
    """An engine that welcomes the window and then says nothing more (its event loop
    hangs): the generation fails within the watchdog's time, saying so."""
    path = tmp_path / "silent.sock"
    welcome = wire.Welcome(
        protocol=wire.PROTOCOL_VERSION,
        kode_version="test",
        pid=4242,
        socket=str(path),
        engine="fake",
        model="fake.gguf",
    )
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await wire.read_frame(reader)  # the hello
        writer.write(wire.encode(welcome))
        held.append(writer)  # and never a word again

    server = await asyncio.start_unix_server(silent, path=str(path))
    try:
        conn = await Connection.open(
            str(path), fingerprint="x", window=True, timeout_s=STEP_S, silent_s=0.3
        )
        hung: list[int] = []
        conn.on_hung = hung.append
        generation = conn.generate(request("s"))
        with pytest.raises(EngineError, match=r"\(pid 4242\) stopped answering") as raised:
            await asyncio.wait_for(text_of(generation), STEP_S)
        assert "during a request" in str(raised.value)
        assert hung == [os.getpid()] and conn.closed
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
