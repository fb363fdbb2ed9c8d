"""How long does the event loop stall while the workspace index is built? (no model)

``python -m kode.bench.index_stall ROOT [ROOT ...]``: opens ``ROOT`` as the workspace of
a ``CompletionEngine`` (the server's own path, ``open_workspace``) while the event loop
ticks ``await asyncio.sleep(0.005)``, and reports each tick's overshoot: the worst and
the 99th percentile stall, the build's wall time and the number of files. A keystroke
arriving during a stall waits that long before the server even reads it. Run it on a
quiet machine (the figures are wall times) and write the load next to them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

TICK_S = 0.005


async def probe(roots: list[Path], max_files: int) -> dict[str, Any]:
    from kode.completion.engine import CompletionEngine
    from kode.completion.settings import parse

    async def no_backend(_settings: object) -> Any:
        raise RuntimeError("no model in this probe")

    settings, problems = parse({"indexMaxFiles": max_files, "readAhead": False})
    if problems:
        raise ValueError("; ".join(problems))
    engine = CompletionEngine(no_backend, settings)
    stalls: list[float] = []
    started = time.perf_counter()
    engine.open_workspace(roots)
    index = engine.workspace
    assert index is not None
    try:
        while not index.stats.complete:
            tick = time.perf_counter()
            await asyncio.sleep(TICK_S)
            stalls.append(time.perf_counter() - tick - TICK_S)
        wall = time.perf_counter() - started
    finally:
        await engine.aclose()
    stalls.sort()
    p99 = stalls[min(len(stalls) - 1, int(0.99 * len(stalls)))] if stalls else 0.0
    over = [s for s in stalls if s > 0.05]
    return {
        "files": index.stats.files,
        "build_wall_s": round(wall, 2),
        "build_s (index's own)": round(index.stats.build_s, 2),
        "ticks": len(stalls),
        "worst_stall_ms": round(1000 * stalls[-1], 1) if stalls else None,
        "p99_stall_ms": round(1000 * p99, 1),
        "p50_stall_ms": round(1000 * stalls[len(stalls) // 2], 1) if stalls else None,
        "ticks_over_50ms": len(over),
        "load": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", type=Path)
    parser.add_argument("--max-files", type=int, default=20_000)
    args = parser.parse_args(argv)
    result = asyncio.run(probe([r.resolve() for r in args.roots], args.max_files))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
