"""A window's connection to the shared engine: ``Connection`` (one session over the Unix
socket: requests go out, a reader task routes what comes back, a watchdog gives a hung
engine up) and ``EngineGeneration`` (one generation running in the engine, as the window
consumes it). Finding or starting the engine is ``launch``; the ``Backend`` over it is
``client.SharedEngineBackend``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from kode.backends.base import (
    Backend,
    FinishReason,
    Generation,
    GenerationRequest,
    GenerationStats,
    TokenChunk,
)
from kode.backends.chunks import ChunkQueue, drain
from kode.backends.daemon import protocol as wire
from kode.backends.defaults import KODE_VERSION
from kode.backends.errors import (
    BackendClosed,
    BackendError,
    EngineError,
    EngineSetupError,
    describe,
)
from kode.backends.system import peer_credentials

log = logging.getLogger("kode.engine")

# The hang watchdog, while this window has work in the engine: the engine sends a
# heartbeat every second (``server.HEARTBEAT_S``). Silent this long: its event loop hangs.
SILENT_S = 15.0
# Its progress (model calls, generations served) standing still this long: its model
# hangs. A prompt batch on a busy 2-core machine takes seconds, never minutes.
STALL_S = 120.0


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
        self.chunks: dict[str, int] | None = None  # its chunk store when it ended
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
        self.chunks = end.chunks
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
