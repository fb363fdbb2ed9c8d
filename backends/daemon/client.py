"""A window's side of the shared engine: the ``Backend`` that ``kode lsp`` uses.

``SharedEngineBackend`` connects to the engine for its settings' model, and starts one
when none answers: the first window to take the start lock spawns ``kode engine run``
(detached, logging to the state folder), the others wait for its socket with backoff,
so windows opening at the same moment end with exactly one engine. If the engine dies
under a window, the next request starts it again, once; if that fails too, or no engine
can be started, the window says so once (``notify``, shown as ``window/showMessage``)
and loads the model in its own process, as before the shared engine existed.

What stays in the window: token counting (the GGUF's vocabulary only, a few MB, so a
keystroke never waits for the socket to count context lines) and an estimate of what
the engine holds for this window's prompts (``cached_prefix``, from what its
generations reported evaluating: the engine's own saved states may have been evicted
since, or another window's may serve more; it is an estimate, as the protocol says).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, Protocol

from kode.backends.base import (
    Backend,
    FinishReason,
    Generation,
    GenerationRequest,
    GenerationStats,
    PromptCache,
    TokenChunk,
    TokenHealing,
)
from kode.backends.chunks import ChunkQueue, drain
from kode.backends.daemon import protocol as wire
from kode.backends.daemon.paths import (
    EngineConfig,
    EnginePlace,
    lock_is_held,
    socket_obstacle,
)
from kode.backends.defaults import KODE_VERSION
from kode.backends.errors import (
    BackendClosed,
    BackendError,
    EngineError,
    EngineSetupError,
    describe,
)
from kode.backends.kv_reuse import MOVED_REFRESH, plan_moved_tail, prefix_reach
from kode.backends.system import alive, peer_credentials
from kode.backends.worker import BackendCounters

log = logging.getLogger("kode.engine")

# How long a window waits for a new engine to load its model and answer (the 1.5B loads
# in seconds on a quiet machine; a busy one and a cold page cache take much longer).
START_TIMEOUT_S = 180.0
# How often a window restarts an engine that died under it before it falls back.
MAX_RESTARTS = 1
# Prompts of this window remembered for ``cached_prefix``.
_MIRRORED = 16
# The hang watchdog, while this window has work in the engine: the engine sends a
# heartbeat every second (``server.HEARTBEAT_S``). Silent this long: its event loop hangs.
SILENT_S = 15.0
# Its progress (model calls, generations served) standing still this long: its model
# hangs. A prompt batch on a busy 2-core machine takes seconds, never minutes.
STALL_S = 120.0

Notify = Callable[[str], None]


class Vocabulary(Protocol):
    """The model's tokenizer, loaded in the window (``LlamaModel(path, vocab_only=True)``)."""

    def tokenize(self, text: str, *, special: bool = True) -> list[int]: ...

    def piece(self, token: int) -> bytes:
        """The bytes ``token`` spells (token healing)."""
        ...

    def close(self) -> None: ...


class EngineGeneration:
    """One generation running in the engine, as the window consumes it."""

    def __init__(self, conn: Connection, request_id: int, request: GenerationRequest) -> None:
        self._conn = conn
        self.id = request_id
        self.request = request
        self._stats = GenerationStats()
        self._queue: ChunkQueue = asyncio.Queue()
        self._done = asyncio.Event()
        self._cancel_sent = False
        self.decode_calls = 0
        self.kv: dict[str, int] | None = None  # the engine's KV memory when it ended
        # Called at the first chunk: the engine has evaluated the whole prompt by then.
        self.on_prompt: Callable[[EngineGeneration], None] | None = None
        self.tokens: list[int] | None = None  # the prompt's tokens, once the window needs them
        self._relay: asyncio.Task[None] | None = None  # on the fallback, when moved there

    @property
    def stats(self) -> GenerationStats:
        return self._stats

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        try:
            async with aclosing(drain(self._queue)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self._request_cancel()  # leaving early stops the engine's work

    async def cancel(self) -> None:
        self._request_cancel()
        await self._done.wait()

    async def wait(self) -> GenerationStats:
        await self._done.wait()
        return self._stats

    def _request_cancel(self) -> None:
        if not self._done.is_set() and not self._cancel_sent:
            self._cancel_sent = True
            if self._relay is not None:
                self._relay.cancel()  # leaving the fallback's generation stops it
            else:
                self._conn.send(wire.Cancel(id=self.id))

    def run_on(self, backend: Backend) -> None:
        """Run this generation on ``backend`` (the window's own model, after the engine
        died and could not be restarted) instead: the keystroke is still answered."""

        async def relay() -> None:
            inner: Generation | None = None
            try:
                inner = await backend.generate(self.request)
                async for chunk in inner:
                    self._stats.completion_tokens += len(chunk.token_ids)
                    self._queue.put_nowait(chunk)
                stats = await inner.wait()
                for f in dataclasses.fields(GenerationStats):
                    setattr(self._stats, f.name, getattr(stats, f.name))
                self._queue.put_nowait(None)
                self._done.set()
            except asyncio.CancelledError:
                if inner is not None:
                    await inner.cancel()  # released before this one says it is done
                self._stats.finish_reason = FinishReason.CANCELLED
                self._queue.put_nowait(None)
                self._done.set()
            except Exception as exc:  # the fallback's own failure reaches the user
                self.fail(exc)

        self._relay = asyncio.ensure_future(relay())

    # -- called by the connection's reader --------------------------------------------------

    @property
    def untouched(self) -> bool:
        """Nothing came back yet and no one cancelled it: it can move to another engine."""
        return self._stats.completion_tokens == 0 and not self._cancel_sent and not self.done

    def chunk(self, chunk: wire.Chunk) -> None:
        first = self._stats.completion_tokens == 0
        self._stats.completion_tokens += len(chunk.token_ids)
        if first and self.on_prompt is not None:
            self.on_prompt(self)
        self._queue.put_nowait(TokenChunk(chunk.text, chunk.token_ids))

    def end(self, end: wire.End) -> None:
        for f in dataclasses.fields(GenerationStats):
            setattr(self._stats, f.name, getattr(end.stats, f.name))
        self.decode_calls = end.decode_calls
        self.kv = end.kv_memory
        self._queue.put_nowait(None)
        self._done.set()

    def fail(self, exc: BaseException) -> None:
        self._stats.finish_reason = FinishReason.ERROR
        self._queue.put_nowait(exc)
        self._done.set()


class Connection:
    """One session with the engine: requests go out, a reader task routes what comes back."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        welcome: wire.Welcome,
        on_end: Callable[[EngineGeneration], None],
        on_lost: Callable[[list[EngineGeneration]], bool] = lambda _g: False,
        *,
        peer_pid: int = 0,
        silent_s: float = SILENT_S,
        stall_s: float = STALL_S,
    ) -> None:
        self._reader, self._writer = reader, writer
        self.welcome = welcome
        self.peer_pid = peer_pid  # the engine's pid, as the kernel says (SO_PEERCRED)
        self._on_end = on_end
        self.on_lost = on_lost  # takes over untouched generations when the engine dies
        # Ends a hung engine (its pid), so that a new one can take its lock.
        self.on_hung: Callable[[int], None] = lambda _pid: None
        self._ids = itertools.count(1)
        self._generations: dict[int, EngineGeneration] = {}
        self._status: list[asyncio.Future[dict[str, Any]]] = []
        self.closed = False
        self._closing = False  # this window closes the connection (``close``)
        self._hung: str | None = None  # why the watchdog gave the engine up
        self.silent_s, self.stall_s = silent_s, stall_s
        self.heard = self.progressed = time.monotonic()
        self._progress: int | None = None
        self._task = asyncio.ensure_future(self._read())
        self._watchdog = asyncio.ensure_future(self._watch())

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        fingerprint: str,
        window: bool,
        timeout_s: float,
        on_end: Callable[[EngineGeneration], None] = lambda _g: None,
        silent_s: float = SILENT_S,
        stall_s: float = STALL_S,
    ) -> Connection:
        """Connect and say hello. Raises ``OSError`` if nothing listens, ``EngineSetupError``
        if the engine refuses (another protocol, a model it could not load), ``EngineError``
        if it does not answer within ``timeout_s``."""
        reader, writer = await asyncio.open_unix_connection(path)
        try:
            sock = writer.get_extra_info("socket")
            peer_pid, uid, _gid = peer_credentials(sock)
            if uid != os.getuid():
                raise EngineSetupError(f"the engine socket {path} is served by user id {uid}")
            hello = wire.Hello(
                protocol=wire.PROTOCOL_VERSION,
                kode_version=KODE_VERSION,
                fingerprint=fingerprint,
                pid=os.getpid(),
                window=window,
            )
            writer.write(wire.encode(hello))
            try:
                payload = await asyncio.wait_for(wire.read_frame(reader), timeout_s)
            except TimeoutError:
                raise EngineError(
                    f"the Kode engine on {path} did not answer within {timeout_s:.0f} s"
                ) from None
            if payload is None:
                raise EngineError(f"the Kode engine on {path} closed the connection")
            welcome = wire.check_welcome(wire.decode_engine(payload))
        except BaseException:
            writer.close()
            raise
        return cls(
            reader,
            writer,
            welcome,
            on_end,
            peer_pid=peer_pid,
            silent_s=silent_s,
            stall_s=stall_s,
        )

    def send(self, message: Any) -> None:
        if not self.closed and not self._writer.is_closing():
            self._writer.write(wire.encode(message))

    def generate(self, request: GenerationRequest) -> EngineGeneration:
        if self.closed:
            raise EngineError("the connection to the Kode engine is closed")
        generation = EngineGeneration(self, 0, request)
        self.adopt(generation)
        return generation

    def adopt(self, generation: EngineGeneration) -> None:
        """Run ``generation`` here (a new one, or one a dead engine never started)."""
        if not self._generations:  # the watchdog counts from the first work sent
            self.heard = self.progressed = time.monotonic()
        generation._conn, generation.id = self, next(self._ids)
        self._generations[generation.id] = generation
        self.send(wire.Generate(id=generation.id, request=generation.request))

    async def status(self, timeout_s: float = 2.0) -> dict[str, Any]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._status.append(future)
        self.send(wire.Status())
        return await asyncio.wait_for(future, timeout_s)

    def stop_engine(self) -> None:
        self.send(wire.Stop())

    async def close(self) -> None:
        self.closed = self._closing = True
        self._writer.close()
        self._watchdog.cancel()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await self._task
        self._fail_all(BackendClosed("this window closed its connection to the Kode engine"))

    async def _read(self) -> None:
        why = "closed the connection"
        try:
            while (payload := await wire.read_frame(self._reader)) is not None:
                self.heard = time.monotonic()
                self._route(wire.decode_engine(payload))
        except (ConnectionError, EngineError) as exc:
            why = f"failed ({describe(exc)})"
        finally:
            self.closed = True
            self._writer.close()
            self._watchdog.cancel()
            if not self._closing:  # else the window's own doing, which ``close`` says
                self._engine_lost(self._hung or why)

    async def _watch(self) -> None:
        """The hang watchdog: while generations of this window are in the engine, give it
        up when it sends nothing for ``silent_s`` (its heartbeat stopped) or its progress
        stands still for ``stall_s``; end it (``on_hung``), so that a new engine can start,
        then close the connection, which fails or moves the generations as a death does."""
        step = max(0.05, min(self.silent_s, self.stall_s) / 5)
        while True:
            await asyncio.sleep(step)
            now = time.monotonic()
            if not self._generations:
                continue
            if now - self.heard > self.silent_s:
                self._hung = f"stopped answering ({now - self.heard:.0f} s without a word)"
            elif now - self.progressed > self.stall_s:
                self._hung = f"hung ({now - self.progressed:.0f} s without progress)"
            else:
                continue
            log.warning("the Kode engine (pid %d) %s", self.welcome.pid, self._hung)
            await asyncio.to_thread(self.on_hung, self.peer_pid)
            transport = self._writer.transport
            transport.abort()  # the reader ends, and says why (``_hung``)
            return

    def _engine_lost(self, why: str) -> None:
        untouched = [g for g in self._generations.values() if g.untouched]
        if untouched and self.on_lost(untouched):
            for g in untouched:
                self._generations.pop(g.id, None)
        self._fail_all(
            EngineError(f"the Kode engine (pid {self.welcome.pid}) {why} during a request")
        )

    def _route(self, message: wire.EngineMessage) -> None:
        if self._hung is not None:
            # Given up as hung and being ended: what it says now (a stop that ends its
            # generations as cancelled) must not answer them; they move to a new engine.
            return
        if isinstance(message, wire.Heartbeat):
            if message.progress != self._progress:
                self._progress = message.progress
                self.progressed = self.heard
            return
        if isinstance(message, wire.Chunk | wire.End | wire.Failed):
            self.progressed = self.heard
        if isinstance(message, wire.Chunk):
            generation = self._generations.get(message.id)
            if generation is not None:
                generation.chunk(message)
        elif isinstance(message, wire.End):
            generation = self._generations.pop(message.id, None)
            if generation is not None:
                generation.end(message)
                self._on_end(generation)
        elif isinstance(message, wire.Failed):
            generation = self._generations.pop(message.id, None)
            if generation is not None:
                generation.fail(wire.raised(message))
        elif isinstance(message, wire.StatusReply) and self._status:
            future = self._status.pop(0)
            if not future.done():
                future.set_result(message.info)

    def _fail_all(self, exc: BackendError) -> None:
        generations, self._generations = self._generations, {}
        for generation in generations.values():
            generation.fail(exc)
        for future in self._status:
            if not future.done():
                future.set_exception(exc)
        self._status.clear()


def spawn_engine(config: EngineConfig, place: EnginePlace, *, idle_s: float) -> int:
    """Start ``kode engine run`` for ``config``, detached (its own session, no terminal),
    its output appended to its log; returns its pid. A thread reaps it if it ends while
    this window lives."""
    command = [sys.executable, "-m", "kode.cli.main", "engine", "run", *config.argv()]
    command += ["--idle-seconds", str(idle_s)]
    with open(place.log, "ab") as out:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
            cwd="/",  # a daemon keeps no folder of the window's busy
        )
    threading.Thread(target=proc.wait, name="kode-engine-reaper", daemon=True).start()
    return proc.pid


async def connect(
    config: EngineConfig,
    place: EnginePlace,
    *,
    idle_s: float,
    window: bool = True,
    start: bool = True,
    timeout_s: float = START_TIMEOUT_S,
    on_end: Callable[[EngineGeneration], None] = lambda _g: None,
    spawn: Callable[[EngineConfig, EnginePlace], int] | None = None,
    silent_s: float = SILENT_S,
    stall_s: float = STALL_S,
) -> Connection:
    """A connection to the engine for ``config``, starting it if none answers (``start``).

    Connect; else, if no engine holds its lock, take the start lock and spawn one (the
    others, finding the start lock taken, only wait); then retry with backoff until the
    engine answers or ``timeout_s`` passes. At most one engine is spawned: one that
    ends before it answers (its log says why) is not spawned again, and what stands at
    the socket path that no engine can clear (``socket_obstacle``: a folder) is said
    at once, before any spawn (#34: a folder there made a window spawn 73 engines).
    """

    def default_spawn(c: EngineConfig, p: EnginePlace) -> int:
        return spawn_engine(c, p, idle_s=idle_s)

    spawn = spawn or default_spawn
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    start_lock = place.lock.with_suffix(".start")
    spawned: int | None = None  # the engine this call started
    while True:
        try:
            return await Connection.open(
                str(place.socket),
                fingerprint=place.name,
                window=window,
                timeout_s=max(1.0, deadline - time.monotonic()),
                on_end=on_end,
                silent_s=silent_s,
                stall_s=stall_s,
            )
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        obstacle = socket_obstacle(place.socket)
        if obstacle is not None:
            raise EngineSetupError(obstacle)
        if not start:
            raise EngineError(f"no Kode engine is running on {place.socket}")
        if not lock_is_held(place.lock):
            if spawned is not None:
                raise EngineError(
                    f"the Kode engine this window started (pid {spawned}) ended before it "
                    f"answered; its log: {place.log}"
                )
            spawned = await asyncio.to_thread(
                _start_once, start_lock, place, config, spawn, deadline
            )
        if time.monotonic() >= deadline:
            raise EngineError(
                f"no Kode engine answered on {place.socket} within {timeout_s:.0f} s "
                f"(its log: {place.log})"
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


def _start_once(
    start_lock: Any,
    place: EnginePlace,
    config: EngineConfig,
    spawn: Callable[[EngineConfig, EnginePlace], int],
    deadline: float,
) -> int | None:
    """Spawn the engine unless another window is doing it; hold the start lock until the
    engine holds its own lock (or it gave up), so that exactly one is spawned. The pid
    spawned, None if none was."""
    fd = os.open(start_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # another window is starting it
        if lock_is_held(place.lock):
            return None
        pid = spawn(config, place)
        log.info("started the Kode engine (pid %d) for %s", pid, config.model.name)
        while time.monotonic() < deadline and not lock_is_held(place.lock):
            if not alive(pid):
                break
            time.sleep(0.02)
        return pid
    finally:
        os.close(fd)


def end_process(pid: int, grace_s: float = 2.0) -> None:
    """End a hung engine: SIGTERM, then SIGKILL if it is still there after ``grace_s``
    (a hung event loop never runs its SIGTERM handler); returns once it is gone or 2 s
    after the SIGKILL. Never this process (a test's engine may live in it)."""
    if pid <= 1 or pid == os.getpid():
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not alive(pid):
                return
            time.sleep(0.02)


class KvMirror:
    """What this window's generations left evaluated in the engine, to estimate
    ``cached_prefix`` without a round trip: the evaluated tokens of recent prompts
    (longest common prefix), and the last prompt's suffix moved after an edit.

    >>> m = KvMirror()
    >>> m.remember([1, 2, 3, 4, 5], evaluated=5)
    >>> m.reach([1, 2, 3, 9])
    3
    """

    def __init__(self, size: int = _MIRRORED) -> None:
        self._size = size
        self._prompts: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self._last: tuple[int, ...] = ()

    def remember(self, tokens: list[int], evaluated: int) -> None:
        kept = tuple(tokens[: max(0, evaluated)])
        if not kept:
            return
        self._prompts.pop(kept, None)
        self._prompts[kept] = None
        while len(self._prompts) > self._size:
            self._prompts.popitem(last=False)
        self._last = kept

    def reach(self, tokens: list[int]) -> int:
        best = max((prefix_reach(p, tokens, None) for p in self._prompts), default=0)
        if len(self._last) >= 2:
            plan = plan_moved_tail(self._last, tokens, refresh=MOVED_REFRESH)
            if plan is not None:
                best = max(best, plan.keep + plan.length)
        return min(best, max(len(tokens) - 1, 0))


class SharedEngineBackend:
    """The ``Backend`` protocol over the shared engine (or, after a failure, over the
    in-process backend ``fallback`` loads)."""

    def __init__(
        self,
        config: EngineConfig,
        place: EnginePlace,
        vocab: Vocabulary,
        *,
        idle_s: float,
        fallback: Callable[[], Awaitable[Backend]],
        notify: Notify,
        timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.place = place
        self._vocab = vocab
        self.idle_s = idle_s
        self._load_fallback = fallback
        self._notify = notify
        self._timeout_s = timeout_s
        self.counters = BackendCounters()
        self.mirror = KvMirror()
        self._conn: Connection | None = None
        self._fallback: Backend | None = None
        self._lock = asyncio.Lock()
        self._kv: dict[str, int] = {}
        self.restarts = 0
        self._closed = False
        self._spawn: Callable[[EngineConfig, EnginePlace], int] | None = None  # tests swap it
        self._end_hung: Callable[[int], None] = end_process  # tests swap it
        self.silent_s, self.stall_s = SILENT_S, STALL_S
        self._moving: set[asyncio.Future[None]] = set()

    # -- Backend protocol -----------------------------------------------------------------

    @property
    def name(self) -> str:
        if self._fallback is not None:
            return self._fallback.name
        return "llama.cpp" if self._conn is None else self._conn.welcome.engine

    @property
    def model_name(self) -> str:
        return self.config.model.name

    def count_tokens(self, text: str) -> int:
        return len(self._vocab.tokenize(text))

    def last_token_chars(self, text: str) -> int:
        """``TokenHealing``, answered in the window from the vocabulary (the engine's
        llama.cpp backend then constrains the generation's first tokens to spell the
        ``heal`` text the request carries): the characters of ``text``'s last token, 0
        when that token does not end on a character boundary."""
        if self._fallback is not None:
            if isinstance(self._fallback, TokenHealing):
                return self._fallback.last_token_chars(text)
            return 0
        tokens = self._vocab.tokenize(text, special=False)
        if not tokens:
            return 0
        try:
            last = self._vocab.piece(tokens[-1]).decode()
        except UnicodeDecodeError:
            return 0
        return len(last) if last and text.endswith(last) else 0

    async def generate(self, request: GenerationRequest) -> Any:
        if self._closed:
            raise BackendClosed("backend is closed")
        conn = await self._connection()
        if conn is None:
            assert self._fallback is not None
            return await self._fallback.generate(request)
        generation = conn.generate(request)
        generation.on_prompt = self._evaluated
        return generation

    async def health(self, timeout_s: float = 1.0) -> bool:
        if self._fallback is not None:
            return await self._fallback.health(timeout_s)
        conn = self._conn
        if conn is None or conn.closed:
            return False
        try:
            await conn.status(timeout_s)
        except (EngineError, TimeoutError):
            return False
        return True

    async def aclose(self) -> None:
        self._closed = True
        if self._conn is not None:
            await self._conn.close()
        if self._fallback is not None:
            await self._fallback.aclose()
        self._vocab.close()

    # -- PromptCache, KvMemoryReport, EngineReport -------------------------------------------

    def cached_prefix(self, prompt: str) -> tuple[int, int]:
        if self._fallback is not None:
            if isinstance(self._fallback, PromptCache):
                return self._fallback.cached_prefix(prompt)
            return 0, self.count_tokens(prompt)
        tokens = self._vocab.tokenize(prompt)
        return self.mirror.reach(tokens), len(tokens)

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """The prefill speed the engine measured for earlier windows (``PrefillSpeed``)."""
        if self._fallback is not None or self._conn is None:
            return None
        return self._conn.welcome.prefill_tokens_per_s

    @property
    def kv_memory(self) -> dict[str, int]:
        """The engine's saved-state memory as its last answer to this window reported it."""
        return dict(self._kv)

    @property
    def engine_info(self) -> dict[str, Any]:
        conn = self._conn
        if self._fallback is not None:
            return {"kind": "inProcess", "pid": os.getpid(), "fallback": True}
        return {
            "kind": "shared",
            "pid": None if conn is None else conn.welcome.pid,
            "socket": str(self.place.socket),
            "connected": conn is not None and not conn.closed,
            "restarts": self.restarts,
        }

    # -- the connection -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect to (or start) the engine; on failure, fall back and say why."""
        async with self._lock:
            if self._conn is None and self._fallback is None:
                await self._open_or_fall_back()

    async def _connection(self) -> Connection | None:
        async with self._lock:
            if self._fallback is not None:
                return None
            conn = self._conn
            if conn is not None and not conn.closed:
                return conn
            if conn is not None:
                if self.restarts >= MAX_RESTARTS:
                    await self._fall_back(
                        f"the shared Kode engine stopped again (it was restarted "
                        f"{self.restarts} time); see {self.place.log}"
                    )
                    return None
                self.restarts += 1
                log.warning("the Kode engine (pid %d) is gone; starting it again", conn.welcome.pid)
            return await self._open_or_fall_back()

    async def _open_or_fall_back(self) -> Connection | None:
        try:
            self._conn = await connect(
                self.config,
                self.place,
                idle_s=self.idle_s,
                timeout_s=self._timeout_s,
                on_end=self._ended,
                spawn=self._spawn,
                silent_s=self.silent_s,
                stall_s=self.stall_s,
            )
            self._conn.on_lost = self._lost
            self._conn.on_hung = self._end_hung
        except (EngineError, OSError) as exc:
            await self._fall_back(describe(exc))
            return None
        log.info("using the Kode engine pid %d on %s", self._conn.welcome.pid, self.place.socket)
        return self._conn

    async def _fall_back(self, why: str) -> None:
        self._notify(
            f"Kode: the shared engine is not available ({why}); this window loads its own "
            "copy of the model"
        )
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        self._fallback = await self._load_fallback()

    def _lost(self, generations: list[EngineGeneration]) -> bool:
        """The engine died before these produced anything: run them on a restarted one
        (once per window, as any restart), else on the window's own model, so that the
        keystroke is still answered."""
        if self._closed:
            return False

        async def move() -> None:
            conn = await self._connection()
            for generation in generations:
                if conn is not None:
                    conn.adopt(generation)
                elif self._fallback is not None:  # the user was told, once
                    generation.run_on(self._fallback)
                else:
                    generation.fail(EngineError("the shared Kode engine stopped"))

        task = asyncio.ensure_future(move())
        self._moving.add(task)
        task.add_done_callback(self._moving.discard)
        return True

    def _prompt_tokens(self, generation: EngineGeneration) -> list[int]:
        if generation.tokens is None:
            generation.tokens = self._vocab.tokenize(generation.request.prompt)
        return generation.tokens

    def _evaluated(self, generation: EngineGeneration) -> None:
        """The first token came: the engine holds the whole prompt now. Known at once, not
        at the generation's end, so that what the window prepares next (``cached_prefix``)
        never re-does a prompt that a generation still running (or being cancelled) has
        already evaluated."""
        tokens = self._prompt_tokens(generation)
        self.mirror.remember(tokens, len(tokens))

    def _ended(self, generation: EngineGeneration) -> None:
        stats = generation.stats
        self.counters.record(stats, generation.decode_calls)
        if stats.prompt_tokens:
            tokens = self._prompt_tokens(generation)
            self.mirror.remember(tokens, stats.reused_prompt_tokens + stats.evaluated_prompt_tokens)
        if generation.kv is not None:
            self._kv = generation.kv
