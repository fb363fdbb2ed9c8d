"""``kode bench engine --lossless N``: how often two generations decoded in one batch
(the shared engine's slots) write other text than each alone in a one-slot backend (what
a window ran before).

N pairs of real prompts (standard-library files cut at a line's end), greedy, 32 tokens;
where they differ, the reference's top-2 logit gap at the first differing token (batched
rows compute other logits by kernel noise, so only a near tie may flip).
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import TYPE_CHECKING, Any

from kode.backends.defaults import ENGINE_SLOTS, KV_MEMORY_MB
from kode.bench import report, tasks

if TYPE_CHECKING:
    from kode.bench.engine import Options


def lossless_prompts(n: int, seed: int) -> list[str]:
    """``n`` FIM prompts from the standard library's largest files, each cut at the end of
    a random line (about 1,200 characters before it, 200 after)."""
    rng = random.Random(seed)
    files = tasks.stdlib_files(max(4, n))
    out = []
    for i in range(n):
        text = files[i % len(files)].read_text(encoding="utf-8")
        cuts = [m for m in range(1200, len(text) - 200) if text[m] == "\n"]
        cut = rng.choice(cuts) + 1
        before, after = text[cut - 1200 : cut], text[cut : cut + 200]
        out.append(f"<|fim_prefix|>{before}<|fim_suffix|>{after}<|fim_middle|>")
    return out


async def lossless_bench(options: Options) -> str:
    from kode.backends import models
    from kode.backends.base import GenerationRequest, SpeculationMethod
    from kode.backends.llama.backend import LlamaBackend
    from kode.backends.llama.target import LlamaTarget
    from kode.backends.speculative import CostCurve

    path = await asyncio.to_thread(models.resolve, options.model)
    prompts = lossless_prompts(2 * options.lossless, options.seed)
    curve = CostCurve({1: 1.0})
    one = await LlamaBackend.load(path, curve=curve)
    two = await LlamaBackend.load(
        path, n_slots=ENGINE_SLOTS, curve=curve, kv_memory_mb=KV_MEMORY_MB
    )

    async def tokens(backend: LlamaBackend, prompt: str) -> list[int]:
        request = GenerationRequest(prompt, 32, speculation=SpeculationMethod.NONE)
        generation = await backend.generate(request)
        return [t async for chunk in generation for t in chunk.token_ids]

    out = report.prepare_out(options.out)
    rows: list[dict[str, Any]] = []
    try:
        for i in range(0, len(prompts), 2):
            pair = prompts[i : i + 2]
            alone = [await tokens(one, p) for p in pair]
            engine_alone = [await tokens(two, p) for p in pair]
            together = await asyncio.gather(*(tokens(two, p) for p in pair))
            for prompt, want, solo, got in zip(pair, alone, engine_alone, together, strict=True):
                row: dict[str, Any] = {"prompt": len(rows), "tokens": len(want)}
                for name, seen in (("engineAlone", solo), ("together", got)):
                    first = next(
                        (k for k, (a, b) in enumerate(zip(seen, want, strict=False)) if a != b),
                        None,
                    )
                    if first is None and len(seen) != len(want):
                        first = min(len(seen), len(want))
                    row[name] = first
                    if first is not None:
                        # The gap of the reference's logits where the texts part; where
                        # the reference stopped there (its stop token is not in ``want``)
                        # the other's token stands in: only the logits before it count.
                        upto = [*want[:first], (want if first < len(want) else seen)[first]]
                        gaps = await one.logit_gaps(prompt, upto)
                        row[name + "Gap"] = round(gaps[first], 3)
                rows.append(row)
            (out / "lossless.json").write_text(json.dumps(rows, indent=1))  # a run cut short
    finally:
        await two.aclose()
        await one.aclose()
    lines = [
        f"# kode bench engine --lossless ({options.model})",
        "",
        f"{len(rows)} prompts, 32 greedy tokens each, against each alone in a one-slot "
        f"backend; a divergence is a near tie if the reference's top-2 gap there is below "
        f"{LlamaTarget.near_tie} logits.",
        "",
    ]
    for name, what in (("together", "two in one batch"), ("engineAlone", "alone, two slots")):
        differ = [r for r in rows if r[name] is not None]
        gaps = [r[name + "Gap"] for r in differ if name + "Gap" in r]
        near = sum(g < LlamaTarget.near_tie for g in gaps)
        at = ", ".join(f"token {r[name]} (gap {r.get(name + 'Gap')})" for r in differ)
        lines.append(
            f"- {what}: {len(rows) - len(differ)}/{len(rows)} texts identical; "
            f"{len(differ)} differ, {near} of them at a near tie{': ' + at if at else ''}"
        )
    lines.append(f"- machine: {report.machine_note()}")
    return "\n".join(lines)
