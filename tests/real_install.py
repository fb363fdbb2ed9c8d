"""One real install of the server (editors/install/kode_install.py) per test session, for
the tests that need one: tests/test_install_e2e.py checks it, tests/test_real_install.py
seeds the editors' fresh installs with the llama.cpp wheel it built (so that llama.cpp is
built once a run, not three times: 5-9 minutes each on two cores).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fakes.install_steps import ROOT, SCRIPT

INSTALL_TIMEOUT = 3600  # the llama.cpp build beside other work on 2 cores took up to 40 min


@dataclass(frozen=True)
class Installed:
    target: Path
    env: dict[str, str]
    events: list[dict[str, Any]]
    seconds: float

    @property
    def wheels(self) -> Path:
        """The kept llama.cpp wheel's folder (TARGET/wheels), the editors' seed."""
        return self.target / "wheels"


def install(target: Path, env: dict[str, str]) -> tuple[list[dict[str, Any]], float]:
    """Run the installer from this repository into ``target``; its progress events and
    how long it took. Fails with the log's end when it fails."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(target), str(ROOT), "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=INSTALL_TIMEOUT,
        check=False,
    )
    events = [json.loads(line) for line in done.stdout.splitlines()]
    log = target / "install.log"
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else done.stderr
    assert done.returncode == 0, f"{events[-1:]}\n{tail}"
    return events, time.monotonic() - started


@pytest.fixture(scope="session")
def installed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The server installed into a fresh folder from this repository (its models in a
    model folder of their own); removed at the end of the session (3.4 GB)."""
    base = tmp_path_factory.mktemp("installed")
    env = {**os.environ, "KODE_MODEL_DIR": str(base / "models")}
    events, took = install(base / "server", env)
    try:
        yield Installed(base / "server", env, events, took)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def seed_wheels(installed: Installed) -> Path:
    """The llama.cpp wheel folder to put in a fresh install first:
    ``KODE_INSTALL_SEED_WHEELS`` if set, else the session's install's."""
    seed = os.environ.get("KODE_INSTALL_SEED_WHEELS")
    return Path(seed) if seed else installed.wheels
