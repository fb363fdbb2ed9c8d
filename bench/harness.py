"""How the benchmarks run: the order of what they compare, and the processes they start.

Runs: every benchmark that compares ways of doing one thing (methods, conditions,
settings, configurations) interleaves them, so that a slow patch of the machine (another
process, the thermal state, the page cache) lands on each alike: ``rotated`` turns the
order by one per prompt or place, ``round_order`` runs it backwards in odd rounds.

Processes: a helper process (a peer server, a busy loop, ``kode lsp``) dies with the
benchmark (``die_with_parent``) and is stopped by it (``stop``/``stop_async``); the
shared engines a run started in its own runtime folder are found and stopped by that
folder (``engine_pids``/``stop_engines``); memory is PSS over a set of processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from kode.backends.system import alive

T = TypeVar("T")
# The longest one step of a benchmark may take: a model load (perhaps its assembly from its
# parts) on a busy 2-core machine, or a generation behind it.
STEP_S = 600.0


# -- runs ---------------------------------------------------------------------------------


def rotated(items: Sequence[T], k: int) -> list[T]:
    """``items`` rotated left by ``k``: ``rotated([1, 2, 3], 1) == [2, 3, 1]``."""
    if not items:
        return []
    k %= len(items)
    return [*items[k:], *items[:k]]


def round_order(items: Sequence[T], round_: int) -> list[T]:
    """``items`` forwards in even rounds, backwards in odd ones, so that none always
    comes first (a fresh state, the first time a prompt is seen) or last:
    ``round_order("ab", 1) == ["b", "a"]``."""
    return list(items) if round_ % 2 == 0 else list(reversed(items))


# -- processes ----------------------------------------------------------------------------


def kode_command(*args: str) -> list[str]:
    """The command line of ``kode ARGS`` run by this interpreter (the checkout's Kode)."""
    return [sys.executable, "-m", "kode.cli.main", *args]


def die_with_parent() -> None:
    """``preexec_fn`` for a benchmark's helper process (a peer server, a busy loop): the
    kernel sends it SIGTERM when the benchmark dies, however it dies (Linux's
    ``PR_SET_PDEATHSIG``). A benchmark stopped with SIGTERM or SIGKILL runs no ``finally``,
    and a ``llama-server`` or a ``while True: pass`` left behind slows every later run."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def stop(proc: subprocess.Popen[Any], timeout_s: float = 15.0) -> None:
    """SIGTERM ``proc``, then SIGKILL it if it has not exited within ``timeout_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


async def stop_async(proc: asyncio.subprocess.Process, timeout_s: float = 15.0) -> None:
    """``stop`` for a process started by asyncio."""
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` processes that spin (``while True: pass``) for the block, then are killed."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=die_with_parent)
        for _ in range(n)
    ]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def engine_pids(folder: Path) -> list[int]:
    """Live ``kode engine run`` processes whose ``XDG_RUNTIME_DIR`` is ``folder``."""
    found = []
    want = f"XDG_RUNTIME_DIR={folder}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            if b"engine" not in cmdline or b"run" not in cmdline:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if want in environ and alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def stop_engines(folder: Path, timeout_s: float = 20.0) -> list[int]:
    """SIGTERM every engine of ``folder``; the pids still running after ``timeout_s``
    (then killed)."""
    pids = engine_pids(folder)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    stubborn = [p for p in pids if alive(p)]
    for pid in stubborn:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return stubborn


def pss_mb(pids: Sequence[int]) -> float:
    """Proportional set size summed over ``pids`` (shared pages split among sharers)."""
    total_kb = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
    return total_kb / 1024.0
