"""Finding or starting the shared engine: ``connect`` (connect, else spawn exactly one
engine across the windows that ask at the same moment, then wait for it with backoff),
``spawn_engine`` (``kode engine run``, detached) and ``end_process`` (a hung engine).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kode.backends.daemon.connection import SILENT_S, STALL_S, Connection, EngineGeneration
from kode.backends.daemon.paths import (
    EngineConfig,
    EnginePlace,
    lock_is_held,
    socket_obstacle,
)
from kode.backends.errors import EngineError, EngineSetupError
from kode.backends.system import alive

log = logging.getLogger("kode.engine")

# How long a window waits for a new engine to load its model and answer (the 1.5B loads
# in seconds on a quiet machine; a busy one and a cold page cache take much longer).
START_TIMEOUT_S = 180.0


def spawn_engine(config: EngineConfig, place: EnginePlace, *, idle_s: float) -> int:
    """Start ``kode engine run`` for ``config``, detached (its own session, no terminal),
    its output appended to its log; returns its pid. A thread reaps it if it ends while
    this window lives."""
    command = [sys.executable, "-m", "kode.cli.main", "engine", "run", *config.argv()]
    command += ["--idle-seconds", str(idle_s)]
    with open(place.log, "ab") as out:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
            cwd="/",  # a daemon keeps no folder of the window's busy
        )
    threading.Thread(target=proc.wait, name="kode-engine-reaper", daemon=True).start()
    return proc.pid


async def connect(
    config: EngineConfig,
    place: EnginePlace,
    *,
    idle_s: float,
    window: bool = True,
    start: bool = True,
    timeout_s: float = START_TIMEOUT_S,
    on_end: Callable[[EngineGeneration], None] = lambda _g: None,
    spawn: Callable[[EngineConfig, EnginePlace], int] | None = None,
    silent_s: float = SILENT_S,
    stall_s: float = STALL_S,
) -> Connection:
    """A connection to the engine for ``config``, starting it if none answers (``start``).

    Connect; else, if no engine holds its lock, take the start lock and spawn one (the
    others, finding the start lock taken, only wait); then retry with backoff until the
    engine answers or ``timeout_s`` passes. At most one engine is spawned: one that
    ends before it answers (its log says why) is not spawned again, and what stands at
    the socket path that no engine can clear (``socket_obstacle``: a folder) is said
    at once, before any spawn (#34: a folder there made a window spawn 73 engines).
    """

    def default_spawn(c: EngineConfig, p: EnginePlace) -> int:
        return spawn_engine(c, p, idle_s=idle_s)

    spawn = spawn or default_spawn
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    start_lock = place.lock.with_suffix(".start")
    spawned: int | None = None  # the engine this call started
    while True:
        try:
            return await Connection.open(
                str(place.socket),
                fingerprint=place.name,
                window=window,
                timeout_s=max(1.0, deadline - time.monotonic()),
                on_end=on_end,
                silent_s=silent_s,
                stall_s=stall_s,
            )
        except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError):
            # reset: an engine dying as the window connects (its listener closes with the
            # window's hello unread; seen when a window reconnects at once after its
            # engine was killed): nothing listens any more, as for refused
            pass
        obstacle = socket_obstacle(place.socket)
        if obstacle is not None:
            raise EngineSetupError(obstacle)
        if not start:
            raise EngineError(f"no Kode engine is running on {place.socket}")
        if not lock_is_held(place.lock):
            if spawned is not None:
                raise EngineError(
                    f"the Kode engine this window started (pid {spawned}) ended before it "
                    f"answered; its log: {place.log}"
                )
            spawned = await asyncio.to_thread(
                _start_once, start_lock, place, config, spawn, deadline
            )
        if time.monotonic() >= deadline:
            raise EngineError(
                f"no Kode engine answered on {place.socket} within {timeout_s:.0f} s "
                f"(its log: {place.log})"
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


def _start_once(
    start_lock: Any,
    place: EnginePlace,
    config: EngineConfig,
    spawn: Callable[[EngineConfig, EnginePlace], int],
    deadline: float,
) -> int | None:
    """Spawn the engine unless another window is doing it; hold the start lock until the
    engine holds its own lock (or it gave up), so that exactly one is spawned. The pid
    spawned, None if none was."""
    fd = os.open(start_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # another window is starting it
        if lock_is_held(place.lock):
            return None
        pid = spawn(config, place)
        log.info("started the Kode engine (pid %d) for %s", pid, config.model.name)
        while time.monotonic() < deadline and not lock_is_held(place.lock):
            if not alive(pid):
                break
            time.sleep(0.02)
        return pid
    finally:
        os.close(fd)


def end_process(pid: int, grace_s: float = 2.0) -> None:
    """End a hung engine: SIGTERM, then SIGKILL if it is still there after ``grace_s``
    (a hung event loop never runs its SIGTERM handler); returns once it is gone or 2 s
    after the SIGKILL. Never this process (a test's engine may live in it)."""
    if pid <= 1 or pid == os.getpid():
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not alive(pid):
                return
            time.sleep(0.02)
