"""The editor installer (editors/install/kode_install.py) as the clients run it: a process
whose JSON lines say what happens. What a machine lacks (a Python older than 3.11, a
compiler, disk space) stops it before anything is made, with the command that fixes it;
a cancelled install leaves nothing a client would use and the next run resumes it. The
steps are fakes (tests/fakes/install_steps.py) except in the checks; the real install is
tests/test_install_e2e.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.install_steps import ROOT, SCRIPT, ki

FAKE_STEPS = ROOT / "tests" / "fakes" / "install_steps.py"
WAIT_S = 120  # a process start and a few lines, on a loaded 2-core machine


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env={**os.environ, **(env or {})},
        check=False,
    )


def fake_install(target: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, str(FAKE_STEPS), str(target), str(ROOT), *extra], env)


def runs(target: Path) -> list[str]:
    path = target / "runs.txt"
    return path.read_text().split() if path.exists() else []


def nothing_usable(target: Path) -> bool:
    return ki.installed_kode(str(target)) is None


def test_an_install_runs_its_steps_marks_the_environment_and_switches_to_it(
    tmp_path: Path,
) -> None:
    target = tmp_path / "server"
    done = fake_install(target)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = events(done.stdout)
    assert [(e["event"], e.get("step")) for e in lines] == [
        ("start", None),
        ("step", "venv"),
        ("step", "fetch"),
        ("progress", "fetch"),
        ("progress", "fetch"),
        ("step", "block"),
        ("step", "fail"),
        ("step", "finish"),
        ("done", None),
    ]
    fetched = [e for e in lines if e["event"] == "progress"]
    assert [e["message"] for e in fetched] == ["[1/2] one", "[2/2] two"]
    overall = [e["overall"] for e in lines if "overall" in e]
    assert overall == sorted(overall) and overall[-1] == 1.0
    assert runs(target) == ["venv", "fetch", "block", "fail", "finish"]
    kode = ki.installed_kode(str(target))
    assert kode == lines[-1]["kode"] == str(target / "current" / "bin" / "kode")
    assert (target / "current").resolve() == (target / "envs" / "kode-0.1.0").resolve()
    marker = json.loads((target / "current" / "kode-install.json").read_text())
    assert marker["version"] == "0.1.0" and marker["source"] == str(ROOT)
    assert not (target / "tmp").exists()
    assert "$ " + sys.executable in (target / "install.log").read_text()

    # Run again: every step is recorded and still there, so nothing runs.
    again = fake_install(target)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [e["event"] for e in events(again.stdout)] == ["start", *["skip"] * 5, "done"]
    assert runs(target) == ["venv", "fetch", "block", "fail", "finish"]


@pytest.fixture
def blocked(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """An install stopped in its ``block`` step (its command waiting), ended after."""
    target = tmp_path / "server"
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_STEPS), str(target), str(ROOT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "KODE_TEST_BLOCK": "1"},
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the installer's own lines: wait for the event
            event = json.loads(line)
            if event.get("message") == "blocking":
                break
        else:
            pytest.fail(f"the block step never started (exit status {proc.wait()})")
        yield proc, target
    finally:
        # SIGTERM: the installer stops its command (a process group of its own, which a
        # SIGKILL of the installer would leave running) and exits
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        blocker = target / "block.pid"
        if blocker.exists() and _alive(pid := int(blocker.read_text())):
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"the blocked command {pid} outlived its installer")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_cancelled_install_stops_its_command_and_the_next_run_resumes(
    blocked: tuple[subprocess.Popen[str], Path], signum: signal.Signals
) -> None:
    proc, target = blocked
    command = int((target / "block.pid").read_text())
    assert nothing_usable(target) and not (target / "current").exists()
    proc.send_signal(signum)
    assert proc.wait(timeout=WAIT_S) == ki.CANCELLED
    assert proc.stdout is not None
    assert [json.loads(line)["event"] for line in proc.stdout] == ["cancelled"]
    assert not _alive(command), "the step's command still runs"
    assert nothing_usable(target) and not (target / "current").exists()
    assert not (target / "tmp").exists()
    assert "kode_install: cancelled" in (target / "install.log").read_text()

    done = fake_install(target)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [(e["event"], e.get("step")) for e in events(done.stdout)][1:6] == [
        ("skip", "venv"),
        ("skip", "fetch"),
        ("step", "block"),
        ("step", "fail"),
        ("step", "finish"),
    ]
    assert runs(target) == ["venv", "fetch", "block", "block", "fail", "finish"]
    assert ki.installed_kode(str(target)) == str(target / "current" / "bin" / "kode")


def test_a_second_install_into_the_same_folder_is_refused_while_one_runs(
    blocked: tuple[subprocess.Popen[str], Path],
) -> None:
    _, target = blocked
    second = fake_install(target)
    assert second.returncode == ki.BUSY
    (error,) = events(second.stdout)
    assert error["event"] == "error" and "another install" in error["message"]


def test_a_failed_step_says_why_and_a_repair_in_place_unmarks_the_environment(
    tmp_path: Path,
) -> None:
    target = tmp_path / "server"
    assert fake_install(target).returncode == 0
    # A new key for ``fetch`` (say, another llama.cpp build): it and every later step run
    # again in the environment in use, and ``fail`` fails.
    done = fake_install(target, KODE_TEST_KEY="other", KODE_TEST_FAIL="1")
    assert done.returncode == ki.FAILED
    error = events(done.stdout)[-1]
    assert error["event"] == "error" and error["step"] == "fail"
    assert error["message"].endswith("(exit status 3):\nline one\nit went wrong")
    assert error["log"] == str(target / "install.log")
    assert (target / "current").exists(), "the link stays"
    assert nothing_usable(target), "but the environment being repaired is not complete"

    again = fake_install(target, KODE_TEST_KEY="other")
    assert again.returncode == 0, again.stdout + again.stderr
    assert [e["event"] for e in events(again.stdout)][1:6] == ["skip"] * 3 + ["step"] * 2
    assert ki.installed_kode(str(target)) is not None


def test_too_little_disk_space_stops_it_before_anything_is_made(tmp_path: Path) -> None:
    target = tmp_path / "server"
    done = fake_install(target, "--free-gib", "1.5")
    assert done.returncode == ki.LACKING
    error = events(done.stdout)[-1]
    assert error["event"] == "error"
    assert error["message"] == (
        f"not enough disk space in {target}: 2.0 GiB needed at the most "
        "(the environment 2.0), 1.5 GiB free"
    )
    assert "KODE_MODEL_DIR" in error["fix"]
    assert runs(target) == [] and not (target / "envs").exists()
    assert nothing_usable(target)


def test_no_compiler_stops_it_with_the_command_that_installs_one(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    target = tmp_path / "server"
    done = run([sys.executable, str(SCRIPT), str(target), str(ROOT)], {"PATH": str(empty)})
    assert done.returncode == ki.LACKING
    error = events(done.stdout)[-1]
    assert error["event"] == "error" and error["step"] == "check"
    assert error["message"].startswith("no C and no C++ compiler on PATH (looked for cc, gcc")
    assert error["fix"] == ki.fix_for("compiler", ki.system_kind())
    assert not (target / "envs").exists() and nothing_usable(target)


def _old_pythons() -> list[str]:
    """Real interpreters older than 3.11 on this machine (pyenv keeps some)."""
    candidates = [shutil.which(f"python3.{minor}") for minor in (10, 9, 8, 7)]
    candidates += sorted(map(str, Path.home().glob(".pyenv/versions/3.[789]*/bin/python3")))
    candidates += sorted(map(str, Path.home().glob(".pyenv/versions/3.10*/bin/python3")))
    return [p for p in candidates if p and run([p, "-c", "pass"]).returncode == 0]


def test_a_python_older_than_3_11_is_named_with_the_command_that_installs_one(
    tmp_path: Path,
) -> None:
    target = tmp_path / "server"
    # This interpreter, told it is 3.10 (always possible), then each real old one here
    # (the script must get as far as saying so on them).
    pretend = (
        "import runpy, sys; sys.version_info = (3, 10, 13, 'final', 0); "
        f"sys.argv = ['kode_install.py', {str(target)!r}, {str(ROOT)!r}]; "
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    )
    runs_ = [([sys.executable, "-c", pretend], "3.10.13", sys.executable)]
    for python in _old_pythons():
        version = run([python, "-c", "import platform; print(platform.python_version())"])
        runs_.append(([python, str(SCRIPT), str(target), str(ROOT)], version.stdout.strip(), ""))
    for argv, version, executable in runs_:
        done = run(argv)
        assert done.returncode == ki.LACKING, done.stdout + done.stderr
        (error,) = events(done.stdout)
        assert error["event"] == "error" and error["step"] == "check"
        assert error["message"].startswith("Kode needs Python 3.11 or newer; ")
        assert error["message"].endswith(f" is Python {version}")
        assert executable in error["message"]
        assert error["fix"] == ki.fix_for("python", ki.system_kind())
    assert not target.exists()


def test_llama_cpp_is_built_once_with_this_cpus_flags_then_installed_from_the_kept_wheel(
    tmp_path: Path,
) -> None:
    # The real llama step, with the environment's python a fake that logs what it was asked
    # (and CMAKE_ARGS), prints ninja's progress and makes the wheel pip would.
    target = tmp_path / "server"
    log = tmp_path / "pip.log"
    with open(tmp_path / "install.log", "wb") as out:
        runner = ki.Runner(out, {**os.environ}, echo=False)
        plan = ki.Plan(str(target), ki.Source(str(ROOT)), runner)
        python = Path(plan.bin("python"))
        python.parent.mkdir(parents=True)
        python.write_text(
            "#!/bin/sh\n"
            f'echo "$* CMAKE_ARGS=$CMAKE_ARGS" >> {log}\n'
            'if [ "$3" = wheel ]; then\n'
            "  echo '[1/4] Building C object ggml.c.o'; echo '[4/4] Linking libllama.so'\n"
            '  while [ "$1" != --wheel-dir ]; do shift; done; mkdir -p "$2"\n'
            '  touch "$2/llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"\n'
            "fi\n"
        )
        python.chmod(0o755)
        reports: list[dict[str, Any]] = []

        def report(**fields: Any) -> None:
            reports.append(fields)

        ki._install_llama(plan, report)
        wheel = Path(plan.wheels) / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
        build, install = log.read_text().splitlines()
        assert build.startswith("-m pip wheel --verbose --no-deps --no-cache-dir --wheel-dir ")
        assert f"llama-cpp-python=={plan.source.llama_pin} " in build
        assert build.endswith(f"CMAKE_ARGS={plan.cmake_args}")
        assert install.startswith(f"-m pip install --no-cache-dir {wheel} ")
        assert install.endswith("CMAKE_ARGS=")  # set for the build only
        assert wheel.exists() and not Path(plan.wheels + ".partial").exists()
        compiled = [r for r in reports if "compiled" in r.get("message", "")]
        assert [(r["fraction"], r["message"]) for r in compiled] == [
            (0.2375, "1 of 4 compiled"),
            (0.95, "4 of 4 compiled"),
        ]
        assert reports[0]["message"].startswith("for AVX, AVX2, FMA, F16C")

        # Again (an update of Kode, or a new environment): installed from the kept wheel.
        log.unlink()
        ki._install_llama(plan, report)
        (install,) = log.read_text().splitlines()
        assert install.startswith(f"-m pip install --no-cache-dir {wheel} ")
        assert ki._llama_needs(plan) == []  # and no space asked for a build
