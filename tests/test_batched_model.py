"""Several generations decoded in one batch on the real 0.5B (``LlamaBackend`` with two
slots, as the shared engine loads it): the texts of each alone, a cancel that releases
its slot while the other goes on, and a second prompt that starts while the first
generation runs instead of waiting for it.

"The texts of each alone" is judged as speculation's losslessness is
(``test_speculation_model.py``): a batched row's logits differ from a one-row step's by
kernel noise (0.3-0.6 logits on these quantized CPU kernels), so a near tie may flip.
The reference runs alone in a backend of one slot (what every window ran before); a
divergence is accepted only at a near tie of the reference (``LlamaTarget.near_tie``).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from kode.backends import models
from kode.backends.base import FinishReason, GenerationRequest, SpeculationMethod
from kode.backends.llama.backend import LlamaBackend
from kode.backends.llama.target import LlamaTarget
from kode.backends.speculative import CostCurve
from kode.backends.worker import WorkerGeneration

pytestmark = [pytest.mark.model, pytest.mark.asyncio(loop_scope="module")]

SOURCE = Path(argparse.__file__).read_text()  # real material nobody here wrote
CURVE = CostCurve({1: 1.0})


def fim(before: str, after: str = "\n") -> str:
    return f"<|fim_prefix|>{before}<|fim_suffix|>{after}<|fim_middle|>"


# Two documents that share nothing but the FIM header, cut at a line's end.
PROMPT_A = fim(SOURCE[:1200].rsplit("\n", 1)[0] + "\n")
PROMPT_B = fim(SOURCE[30000:31200].rsplit("\n", 1)[0] + "\n    ")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair() -> AsyncIterator[tuple[LlamaBackend, LlamaBackend]]:
    """(the engine's backend: two slots, the reference: one slot)."""
    small = models.resolve("small")
    two = await LlamaBackend.load(small, n_ctx=2048, n_slots=2, curve=CURVE, kv_memory_mb=64)
    one = await LlamaBackend.load(small, n_ctx=2048, curve=CURVE)
    yield two, one
    await two.aclose()
    await one.aclose()


def request(prompt: str, n: int) -> GenerationRequest:
    return GenerationRequest(prompt, n, speculation=SpeculationMethod.NONE)


async def tokens_of(generation: WorkerGeneration) -> list[int]:
    return [t async for chunk in generation for t in chunk.token_ids]


async def alone(backend: LlamaBackend, prompt: str, n: int) -> list[int]:
    return await tokens_of(await backend.generate(request(prompt, n)))


async def same_or_near_tie(
    reference: LlamaBackend, prompt: str, want: list[int], got: list[int]
) -> None:
    if got == want:
        return
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    assert first is not None, "one text is a prefix of the other"
    gaps = await reference.logit_gaps(prompt, want[: first + 1])
    assert gaps[first] < LlamaTarget.near_tie, (first, gaps[first])


async def test_two_generations_decode_in_one_batch_with_the_texts_of_each_alone(
    pair: tuple[LlamaBackend, LlamaBackend],
) -> None:
    two, one = pair
    want_a, want_b = await alone(one, PROMPT_A, 24), await alone(one, PROMPT_B, 24)
    steps_before = two.counters.batched_steps
    gen_a = await two.generate(request(PROMPT_A, 24))
    gen_b = await two.generate(request(PROMPT_B, 24))
    got_a, got_b = await asyncio.gather(tokens_of(gen_a), tokens_of(gen_b))
    assert gen_a.stats.batched_steps > 0 and gen_b.stats.batched_steps > 0
    assert two.counters.batched_steps > steps_before
    await same_or_near_tie(one, PROMPT_A, want_a, got_a)
    await same_or_near_tie(one, PROMPT_B, want_b, got_b)
    assert two.engine.ctx.busy == 0  # both slots were given back
    # each document kept its own slot: the next keystroke in either reuses its prompt
    again = await two.generate(request(PROMPT_B, 1))
    assert (await again.wait()).evaluated_prompt_tokens == 1


async def test_a_cancel_mid_batch_releases_its_slot_and_the_other_goes_on(
    pair: tuple[LlamaBackend, LlamaBackend],
) -> None:
    two, one = pair
    want_b = await alone(one, PROMPT_B, 40)
    gen_a = await two.generate(request(PROMPT_A, 400))
    gen_b = await two.generate(request(PROMPT_B, 40))
    b_task = asyncio.ensure_future(tokens_of(gen_b))
    seen = 0
    async for chunk in gen_a:
        seen += len(chunk.token_ids)
        if seen >= 4 and gen_b.stats.completion_tokens >= 2:
            break  # leaving the loop cancels, while both decode in one batch
    await asyncio.wait_for(gen_a.cancel(), 30)
    stats = gen_a.stats
    assert stats.finish_reason is FinishReason.CANCELLED
    assert stats.steps_after_cancel <= 1 and stats.batched_steps > 0
    got_b = await asyncio.wait_for(b_task, 120)
    assert gen_b.stats.finish_reason is FinishReason.LENGTH
    await same_or_near_tie(one, PROMPT_B, want_b, got_b)
    assert two.engine.ctx.busy == 0
    # the released slot serves the next generation
    third = await two.generate(request(fim("def add(a, b):\n    "), 4))
    assert len(await tokens_of(third)) == 4


async def test_a_second_prompt_starts_while_the_first_generation_runs(
    pair: tuple[LlamaBackend, LlamaBackend],
) -> None:
    two, _ = pair
    long = await two.generate(request(PROMPT_A, 160))
    long_task = asyncio.ensure_future(tokens_of(long))
    while long.stats.completion_tokens < 2:  # the first generation decodes now
        await asyncio.sleep(0.01)
    short = await two.generate(request(fim("def square(x):\n    "), 3))
    assert len(await asyncio.wait_for(tokens_of(short), 60)) == 3
    assert long.stats.finish_reason is None  # it did not wait for the long one to end
    assert short.stats.batched_steps > 0 and long.stats.batched_steps > 0
    long_task.cancel()
    await asyncio.wait_for(long.cancel(), 30)
    assert long.stats.finish_reason is FinishReason.CANCELLED
