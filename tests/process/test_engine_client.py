"""A window's client of the engine (``SharedEngineBackend``) over a real Unix socket,
with an in-memory backend instead of a model (issue #15): restart once then fall back,
spawn at most once, keystrokes in flight when the engine dies, token healing, the hang
watchdog. Fast; no engine process."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from pathlib import Path

import pytest
from fakes.shared_engine import (
    STEP_S,
    InLoopEngine,
    SlowBackend,
    SlowGeneration,
    StuckBackend,
    client_window,
    request,
    shared_backend,
    text_of,
)
from kode.backends.base import (
    ChunkAssembly,
    FinishReason,
    GenerationRequest,
    PrefillSpeed,
    PromptCache,
    TokenHealing,
)
from kode.backends.daemon.engine_backend import MAX_RESTARTS
from kode.backends.daemon.paths import EngineConfig, EnginePlace
from kode.backends.errors import BackendClosed


async def test_the_client_restarts_a_dead_engine_once_then_falls_back(
    place: EnginePlace, tmp_path: Path
) -> None:
    engines: list[InLoopEngine] = []
    notices: list[str] = []
    loop = asyncio.get_running_loop()

    def spawn(_config: EngineConfig, p: EnginePlace) -> int:
        # called on a worker thread, as the real one starts a process from there
        loop.call_soon_threadsafe(lambda: engines.append(InLoopEngine(p, SlowBackend(delay=0.01))))
        return 0  # no process to watch

    backend, fallback = shared_backend(place, tmp_path, [], notices)
    backend.engine.spawn = spawn  # engines that run, in this loop
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        assert len(engines) == 1 and backend.engine_info["kind"] == "shared"
        assert await text_of(await backend.generate(request("x", n=2))) == "x:0 x:1 "
        assert backend.cached_prefix("prompt of x and more")[0] == len("prompt of x")
        await engines[0].stop()  # the engine dies under the window
        await asyncio.sleep(0.05)
        assert await text_of(await backend.generate(request("y", n=1))) == "y:0 "
        assert len(engines) == 2 and backend.engine.restarts == 1 and not notices
        await engines[1].stop()  # and again: the window loads its own model
        await asyncio.sleep(0.05)
        assert await text_of(await backend.generate(request("z", n=1))) == "z:0 "
        assert backend.engine_info["kind"] == "inProcess" and fallback.started == ["z"]
        assert len(notices) == 1 and "stopped again" in notices[0]
        assert backend.counters.generations == 2  # the engine's; the fallback counts its own
    finally:
        await backend.aclose()
        for engine in engines:
            if not engine.task.done():
                await engine.stop()


async def test_a_folder_at_the_socket_path_is_said_once_and_no_engine_spawned(
    place: EnginePlace, tmp_path: Path
) -> None:
    """#34: a folder where the socket goes made a window spawn 73 engines, each dying
    on it, and answer only after the 180 s start timeout."""
    place.socket.mkdir()
    spawned: list[int] = []
    notices: list[str] = []
    backend, fallback = shared_backend(place, tmp_path, spawned, notices)
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        assert await text_of(await backend.generate(request("x", n=1))) == "x:0 "
        assert spawned == [] and fallback.started == ["x"]
        assert len(notices) == 1, notices
        assert f"{place.socket} is a folder" in notices[0] and f"rmdir {place.socket}" in notices[0]
    finally:
        await backend.aclose()


async def test_an_engine_that_ends_as_it_starts_is_spawned_once(
    place: EnginePlace, tmp_path: Path
) -> None:
    spawned: list[int] = []
    notices: list[str] = []
    backend, _ = shared_backend(place, tmp_path, spawned, notices)
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        assert spawned == [0] and backend.engine_info["kind"] == "inProcess"
        assert len(notices) == 1 and "ended before it answered" in notices[0]
        assert str(place.log) in notices[0]
    finally:
        await backend.aclose()


async def test_an_engine_dying_as_the_window_connects_is_started_again(
    place: EnginePlace, tmp_path: Path
) -> None:
    """An engine that accepts the window and dies with its hello unread (a window
    reconnecting at once after its engine was killed reaches its closing listener) resets
    the connection: that is an engine gone, so one is started (here one that ends at
    once), not a fall back for "not available (ConnectionResetError)" (a loaded run of
    ``test_an_engine_killed_under_a_window_is_restarted`` failed so)."""
    listener = socket.socket(socket.AF_UNIX)
    listener.settimeout(STEP_S)  # accept is bounded: closing it does not wake a thread
    listener.bind(str(place.socket))
    listener.listen()

    def die_on_the_first_window() -> None:
        conn, _ = listener.accept()
        conn.settimeout(STEP_S)
        conn.recv(1, socket.MSG_PEEK)  # the hello is here, unread
        conn.close()
        listener.close()

    dying = threading.Thread(target=die_on_the_first_window, daemon=True)
    dying.start()
    spawned: list[int] = []
    notices: list[str] = []
    backend, _ = shared_backend(place, tmp_path, spawned, notices)
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        assert spawned == [0], notices
        assert len(notices) == 1 and "ended before it answered" in notices[0], notices
    finally:
        await backend.aclose()
        listener.close()
        dying.join(STEP_S)


async def test_a_keystroke_in_flight_when_the_engine_dies_is_answered(
    place: EnginePlace, tmp_path: Path
) -> None:
    engines: list[InLoopEngine] = [InLoopEngine(place, SlowBackend(delay=5.0))]
    loop = asyncio.get_running_loop()

    def spawn(_config: EngineConfig, p: EnginePlace) -> int:
        loop.call_soon_threadsafe(lambda: engines.append(InLoopEngine(p, SlowBackend(delay=0.01))))
        return 0

    backend = client_window(place, tmp_path)
    backend.engine.spawn = spawn
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        generation = await backend.generate(request("k", n=2))
        await asyncio.sleep(0.2)  # running, no token yet
        for w in list(engines[0].server.windows.values()):
            w.writer.transport.abort()  # the engine dies: connections reset
        engines[0].server.stop("crash")
        assert await asyncio.wait_for(text_of(generation), STEP_S) == "k:0 k:1 "
        assert backend.engine.restarts == 1 and len(engines) == 2
    finally:
        await backend.aclose()
        for engine in engines:
            if not engine.task.done():
                await engine.stop()


async def test_a_keystroke_in_flight_when_the_engine_cannot_come_back_runs_on_the_fallback(
    place: EnginePlace, tmp_path: Path
) -> None:
    """The engine dies once more than a window restarts it: the keystroke it was running
    is answered by the window's own model (the user is told once), not failed."""
    engine = InLoopEngine(place, SlowBackend(delay=5.0))
    notices: list[str] = []
    backend, fallback = shared_backend(place, tmp_path, [], notices)
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        backend.engine.restarts = MAX_RESTARTS  # restarted as often as a window does already
        generation = await backend.generate(request("k", n=2))
        long = await backend.generate(request("c", n=10_000))  # sent; no token yet
        for w in list(engine.server.windows.values()):
            w.writer.transport.abort()  # the engine dies: connections reset
        engine.server.stop("crash")
        assert await asyncio.wait_for(text_of(generation), STEP_S) == "k:0 k:1 "
        assert sorted(fallback.started) == ["c", "k"]
        assert generation.stats.completion_tokens == 2
        assert generation.stats.finish_reason is FinishReason.LENGTH
        assert len(notices) == 1 and "stopped again" in notices[0]
        assert backend.engine_info["kind"] == "inProcess"
        # cancelling one that runs there stops the fallback's generation
        chunks = aiter(long)
        assert (await asyncio.wait_for(anext(chunks), STEP_S)).text == "c:0 "
        await asyncio.wait_for(long.cancel(), STEP_S)
        assert long.stats.finish_reason is FinishReason.CANCELLED
        assert fallback.counters.generations == 2  # both ended there: nothing left running
    finally:
        await backend.aclose()
        if not engine.task.done():
            await engine.stop()


async def test_the_window_knows_the_prompt_is_evaluated_at_the_first_token(
    place: EnginePlace, tmp_path: Path
) -> None:
    """Not only when the generation ends: a generation being cancelled must not make the
    window prepare (evaluate again) the prompt it already evaluated (#15, fault 1)."""
    engine = InLoopEngine(place, SlowBackend(delay=0.05))

    backend = client_window(place, tmp_path)
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        prompt = request("d", n=100).prompt
        assert backend.cached_prefix(prompt) == (0, len(prompt))
        generation = await backend.generate(request("d", n=100))
        chunks = aiter(generation)
        await asyncio.wait_for(anext(chunks), STEP_S)
        assert not generation.done
        assert backend.cached_prefix(prompt) == (len(prompt) - 1, len(prompt))
        await asyncio.wait_for(generation.cancel(), STEP_S)
        assert generation.stats.finish_reason is FinishReason.CANCELLED
    finally:
        await backend.aclose()
        await engine.stop()


async def test_token_healing_goes_through_the_shared_engine(
    place: EnginePlace, tmp_path: Path
) -> None:
    """``tokenHealing`` with a shared engine: the window finds the text to heal with its
    vocabulary, and the request carries it to the engine, whose backend constrains."""
    engine = InLoopEngine(place, SlowBackend(delay=0.01))
    seen: list[str] = []
    original = engine.backend.generate

    async def generate(request: GenerationRequest) -> SlowGeneration:
        seen.append(request.heal)
        return await original(request)

    engine.backend.generate = generate  # type: ignore[method-assign]

    backend = client_window(place, tmp_path)
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        assert isinstance(backend, TokenHealing)
        assert backend.last_token_chars("self.pro") == 1  # one character per token here
        assert backend.last_token_chars("") == 0
        heal = GenerationRequest(prompt="x = self.pr", max_tokens=1, heal="o")
        await asyncio.wait_for(text_of(await backend.generate(heal)), STEP_S)
        assert seen == ["o"]
    finally:
        await backend.aclose()
        await engine.stop()


async def test_a_window_gives_up_an_engine_whose_work_stands_still(
    place: EnginePlace, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine still beats (its event loop runs) but makes no progress: the window
    ends it, restarts it once, and the keystroke is answered by the new one (#15)."""
    stuck = InLoopEngine(place, StuckBackend())
    stuck.server.heartbeat_s = 0.05
    engines = [stuck]
    ended: list[int] = []
    loop = asyncio.get_running_loop()

    def spawn(_config: EngineConfig, p: EnginePlace) -> int:
        loop.call_soon_threadsafe(lambda: engines.append(InLoopEngine(p, SlowBackend(delay=0.01))))
        return 0

    def end(pid: int) -> None:  # the real one signals the engine's process
        ended.append(pid)
        loop.call_soon_threadsafe(stuck.server.stop, "ended as hung")

    backend = client_window(place, tmp_path)
    backend.engine.spawn = spawn
    backend.engine.end_hung = end
    backend.engine.silent_s, backend.engine.stall_s = 5.0, 0.5
    caplog.set_level(logging.WARNING, logger="kode.engine")
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        generation = await backend.generate(request("k", n=2))
        assert await asyncio.wait_for(text_of(generation), STEP_S) == "k:0 k:1 "
        # given up for its progress standing still (``stall_s``), not for silence
        assert "hung (" in caplog.text and "stopped answering" not in caplog.text
        assert ended == [os.getpid()]  # the engine's pid, as the kernel gave it
        assert backend.engine.restarts == 1 and len(engines) == 2
    finally:
        await backend.aclose()
        for engine in engines:
            if not engine.task.done():
                await engine.stop()


async def test_a_window_closing_while_its_engine_restarts_leaves_nothing_running(
    place: EnginePlace, tmp_path: Path
) -> None:
    """#51, bug 5: the engine dies under a keystroke and the window closes while it starts
    the engine again: closing ends that restart (the keystroke ends with the window, it
    is not left to a reconnect that a closed window would make), and a closed window
    starts no engine."""
    engine = InLoopEngine(place, SlowBackend(delay=5.0))
    loop = asyncio.get_running_loop()
    spawning = asyncio.Event()
    release = threading.Event()
    spawned: list[int] = []

    def spawn(_config: EngineConfig, _p: EnginePlace) -> int:  # on a worker thread
        spawned.append(0)
        loop.call_soon_threadsafe(spawning.set)
        release.wait(STEP_S)
        return 0  # no process: it ended at once

    backend = client_window(place, tmp_path)
    backend.engine.spawn = spawn
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        generation = await backend.generate(request("k", n=2))
        for w in list(engine.server.windows.values()):
            w.writer.transport.abort()  # the engine dies: connections reset
        engine.server.stop("crash")
        await asyncio.wait_for(spawning.wait(), STEP_S)  # the window starts it again
        await asyncio.wait_for(backend.aclose(), STEP_S)
        assert generation.done  # ended with the window, not left to the restart
        with pytest.raises(BackendClosed):
            await text_of(generation)
        with pytest.raises(BackendClosed):
            await backend.generate(request("x", n=1))
        assert spawned == [0]
    finally:
        release.set()
        await backend.aclose()
        if not engine.task.done():
            await engine.stop()


async def test_after_a_fall_back_the_window_answers_for_its_own_model(
    place: EnginePlace, tmp_path: Path
) -> None:
    """One backend at a time: the client forwards to whichever is current, and what the
    fallback lacks (here: no prompt cache, no chunk store, no healing) it answers as a
    backend without it, as the engine's features are not the fallback's."""
    backend, fallback = shared_backend(place, tmp_path, [], [])
    try:
        assert backend.cached_prefix("abc") == (0, 3)  # the engine's estimate: nothing yet
        await asyncio.wait_for(backend.start(), STEP_S)  # the engine ends as it starts
        assert backend.name == fallback.name == "fake"
        features = (PromptCache, ChunkAssembly, TokenHealing, PrefillSpeed)
        assert all(isinstance(backend, feature) for feature in features)
        assert backend.cached_prefix("abc") == (0, 3)
        assert backend.assembled_prefix("abc") == (0, 3)
        assert backend.chunk_store is None and backend.prefill_tokens_per_s is None
        assert backend.last_token_chars("self.pro") == 0 and backend.kv_memory == {}
        assert await backend.health()
    finally:
        await backend.aclose()
    assert fallback.closed
