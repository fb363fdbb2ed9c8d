"""Moved-suffix KV reuse on the real 0.5B model (``backends/kv_reuse.py``).

After a keystroke in PSM order only the typed tokens, ``<|fim_suffix|>`` and the last
token are evaluated; the suffix entries are moved. Exact requests never see those
approximate entries.
"""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kode.backends import models
from kode.backends.base import GenerationRequest, GenerationStats, SpeculationMethod
from kode.backends.kv_reuse import MOVED_REFRESH
from kode.backends.llama.backend import LlamaBackend
from kode.backends.speculative import CostCurve

pytestmark = [pytest.mark.model, pytest.mark.asyncio(loop_scope="module")]

PREFIX = """from dataclasses import dataclass


@dataclass
class Rectangle:
    width: float
    height: float

    def area(self) -> float:
        return self.width * self.height

    def perimeter(self) -> float:
        return 2 * (self."""
SUFFIX = textwrap.dedent(
    """\



    @dataclass
    class Square:
        side: float

        def area(self) -> float:
            return self.side * self.side
"""
)


def prompt(prefix: str) -> str:
    return f"<|fim_prefix|>{prefix}<|fim_suffix|>{SUFFIX}<|fim_middle|>"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend() -> AsyncIterator[LlamaBackend]:
    b = await LlamaBackend.load(models.resolve("small"), n_ctx=2048, curve=CostCurve({1: 1.0}))
    yield b
    await b.aclose()


async def run(backend: LlamaBackend, text: str, drift: int) -> tuple[list[int], GenerationStats]:
    request = GenerationRequest(text, 6, speculation=SpeculationMethod.NONE, moved_kv_drift=drift)
    generation = await backend.generate(request)
    tokens = [t async for chunk in generation for t in chunk.token_ids]
    return tokens, await generation.wait()


async def test_a_keystroke_evaluates_only_the_edit(backend: LlamaBackend) -> None:
    await run(backend, prompt(PREFIX), 0)
    tokens, stats = await run(backend, prompt(PREFIX + "w"), 32)
    suffix_tokens = len(backend.model.tokenize(SUFFIX, special=False))
    assert stats.moved_prompt_tokens >= suffix_tokens - MOVED_REFRESH
    # The typed token(s), MOVED_REFRESH tokens from <|fim_suffix|> on, <|fim_middle|>.
    assert stats.evaluated_prompt_tokens <= MOVED_REFRESH + 4
    exact, _ = await run(backend, prompt(PREFIX + "w"), 0)
    assert tokens[0] == exact[0]  # the typed text is seen: the next token agrees


async def test_exact_requests_never_reuse_moved_entries(backend: LlamaBackend) -> None:
    await run(backend, prompt(PREFIX), 0)
    _, moved = await run(backend, prompt(PREFIX + "wi"), 32)
    assert moved.moved_prompt_tokens > 0
    again, stats = await run(backend, prompt(PREFIX + "wi"), 0)
    assert stats.moved_prompt_tokens == 0
    assert stats.evaluated_prompt_tokens > moved.moved_prompt_tokens  # the suffix, again
    fresh = await LlamaBackend.load(models.resolve("small"), n_ctx=2048, curve=CostCurve({1: 1.0}))
    try:
        reference, _ = await run(fresh, prompt(PREFIX + "wi"), 0)
    finally:
        await fresh.aclose()
    assert again == reference


async def test_drift_is_bounded(backend: LlamaBackend) -> None:
    await run(backend, prompt(PREFIX), 0)
    typed = ""
    moves = []
    for word in ("width", " +", " self", ".height", ")"):
        typed += word
        _, stats = await run(backend, prompt(PREFIX + typed), 4)
        moves.append(stats.moved_prompt_tokens > 0)
    # Some keystrokes moved the suffix, and once 4 edited tokens had gone unseen the
    # suffix was evaluated exactly again.
    assert any(moves)
    assert not all(moves)
