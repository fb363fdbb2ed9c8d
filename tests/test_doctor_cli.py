"""``kode doctor --json --skip-model`` run whole (this environment's ``kode``): the real
machine's checks, and a model folder (``KODE_MODEL_DIR``, a temporary one: the real
cache is never touched) where the default model is damaged and the small one absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kode.backends import models

KODE = Path(sys.executable).with_name("kode")
CHECKS = ["python", "llama.cpp build", "model default", "model small", "shared engine"]


def doctor(env: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]], str]:
    done = subprocess.run(
        [str(KODE), "doctor", "--json", "--skip-model"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )
    return done.returncode, json.loads(done.stdout), done.stderr


def test_doctor_reports_every_check_of_this_machine(engine_folder: Path) -> None:
    code, checks, stderr = doctor()
    names = [c["name"] for c in checks]
    assert names == [*CHECKS, "machine load"], checks
    for check in checks:
        assert set(check) == {"name", "status", "detail", "fix"}
        assert check["status"] in ("OK", "WARN", "FAIL")
        assert check["detail"]
        # Every problem comes with its fix.
        assert (check["fix"] is None) == (check["status"] == "OK"), check
    assert code == (1 if any(c["status"] == "FAIL" for c in checks) else 0)
    by = {c["name"]: c for c in checks}
    assert sys.executable in by["python"]["detail"]
    assert "llama-cpp-python " in by["llama.cpp build"]["detail"]
    # The engine folder is this test's own (conftest.py): none running there.
    assert str(engine_folder) in by["shared engine"]["detail"]
    assert "no engine running" in by["shared engine"]["detail"]
    assert "timed completion" not in names
    assert "kode doctor: the load on the machine" in stderr  # progress on stderr


def test_a_damaged_and_an_absent_model_fail_with_kode_model_install(tmp_path: Path) -> None:
    # The default model as a file of the right size (sparse: no disk used) that was once
    # verified (its marker), but whose bytes no longer hash to the pinned sha256.
    spec = models.DEFAULT_MODELS["default"]
    damaged = tmp_path / spec.filename
    with damaged.open("wb") as out:
        out.truncate(spec.size)
    damaged.with_name(damaged.name + ".sha256").write_text(f"{spec.sha256}  {spec.size}\n")

    code, checks, _ = doctor({"KODE_MODEL_DIR": str(tmp_path)})
    by = {c["name"]: c for c in checks}
    default, small = by["model default"], by["model small"]
    assert default["status"] == "FAIL" and "DAMAGED" in default["detail"], default
    assert str(damaged) in default["detail"]
    assert "kode model install default --force" in default["fix"]
    assert small["status"] == "WARN" and "not installed" in small["detail"], small
    assert "kode model install small" in small["fix"]
    assert code == 1


def test_a_removed_model_file_fails_with_kode_model_install(tmp_path: Path) -> None:
    code, checks, _ = doctor({"KODE_MODEL_DIR": str(tmp_path)})
    check = {c["name"]: c for c in checks}["model default"]
    assert check["status"] == "FAIL" and "not installed" in check["detail"], check
    assert check["fix"].endswith("kode model install default")
    assert code == 1
