"""The team deployment of docs/team-server.md, started on this machine.

    editors ──▶ kode serve (keys) ──▶ sglang_router (cache_aware) ──▶ kode serve worker-0
                                                                  ──▶ kode serve worker-1

The workers are ``kode serve`` in local-engine mode (the small model, one thread each):
they speak the API of SGLang's workers (``serve/worker_api.py``), so the real router,
``python -m sglang_router.launch_router`` from the ``sglang-router`` wheel, runs in
front of them as it would in front of GPU workers. ``start_chain`` starts all four and
returns once the router has registered both workers and the front answers;
``Chain.stop`` ends them (each also dies with the process that started it).

Used by tests/test_router_e2e.py and ``kode bench load --through-router``.
"""

from __future__ import annotations

import os
import re
import secrets
import select
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from kode.bench import harness
from kode.serve.sglang_router import router_argv

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120.0  # model load and batch-cost measurement, two workers on 2 cores
# The router notices that its client (the front) closed a stream only when it next
# writes to it, so a superseded request that waits in a worker's line or evaluates its
# prompt runs on until its first token. A keep-alive comment this often gives the router
# something to write. 4 users typing for 10 s: at 15 s (the default) 86 of 96 requests
# started a generation on a worker and the median answer took 18.6 s; at 0.5 s, 52 of 99
# and 7.4 s (one kode serve alone with 2 threads: 7.6 s).
WORKER_KEEPALIVE_S = 0.5


@dataclass
class Process:
    """One process of the chain, its URL and its log file."""

    name: str
    proc: subprocess.Popen[str]
    url: str
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: a worker that dies, as a crashed GPU host would."""
        if self.alive():
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        harness.stop(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Chain:
    """The running deployment; ``keys`` are the users' API keys at the front."""

    workers: list[Process]
    router: Process
    front: Process
    keys: list[str] = field(default_factory=list)

    @property
    def processes(self) -> list[Process]:
        return [self.front, self.router, *self.workers]

    def worker_named(self, name: str) -> Process:
        return next(w for w in self.workers if w.name == name)

    def stop(self) -> None:
        for process in self.processes:  # the front first: nothing new reaches the router
            process.stop()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now (the router takes no port 0)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _spawn(argv: Sequence[str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as err:
        return subprocess.Popen(
            list(argv),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=harness.die_with_parent,
        )


def _serve_argv(*args: str) -> list[str]:
    return harness.kode_command("serve", "--host", "127.0.0.1", *args)


def _listening(proc: subprocess.Popen[str], deadline: float) -> str | None:
    """The URL from ``kode serve``'s 'listening on' line, or None if it exits first."""
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        line = proc.stdout.readline()
        if not line:
            return None
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return match.group(1)
    return None


def _router_ready(url: str, workers: int, deadline: float) -> bool:
    """True once the router lists ``workers`` healthy workers."""
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{url}/workers", timeout=2.0)
            if response.status_code == 200:
                listed = response.json().get("workers", [])
                if sum(1 for w in listed if w.get("is_healthy", True)) >= workers:
                    return True
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    return False


def start_chain(
    workdir: Path,
    *,
    users: int = 4,
    model: str = "small",
    threads: int = 1,
    context_size: int = 2048,
    kv_memory_mb: int = 64,
    max_per_key: int = 8,
) -> Chain:
    """Start two workers, the router and the front, with one API key per user."""
    workdir.mkdir(parents=True, exist_ok=True)
    keys = [secrets.token_hex(16) for _ in range(users)]
    keyfile = workdir / "keys.txt"
    keyfile.write_text("".join(f"user{i}:{key}\n" for i, key in enumerate(keys)))
    keyfile.chmod(0o600)
    started: list[Process] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = []
        for i in range(2):
            name = f"worker-{i}"
            argv = _serve_argv(
                "--port", "0", "--name", name, "--model", model, "--threads", str(threads),
                "--context-size", str(context_size), "--kv-memory-mb", str(kv_memory_mb),
                "--max-concurrency-per-key", "64", "--keepalive-s", str(WORKER_KEEPALIVE_S),
            )  # fmt: skip
            log = workdir / f"{name}.log"
            pending.append((name, _spawn(argv, log), log))
        for name, proc, log in pending:
            url = _listening(proc, deadline)
            started.append(Process(name, proc, url or "", log))
            if url is None:
                raise RuntimeError(f"{name} did not start:\n{log.read_text()[-2000:]}")
        port = free_port()
        router_url = f"http://127.0.0.1:{port}"
        log = workdir / "router.log"
        argv = [*router_argv(sys.executable, [w.url for w in started], "127.0.0.1", port)]
        argv += ["--log-level", "warn"]
        router = Process("router", _spawn(argv, log), router_url, log)
        started.append(router)
        if not _router_ready(router_url, 2, deadline):
            raise RuntimeError(f"the router did not register both workers:\n{router.log_text()}")
        log = workdir / "front.log"
        argv = _serve_argv(
            "--port", "0", "--name", "front", "--api-keys", str(keyfile),
            "--upstream", router_url, "--max-concurrency-per-key", str(max_per_key),
        )  # fmt: skip
        proc = _spawn(argv, log)
        url = _listening(proc, deadline)
        front = Process("front", proc, url or "", log)
        started.append(front)
        if url is None:
            raise RuntimeError(f"the front did not start:\n{log.read_text()[-2000:]}")
    except BaseException:
        for process in reversed(started):
            process.stop()
        raise
    return Chain(started[:2], router, front, keys)
