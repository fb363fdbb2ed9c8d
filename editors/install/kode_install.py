#!/usr/bin/env python3
"""Install the Kode server into a private environment: what both editor clients run.

    python3 kode_install.py TARGET SOURCE [--log FILE] [--quiet]

TARGET is a folder of the editor's own (VS Code: the extension's global storage,
``.../server``; Neovim: ``stdpath("data")/kode/server``). SOURCE is a Kode wheel (the one
the .vsix carries) or a Kode source folder (the repository the Neovim plugin lives in).
Standard library only, so any Python the editor finds can run it; on a Python older than
3.11 it gets far enough to say so, with the command that installs a newer one.

What it makes in TARGET::

    current -> envs/kode-0.1.0          the environment a client runs (bin/kode): a link
    envs/kode-0.1.0/                    a venv: llama-cpp-python, Kode[models,structure]
    envs/kode-0.1.0/kode-install.json   written last: this environment is complete
    wheels/llama-cpp-python-0.3.36-KEY/ llama.cpp built for this CPU, kept for updates
    install.log                         everything the last run's commands printed
    tmp/                                the commands' TMPDIR (pip's downloads, the build)

A client runs ``TARGET/current/bin/kode`` only when ``TARGET/current/kode-install.json``
is there (``installed_kode``): a half-made environment is never used. A venv cannot be
moved (its scripts name its interpreter by absolute path), so each is made where it
stays, and the ``current`` link is switched to it (a new link renamed over the old one,
atomically) once its marker is written; an environment repaired in place loses its
marker before anything in it changes. Older environments are removed after the switch.
The models go where every Kode puts them (``~/.cache/kode/models``, ``KODE_MODEL_DIR``).

The steps, after the checks (Python 3.11+, the venv module, a C and a C++ compiler, the
disk space the remaining steps need): make the venv, upgrade pip, build
llama-cpp-python (the version SOURCE pins) with the CMake flags of SOURCE's
``backends/llama/build_flags.py`` into a kept wheel and install it, install Kode with its
models and tree-sitter's grammars, assemble the models (``kode model install``); then
mark the environment complete and switch ``current`` to it.

Progress: one JSON object per line on stdout, ``event`` one of
``start`` (target, log, version, steps), ``step`` and ``skip`` (step, index, total,
title), ``progress`` (step, fraction of the step, message), ``done`` (kode, version,
seconds), ``error`` (step, message, fix: the one command that fixes it, or null; log),
``cancelled`` (log); ``overall`` is the fraction of a whole install done, by the steps'
measured times. Everything the commands print goes to the log, and to stderr unless
``--quiet``.

Resumable: a step's result is recorded in the environment (``.install-steps.json``) only
after it succeeded, and what it made is checked again on the next run (the installed
llama-cpp-python's version, Kode's, ``kode model info``); a step that runs makes every
later one run again. SIGTERM or SIGINT stops the running command (its process group) and
exits 130; what was recorded stays valid, nothing is marked complete.

Exit status: 0 installed; 1 a step failed; 2 bad arguments; 3 this machine lacks
something (the message names the command that installs it); 4 another install into
TARGET is running; 130 cancelled.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # only in annotations: the script runs on old Pythons far enough to
    # say they are too old, and collections.abc's types are not subscriptable before 3.9
    Free = Callable[[str], int]  # a folder's free bytes
    Report = Callable[..., None]  # report(fraction=None, message=None)

MIN_PYTHON = (3, 11)  # pyproject's requires-python

# The extras an editor install gets: the default models from PyPI and tree-sitter's
# grammars, as the README's quick start installs them.
EXTRAS = "models,structure"

# Disk space, measured on real installs (2026-12-07, x86-64 Linux, Python 3.11, the
# packages from a local index; `du` every 5 s): the llama.cpp build tree 0.3 GiB, gone
# before the downloads come; the finished venv 1.9 GiB (1.5 of it the models' PyPI
# parts); pip keeps the downloaded parts (1.5 GiB) in TMPDIR until it has installed them
# all, so TARGET held 3.2 GiB at most; the assembled models 1.5 GiB in the model folder:
# 3.4 GiB at most with everything on one disk. Each figure here carries 10-30% more; on
# one disk a fresh install asks for 3.8 GiB free.
GIB = 1 << 30
ENV_BYTES = int(2.1 * GIB)
DOWNLOAD_BYTES = int(1.7 * GIB)
BUILD_BYTES = int(0.4 * GIB)
MODELS_BYTES = int(1.7 * GIB)

CURRENT = "current"
MARKER = "kode-install.json"
RECORD = ".install-steps.json"

# Exit statuses (the clients read the JSON lines; these are for scripts).
OK, FAILED, USAGE, LACKING, BUSY, CANCELLED = 0, 1, 2, 3, 4, 130


class InstallError(Exception):
    """A check or a step failed: ``message`` says what, ``fix`` the command that fixes
    it (or None), ``status`` the exit status."""

    def __init__(self, message: str, fix: str | None = None, status: int = FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.status = status


class Cancelled(Exception):
    """SIGTERM or SIGINT arrived."""


# ---------------------------------------------------------------- what this machine lacks

# The one command that installs each missing piece, per system; {v}: "3.11".
FIXES = {
    "python": {
        "debian": "sudo apt install python3.11 python3.11-venv",
        "fedora": "sudo dnf install python3.11",
        "macos": "brew install python@3.12",
    },
    "venv": {
        "debian": "sudo apt install python{v}-venv",
        "fedora": "sudo dnf install python{v}",
        "macos": "brew install python@{v}",
    },
    "compiler": {
        "debian": "sudo apt install build-essential",
        "fedora": "sudo dnf install gcc gcc-c++",
        "macos": "xcode-select --install",
    },
}
SYSTEMS = {"debian": "Debian/Ubuntu", "fedora": "Fedora", "macos": "macOS"}


def system_kind(os_release: str | None = None) -> str:
    """Which system's commands to name: "debian", "fedora", "macos" or "other".

    >>> system_kind('NAME="Ubuntu"\\nID=ubuntu\\nID_LIKE=debian\\n')
    'debian'
    >>> system_kind("ID=arch\\n")
    'other'
    """
    if os_release is None:
        if sys.platform == "darwin":
            return "macos"
        try:
            with open("/etc/os-release", encoding="utf-8") as f:
                os_release = f.read()
        except OSError:
            os_release = ""
    ids: set[str] = set()
    for line in os_release.splitlines():
        key, _, value = line.partition("=")
        if key in ("ID", "ID_LIKE"):
            ids.update(value.strip().strip("\"'").split())
    if ids & {"debian", "ubuntu"}:
        return "debian"
    if ids & {"fedora", "rhel", "centos"}:
        return "fedora"
    return "other"


def fix_for(piece: str, kind: str, version: str = "") -> str:
    """The command that installs ``piece`` on ``kind``; on another system, each known
    system's, named.

    >>> fix_for("compiler", "fedora")
    'sudo dnf install gcc gcc-c++'
    >>> fix_for("venv", "debian", "3.12")
    'sudo apt install python3.12-venv'
    """
    commands = FIXES[piece]
    if kind in commands:
        return commands[kind].format(v=version)
    return "; ".join(f"{name}: {commands[k].format(v=version)}" for k, name in SYSTEMS.items())


def check_python(version: Sequence[int], executable: str, kind: str) -> None:
    if tuple(version[:2]) < MIN_PYTHON:
        shown = ".".join(str(n) for n in version[:3])
        raise InstallError(
            f"Kode needs Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer; {executable} is "
            f"Python {shown}",
            fix_for("python", kind),
            LACKING,
        )


def check_venv(kind: str, find_spec: Callable[[str], object] | None = None) -> None:
    """The venv module with ensurepip (Debian ships them as pythonX.Y-venv)."""
    import importlib.util

    find = find_spec or importlib.util.find_spec
    if find("venv") is None or find("ensurepip") is None:
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        raise InstallError(
            f"this Python ({sys.executable}) cannot make virtual environments: the venv "
            "module or ensurepip is missing",
            fix_for("venv", kind, version),
            LACKING,
        )


C_COMPILERS = ("cc", "gcc", "clang")
CXX_COMPILERS = ("c++", "g++", "clang++")


def working_compiler(names: Iterable[str], path: str | None) -> str | None:
    """The first of ``names`` on ``path`` that answers ``--version`` (macOS's
    /usr/bin/cc is a stub that fails until the command line tools are installed)."""
    for name in names:
        found = shutil.which(name, path=path)
        if found is None:
            continue
        try:
            done = subprocess.run(
                [found, "--version"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return found
    return None


def check_compilers(kind: str, path: str | None) -> None:
    """A C and a C++ compiler: llama-cpp-python builds llama.cpp from source."""
    missing = [
        language
        for language, names in (("C", C_COMPILERS), ("C++", CXX_COMPILERS))
        if working_compiler(names, path) is None
    ]
    if missing:
        raise InstallError(
            f"no {' and no '.join(missing)} compiler on PATH (looked for "
            f"{', '.join(C_COMPILERS + CXX_COMPILERS)}): llama.cpp is built from source "
            "for this CPU",
            fix_for("compiler", kind),
            LACKING,
        )


class Need(NamedTuple):
    """Disk space a step needs: ``size`` bytes in ``folder`` for ``what``; ``transient``
    space is given back when the step ends (pip's downloads, a build tree)."""

    folder: str
    size: int
    what: str
    transient: bool = False


def existing_ancestor(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def free_space(folder: str) -> int:
    return shutil.disk_usage(folder).free


def check_disk(
    steps: Iterable[Sequence[Need]],
    free: Free = free_space,
    device: Callable[[str], int] = lambda folder: os.stat(folder).st_dev,
) -> None:
    """``steps``: each remaining step's needs, in order. On each file system the most
    that is in use at once must be free: what the steps before keep plus what this one
    takes. Raises naming the first file system without room, what needs the space and
    how much is free.

    >>> fs = {"free": lambda folder: 4 * GIB, "device": lambda folder: 1}
    >>> build, env = Need("/", 3 * GIB, "build", True), Need("/", 2 * GIB, "env")
    >>> models, downloads = Need("/", 2 * GIB, "models"), Need("/", 3 * GIB, "downloads", True)
    >>> check_disk([[build], [env], [models]], **fs)  # at most 4 GiB at once
    >>> check_disk([[build], [env, downloads], [models]], **fs)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    kode_install.InstallError: not enough disk space in /: 5.0 GiB needed at the most ...
    """
    where: dict[int, str] = {}  # per file system: a folder on it,
    kept: dict[int, int] = {}  # what the steps so far keep there,
    peak: dict[int, int] = {}  # the most in use there at once,
    named: dict[int, list[Need]] = {}  # and what for
    for needs in steps:
        taken: dict[int, int] = {}
        for need in needs:
            folder = existing_ancestor(need.folder)
            dev = device(folder)
            where.setdefault(dev, folder)
            named.setdefault(dev, []).append(need)
            kept[dev] = kept.get(dev, 0) + (0 if need.transient else need.size)
            taken[dev] = taken.get(dev, 0) + (need.size if need.transient else 0)
        for dev in taken:
            peak[dev] = max(peak.get(dev, 0), kept[dev] + taken[dev])
    for dev, size in peak.items():
        available = free(where[dev])
        if available < size:
            whats = ", ".join(f"{n.what} {n.size / GIB:.1f}" for n in named[dev])
            raise InstallError(
                f"not enough disk space in {where[dev]}: {size / GIB:.1f} GiB needed at the "
                f"most ({whats}), {available / GIB:.1f} GiB free",
                "free some space there (or set KODE_MODEL_DIR to a folder on a larger disk "
                "for the models), then install again",
                LACKING,
            )


def models_dir(environ: dict[str, str]) -> str:
    """Where ``kode model install`` puts the models (backends/models.py ``cache_dir``:
    ``KODE_MODEL_DIR``, else platformdirs' user cache); only its file system matters."""
    if environ.get("KODE_MODEL_DIR"):
        return os.path.expanduser(environ["KODE_MODEL_DIR"])
    if sys.platform == "darwin":
        return os.path.expanduser("~/Library/Caches/kode/models")
    cache = environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "kode", "models")


# ---------------------------------------------------------------- what is installed


def _headers(metadata: str) -> Iterator[tuple[str, str]]:
    for line in metadata.splitlines():
        if not line.strip():
            return  # the description follows the headers
        key, sep, value = line.partition(": ")
        if sep:
            yield key, value.strip()


def llama_pin(requirements: Iterable[str]) -> str:
    """The ``==`` version of llama-cpp-python among requirement strings.

    >>> llama_pin(["pygls>=2.0,<3", "llama-cpp-python==0.3.36"])
    '0.3.36'
    """
    for req in requirements:
        m = re.match(r"\s*llama[-_.]cpp[-_.]python\s*==\s*([^\s;,]+)", req, re.IGNORECASE)
        if m:
            return m.group(1)
    raise InstallError("the source does not pin llama-cpp-python (llama-cpp-python==X)")


class Source:
    """A Kode wheel or source folder: its version, its llama-cpp-python pin, its files."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.is_wheel = self.path.endswith(".whl")
        if self.is_wheel:
            if not os.path.isfile(self.path):
                raise InstallError(f"no such wheel: {self.path}", status=USAGE)
            headers = list(_headers(self._metadata()))
            self.version = next(v for k, v in headers if k == "Version")
            requires = [v for k, v in headers if k == "Requires-Dist" and "extra ==" not in v]
        else:
            pyproject = os.path.join(self.path, "pyproject.toml")
            if not os.path.isfile(pyproject):
                raise InstallError(
                    f"{self.path} is neither a Kode wheel (.whl) nor a Kode source folder "
                    "(it has no pyproject.toml)",
                    status=USAGE,
                )
            import tomllib  # Python 3.11+, checked before a Source is made

            with open(pyproject, "rb") as f:
                project = tomllib.load(f)["project"]
            self.version = str(project["version"])
            requires = [str(r) for r in project.get("dependencies", [])]
        self.llama_pin = llama_pin(requires)

    def _metadata(self) -> str:
        with zipfile.ZipFile(self.path) as wheel:
            name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
            return wheel.read(name).decode("utf-8")

    def read(self, relative: str) -> str:
        """One of Kode's files by its path in the repository (``backends/...``)."""
        if self.is_wheel:
            with zipfile.ZipFile(self.path) as wheel:
                return wheel.read("kode/" + relative).decode("utf-8")
        with open(os.path.join(self.path, relative), encoding="utf-8") as f:
            return f.read()

    def cmake_args(self) -> str:
        """The CMake flags for this CPU, as SOURCE's ``backends/llama/build_flags.py``
        computes them (it is standard library only, so it runs here)."""
        module: dict[str, Any] = {"__name__": "kode_build_flags"}
        exec(compile(self.read("backends/llama/build_flags.py"), "build_flags.py", "exec"), module)
        return " ".join(module["for_this_machine"]())

    def identity(self) -> str | None:
        """What the Kode step installs: a wheel by its hash; a folder never counts as
        installed (its files change without its version), so each run installs it."""
        if not self.is_wheel:
            return None
        with open(self.path, "rb") as f:
            return "sha256:" + hashlib.sha256(f.read()).hexdigest()

    def requirement_count(self) -> int:
        """About how many packages pip collects for Kode with the extras."""
        if self.is_wheel:
            return sum(1 for k, _ in _headers(self._metadata()) if k == "Requires-Dist") + 10
        return 50


# ---------------------------------------------------------------- running commands


class Runner:
    """Runs one command at a time, everything it prints into the log (and stderr), and
    stops it, its whole process group, when the installer is told to stop."""

    def __init__(self, log: IO[bytes], environ: dict[str, str], echo: bool = True) -> None:
        self.log = log
        self.environ = environ
        self.echo = echo
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def stop(self, signum: int = signal.SIGTERM, frame: object = None) -> None:
        """The SIGTERM/SIGINT handler: the command gets SIGTERM, SIGKILL 10 s later."""
        self.stopping = True
        self._signal(signal.SIGTERM)
        signal.signal(signal.SIGALRM, lambda *_: self._signal(signal.SIGKILL))
        signal.alarm(10)

    def _signal(self, signum: int) -> None:
        child = self.child
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signum)

    def run(
        self, argv: list[str], on_line: Callable[[str], None] | None = None, what: str = ""
    ) -> None:
        """Runs ``argv`` to its end; ``on_line`` sees each line it prints (split at
        carriage returns too: progress bars). Raises Cancelled or InstallError."""
        self.write(f"\n$ {' '.join(argv)}\n".encode())
        try:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=self.environ,
                start_new_session=True,  # a process group of its own, stopped as one
            )
        except OSError as exc:
            raise InstallError(f"could not run {argv[0]}: {exc.strerror}") from None
        self.child = child
        if self.stopping:  # cancelled before this command started
            self._signal(signal.SIGTERM)
        assert child.stdout is not None
        pending = b""
        tail: list[str] = []
        while True:
            chunk = os.read(child.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            self.write(chunk)
            *lines, pending = re.split(rb"[\r\n]", pending + chunk)
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip()
                if line:
                    tail = [*tail[-11:], line]
                    if on_line is not None:
                        on_line(line)
        code = child.wait()
        child.stdout.close()
        self.child = None
        if self.stopping:
            raise Cancelled()
        if code != 0:
            last = "\n".join(tail[-8:])
            raise InstallError(f"{what or argv[0]} failed (exit status {code}):\n{last}")

    def output(self, argv: list[str]) -> str | None:
        """A short command's stdout (its stderr to the log), or None when it failed."""
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=self.environ,
                check=False,
                timeout=300,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        self.write(done.stderr.encode())
        return done.stdout if done.returncode == 0 else None

    def write(self, data: bytes) -> None:
        self.log.write(data)
        self.log.flush()
        if self.echo:
            sys.stderr.buffer.write(data)
            sys.stderr.buffer.flush()


# ---------------------------------------------------------------- the plan and its steps


class Plan:
    """What this run installs, from where, and where to."""

    def __init__(self, target: str, source: Source, runner: Runner) -> None:
        self.target = target
        self.source = source
        self.runner = runner
        self.python = sys.executable
        self.env = os.path.join(target, "envs", f"kode-{source.version}")
        self.tmp = os.path.join(target, "tmp")
        self.cmake_args = source.cmake_args()
        # The wheel's ABI (cpython-311), not the patch release: a build for 3.11.2 serves
        # 3.11.7, and an editor may find either Python on PATH
        flavour = f"{self.cmake_args}|{sys.implementation.cache_tag}|{platform.machine()}"
        digest = hashlib.sha256(flavour.encode()).hexdigest()[:12]
        self.llama_key = f"llama-cpp-python-{source.llama_pin}-{digest}"
        self.wheels = os.path.join(target, "wheels", self.llama_key)

    def bin(self, name: str) -> str:
        return os.path.join(self.env, "bin", name)

    def pip(self, *args: str) -> list[str]:
        quiet = ("--disable-pip-version-check", "--no-input", "--progress-bar", "off")
        return [self.bin("python"), "-m", "pip", *args, *quiet]

    def installed_version(self, dist: str) -> str | None:
        if not os.path.isfile(self.bin("python")):
            return None
        code = f"import importlib.metadata as m; print(m.version({dist!r}))"
        out = self.runner.output([self.bin("python"), "-c", code])
        return out.strip() if out else None

    def models_ready(self, kode: str) -> bool:
        """Every default model installed and verified, as ``kode model info`` says."""
        if not os.path.isfile(kode):
            return False
        out = self.runner.output([kode, "model", "info", "--json"])
        try:
            rows = json.loads(out) if out else []
        except ValueError:
            return False
        return bool(rows) and all(r.get("installed") and r.get("verified") for r in rows)


class Step(NamedTuple):
    """One step. ``key(plan)`` names what it makes, recorded once it succeeded (None:
    never counts as done); ``check(plan)`` whether that is still there; ``run(plan,
    report)`` makes it; ``needs(plan)`` the disk space it takes; ``weight`` its share of
    a whole install's time."""

    name: str
    title: str
    weight: float
    run: Callable[[Plan, Report], None]
    key: Callable[[Plan], str | None] = lambda plan: "done"
    check: Callable[[Plan], bool] = lambda plan: True
    needs: Callable[[Plan], list[Need]] = lambda plan: []


def _make_venv(plan: Plan, report: Report) -> None:
    plan.runner.run([plan.python, "-m", "venv", "--clear", plan.env], what="python -m venv")


def _venv_works(plan: Plan) -> bool:
    return plan.installed_version("pip") is not None


def _upgrade_pip(plan: Plan, report: Report) -> None:
    plan.runner.run(plan.pip("install", "--upgrade", "pip"), what="pip install --upgrade pip")


def _llama_wheel(plan: Plan) -> str | None:
    try:
        names = [n for n in os.listdir(plan.wheels) if n.endswith(".whl")]
    except OSError:
        return None
    return os.path.join(plan.wheels, names[0]) if len(names) == 1 else None


def _install_llama(plan: Plan, report: Report) -> None:
    """Builds llama-cpp-python for this CPU into a kept wheel, unless one was built with
    the same flags, then installs that wheel."""
    wheel = _llama_wheel(plan)
    if wheel is None:
        partial = plan.wheels + ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        sets = [
            a[len("-DGGML_") : -len("=ON")] for a in plan.cmake_args.split() if a.endswith("=ON")
        ]
        report(fraction=0.0, message=f"for {', '.join(sets) or 'this CPU (llama.cpp decides)'}")

        def on_line(line: str) -> None:
            m = re.search(r"\[(\d+)/(\d+)\]", line)  # ninja's "[12/140] /usr/bin/cc ..."
            if m and int(m.group(2)) > 0:
                done, total = int(m.group(1)), int(m.group(2))
                report(fraction=0.95 * done / total, message=f"{done} of {total} compiled")

        # Never pip's wheel cache: a wheel cached by a build with other CMAKE_ARGS would be
        # used silently (.ci/run). This one is kept under a name made of the flags.
        environ = plan.runner.environ
        environ["CMAKE_ARGS"] = plan.cmake_args
        try:
            plan.runner.run(
                plan.pip(
                    "wheel", "--verbose", "--no-deps", "--no-cache-dir", "--wheel-dir", partial,
                    f"llama-cpp-python=={plan.source.llama_pin}",
                ),
                on_line,
                what="building llama-cpp-python",
            )  # fmt: skip
        finally:
            environ.pop("CMAKE_ARGS")
        shutil.rmtree(plan.wheels, ignore_errors=True)
        os.replace(partial, plan.wheels)
        wheel = _llama_wheel(plan)
        if wheel is None:
            raise InstallError(f"pip built no single wheel into {plan.wheels}")
    report(fraction=0.96, message=f"installing {os.path.basename(wheel)}")
    plan.runner.run(plan.pip("install", "--no-cache-dir", wheel), what="installing llama.cpp")


def _llama_installed(plan: Plan) -> bool:
    return plan.installed_version("llama-cpp-python") == plan.source.llama_pin


def _llama_needs(plan: Plan) -> list[Need]:
    if _llama_wheel(plan):
        return []
    return [Need(plan.tmp, BUILD_BYTES, "the llama.cpp build", True)]


def _install_kode(plan: Plan, report: Report) -> None:
    collected, expected = [0], plan.source.requirement_count()

    def on_line(line: str) -> None:
        if line.startswith("Collecting "):
            collected[0] += 1
            fraction = min(0.9, 0.9 * collected[0] / expected)
            report(fraction=fraction, message=f"fetching {line.split()[1]}")
        elif line.startswith("Installing collected packages"):
            report(fraction=0.9, message="installing the packages")

    source = plan.source
    plan.runner.run(
        plan.pip("install", "--no-cache-dir", f"{source.path}[{EXTRAS}]"), on_line, "pip install"
    )
    # pip keeps an installed Kode of the same version ("already installed with the same
    # version as the provided wheel"), but a folder's files, or a wheel rebuilt without a
    # new version, differ: Kode's own files again, its requirements being in place.
    report(fraction=0.95, message="installing Kode's own files")
    plan.runner.run(
        plan.pip("install", "--no-cache-dir", "--no-deps", "--force-reinstall", source.path),
        what="pip install (Kode's files)",
    )


def _kode_installed(plan: Plan) -> bool:
    return plan.installed_version("kode") == plan.source.version


def _kode_needs(plan: Plan) -> list[Need]:
    if plan.installed_version("kode") is not None:  # only Kode's own files change
        return []
    return [
        Need(plan.env, ENV_BYTES, "the environment"),
        Need(plan.tmp, DOWNLOAD_BYTES, "pip's downloads", True),
    ]


def _install_models(plan: Plan, report: Report) -> None:
    def on_line(line: str) -> None:
        m = re.match(r"(assembling .*?):\s+(\d+)%", line)  # tqdm: "assembling X:  42%|..."
        if m:
            report(message=f"{m.group(1)}: {m.group(2)}%")

    plan.runner.run([plan.bin("kode"), "model", "install", "all"], on_line, "kode model install")


def _models_ready(plan: Plan) -> bool:
    return plan.models_ready(plan.bin("kode"))


def _models_needs(plan: Plan) -> list[Need]:
    # Already there for the kode of this environment or of the one in use (an update).
    for kode in (plan.bin("kode"), os.path.join(plan.target, CURRENT, "bin", "kode")):
        if plan.models_ready(kode):
            return []
    return [Need(models_dir(plan.runner.environ), MODELS_BYTES, "the models")]


# Weights: each step's share of a whole install's time on the 2-core development machine:
# the venv 4 s, pip 2 s, llama.cpp's build 4 min 54 s quiet (README.md; 8 min 55 s beside
# a model benchmark), Kode with the models' parts 42 s (from a local index; over the
# network, 1.5 GB to download), the models 11 s.
STEPS = (
    Step("venv", "Making the environment", 0.01, _make_venv, check=_venv_works),
    Step("pip", "Upgrading pip", 0.02, _upgrade_pip),
    Step(
        "llama", "Building llama.cpp for this CPU (minutes)", 0.72, _install_llama,
        key=lambda plan: plan.llama_key, check=_llama_installed, needs=_llama_needs,
    ),
    Step(
        "kode", "Installing Kode and the models' parts (1.5 GB)", 0.17, _install_kode,
        key=lambda plan: plan.source.identity(), check=_kode_installed, needs=_kode_needs,
    ),
    Step("models", "Assembling the models", 0.08, _install_models, check=_models_ready,
         needs=_models_needs),
)  # fmt: skip


# ---------------------------------------------------------------- the install


class Progress:
    """The JSON lines on stdout."""

    def __init__(self, steps: Sequence[Step], out: IO[str]) -> None:
        self.out = out
        total = sum(s.weight for s in steps) or 1.0
        self.span: dict[str, tuple[float, float]] = {}
        start = 0.0
        for s in steps:
            self.span[s.name] = (start / total, s.weight / total)
            start += s.weight
        self.step = "check"  # the step running, named in an error

    def emit(self, event: str, **fields: object) -> None:
        self.out.write(json.dumps({"event": event, **fields}) + "\n")
        self.out.flush()

    def overall(self, step: str, fraction: float) -> float:
        start, width = self.span[step]
        return round(start + width * fraction, 4)

    def begin(self, event: str, index: int, steps: Sequence[Step]) -> None:
        step = steps[index]
        self.step = step.name
        done = 1.0 if event == "skip" else 0.0
        self.emit(
            event, step=step.name, index=index + 1, total=len(steps), title=step.title,
            overall=self.overall(step.name, done),
        )  # fmt: skip

    def reporter(self, step: str) -> Report:
        def report(fraction: float | None = None, message: str | None = None) -> None:
            fields: dict[str, object] = {"step": step}
            if fraction is not None:
                fields["fraction"] = round(fraction, 4)
                fields["overall"] = self.overall(step, fraction)
            if message is not None:
                fields["message"] = message
            self.emit("progress", **fields)

        return report


def load_record(env: str) -> dict[str, object]:
    try:
        with open(os.path.join(env, RECORD), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def write_json(path: str, value: object) -> None:
    """Written whole or not at all (a temporary file renamed over it)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def installed_kode(target: str) -> str | None:
    """The kode a client runs from TARGET: only a complete environment's, else None."""
    env = os.path.join(target, CURRENT)
    kode = os.path.join(env, "bin", "kode")
    complete = os.path.isfile(os.path.join(env, MARKER))
    return kode if complete and os.access(kode, os.X_OK) else None


def switch(plan: Plan) -> None:
    """``current`` to the new environment (a new link renamed over the old one), then
    the other environments removed."""
    link = os.path.join(plan.target, CURRENT)
    tmp = f"{link}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)
    os.symlink(os.path.relpath(plan.env, plan.target), tmp)
    os.replace(tmp, link)
    envs = os.path.dirname(plan.env)
    for name in os.listdir(envs):
        if os.path.join(envs, name) != plan.env:
            shutil.rmtree(os.path.join(envs, name), ignore_errors=True)


def pending(plan: Plan, steps: Sequence[Step]) -> list[Step]:
    """The steps this run must run: from the first one not recorded with its key, or
    whose result is gone, to the end."""
    record = load_record(plan.env)
    for index, step in enumerate(steps):
        key = step.key(plan)
        if key is None or record.get(step.name) != key or not step.check(plan):
            return list(steps[index:])
    return []


def install(plan: Plan, steps: Sequence[Step], progress: Progress, free: Free = free_space) -> str:
    """Runs the pending steps, marks the environment complete, switches ``current`` to
    it; returns the kode to run."""
    started = time.monotonic()
    todo = pending(plan, steps)
    check_disk((step.needs(plan) for step in todo), free)
    os.makedirs(os.path.dirname(plan.env), exist_ok=True)
    record = load_record(plan.env)
    for index, step in enumerate(steps):
        if step not in todo:
            progress.begin("skip", index, steps)
            continue
        progress.begin("step", index, steps)
        if os.path.isdir(plan.env):
            # About to change: no longer complete, and this step's record and every later
            # one's no longer hold.
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(plan.env, MARKER))
            for later in steps[index:]:
                record.pop(later.name, None)
            write_json(os.path.join(plan.env, RECORD), record)
        began = time.monotonic()
        step.run(plan, progress.reporter(step.name))
        record[step.name] = step.key(plan)
        write_json(os.path.join(plan.env, RECORD), record)
        plan.runner.write(f"[{step.name}: {time.monotonic() - began:.0f} s]\n".encode())
    marker = {
        "version": plan.source.version,
        "source": plan.source.path,
        "python": plan.python,
        "llama_cpp_python": plan.source.llama_pin,
        "cmake_args": plan.cmake_args,
        "completed": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json(os.path.join(plan.env, MARKER), marker)
    switch(plan)
    kode = os.path.join(plan.target, CURRENT, "bin", "kode")
    seconds = round(time.monotonic() - started, 1)
    progress.emit("done", kode=kode, version=plan.source.version, seconds=seconds, overall=1.0)
    return kode


# ---------------------------------------------------------------- the command


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kode_install.py",
        description="Install the Kode server into a private environment (editors/README.md).",
    )
    p.add_argument("target", help="the folder to install into (an editor's own)")
    p.add_argument("source", help="a Kode wheel (.whl) or a Kode source folder")
    p.add_argument("--log", help="the log file (default: TARGET/install.log)")
    p.add_argument("--quiet", action="store_true", help="the commands' output to the log only")
    return p


def _lock(target: str) -> IO[str] | None:
    """An exclusive lock on TARGET for this run; None while another run holds it."""
    import fcntl

    f = open(os.path.join(target, ".lock"), "a")  # noqa: SIM115 - held for the whole run
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    return f


def child_environ(tmp: str) -> dict[str, str]:
    """The commands' environment: TMPDIR in TARGET (the space was checked there), no
    variables that would point pip or Python at another environment."""
    environ = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV"):
        environ.pop(name, None)
    environ["TMPDIR"] = tmp
    environ["PYTHONUNBUFFERED"] = "1"
    return environ


def main(
    argv: Sequence[str] | None = None,
    steps: Sequence[Step] = STEPS,
    out: IO[str] | None = None,
    free: Free = free_space,
) -> int:
    """The command; the tests pass other steps and free space."""
    args = _parser().parse_args(argv)
    progress = Progress(steps, out or sys.stdout)
    kind = system_kind()
    target = os.path.abspath(args.target)
    log_path = os.path.abspath(args.log or os.path.join(target, "install.log"))
    try:
        check_python(sys.version_info[:3], sys.executable, kind)
        if sys.platform == "win32":
            raise InstallError(
                "the editor install runs on Linux and macOS; on Windows, install Kode by "
                "hand (README.md, Quick start)",
                status=LACKING,
            )
        os.makedirs(target, exist_ok=True)
        lock = _lock(target)
        if lock is None:
            raise InstallError(f"another install into {target} is running", status=BUSY)
    except InstallError as exc:
        progress.emit("error", step="check", message=exc.message, fix=exc.fix, log=None)
        return exc.status
    tmp = os.path.join(target, "tmp")
    with lock, open(log_path, "wb") as log:
        runner = Runner(log, child_environ(tmp), echo=not args.quiet)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, runner.stop)
        try:
            source = Source(args.source)
            plan = Plan(target, source, runner)
            progress.emit(
                "start", target=target, log=log_path, version=source.version,
                steps=[s.name for s in steps], python=sys.executable,
            )  # fmt: skip
            runner.write(
                f"kode_install: {source.path} (Kode {source.version}) into {target} with "
                f"{sys.executable} (Python {platform.python_version()}), "
                f"CMAKE_ARGS={plan.cmake_args!r}\n".encode()
            )
            check_venv(kind)
            check_compilers(kind, runner.environ.get("PATH"))
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            install(plan, steps, progress, free)
            return OK
        except Cancelled:
            runner.write(b"\nkode_install: cancelled\n")
            progress.emit("cancelled", step=progress.step, log=log_path)
            return CANCELLED
        except InstallError as exc:
            runner.write(f"\nkode_install: {exc.message}\n".encode())
            progress.emit(
                "error", step=progress.step, message=exc.message, fix=exc.fix, log=log_path
            )
            return exc.status
        finally:
            signal.alarm(0)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
