"""What runs as its own process, as a user or another window runs it: ``kode complete``'s
one line for a missing model, the build-flags script with no Kode installed, ``kode
engine status``/``stop`` with no engine, and the engine lock seen from another process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kode.backends.daemon.paths import EngineLock, lock_is_held
from kode.backends.llama import build_flags


def test_cli_reports_a_missing_model_file_in_one_line(tmp_path: Path) -> None:
    src = tmp_path / "a.py"
    src.write_text("x = 1\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kode.cli.main",
            "complete",
            str(src),
            "--line",
            "0",
            "--character",
            "0",
            "--model",
            str(tmp_path / "nope.gguf"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0
    assert "model file not found" in done.stderr


# Issue #14 item 4: a cached model that changed after it was verified.


def test_the_script_runs_without_the_package(tmp_path: Path) -> None:
    # The README runs it with the system Python before anything is installed: a copy
    # outside the repository, with no kode on the path, prints the flags for this machine.
    script = tmp_path / "build_flags.py"
    script.write_text(Path(build_flags.__file__).read_text())
    done = subprocess.run(
        [sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == build_flags.for_this_machine()


def test_lock_is_exclusive_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "e.lock"
    lock = EngineLock(path)
    assert lock.acquire()
    assert lock_is_held(path)
    code = "import sys; from kode.backends.daemon.paths import EngineLock; "
    code += f"sys.exit(0 if EngineLock(__import__('pathlib').Path({str(path)!r})).acquire() else 3)"
    other = subprocess.run([sys.executable, "-c", code], timeout=30, check=False)
    assert other.returncode == 3
    lock.release()
    assert not lock_is_held(path)
    assert path.read_text().strip() == str(os.getpid())


def test_engine_commands_without_an_engine(engine_folder: Path) -> None:
    for action in ("status", "stop"):
        done = subprocess.run(
            [sys.executable, "-m", "kode.cli.main", "engine", action],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stdout) == (0, "no Kode engine is running\n")
    os.chmod(engine_folder / "kode", 0o777)
    done = subprocess.run(
        [sys.executable, "-m", "kode.cli.main", "engine", "status"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "refusing the engine folder" in done.stderr and "chmod 700" in done.stderr
