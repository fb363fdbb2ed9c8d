"""Fixtures of the tests that start processes or open sockets."""

from __future__ import annotations

from pathlib import Path

import pytest
from kode.backends.daemon.paths import EnginePlace, engine_place


@pytest.fixture
def place(tmp_path: Path) -> EnginePlace:
    folder = Path(tmp_path)
    return engine_place("test", folder, folder)
