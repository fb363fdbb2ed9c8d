"""``kode bench engine --busy``: how llama.cpp degrades under one busy process per core.

Prefill and decode speed for how OpenMP's threads wait (spin, sleep at once, or the
engine's short spin), threads (1, 2) and priority (nice 0, 5), against the quiet
machine, every setting once per round in a fresh process (libgomp reads how its threads
wait once, when it loads), in the opposite order in odd rounds; rounds add up across
``--resume`` runs (``out/busy.jsonl``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kode.backends.system import SPIN_COUNT, usable_cores
from kode.bench import harness, report

if TYPE_CHECKING:
    from kode.bench.engine import Options


# One fresh process per setting: libgomp reads how its threads wait once, when it loads. The
# prompt is synthetic (no user code); plain decoding, no calibration (a fixed cost curve).
_PROBE = """
import asyncio, json, os, sys
from pathlib import Path
from kode.backends.base import GenerationRequest, SpeculationMethod
from kode.backends.llama.backend import LlamaBackend
from kode.backends.speculative import CostCurve

model, threads, nice = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
os.nice(nice)
text = "".join(f"def step_{i}(value, scale={i}):\\n    return value * scale + {i}\\n\\n"
               for i in range(24))

async def main():
    backend = await LlamaBackend.load(model, n_threads=threads, curve=CostCurve({1: 1.0}))
    request = GenerationRequest(prompt=text, max_tokens=24, speculation=SpeculationMethod.NONE)
    generation = await backend.generate(request)
    async for _ in generation:
        pass
    s = await generation.wait()
    await backend.aclose()
    print(json.dumps({"prefill_tok_s": s.evaluated_prompt_tokens / (s.prefill_ms / 1000),
                      "ms_per_token": s.ms_per_token, "prompt": s.evaluated_prompt_tokens,
                      "tokens": s.completion_tokens}))

asyncio.run(main())
"""


# How OpenMP threads wait, as the environment says it (nothing else of the two is set).
ACTIVE, PASSIVE = "OMP_WAIT_POLICY=ACTIVE", "OMP_WAIT_POLICY=PASSIVE"
SHORT_SPIN = f"GOMP_SPINCOUNT={SPIN_COUNT}"  # the engine's own (backends/system.py)


def busy_configs(cores: int) -> list[tuple[str, str, int, int]]:
    """(load, waiting, threads, nice) for every setting the busy bench runs."""
    configs = [("quiet", waiting, cores, 0) for waiting in (ACTIVE, PASSIVE, SHORT_SPIN)]
    configs += [("busy", waiting, cores, 0) for waiting in (ACTIVE, PASSIVE, SHORT_SPIN)]
    if cores > 1:
        configs.append(("busy", SHORT_SPIN, 1, 0))
    configs.append(("busy", SHORT_SPIN, cores, 5))
    return configs


def probe(model: Path, load: str, waiting: str, threads: int, nice: int) -> dict[str, Any]:
    """One setting in a fresh process, with one busy process per core if ``load`` says."""
    chosen = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    env = {k: v for k, v in os.environ.items() if k not in chosen}
    name, _, value = waiting.partition("=")
    env[name] = value
    with harness.busy_processes(usable_cores() if load == "busy" else 0):
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, str(model), str(threads), str(nice)],
            capture_output=True,
            text=True,
            env=env,
            timeout=harness.STEP_S,
            check=False,
        )
    row: dict[str, Any] = {"load": load, "waiting": waiting, "threads": threads, "nice": nice}
    if done.returncode != 0:
        return {**row, "failed": done.stderr[-200:]}
    return {**row, **json.loads(done.stdout.strip().splitlines()[-1])}


def busy_slowdowns(results: Sequence[dict[str, Any]], cores: int) -> dict[str, list[float]]:
    """Per round, how much the engine's own setting (a short spin, every core, nice 0) slows
    under the busy processes against the same round's quiet run: prefill (tokens/s,
    quiet / busy) and decode (ms/token, busy / quiet).

    >>> rows = [{"round": 0, "load": "quiet", "waiting": SHORT_SPIN, "threads": 2, "nice": 0,
    ...          "prefill_tok_s": 40.0, "ms_per_token": 50.0},
    ...         {"round": 0, "load": "busy", "waiting": SHORT_SPIN, "threads": 2, "nice": 0,
    ...          "prefill_tok_s": 20.0, "ms_per_token": 125.0}]
    >>> busy_slowdowns(rows, 2)
    {'prefill': [2.0], 'decode': [2.5]}
    """
    out: dict[str, list[float]] = {"prefill": [], "decode": []}
    mine = [
        r
        for r in results
        if (r["waiting"], r["threads"], r["nice"]) == (SHORT_SPIN, cores, 0) and "failed" not in r
    ]
    for round_ in sorted({r["round"] for r in mine}):
        quiet = [r for r in mine if r["round"] == round_ and r["load"] == "quiet"]
        busy = [r for r in mine if r["round"] == round_ and r["load"] == "busy"]
        if quiet and busy:
            out["prefill"].append(quiet[0]["prefill_tok_s"] / busy[0]["prefill_tok_s"])
            out["decode"].append(busy[0]["ms_per_token"] / quiet[0]["ms_per_token"])
    return out


def busy_bench(options: Options) -> str:
    """Prefill and decode under one busy process per core, per thread setting: every
    setting once per round, in the opposite order in odd rounds; rounds add up across
    ``--resume`` runs (``out/busy.jsonl``)."""
    from kode.backends import models

    model = models.resolve(options.model)
    cores = usable_cores()
    path = options.out / "busy.jsonl"
    if not options.resume:
        path.unlink(missing_ok=True)
    results = report.read_jsonl(path)
    first = max((r["round"] for r in results), default=-1) + 1
    for round_ in range(first, first + options.rounds):
        configs = busy_configs(cores)
        for config in harness.round_order(configs, round_):
            before = os.getloadavg()[0]
            row = {"round": round_, **probe(model, *config), "loadBefore": before}
            row["loadAfter"] = os.getloadavg()[0]
            results.append(row)
            report.append_jsonl(path, [row])
    rows = []
    for load, waiting, threads, nice in busy_configs(cores):
        mine = [
            r
            for r in results
            if (r["load"], r["waiting"], r["threads"], r["nice"]) == (load, waiting, threads, nice)
            and "failed" not in r
        ]
        rows.append(
            [
                load,
                waiting,
                threads,
                nice,
                len(mine),
                report.fmt(report.median(r["prefill_tok_s"] for r in mine), 0),
                report.fmt(report.median(r["ms_per_token"] for r in mine), 1),
            ]
        )
    table = report.markdown_table(
        ["load", "threads wait", "threads", "nice", "runs", "prefill tok/s", "ms/token"],
        rows,
    )
    slow = busy_slowdowns(results, cores)
    # ``cores`` busy processes and Kode share the cores: Kode's fair share is one process's
    # (cores / (cores + 1) of a core, against every core quiet): cores + 1 times slower.
    fair = float(cores + 1)
    lines = [f"# kode bench engine --busy ({options.model})", "", table]
    lines.append(
        f"Busy against quiet, {SHORT_SPIN} with {cores} threads, per round (a fair share of the "
        f"cores costs {fair:.0f}x):"
    )
    for what, values in slow.items():
        med = report.median(values)
        lines.append(
            f"- {what}: median {report.fmt(med, 2, 'x')} "
            f"({report.fmt(None if med is None else med / fair, 2)} of the fair share); "
            f"per round {' '.join(f'{v:.2f}' for v in values)}"
        )
    failed = [r for r in results if "failed" in r]
    lines += [f"- failed: {r}" for r in failed]
    return "\n".join(lines)
