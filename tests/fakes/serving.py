"""Backends under ``kode serve``'s workers and the router, without a model or a server:
``FakeLocal`` (a local backend stand-in of fixed chunks) and its factory
``LocalFactory``; over it ``GatedEndLocal`` (its generations end when the test opens a
gate) and ``BrokenLocal`` (it cannot generate); ``ScriptedRemote``, a remote backend
whose generations behave as told."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from kode.backends.base import FinishReason, GenerationRequest, GenerationStats, TokenChunk
from kode.backends.errors import BackendError, RemoteBusyError, RemoteError
from kode.backends.worker import BackendCounters


class FixedGeneration:
    """A generation that yields fixed chunks (optionally slowly)."""

    def __init__(self, chunks: Sequence[str], delay: float = 0.0) -> None:
        self._chunks = list(chunks)
        self._delay = delay
        self._stats = GenerationStats()
        self.cancelled = False

    @property
    def stats(self) -> GenerationStats:
        return self._stats

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        for text in self._chunks:
            if self.cancelled:
                return
            if self._delay:
                await asyncio.sleep(self._delay)
            self._stats.completion_tokens += 1
            yield TokenChunk(text, ())
        self._stats.finish_reason = FinishReason.END

    async def cancel(self) -> None:
        self.cancelled = True
        if self._stats.finish_reason is None:
            self._stats.finish_reason = FinishReason.CANCELLED

    async def wait(self) -> GenerationStats:
        return self._stats


@dataclass
class FakeLocal:
    """A local backend stand-in; ``loads`` counts how often the factory built it."""

    chunks: Sequence[str] = ("local", " text")
    delay: float = 0.0  # seconds before each chunk
    requests: list[GenerationRequest] = field(default_factory=list)
    closed: bool = False
    counters: BackendCounters = field(default_factory=BackendCounters)

    @property
    def name(self) -> str:
        return "fake-local"

    @property
    def model_name(self) -> str:
        return "fake-local-model"

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def generate(self, request: GenerationRequest) -> FixedGeneration:
        self.requests.append(request)
        return FixedGeneration(self.chunks, self.delay)

    async def health(self, timeout_s: float = 1.0) -> bool:
        return not self.closed

    async def aclose(self) -> None:
        self.closed = True


@dataclass
class LocalFactory:
    backend: FakeLocal = field(default_factory=FakeLocal)
    loads: int = 0

    async def __call__(self) -> FakeLocal:
        self.loads += 1
        return self.backend


class GatedEndGeneration(FixedGeneration):
    """Yields its chunks, then waits for ``gate`` before it ends."""

    def __init__(self, chunks: list[str], gate: asyncio.Event) -> None:
        super().__init__(chunks)
        self.gate = gate

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        for text in self._chunks:
            self._stats.completion_tokens += 1
            yield TokenChunk(text, ())
        await self.gate.wait()
        self._stats.finish_reason = FinishReason.END


class GatedEndLocal(FakeLocal):
    """Its generations yield "a", "b", then end once the test sets ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> FixedGeneration:
        self.requests.append(request)
        return GatedEndGeneration(["a", "b"], self.gate)


class BrokenLocal(FakeLocal):
    async def generate(self, request: GenerationRequest) -> FixedGeneration:
        raise BackendError("the engine is gone")


class RemoteGeneration:
    """A remote generation: ``ok``, ``error`` (before any text), ``slow``, ``mid-error``."""

    def __init__(self, behavior: str) -> None:
        self.behavior = behavior
        self._stats = GenerationStats()
        self.cancelled = False

    @property
    def stats(self) -> GenerationStats:
        return self._stats

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        if self.behavior == "error":
            raise RemoteBusyError("sglang answered HTTP 429")
        if self.behavior == "slow":
            await asyncio.sleep(30)
        yield TokenChunk("remote", ())
        if self.behavior == "mid-error":
            raise RemoteError("connection reset")
        yield TokenChunk(" text", ())

    async def cancel(self) -> None:
        self.cancelled = True

    async def wait(self) -> GenerationStats:
        return self._stats


@dataclass
class ScriptedRemote:
    """A remote backend whose generations behave as ``behavior`` says."""

    behavior: str = "ok"
    healthy: bool = True
    generations: list[RemoteGeneration] = field(default_factory=list)
    probes: int = 0
    closed: bool = False
    counters: BackendCounters = field(default_factory=BackendCounters)

    @property
    def name(self) -> str:
        return "sglang"

    @property
    def model_name(self) -> str:
        return "remote-model"

    def count_tokens(self, text: str) -> int:
        return len(text) // 3 + 1

    async def generate(self, request: GenerationRequest) -> RemoteGeneration:
        generation = RemoteGeneration(self.behavior)
        self.generations.append(generation)
        return generation

    async def health(self, timeout_s: float = 1.0) -> bool:
        self.probes += 1
        return self.healthy

    async def aclose(self) -> None:
        self.closed = True
