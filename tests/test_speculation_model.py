"""Speculative decoding on the real 0.5B model: lossless, effective, cancellable.

Lossless is judged token by token against plain greedy decoding. llama.cpp's CPU kernels
compute a multi-row verify batch in a different order than a one-row decode step, so the
logits differ slightly and a near tie can flip. A divergence is accepted only where plain
decoding's top-2 logit gap at the first differing token is below ``NEAR_TIE``, and such
cases are counted (printed). Measured here (0.5B, Q-quantized GGUF): flips happened at gaps
of 0.06 logits, with every speculative method agreeing among themselves, so ``NEAR_TIE`` is
0.1 rather than the 1e-3 a bit-exact kernel would allow.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from kode.backends import models
from kode.backends.base import (
    Backend,
    FinishReason,
    GenerationRequest,
    SpeculationMethod,
    TokenHealing,
)
from kode.backends.llama.backend import LlamaBackend
from kode.backends.speculative import CostCurve

pytestmark = [pytest.mark.model, pytest.mark.asyncio(loop_scope="module")]

NEAR_TIE = 0.1
METHODS = [
    SpeculationMethod.NGRAM,
    SpeculationMethod.AUTO,
    SpeculationMethod.LOOKAHEAD,
    SpeculationMethod.DRAFT,
]
SHAPES = textwrap.dedent(
    """\
    from dataclasses import dataclass


    @dataclass
    class Circle:
        radius: float

        def area(self) -> float:
            return 3.14159 * self.radius * self.radius

        def describe(self) -> str:
            return f"Circle(radius={self.radius}, area={self.area()})"


    @dataclass
    class Square:
        side: float

        def area(self) -> float:
"""
)
PROMPTS = [
    f"<|fim_prefix|>{SHAPES}<|fim_suffix|>\n<|fim_middle|>",
    "<|fim_prefix|>def fibonacci(n):\n    <|fim_suffix|>\n\nprint(fibonacci(10))\n<|fim_middle|>",
    "<|fim_prefix|>COLORS = {\n    'red': (255, 0, 0),\n    'green': (0, 255, 0),\n"
    "    'blue': (0, 0, 255),\n<|fim_suffix|>\n}\n<|fim_middle|>",
]
REPETITIVE = (
    "<|fim_prefix|>"
    + "".join(f"    assert square({i}) == {i * i}\n" for i in range(1, 12))
    + "<|fim_suffix|>\n<|fim_middle|>"
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend() -> AsyncIterator[LlamaBackend]:
    small = models.resolve("small")
    # A fixed curve keeps the policy's choices independent of machine load in tests.
    curve = CostCurve({1: 1.0, 2: 1.15, 4: 1.5, 8: 2.6}, fixed=True)
    b = await LlamaBackend.load(small, n_ctx=2048, draft_path=small, curve=curve)
    yield b
    await b.aclose()


async def generate(
    backend: LlamaBackend, prompt: str, method: SpeculationMethod, n: int = 40
) -> tuple[list[int], GenerationRequest]:
    request = GenerationRequest(prompt, n, speculation=method)
    generation = await backend.generate(request)
    tokens = [t async for chunk in generation for t in chunk.token_ids]
    await generation.wait()
    return tokens, request


@pytest.mark.parametrize("method", METHODS)
async def test_greedy_output_equals_plain_decoding(
    backend: LlamaBackend, method: SpeculationMethod
) -> None:
    near_ties = 0
    for prompt in PROMPTS:
        plain, _ = await generate(backend, prompt, SpeculationMethod.NONE)
        spec, _ = await generate(backend, prompt, method)
        assert backend.counters.last.speculation.method == str(method)
        if spec == plain:
            continue
        first = next(
            (i for i, (a, b) in enumerate(zip(spec, plain, strict=False)) if a != b),
            min(len(spec), len(plain)),
        )
        assert first < min(len(spec), len(plain)), "one output is a prefix of the other"
        gaps = await backend.logit_gaps(prompt, plain[: first + 1])
        assert gaps[first] < NEAR_TIE, (method, first, gaps[first])
        near_ties += 1
    print(f"{method}: {near_ties} near-tie divergences in {len(PROMPTS)} prompts")


@pytest.mark.parametrize("method", [SpeculationMethod.NGRAM, SpeculationMethod.LOOKAHEAD])
async def test_drafts_are_accepted_on_a_repetitive_prompt(
    backend: LlamaBackend, method: SpeculationMethod
) -> None:
    await generate(backend, REPETITIVE, method, n=48)
    spec = backend.counters.last.speculation
    assert spec.drafted > 0
    assert spec.accepted_mean > 1.3, spec  # a silently broken drafter gives 1.0


async def test_cancel_during_speculation_stops_within_one_verify_step(
    backend: LlamaBackend,
) -> None:
    request = GenerationRequest(REPETITIVE, 400, speculation=SpeculationMethod.NGRAM)
    generation = await backend.generate(request)
    seen = 0
    async for chunk in generation:
        seen += len(chunk.token_ids)
        if seen >= 6:
            break  # leaving the loop cancels
    await asyncio.wait_for(generation.cancel(), 30)
    stats = generation.stats
    assert stats.finish_reason is FinishReason.CANCELLED
    assert stats.steps_after_cancel <= 1
    assert stats.completion_tokens < 400
    # The KV cache is consistent afterwards: a new generation equals a fresh plain run.
    again, _ = await generate(backend, PROMPTS[1], SpeculationMethod.NONE)
    fresh = await LlamaBackend.load(models.resolve("small"), n_ctx=2048, curve=CostCurve({1: 1.0}))
    try:
        reference, _ = await generate(fresh, PROMPTS[1], SpeculationMethod.NONE)
    finally:
        await fresh.aclose()
    assert again[:8] == reference[:8]


async def test_token_healing_spells_the_removed_text_first(backend: LlamaBackend) -> None:
    """The first tokens are constrained to spell ``heal``, even text the model would never
    choose there (``zq_``), over one or several tokens; every method decodes on after it."""
    n = backend.last_token_chars("        return self.si")
    assert 0 < n <= len(".si")
    prompt = f"<|fim_prefix|>{SHAPES}        return self<|fim_suffix|>\n<|fim_middle|>"
    for heal in (".si", "zq_"):
        for method in (SpeculationMethod.NONE, SpeculationMethod.AUTO):
            request = GenerationRequest(prompt, 12, speculation=method, heal=heal)
            generation = await backend.generate(request)
            text = "".join([chunk.text async for chunk in generation])
            stats = await generation.wait()
            assert text.startswith(heal), (heal, method, text)
            assert stats.completion_tokens > 1
    request = GenerationRequest(prompt, 12, heal=".si")
    generation = await backend.generate(request)
    healed = "".join([chunk.text async for chunk in generation])
    assert healed.startswith(".side")  # the model's own choice among the fitting tokens


async def test_a_shared_engine_window_heals_the_same_text(
    backend: LlamaBackend, tmp_path: Path
) -> None:
    """A window of the shared engine finds the text to heal with its vocabulary alone
    (the engine constrains the tokens): the same as the in-process backend finds."""
    from kode.backends.daemon.client import SharedEngineBackend
    from kode.backends.daemon.paths import EngineConfig, engine_place
    from kode.backends.llama.runtime import LlamaModel

    small = models.resolve("small")

    async def no_fallback() -> Backend:
        raise AssertionError("never used")

    window = SharedEngineBackend(
        EngineConfig(small),
        engine_place("test", tmp_path, tmp_path),
        LlamaModel(small, vocab_only=True),
        idle_s=0,
        fallback=no_fallback,
        notify=lambda _m: None,
    )
    try:
        assert isinstance(window, TokenHealing)
        texts = ["        return self.si", "x = self.pro", "print(name", "héllo wörl", "a = 1"]
        texts += ["    def __in", "import o", "# naïve café", "\t", ""]
        answers = [window.last_token_chars(t) for t in texts]
        assert answers == [backend.last_token_chars(t) for t in texts]
        assert answers[0] > 0 and answers[1] > 0
    finally:
        await window.aclose()
