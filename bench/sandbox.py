"""Run untrusted generated code: a fresh isolated interpreter, a throwaway folder, limits.

Model output is executed with ``python -I`` (no user site, no ``PYTHON*`` variables, no
script folder on ``sys.path``) in a new temporary folder, in its own session (so the whole
process group can be killed), with ``resource.setrlimit`` caps on CPU seconds, address
space, file size and open files, and no core dumps, plus a wall-clock timeout. This is
the sandbox HumanEval's own harness uses in spirit; it stops accidents (an infinite loop,
a memory bomb, a stray file), not a determined attacker: run it on a machine you do not
mind.
"""

from __future__ import annotations

import contextlib
import enum
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass


class Verdict(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"  # non-zero exit (an assertion, an exception, a syntax error)
    TIMEOUT = "timeout"  # wall-clock timeout or CPU limit


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    open_files: int = 64


@dataclass(frozen=True, slots=True)
class Outcome:
    verdict: Verdict
    returncode: int | None
    seconds: float
    stderr_tail: str

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.PASSED


def _limiter(limits: Limits) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
    """Execute ``source`` as a script; PASSED when it exits with status 0."""
    env = {"PATH": os.defpath, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kode-sandbox-") as folder:
        script = os.path.join(folder, "program.py")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(source)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", script],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            # Between fork and exec; it calls only setrlimit (async-signal-safe in effect).
            preexec_fn=_limiter(limits),
        )
        try:
            _, err = proc.communicate(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            _, err = proc.communicate()
            return Outcome(Verdict.TIMEOUT, None, time.perf_counter() - started, _tail(err))
        finally:
            if proc.poll() is None:  # interrupted (KeyboardInterrupt): leave nothing behind
                _kill_group(proc)
                proc.wait()
    seconds = time.perf_counter() - started
    code = proc.returncode
    if code == -signal.SIGXCPU or code == -signal.SIGKILL:
        return Outcome(Verdict.TIMEOUT, code, seconds, _tail(err))
    verdict = Verdict.PASSED if code == 0 else Verdict.FAILED
    return Outcome(verdict, code, seconds, _tail(err))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _tail(err: bytes | None, limit: int = 400) -> str:
    text = (err or b"").decode(errors="replace").strip()
    return text[-limit:]
