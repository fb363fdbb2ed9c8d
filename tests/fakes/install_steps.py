"""The editor installer (editors/install/kode_install.py) with fake steps, run as a
process by tests/process/test_install_script.py:

    python tests/fakes/install_steps.py TARGET SOURCE [--free-gib N]

Each step appends its name to TARGET/runs.txt when it runs; ``venv`` makes bin/kode, a
script that runs ``KODE_TEST_SERVER`` (a real kode) if it is set. ``fetch`` prints ninja-like
progress; ``block`` starts a command that writes its pid to TARGET/block.pid and then
waits (for the SIGTERM the test sends) while ``KODE_TEST_BLOCK`` is set, else returns at
once; ``fail`` fails while ``KODE_TEST_FAIL`` is set. ``KODE_TEST_KEY`` changes the
``fetch`` step's key (a new llama.cpp build, say), so it and the steps after it run again.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "editors" / "install" / "kode_install.py"


def load_installer() -> ModuleType:
    """editors/install/kode_install.py as a module (it is a script, on no import path)."""
    spec = importlib.util.spec_from_file_location("kode_install", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kode_install"] = module  # NamedTuple and doctests look it up by name
    spec.loader.exec_module(module)
    return module


ki = load_installer()


def _ran(plan: ki.Plan, name: str) -> None:
    with open(os.path.join(plan.target, "runs.txt"), "a") as f:
        f.write(name + "\n")


def _python(plan: ki.Plan, code: str, on_line: ki.Report | None = None) -> None:
    plan.runner.run([sys.executable, "-c", code], on_line, what="a fake step")


def make_env(plan: ki.Plan, report: ki.Report) -> None:
    _ran(plan, "venv")
    os.makedirs(os.path.join(plan.env, "bin"), exist_ok=True)
    kode = os.path.join(plan.env, "bin", "kode")
    server = os.environ.get("KODE_TEST_SERVER")  # a real kode for the editors' tests
    with open(kode, "w") as f:
        f.write(f'#!/bin/sh\nexec {shlex.quote(server)} "$@"\n' if server else "#!/bin/sh\n")
    os.chmod(kode, 0o755)


def fetch(plan: ki.Plan, report: ki.Report) -> None:
    _ran(plan, "fetch")

    def on_line(line: str) -> None:
        report(fraction=0.5, message=line)

    _python(plan, "print('[1/2] one'); print('[2/2] two')", on_line)


def block(plan: ki.Plan, report: ki.Report) -> None:
    _ran(plan, "block")
    if not os.environ.get("KODE_TEST_BLOCK"):
        return
    pid_file = os.path.join(plan.target, "block.pid")
    code = (
        "import os, sys, time\n"
        f"open({pid_file!r}, 'w').write(str(os.getpid()))\n"
        "print('blocking', flush=True)\n"
        "time.sleep(600)\n"
    )
    _python(plan, code, lambda line: report(message=line))


def fail(plan: ki.Plan, report: ki.Report) -> None:
    _ran(plan, "fail")
    if os.environ.get("KODE_TEST_FAIL"):
        _python(plan, "import sys; print('line one'); print('it went wrong'); sys.exit(3)")


def finish(plan: ki.Plan, report: ki.Report) -> None:
    _ran(plan, "finish")


def _fetch_key(plan: ki.Plan) -> str:
    return os.environ.get("KODE_TEST_KEY", "fetched")


def _needs(plan: ki.Plan) -> list[ki.Need]:
    return [ki.Need(plan.env, 2 * ki.GIB, "the environment")]


STEPS = (
    ki.Step("venv", "Making the environment", 0.1, make_env, needs=_needs),
    ki.Step("fetch", "Fetching", 0.3, fetch, key=_fetch_key),
    ki.Step("block", "Blocking", 0.3, block),
    ki.Step("fail", "Failing", 0.1, fail),
    ki.Step("finish", "Finishing", 0.2, finish),
)


def main() -> int:
    argv = sys.argv[1:]
    free = ki.free_space
    if "--free-gib" in argv:
        at = argv.index("--free-gib")
        gib = float(argv[at + 1])
        del argv[at : at + 2]

        def free(folder: str) -> int:
            return int(gib * ki.GIB)

    return int(ki.main(argv, STEPS, free=free))


if __name__ == "__main__":
    sys.exit(main())
