"""What the shared engine's tests over a real Unix socket run on: an in-memory backend
instead of a model (``SlowBackend``, and ``StuckBackend`` whose generations never end),
an ``EngineServer`` on the test's loop (``InLoopEngine``), a window's connection and
client, a one-token-per-character vocabulary (``CharVocab``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kode.backends.base import (
    Backend,
    FinishReason,
    GenerationRequest,
    GenerationStats,
    TokenChunk,
)
from kode.backends.daemon.client import SharedEngineBackend
from kode.backends.daemon.connection import Connection
from kode.backends.daemon.paths import EngineConfig, EngineLock, EnginePlace
from kode.backends.daemon.server import EngineServer
from kode.backends.errors import ContextOverflow
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


class InLoopEngine:
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


class CharVocab:
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
        CharVocab(),
        idle_s=60,
        fallback=in_process,
        notify=lambda m: None,
        timeout_s=STEP_S,
    )


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
        CharVocab(),
        idle_s=60,
        fallback=in_process,
        notify=notices.append,
        timeout_s=STEP_S,
    )

    def spawn(_config: EngineConfig, _p: EnginePlace) -> int:
        spawned.append(0)
        return 0  # no such process: it ended at once

    backend.engine.spawn = spawn
    return backend, fallback


class StuckBackend(SlowBackend):
    """Its generations never produce a token nor end (a model call that never returns);
    its ``progress`` stands still."""

    progress = 7

    async def generate(self, request: GenerationRequest) -> SlowGeneration:
        self.started.append(request.document)
        self.delay = 3600.0
        return SlowGeneration(self, request)
