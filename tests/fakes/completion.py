"""Backends and generations the completion engine and the language server run on, without
a model.

The scripted family answers every prompt from a script, one piece per ``delay`` seconds:
``ScriptedBackend`` (its own factory too, as ``lsp_wire.Wire`` takes one), and over it
``CachingBackend`` (remembers what it evaluated: a prompt cache), ``ColdCacheBackend``
(a prompt cache that has evaluated nothing), ``SteppedBackend`` (the test releases each
piece), ``ClockedBackend`` (pieces on the engine's ``ManualClock``),
``GatedBackgroundBackend`` (background generations wait for a gate),
``SlowToStopBackend`` (a cancel takes until the test says) and ``PrefillTimedBackend``
(reports a prefill speed of 100 tokens/s). ``FailingBackend`` behaves like the real
backends where it matters (strict UTF-8 prompts) and can fail before or after its first
tokens; ``LatencyTimedBackend`` reports a time to first token and a total.
``engine_for`` builds a ``CompletionEngine`` over any of them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

from kode.backends.base import (
    FinishReason,
    GenerationRequest,
    GenerationStats,
    PrefillRate,
    TokenChunk,
)
from kode.backends.worker import BackendCounters
from kode.completion.clock import ManualClock
from kode.completion.engine import CompletionEngine
from kode.completion.settings import Settings, parse

URI = "file:///p/m.py"

# The engine tests' settings under their own: no snippets of the other open documents.
NO_SNIPPETS: Mapping[str, object] = {"snippetTokens": 0}
# The preparation tests': nor a read-ahead of a newly opened document (prepared only
# when the test moves the cursor).
NO_READ_AHEAD: Mapping[str, object] = {**NO_SNIPPETS, "readAhead": False}


def engine_for(
    backend: ScriptedBackend,
    clock: ManualClock | None = None,
    *,
    rate: float | None = None,
    defaults: Mapping[str, object] = NO_SNIPPETS,
    **settings: object,
) -> CompletionEngine:
    """A ``CompletionEngine`` over ``backend``, with ``defaults`` and then ``settings``;
    ``rate``: a fixed prefill speed in tokens/s (else the engine learns one)."""

    async def factory(_settings: object) -> ScriptedBackend:
        return backend

    parsed, problems = parse({**defaults, **settings})
    assert problems == []
    prefill_rate = None if rate is None else PrefillRate(rate, fixed=True)
    return CompletionEngine(factory, parsed, prefill_rate=prefill_rate, clock=clock)


# -- the scripted family --------------------------------------------------------------


class ScriptedGeneration:
    def __init__(self, pieces: list[str], delay: float) -> None:
        self._pieces, self._delay = pieces, delay
        self._cancelled = asyncio.Event()
        self._done = asyncio.Event()
        self.stats = GenerationStats()

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        try:
            for i, piece in enumerate(self._pieces):
                if self._cancelled.is_set():
                    self.stats.finish_reason = FinishReason.CANCELLED
                    return
                await asyncio.sleep(self._delay)
                self.stats.completion_tokens += 1
                yield TokenChunk(piece, (i,))
            self.stats.finish_reason = FinishReason.END
        finally:
            if self.stats.finish_reason is None:  # the consumer left early
                self.stats.finish_reason = FinishReason.CANCELLED
            self._cancelled.set()
            self._done.set()

    async def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    async def wait(self) -> GenerationStats:
        await self._done.wait()
        return self.stats


class ScriptedBackend:
    """Answers every prompt with ``pieces``, one per ``delay`` seconds. It is its own
    factory (``await backend(settings)``), as ``lsp_wire.Wire`` takes one."""

    name = "scripted"
    model_name = "script"

    def __init__(self, pieces: list[str], delay: float = 0.01) -> None:
        self.pieces, self.delay = pieces, delay
        self.requests: list[GenerationRequest] = []
        self.generations: list[ScriptedGeneration] = []
        self.counters = BackendCounters()

    def count_tokens(self, text: str) -> int:
        return len(text.split()) + 1

    async def generate(self, request: GenerationRequest) -> ScriptedGeneration:
        self.requests.append(request)
        generation = ScriptedGeneration(list(self.pieces), self.delay)
        self.generations.append(generation)
        return generation

    async def health(self, timeout_s: float = 1.0) -> bool:
        return True

    async def aclose(self) -> None:
        return None

    async def __call__(self, settings: object) -> ScriptedBackend:
        return self


class CachingBackend(ScriptedBackend):
    """A scripted backend that remembers every prompt it started as evaluated."""

    def __init__(self, pieces: list[str], delay: float = 0.01) -> None:
        super().__init__(pieces, delay)
        self.evaluated: list[list[str]] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def cached_prefix(self, prompt: str) -> tuple[int, int]:
        words = prompt.split()
        best = 0
        for old in self.evaluated:
            n = 0
            for a, b in zip(old, words, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best, len(words)

    async def generate(self, request: GenerationRequest) -> ScriptedGeneration:
        self.evaluated.append(request.prompt.split())
        return await super().generate(request)


class ColdCacheBackend(ScriptedBackend):
    """A ``PromptCache`` that has evaluated nothing: the start-up timing runs on it."""

    def cached_prefix(self, prompt: str) -> tuple[int, int]:
        return 0, self.count_tokens(prompt)


class PrefillTimedBackend(CachingBackend):
    """Every generation reports 200 prompt tokens evaluated in 2 s: 100 tokens/s."""

    async def generate(self, request: GenerationRequest) -> ScriptedGeneration:
        generation = await super().generate(request)
        generation.stats.evaluated_prompt_tokens = 200
        generation.stats.prefill_ms = 2000.0
        return generation


class SteppedGeneration(ScriptedGeneration):
    """Yields its next piece each time ``released`` is released (by the test)."""

    def __init__(self, pieces: list[str], released: asyncio.Semaphore) -> None:
        super().__init__(pieces, 0.0)
        self._released = released

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        try:
            for i, piece in enumerate(self._pieces):
                await self._released.acquire()
                if self._cancelled.is_set():
                    break
                self.stats.completion_tokens += 1
                yield TokenChunk(piece, (i,))
            else:
                self.stats.finish_reason = FinishReason.END
        finally:
            if self.stats.finish_reason is None:
                self.stats.finish_reason = FinishReason.CANCELLED
            self._done.set()


class SteppedBackend(ScriptedBackend):
    """Its generations yield the next piece each time the test calls ``release``."""

    def __init__(self, pieces: list[str]) -> None:
        super().__init__(pieces, delay=0.0)
        self.released = asyncio.Semaphore(0)

    def release(self) -> None:
        self.released.release()

    async def generate(self, request: GenerationRequest) -> ScriptedGeneration:
        self.requests.append(request)
        generation = SteppedGeneration(list(self.pieces), self.released)
        self.generations.append(generation)
        return generation


class ClockedGeneration(ScriptedGeneration):
    """Its pieces come one per ``step`` seconds of ``clock`` (the engine's): the test
    says when each is generated by moving the clock on."""

    def __init__(self, pieces: list[str], clock: ManualClock, step: float) -> None:
        super().__init__(pieces, 0.0)
        self._clock, self._step = clock, step

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        async with contextlib.aclosing(super().__aiter__()) as pieces:
            async for chunk in pieces:
                await self._clock.sleep(self._step)
                yield chunk


class ClockedBackend(ScriptedBackend):
    """A scripted backend whose generations are ``ClockedGeneration``s."""

    def __init__(self, pieces: list[str], clock: ManualClock, step: float) -> None:
        super().__init__(pieces)
        self.clock, self.step = clock, step

    async def generate(self, request: GenerationRequest) -> ScriptedGeneration:
        self.requests.append(request)
        generation = ClockedGeneration(list(self.pieces), self.clock, self.step)
        self.generations.append(generation)
        return generation


class GatedBackgroundBackend(ScriptedBackend):
    """A scripted backend whose background and prefetch generations start only when
    ``gate`` is set: the moment a request can come in between."""

    def __init__(self, pieces: list[str], delay: float = 0.01) -> None:
        super().__init__(pieces, delay)
        self.gate = asyncio.Event()
        self.waiting = 0

    async def generate(self, request: GenerationRequest) -> ScriptedGeneration:
        if request.background:
            self.waiting += 1
            await self.gate.wait()
        return await super().generate(request)


class SlowToStopBackend(ScriptedBackend):
    """A backend whose generations take until ``stopped`` is set to end once cancelled
    (a shared engine's round trip and its decode step)."""

    def __init__(self, pieces: list[str]) -> None:
        super().__init__(pieces, delay=0.01)
        self.stopped = asyncio.Event()
        self.events: list[str] = []

    async def generate(self, request: GenerationRequest) -> ScriptedGeneration:
        self.events.append(f"generate {len(self.requests)}")
        generation = await super().generate(request)
        backend = self

        async def cancel() -> None:
            generation._cancelled.set()
            await backend.stopped.wait()
            backend.events.append("stopped")

        generation.cancel = cancel  # type: ignore[method-assign]
        return generation


# -- the failing family ---------------------------------------------------------------


class FailingGeneration:
    def __init__(self, chunks: Sequence[str], error: Exception | None, fail_after: int) -> None:
        self._chunks, self._error, self._fail_after = list(chunks), error, fail_after
        self._stats = GenerationStats()

    @property
    def stats(self) -> GenerationStats:
        return self._stats

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        for n, text in enumerate(self._chunks):
            if self._error is not None and n == self._fail_after:
                raise self._error
            await asyncio.sleep(0)
            self._stats.completion_tokens += 1
            yield TokenChunk(text, ())
        if self._error is not None:
            raise self._error
        self._stats.finish_reason = FinishReason.END

    async def cancel(self) -> None:
        return None

    async def wait(self) -> GenerationStats:
        return self._stats


@dataclass
class FailingBackend:
    """Answers ``chunks``; with ``error`` set, raises it after ``fail_after`` chunks. It
    encodes the prompt as UTF-8, strictly, as llama.cpp's tokenizer does."""

    chunks: Sequence[str] = (" = 1",)
    error: Exception | None = None
    fail_after: int = 0
    prompts: list[str] = field(default_factory=list)

    name = "failing"
    model_name = "failing-model"

    def count_tokens(self, text: str) -> int:
        return len(text.encode("utf-8")) // 4 + 1  # strict, like a real tokenizer

    async def generate(self, request: GenerationRequest) -> FailingGeneration:
        request.prompt.encode("utf-8")  # llama.cpp's tokenizer: UnicodeEncodeError here
        self.prompts.append(request.prompt)
        return FailingGeneration(self.chunks, self.error, self.fail_after)

    async def aclose(self) -> None:
        return None

    async def __call__(self, settings: Settings) -> FailingBackend:
        return self


class LatencyTimedBackend(FailingBackend):
    """Its generations took ``ttft_ms`` to the first token and ``total_ms`` in all."""

    ttft_ms = 100.0
    total_ms = 1100.0

    async def generate(self, request: GenerationRequest) -> FailingGeneration:
        generation = await super().generate(request)
        generation.stats.ttft_ms, generation.stats.total_ms = self.ttft_ms, self.total_ms
        return generation
