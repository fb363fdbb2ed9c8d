"""What the completion engine's tests share (tests/unit and tests/process): a backend
that answers every prompt from a script (``ScriptedBackend``), one that also remembers
what it evaluated (``CachingBackend``), an engine over one (``engine_for``), and a
small project whose outline of constants costs many tokens (``constants_project``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from kode.backends.base import FinishReason, GenerationRequest, GenerationStats, TokenChunk
from kode.backends.worker import BackendCounters
from kode.completion.clock import ManualClock
from kode.completion.engine import CompletionEngine
from kode.completion.settings import parse

URI = "file:///p/m.py"


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
    """Answers every prompt with ``pieces``, one per ``delay`` seconds."""

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


def engine_for(
    backend: ScriptedBackend, clock: ManualClock | None = None, **settings: object
) -> CompletionEngine:
    async def factory(_settings: object) -> ScriptedBackend:
        return backend

    parsed, problems = parse({"snippetTokens": 0, **settings})
    assert problems == []
    return CompletionEngine(factory, parsed, clock=clock)  # type: ignore[arg-type]


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


async def until(condition: object, seconds: float = 10.0) -> None:
    """Wait for ``condition`` to hold, never for a time: ``seconds`` only turns a hang
    into a failure (a loaded machine is slow, never wrong)."""
    async with asyncio.timeout(seconds):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def settled(engine: CompletionEngine, seconds: float = 10.0) -> None:
    """Wait until the engine's background tasks (read-ahead, prefetch, a suggestion being
    dropped) and its preparation have ended: after it, a check that something did *not*
    happen holds without sleeping. On a ``ManualClock``, advance it first."""
    async with asyncio.timeout(seconds):
        while engine.background or engine.preparation.preparing:
            task = engine.preparation.task
            pending = [*engine.background.pending(), *([task] if task is not None else [])]
            await asyncio.wait(pending)


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path.resolve()


def constants_project(root: Path) -> Path:
    """``starlette/endpoints.py:87`` in small: a module of status codes, whose outline
    costs far more tokens than its characters say, and definitions used at the cursor."""
    write(root, "web/__init__.py", "")
    write(
        root,
        "web/status.py",
        "".join(f"WS_{1000 + i}_CLOSE_REASON_{i} = {1000 + i}\n" for i in range(60)),
    )
    write(
        root,
        "web/concurrency.py",
        "async def run_until_first_complete_quill(*args):\n"
        '    """Run the awaitables given, return when the first one is done."""\n'
        "    return await first_of(args)\n\n\n"
        "async def run_in_threadpool_brisk(func, *args):\n"
        "    return await to_thread(func, *args)\n",
    )
    app = "from web import status\nfrom web.concurrency import run_until_first_complete_quill\n"
    app += "from web.concurrency import run_in_threadpool_brisk\n\n\nasync def dispatch(ws):\n"
    app += "    await run_until_first_complete_quill(ws)\n    await run_in_threadpool_brisk(ws)\n"
    app += "    code = status."
    return write(root, "web/endpoints.py", app)
