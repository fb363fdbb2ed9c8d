"""The shared engine: one process per user and model, serving every editor window.

``kode engine run`` (started by the first window that finds none) takes the engine's
lock, listens on its Unix socket, loads the model once and serves any number of
windows, running their generations in the order ``Scheduler`` decides: keystrokes of
different windows together (decoded in one batch), background work alone.
It stops on SIGTERM or SIGINT, on ``kode engine stop``, or once no window has been
connected for the idle time, removing its socket and releasing its lock; its log goes
to the user's state folder and never holds source code.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kode.backends.base import (
    PREFILL_PROBE,
    Backend,
    ChunkAssembly,
    Concurrent,
    FinishReason,
    Generation,
    GenerationRequest,
    GenerationStats,
    KvMemoryReport,
    PrefillRate,
    Progress,
    SpeculationMethod,
)
from kode.backends.daemon import protocol as wire
from kode.backends.daemon.paths import EnginePlace, clear_socket_path, remove_socket
from kode.backends.daemon.scheduler import EngineJob, Plan, Scheduler
from kode.backends.defaults import KODE_VERSION
from kode.backends.errors import EngineError, EngineSetupError, describe
from kode.backends.system import peer_credentials

log = logging.getLogger("kode.engine")

# How long a freshly started engine waits for its first window before it gives up.
FIRST_WINDOW_S = 60.0
# How often a window with work in the engine hears that it is alive (``Heartbeat``).
HEARTBEAT_S = 1.0


@dataclass(eq=False)
class Window:
    """One connection to the engine (an editor window, or ``kode engine status``)."""

    id: int
    writer: asyncio.StreamWriter
    pid: int
    counts: bool = True  # a window keeps the engine alive; a status query does not
    jobs: dict[int, Running] = field(default_factory=dict)  # by the window's request id

    def send(self, message: Any) -> None:
        if not self.writer.is_closing():
            self.writer.write(wire.encode(message))


@dataclass(eq=False)
class Running:
    """A job and what the engine knows of its generation."""

    job: EngineJob
    window: Window
    request_id: int
    request: Any
    generation: Generation | None = None
    paused: bool = False
    produced: bool = False  # a chunk reached the window
    submitted: float = field(default_factory=time.perf_counter)


class EngineServer:
    """Serves ``backend`` on ``place.socket`` to every window of this user."""

    def __init__(
        self,
        place: EnginePlace,
        load: Callable[[], Awaitable[Backend]],
        *,
        idle_s: float,
        heartbeat_s: float = HEARTBEAT_S,
        time_prefill: bool = True,
    ) -> None:
        self.place = place
        self._load = load
        self.idle_s = idle_s
        self.heartbeat_s = heartbeat_s
        self.time_prefill = time_prefill
        self.backend: Backend | None = None
        self.scheduler = Scheduler()
        self.windows: dict[int, Window] = {}
        self._jobs: dict[int, Running] = {}  # by job id
        self._ids = itertools.count(1)
        self._loaded = asyncio.Event()
        self._load_error: str | None = None
        self._stop = asyncio.Event()
        self._idle_task: asyncio.Task[None] | None = None
        self._wake: asyncio.TimerHandle | None = None  # background work waits for quiet
        self._tasks: set[asyncio.Task[Any]] = set()
        self.started = time.time()
        self.served = 0
        self.prefill = PrefillRate()

    async def run(self, *, signals: bool = True) -> int:
        """Serve until stopped; 0 on a clean stop, 1 if the model could not be loaded.
        ``signals``: stop on SIGTERM and SIGINT (a process of its own)."""
        loop = asyncio.get_running_loop()
        if signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop, f"signal {sig.name}")
        clear_socket_path(self.place.socket)  # a dead engine's (we hold the lock)
        server = await asyncio.start_unix_server(self._connection, path=str(self.place.socket))
        os.chmod(self.place.socket, 0o600)
        log.info("engine %s listening on %s", os.getpid(), self.place.socket)
        try:
            try:
                self.backend = await self._load()
                if isinstance(self.backend, Concurrent):
                    self.scheduler.width = self.backend.width
            except Exception as exc:
                self._load_error = describe(exc)
                log.error("the model could not be loaded: %s", self._load_error)
                self._loaded.set()
                await asyncio.sleep(0.2)  # let waiting windows read why
                return 1
            if self.time_prefill:
                await self._time_prefill(self.backend)
            self._loaded.set()
            log.info("model %s loaded", self.backend.model_name)
            self._arm_idle(max(self.idle_s, FIRST_WINDOW_S))
            self._spawn(self._heartbeats())
            await self._stop.wait()
            return 0
        finally:
            server.close()
            await self._shutdown()
            remove_socket(self.place.socket)

    async def _time_prefill(self, backend: Backend) -> None:
        """Time a synthetic prompt once, before any window is welcomed, so that every
        window starts with this engine's prefill speed (``Welcome``) instead of timing
        one itself: behind other windows' work, or cut short by its own first keystroke,
        which would then be timed in its place, cold (#15)."""
        request = GenerationRequest(
            prompt=PREFILL_PROBE, max_tokens=1, speculation=SpeculationMethod.NONE
        )
        try:
            generation = await backend.generate(request)
            async for _ in generation:
                pass
            self.prefill.observe(await generation.wait())
        except Exception as exc:  # the windows time their own prompts then
            log.warning("could not time the prefill speed: %s", describe(exc))
        log.info("prefill speed: %s tokens/s", self.prefill.value and round(self.prefill.value))

    def progress(self) -> int:
        """What the heartbeat carries: grows with every model call and every generation
        served, and stands still only when the engine does no work at all."""
        backend = self.backend
        calls = backend.progress if isinstance(backend, Progress) else 0
        return calls + self.served

    async def _heartbeats(self) -> None:
        """Tell every window with work here that the engine lives and how far it got.
        Sent from the event loop: a loop that hangs sends none, a worker that hangs sends
        the same ``progress`` again; either way the window knows (``client.Watchdog``)."""
        while True:
            await asyncio.sleep(self.heartbeat_s)
            beat = wire.Heartbeat(progress=self.progress())
            for window in list(self.windows.values()):
                if window.jobs:
                    window.send(beat)

    def stop(self, why: str) -> None:
        if not self._stop.is_set():
            log.info("stopping: %s", why)
            self._stop.set()

    async def _shutdown(self) -> None:
        for running in list(self._jobs.values()):
            running.job.abandoned = True
            if running.generation is not None:
                await running.generation.cancel()
        for window in list(self.windows.values()):
            window.writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.backend is not None:
            await self.backend.aclose()

    # -- connections ----------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        pid, uid, _gid = peer_credentials(sock)
        if uid != os.getuid():
            log.warning("refused a connection from user id %d (pid %d)", uid, pid)
            writer.close()
            return
        window: Window | None = None
        try:
            window = await self._greet(reader, writer, pid)
            if window is None:
                return
            while (payload := await wire.read_frame(reader)) is not None:
                self._handle(window, wire.decode_window(payload))
        except (ConnectionError, EngineError) as exc:
            log.info("window %d: connection ended (%s)", pid, describe(exc))
        finally:
            if window is not None:
                self._gone(window)
            writer.close()

    async def _greet(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pid: int
    ) -> Window | None:
        payload = await wire.read_frame(reader)
        if payload is None:
            return None
        try:
            hello = wire.decode_hello(payload)
            if hello.fingerprint != self.place.name:
                raise EngineSetupError(
                    f"this engine is {self.place.name}, the window asked for {hello.fingerprint}"
                )
        except EngineSetupError as exc:
            log.warning("refused window %d: %s", pid, exc)
            writer.write(wire.encode(wire.Refused(message=str(exc))))
            await writer.drain()
            return None
        await self._loaded.wait()
        if self._load_error is not None or self.backend is None:
            refused = wire.Refused(message=self._load_error or "the engine is stopping")
            writer.write(wire.encode(refused))
            await writer.drain()
            return None
        window = Window(next(self._ids), writer, pid, counts=hello.window)
        self.windows[window.id] = window
        if window.counts and self._idle_task is not None:
            self._idle_task.cancel()
            self._idle_task = None
        window.send(
            wire.Welcome(
                protocol=wire.PROTOCOL_VERSION,
                kode_version=KODE_VERSION,
                pid=os.getpid(),
                socket=str(self.place.socket),
                engine=self.backend.name,
                model=self.backend.model_name,
                prefill_tokens_per_s=self.prefill.value,
            )
        )
        log.info("window %d connected (%d open)", pid, self._open_windows())
        return window

    def _open_windows(self) -> int:
        return sum(w.counts for w in self.windows.values())

    def _handle(self, window: Window, message: wire.WindowMessage) -> None:
        if isinstance(message, wire.Generate):
            job = EngineJob(
                next(self._ids),
                window=window.id,
                background=message.request.background,
                document=message.request.document,
            )
            running = Running(job, window, message.id, message.request)
            self._jobs[job.id] = running
            window.jobs[message.id] = running
            self._apply(self.scheduler.submit(job, now=time.monotonic()))
        elif isinstance(message, wire.Cancel):
            found = window.jobs.get(message.id)
            if found is not None:
                self._apply(self.scheduler.cancel(found.job.id, now=time.monotonic()))
        elif isinstance(message, wire.Status):
            window.send(wire.StatusReply(info=self.status()))
        elif isinstance(message, wire.Stop):
            self.stop(f"asked by pid {window.pid}")

    def _gone(self, window: Window) -> None:
        self.windows.pop(window.id, None)
        self._apply(self.scheduler.disconnect(window.id, now=time.monotonic()))
        if window.counts:
            log.info("window %d disconnected (%d open)", window.pid, self._open_windows())
        if self._open_windows() == 0 and self._loaded.is_set():
            self._arm_idle(self.idle_s)

    def _arm_idle(self, seconds: float) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
        self._idle_task = asyncio.ensure_future(self._idle(seconds))

    async def _idle(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if self._open_windows() == 0:
            self.stop(f"no window for {seconds:.0f} s")

    def status(self) -> dict[str, Any]:
        backend = self.backend
        return {
            "pid": os.getpid(),
            "socket": str(self.place.socket),
            "log": str(self.place.log),
            "version": KODE_VERSION,
            "model": None if backend is None else backend.model_name,
            "windows": self._open_windows(),
            "uptimeS": round(time.time() - self.started, 1),
            "idleS": self.idle_s,
            "served": self.served,
            "prefillTokensPerS": self.prefill.value,
            "running": bool(self.scheduler.running),
            "generating": len(self.scheduler.running),
            "generations": [  # the running ones, as far as they got (no text)
                {
                    "windowPid": running.window.pid,
                    "background": running.job.background,
                    "tokens": running.generation.stats.completion_tokens,
                    "batchedSteps": running.generation.stats.batched_steps,
                }
                for running in self._jobs.values()
                if running.generation is not None
            ],
            "waiting": len(self.scheduler.waiting),
            "counters": None if backend is None else backend.counters.as_dict(),
            "kvMemory": backend.kv_memory if isinstance(backend, KvMemoryReport) else None,
            "chunkStore": backend.chunk_store if isinstance(backend, ChunkAssembly) else None,
            "ompWaitPolicy": os.environ.get("OMP_WAIT_POLICY"),
            "gompSpinCount": os.environ.get("GOMP_SPINCOUNT"),
            "nice": os.nice(0),
        }

    # -- running jobs -------------------------------------------------------------------------

    def _apply(self, plan: Plan) -> None:
        for job in plan.stop:
            running = self._jobs.get(job.id)
            if running is None:
                continue
            if job in self.scheduler.running:
                self._cancel(running)
            else:  # it never started: it ends here, cancelled
                self._end(running, GenerationStats(finish_reason=FinishReason.CANCELLED))
        if plan.pause is not None:
            running = self._jobs.get(plan.pause.id)
            if running is not None:
                running.paused = True
                self._cancel(running)
        if not self._stop.is_set():
            for job in plan.start:
                self._spawn(self._run(self._jobs[job.id]))
        if plan.wake_at is not None:
            if self._wake is not None:
                self._wake.cancel()
            delay = max(0.0, plan.wake_at - time.monotonic())
            self._wake = asyncio.get_running_loop().call_later(delay, self._poke)

    def _poke(self) -> None:
        self._wake = None
        self._apply(self.scheduler.poke(now=time.monotonic()))

    def _cancel(self, running: Running) -> None:
        if running.generation is not None:
            self._spawn(running.generation.cancel())

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _end(self, running: Running, stats: GenerationStats, calls: int = 0) -> None:
        self._forget(running)
        backend = self.backend
        kv = backend.kv_memory if isinstance(backend, KvMemoryReport) else None
        chunks = backend.chunk_store if isinstance(backend, ChunkAssembly) else None
        end = wire.End(
            id=running.request_id, stats=stats, kv_memory=kv, chunks=chunks, decode_calls=calls
        )
        running.window.send(end)

    def _forget(self, running: Running) -> None:
        self._jobs.pop(running.job.id, None)
        running.window.jobs.pop(running.request_id, None)

    async def _run(self, running: Running) -> None:
        """Run one job to its end, then start the next."""
        backend = self.backend
        assert backend is not None
        paused = False
        started = time.perf_counter()
        try:
            generation = await backend.generate(running.request)
            running.generation = generation
            if running.job.abandoned or running.paused:
                await generation.cancel()
            async for chunk in generation:
                running.produced = True
                running.window.send(
                    wire.Chunk(id=running.request_id, text=chunk.text, token_ids=chunk.token_ids)
                )
            stats = await generation.wait()
            paused = running.paused and not running.produced and not running.job.abandoned
            log.info(
                "job %d of window %d%s: waited %.0f ms, %s after %.0f ms, %d prompt tokens "
                "(%d evaluated), %d generated (%d steps batched), %d waiting",
                running.job.id,
                running.window.pid,
                " (background)" if running.job.background else "",
                (started - running.submitted) * 1000.0,
                "paused" if paused else stats.finish_reason,
                (time.perf_counter() - started) * 1000.0,
                stats.prompt_tokens,
                stats.evaluated_prompt_tokens,
                stats.completion_tokens,
                stats.batched_steps,
                len(self.scheduler.waiting),
            )
            if paused:  # it goes back in the queue and comes back as a new generation
                running.generation, running.paused = None, False
            else:
                self.served += 1
                self.prefill.observe(stats)  # for the windows that connect later
                self._end(running, stats, stats.model_calls)
        except Exception as exc:
            self._forget(running)
            running.window.send(wire.failure(running.request_id, exc))
        finally:
            self._apply(
                self.scheduler.finished(running.job.id, paused=paused, now=time.monotonic())
            )
