"""Test helpers for the shared engine: real ``kode lsp`` windows and the engine
processes of one test's folder (the benchmarks' own, ``bench/client.py`` and
``bench/harness.py``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kode.backends.system import alive
from kode.bench.client import Window
from kode.bench.harness import engine_pids, stop_engines
from kode.bench.tasks import REPO_ROOT as REPO

__all__ = ["REPO", "SMALL", "Window", "alive", "engine_pids", "eventually", "stop_engines"]

# The 0.5B, answering quickly.
SMALL = {
    "model": "small",
    "engine": "shared",
    "readAhead": False,
    "prefetch": False,
    "workspaceIndex": False,
    "firstAnswerMs": 0,
    "maxTokens": 16,
}


async def eventually(predicate: Any, timeout_s: float, step_s: float = 0.05) -> bool:
    """Whether ``predicate()`` (run in a thread: it may block) becomes true in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(predicate):
            return True
        await asyncio.sleep(step_s)
    return bool(await asyncio.to_thread(predicate))
