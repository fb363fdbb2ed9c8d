"""Every place fast, without a model: the latency budget picks a window that fits the
prefill speed (injected, never timed), the cursor notification prepares windows in the
background, and any request cancels that background work."""

from __future__ import annotations

import asyncio

from kode.backends.base import GenerationRequest, PromptCache
from kode.completion.documents import Position
from kode.completion.engine import CompletionEngine, PrefillRate
from kode.completion.settings import parse
from test_engine import URI, ScriptedBackend, ScriptedGeneration

# 400 lines of four "tokens" each (the scripted backend counts whitespace-separated words).
DOC = "".join(f"value_{i} = compute ( {i} )\n" for i in range(400))


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


def engine_for(backend: ScriptedBackend, rate: float, **settings: object) -> CompletionEngine:
    async def factory(_settings: object) -> ScriptedBackend:
        return backend

    parsed, problems = parse({"snippetTokens": 0, "readAhead": False, **settings})
    assert problems == []
    return CompletionEngine(
        factory,  # type: ignore[arg-type]
        parsed,
        prefill_rate=PrefillRate(rate, fixed=True),
    )


async def until(condition: object, seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


def test_the_fake_declares_the_prompt_cache_protocol() -> None:
    assert isinstance(CachingBackend(["x"]), PromptCache)
    assert not isinstance(ScriptedBackend(["x"]), PromptCache)


async def test_a_slow_prefill_answers_from_a_window_that_fits_the_budget() -> None:
    backend = CachingBackend([" + 1"])
    # 100 tokens/s and 1,000 ms: at most 100 tokens may be evaluated for the answer.
    engine = engine_for(backend, 100.0, firstAnswerMs=1000)
    engine.documents.open(URI, DOC, 1)
    result = await engine.complete(URI, Position(390, 10))
    assert result.text
    prompt = backend.requests[-1].prompt.split()
    assert len(prompt) <= 100 + 10  # + the template's few header tokens
    assert engine.short_answers == 1
    # The next request at that place reuses the short window (its cache): still short,
    # and nearly nothing left to evaluate.
    await engine.complete(URI, Position(390, 12))
    cached, total = backend.cached_prefix(backend.requests[-1].prompt)
    assert total <= 110 and total - cached <= 30


async def test_a_fast_prefill_uses_the_full_window() -> None:
    backend = CachingBackend([" + 1"])
    engine = engine_for(backend, 100_000.0, firstAnswerMs=1000)
    engine.documents.open(URI, DOC, 1)
    await engine.complete(URI, Position(390, 10))
    assert len(backend.requests[-1].prompt.split()) > 900
    assert engine.short_answers == 0


async def test_budget_off_always_uses_the_full_window() -> None:
    backend = CachingBackend([" + 1"])
    engine = engine_for(backend, 10.0, firstAnswerMs=0)
    engine.documents.open(URI, DOC, 1)
    await engine.complete(URI, Position(390, 10))
    assert len(backend.requests[-1].prompt.split()) > 900


async def test_the_cursor_notification_prepares_a_short_then_the_full_window() -> None:
    backend = CachingBackend(["x"])
    engine = engine_for(backend, 100.0, firstAnswerMs=1000)
    engine.documents.open(URI, DOC, 1)
    engine.cursor_moved(URI, Position(390, 10))
    await until(lambda: engine.prepared >= 2)
    short, full = backend.requests[0], backend.requests[1]
    assert short.max_tokens == full.max_tokens == 1
    # 2.5 s of reading at 100 tokens/s: about 250 tokens first, then the whole window.
    assert len(short.prompt.split()) <= 250 + 10
    assert len(full.prompt.split()) > 900
    await asyncio.sleep(0.4)
    assert len(backend.requests) == 2  # nothing left to prepare
    # The keystroke there now finds the full window evaluated: it uses it.
    await engine.complete(URI, Position(390, 10))
    assert backend.requests[-1].prompt == full.prompt
    assert engine.short_answers == 0
    assert backend.requests[-1].max_tokens > 1  # a real generation, not the prepared one
    await engine.aclose()


async def test_a_request_cancels_background_preparation() -> None:
    backend = CachingBackend(["x"] * 100, delay=0.05)  # preparation that would take 5 s
    engine = engine_for(backend, 100_000.0, firstAnswerMs=1000)
    engine.documents.open(URI, DOC, 1)
    engine.documents.open("file:///p/other.py", "def f():\n    ", 1)
    engine.cursor_moved(URI, Position(390, 10))
    await until(lambda: len(backend.generations) == 1)
    backend.pieces = ["y"]
    # A request in another document: the preparation stops at once.
    async with asyncio.timeout(2):
        await engine.complete("file:///p/other.py", Position(1, 4))
    assert backend.generations[0].cancelled
    await engine.aclose()


async def test_a_tab_opened_meanwhile_is_not_read_ahead_over_the_active_file() -> None:
    backend = CachingBackend([" + 1"])
    engine = engine_for(backend, 100_000.0, readAhead=True)
    engine.documents.open(URI, DOC, 1)
    await engine.complete(URI, Position(390, 10))  # the user works in URI
    other = "file:///p/tab.py"
    engine.documents.open(other, "def g():\n    return 1\n", 1)
    engine.document_opened(other)
    await asyncio.sleep(0.6)  # past the read-ahead delay
    assert engine.read_aheads == 0
    assert all(r.prompt.count("def g") == 0 for r in backend.requests)
    await engine.aclose()
