"""What the real-editor tests share: paths, polling, and where the README's pictures go."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The server the editors start: this venv's `kode`, or KODE_BIN (as in tests/test_editors.py).
KODE_BIN = Path(os.environ.get("KODE_BIN") or Path(sys.executable).parent / "kode")
# One model answer on a loaded 2-core machine: the 0.5B answers in about a second unloaded,
# but at a load of 15 it took 34 s for 16 tokens.
STEP_S = 180.0

T = TypeVar("T")


def require_kode() -> None:
    if not KODE_BIN.exists():
        pytest.fail(f"the kode executable is missing: {KODE_BIN} (pip install -e . in {ROOT})")


def pictures_dir() -> Path | None:
    """Where to write the README's pictures: KODE_EDITOR_PICTURES=docs; unset: nowhere."""
    value = os.environ.get("KODE_EDITOR_PICTURES")
    return (ROOT / value).resolve() if value else None


def with_defaults() -> bool:
    """Whether the editors run Kode with its defaults: when the README's pictures are
    taken, which show what a user gets (the default model, every setting as shipped).
    Otherwise the tests set the small model, short greedy answers and one thread."""
    return pictures_dir() is not None


# What the status bar or line names: the model the editors' settings chose.
MODEL_SHOWN = "qwen2.5-coder-1.5b" if with_defaults() else "qwen2.5-coder-0.5b"


def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float, explain: Callable[[], str]
) -> T:
    """Poll `probe` every 20 ms until it returns something truthy; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{explain()}")
        time.sleep(0.02)
