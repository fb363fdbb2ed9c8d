"""The engine server and the window's client over a real Unix socket, with an in-memory
backend instead of a model (issue #15): scheduling across windows, cancel on
disconnect, restart once then fall back, versions. Fast; no engine process."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kode.backends.base import (
    PREFILL_PROBE,
    Backend,
    FinishReason,
    GenerationRequest,
    GenerationStats,
    TokenChunk,
    TokenHealing,
)
from kode.backends.daemon import protocol as wire
from kode.backends.daemon.client import (
    MAX_RESTARTS,
    Connection,
    SharedEngineBackend,
    end_process,
)
from kode.backends.daemon.paths import EngineConfig, EngineLock, EnginePlace, engine_place
from kode.backends.daemon.server import EngineServer
from kode.backends.errors import BackendClosed, ContextOverflow, EngineError, EngineSetupError
from kode.backends.worker import BackendCounters

STEP_S = 10.0


class SlowGeneration:
    """Chunks after ``delay`` each; a cancel ends it before the next one."""

    def __init__(self, backend: SlowBackend, request: GenerationRequest) -> None:
        self.backend, self.request = backend, request
        n = len(request.prompt)
        self._stats = GenerationStats(prompt_tokens=n, evaluated_prompt_tokens=n, prefill_ms=100.0)
        self._cancel = asyncio.Event()
        self._done = asyncio.Event()

    @property
    def stats(self) -> GenerationStats:
        return self._stats

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        try:
            for n in range(self.request.max_tokens):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._cancel.wait(), self.backend.delay)
                if self._cancel.is_set():
                    self._stats.finish_reason = FinishReason.CANCELLED
                    return
                self._stats.completion_tokens += 1
                yield TokenChunk(f"{self.request.document}:{n} ", (n,))
            self._stats.finish_reason = FinishReason.LENGTH
        finally:
            self.backend.counters.record(self._stats, 1)
            self._done.set()

    async def cancel(self) -> None:
        self._cancel.set()
        await self._done.wait()

    async def wait(self) -> GenerationStats:
        await self._done.wait()
        return self._stats


class SlowBackend:
    name = "fake"
    model_name = "fake.gguf"

    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay
        self.counters = BackendCounters()
        self.started: list[str] = []  # documents, in the order their generations started
        self.closed = False

    def count_tokens(self, text: str) -> int:
        return len(text)

    async def generate(self, request: GenerationRequest) -> SlowGeneration:
        if request.prompt == "overflow":
            raise ContextOverflow("prompt (9 tokens) + max_tokens exceeds the context window")
        self.started.append(request.document)
        return SlowGeneration(self, request)

    async def health(self, timeout_s: float = 1.0) -> bool:
        return True

    async def aclose(self) -> None:
        self.closed = True


class Engine:
    """An ``EngineServer`` on a task of this loop, holding the engine's lock while it runs
    as ``kode engine run`` does (else a window that finds no socket yet starts another)."""

    def __init__(
        self, place: EnginePlace, backend: SlowBackend, *, time_prefill: bool = False
    ) -> None:
        self.backend = backend
        self.lock = EngineLock(place.lock)
        assert self.lock.acquire(wait_s=0.5)  # as ``kode engine run``: past a window's look

        async def load() -> Backend:
            return backend

        self.server = EngineServer(place, load, idle_s=60, time_prefill=time_prefill)
        self.task = asyncio.ensure_future(self.server.run(signals=False))
        self.task.add_done_callback(lambda _t: self.lock.release())

    async def stop(self) -> None:
        self.server.stop("test")
        await asyncio.wait_for(self.task, STEP_S)


@pytest.fixture
def place(tmp_path: Path) -> EnginePlace:
    folder = Path(tmp_path)
    return engine_place("test", folder, folder)


async def window(place: EnginePlace) -> Connection:
    async def opened() -> Connection:
        while True:
            with contextlib.suppress(FileNotFoundError, ConnectionRefusedError):
                return await Connection.open(
                    str(place.socket), fingerprint=place.name, window=True, timeout_s=STEP_S
                )
            await asyncio.sleep(0.01)

    return await asyncio.wait_for(opened(), STEP_S)


def request(document: str, *, background: bool = False, n: int = 3) -> GenerationRequest:
    return GenerationRequest(
        prompt=f"prompt of {document}", max_tokens=n, background=background, document=document
    )


async def text_of(generation: Any) -> str:
    return "".join([chunk.text async for chunk in generation])


async def test_keystroke_of_another_window_goes_before_background_work(
    place: EnginePlace,
) -> None:
    engine = Engine(place, SlowBackend(delay=0.2))
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
    engine = Engine(place, SlowBackend(delay=0.05))
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
    engine = Engine(place, SlowBackend(delay=0.05))
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


class Vocab:
    """One token per character."""

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def piece(self, token: int) -> bytes:
        return chr(token).encode()

    def close(self) -> None:
        return None


def client_window(place: EnginePlace, tmp_path: Path) -> SharedEngineBackend:
    """A window's client of the engine at ``place`` that must never fall back."""

    async def in_process() -> Backend:
        raise AssertionError("no fallback expected")

    return SharedEngineBackend(
        EngineConfig(tmp_path / "m.gguf"),
        place,
        Vocab(),
        idle_s=60,
        fallback=in_process,
        notify=lambda m: None,
        timeout_s=STEP_S,
    )


async def test_the_client_restarts_a_dead_engine_once_then_falls_back(
    place: EnginePlace, tmp_path: Path
) -> None:
    engines: list[Engine] = []
    notices: list[str] = []
    loop = asyncio.get_running_loop()

    def spawn(_config: EngineConfig, p: EnginePlace) -> int:
        # called on a worker thread, as the real one starts a process from there
        loop.call_soon_threadsafe(lambda: engines.append(Engine(p, SlowBackend(delay=0.01))))
        return 0  # no process to watch

    fallback = SlowBackend(delay=0.01)

    async def in_process() -> Backend:
        return fallback

    backend = SharedEngineBackend(
        EngineConfig(tmp_path / "m.gguf"),
        place,
        Vocab(),
        idle_s=60,
        fallback=in_process,
        notify=notices.append,
        timeout_s=STEP_S,
    )
    backend._spawn = spawn  # type: ignore[attr-defined]
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        assert len(engines) == 1 and backend.engine_info["kind"] == "shared"
        assert await text_of(await backend.generate(request("x", n=2))) == "x:0 x:1 "
        assert backend.cached_prefix("prompt of x and more")[0] == len("prompt of x")
        await engines[0].stop()  # the engine dies under the window
        await asyncio.sleep(0.05)
        assert await text_of(await backend.generate(request("y", n=1))) == "y:0 "
        assert len(engines) == 2 and backend.restarts == 1 and not notices
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


def shared_backend(
    place: EnginePlace, tmp_path: Path, spawned: list[int], notices: list[str]
) -> tuple[SharedEngineBackend, SlowBackend]:
    """A window's backend whose spawns are counted and start nothing (an engine that
    ends as it starts), falling back to a ``SlowBackend``."""
    fallback = SlowBackend(delay=0.01)

    async def in_process() -> Backend:
        return fallback

    backend = SharedEngineBackend(
        EngineConfig(tmp_path / "m.gguf"),
        place,
        Vocab(),
        idle_s=60,
        fallback=in_process,
        notify=notices.append,
        timeout_s=STEP_S,
    )

    def spawn(_config: EngineConfig, _p: EnginePlace) -> int:
        spawned.append(0)
        return 0  # no such process: it ended at once

    backend._spawn = spawn  # type: ignore[attr-defined]
    return backend, fallback


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
    engine = Engine(place, SlowBackend())
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
    engine = Engine(place, SlowBackend(delay=0.01))
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
    engine = Engine(place, SlowBackend(delay=0.01), time_prefill=True)
    first = await window(place)
    try:
        # the fake evaluates a prompt of n characters in 100 ms
        rate = len(PREFILL_PROBE) / 0.1
        assert first.welcome.prefill_tokens_per_s == pytest.approx(rate)
        assert engine.backend.started == [""] and engine.server.served == 0
    finally:
        await first.close()
        await engine.stop()


async def test_a_keystroke_in_flight_when_the_engine_dies_is_answered(
    place: EnginePlace, tmp_path: Path
) -> None:
    engines: list[Engine] = [Engine(place, SlowBackend(delay=5.0))]
    loop = asyncio.get_running_loop()

    def spawn(_config: EngineConfig, p: EnginePlace) -> int:
        loop.call_soon_threadsafe(lambda: engines.append(Engine(p, SlowBackend(delay=0.01))))
        return 0

    backend = client_window(place, tmp_path)
    backend._spawn = spawn  # type: ignore[attr-defined]
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        generation = await backend.generate(request("k", n=2))
        await asyncio.sleep(0.2)  # running, no token yet
        for w in list(engines[0].server.windows.values()):
            w.writer.transport.abort()  # the engine dies: connections reset
        engines[0].server.stop("crash")
        assert await asyncio.wait_for(text_of(generation), STEP_S) == "k:0 k:1 "
        assert backend.restarts == 1 and len(engines) == 2
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
    engine = Engine(place, SlowBackend(delay=5.0))
    notices: list[str] = []
    backend, fallback = shared_backend(place, tmp_path, [], notices)
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        backend.restarts = MAX_RESTARTS  # restarted as often as a window does already
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
    engine = Engine(place, SlowBackend(delay=0.05))

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


async def test_a_window_closing_its_connection_does_not_blame_the_engine(
    place: EnginePlace,
) -> None:
    """A generation still waiting when the window closes (its shutdown, its settings
    changed) ends with words that say so, as ``BackendClosed``, which the language
    server answers empty and never shows (#34), and nothing is moved to a restarted
    engine (#15, fault 2)."""
    engine = Engine(place, SlowBackend(delay=5.0))
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


async def test_token_healing_goes_through_the_shared_engine(
    place: EnginePlace, tmp_path: Path
) -> None:
    """``tokenHealing`` with a shared engine: the window finds the text to heal with its
    vocabulary, and the request carries it to the engine, whose backend constrains."""
    engine = Engine(place, SlowBackend(delay=0.01))
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


class StuckBackend(SlowBackend):
    """Its generations never produce a token nor end (a model call that never returns);
    its ``progress`` stands still."""

    progress = 7

    async def generate(self, request: GenerationRequest) -> SlowGeneration:
        self.started.append(request.document)
        self.delay = 3600.0
        return SlowGeneration(self, request)


async def test_a_window_gives_up_an_engine_whose_work_stands_still(
    place: EnginePlace, tmp_path: Path
) -> None:
    """The engine still beats (its event loop runs) but makes no progress: the window
    ends it, restarts it once, and the keystroke is answered by the new one (#15)."""
    stuck = Engine(place, StuckBackend())
    stuck.server.heartbeat_s = 0.05
    engines = [stuck]
    ended: list[int] = []
    loop = asyncio.get_running_loop()

    def spawn(_config: EngineConfig, p: EnginePlace) -> int:
        loop.call_soon_threadsafe(lambda: engines.append(Engine(p, SlowBackend(delay=0.01))))
        return 0

    def end(pid: int) -> None:  # the real one signals the engine's process
        ended.append(pid)
        loop.call_soon_threadsafe(stuck.server.stop, "ended as hung")

    backend = client_window(place, tmp_path)
    backend._spawn = spawn  # type: ignore[attr-defined]
    backend._end_hung = end  # type: ignore[attr-defined]
    backend.silent_s, backend.stall_s = 5.0, 0.5
    try:
        await asyncio.wait_for(backend.start(), STEP_S)
        started = asyncio.get_running_loop().time()
        generation = await backend.generate(request("k", n=2))
        assert await asyncio.wait_for(text_of(generation), STEP_S) == "k:0 k:1 "
        assert 0.5 <= asyncio.get_running_loop().time() - started < 5.0
        assert ended == [os.getpid()]  # the engine's pid, as the kernel gave it
        assert backend.restarts == 1 and len(engines) == 2
    finally:
        await backend.aclose()
        for engine in engines:
            if not engine.task.done():
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


def test_end_process_never_signals_this_process() -> None:
    end_process(os.getpid())
    end_process(1)
