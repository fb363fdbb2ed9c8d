"""Every test is marked by its folder: ``unit`` (tests/unit: pure, no process, no socket),
``process`` (tests/process: child processes and sockets, no model) and ``e2e`` (tests/
itself: Kode's commands and servers run whole, with models and editors, which are also
marked ``model`` and ``editor``); ``pytest -m unit`` runs the pure ones alone.

Every test gets its own engine folder (``XDG_RUNTIME_DIR``) and state folder, so a
``kode lsp`` it starts gets a shared engine of its own; afterwards that engine must stop
on SIGTERM, and no engine of the test may be left running."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_windows import engine_pids, stop_engines

FOLDER_MARKERS = {"unit": "unit", "process": "process"}  # any other folder: "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(here).parts if item.path.is_relative_to(here) else ()
        item.add_marker(FOLDER_MARKERS.get(parts[0] if len(parts) > 1 else "", "e2e"))


@pytest.fixture(autouse=True)
def engine_folder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # Short, under /tmp: a Unix socket's path must fit in 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="kode-t-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    monkeypatch.setenv("XDG_STATE_HOME", str(folder / "state"))
    try:
        yield folder
        left = stop_engines(folder)
        assert not left, f"engines that ignored SIGTERM for 20 s: {left}"
        assert not engine_pids(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
