"""The names monitor on the real 0.5B: held to the allowed names, greedy and sampled, in
process and through a shared engine, and under speculation the same text as plain
constrained decoding (a near tie of the verify batch's kernels excepted, as in
``test_speculation_model.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from engine_windows import SMALL, Window
from kode.backends import models
from kode.backends.base import GenerationRequest, Sampling, SpeculationMethod
from kode.backends.llama.backend import LlamaBackend
from kode.backends.monitor import Names
from kode.backends.speculative import CostCurve

pytestmark = [pytest.mark.model, pytest.mark.asyncio(loop_scope="module")]

# ``os.`` where the model writes ``path`` (or ``environ``), held to a set without them.
LINE = "    config = os."
PROMPT = (
    "<|fim_prefix|>import os\nimport sys\n\n\ndef load(name):\n"
    f"{LINE}<|fim_suffix|>\n    return config\n<|fim_middle|>"
)
NAMES = Names(LINE, {"os": ("getcwd", "getenv", "sep"), "sys": ("argv",)})
NEAR_TIE = 0.1
GREEDY = Sampling()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend() -> AsyncIterator[LlamaBackend]:
    small = models.resolve("small")
    curve = CostCurve({1: 1.0, 2: 1.15, 4: 1.5, 8: 2.6}, fixed=True)
    b = await LlamaBackend.load(small, n_ctx=1024, draft_path=small, curve=curve)
    yield b
    await b.aclose()


async def generate(
    backend: LlamaBackend,
    method: SpeculationMethod,
    names: Names | None,
    sampling: Sampling = GREEDY,
) -> tuple[str, list[int]]:
    request = GenerationRequest(PROMPT, 16, sampling, speculation=method, names=names)
    generation = await backend.generate(request)
    chunks = [chunk async for chunk in generation]
    stats = await generation.wait()
    if names is not None:
        assert stats.monitor_fired >= 1 and stats.monitor_picks >= 1
    return "".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids]


async def test_the_first_name_is_an_allowed_one(backend: LlamaBackend) -> None:
    free, _ = await generate(backend, SpeculationMethod.NONE, None)
    assert not free.startswith(("getcwd", "getenv", "sep")), free  # what the prompt is for
    held, _ = await generate(backend, SpeculationMethod.NONE, NAMES)
    assert held.startswith(("getcwd", "getenv", "sep")), held
    for seed in (1, 2, 3):
        sampled, _ = await generate(
            backend, SpeculationMethod.NONE, NAMES, Sampling(temperature=1.0, seed=seed)
        )
        assert sampled.startswith(("getcwd", "getenv", "sep")), sampled


@pytest.mark.parametrize(
    "method", [SpeculationMethod.NGRAM, SpeculationMethod.LOOKAHEAD, SpeculationMethod.DRAFT]
)
async def test_speculation_under_the_mask_equals_plain_constrained(
    backend: LlamaBackend, method: SpeculationMethod
) -> None:
    _, plain = await generate(backend, SpeculationMethod.NONE, NAMES)
    text, spec = await generate(backend, method, NAMES)
    assert text.startswith(("getcwd", "getenv", "sep")), text
    if spec != plain:
        first = next(i for i, (a, b) in enumerate(zip(spec, plain, strict=False)) if a != b)
        gaps = await backend.logit_gaps(PROMPT, plain[: first + 1])
        assert gaps[first] < NEAR_TIE, (method, first, gaps[first])


@pytest.mark.slow
async def test_a_shared_engine_applies_the_monitor(engine_folder: Path) -> None:
    """A real window sends the receivers it read from the document to a real engine
    process, which holds the name to them; with the setting off it does not."""
    uri = "file:///project/load.py"
    text = "import os\n\n\ndef load(name):\n    return os."
    fired = []
    for on in (True, False):
        window = Window()
        await asyncio.wait_for(window.start({**SMALL, "namesMonitor": on}), 120)
        try:
            window.open(uri, text)
            answer = await window.complete(uri, 4, 14, 120)
            stats = await window.stats()
            fired.append(stats["lastCompletion"]["namesMonitor"]["fired"])
            assert answer.strip(), answer
        finally:
            await window.stop()
    assert fired[0] >= 1 and fired[1] == 0, fired
