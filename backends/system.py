"""What this process asks of the operating system, each in one place: whether a process
is alive (a zombie is not), the cores this process may run on, the peer of a Unix socket,
and how llama.cpp's OpenMP threads wait. Nothing here imports a model library, so the
windows, the CLI and the benchmarks can all use it."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import MutableMapping

# struct ucred, as SO_PEERCRED fills it: pid, uid, gid.
_UCRED = struct.Struct("3i")


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` in ``/proc`` (``R``, ``S``, ``Z`` for a zombie...), or
    None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The command name in parentheses may hold spaces and ')': split after the last.
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie waiting for its parent."""
    state = process_state(pid)
    return state is not None and state != "Z"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """The (pid, uid, gid) of the process at the other end of a Unix socket, as the
    kernel recorded them when it connected (``SO_PEERCRED``)."""
    pid, uid, gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return pid, uid, gid


# How llama.cpp's OpenMP threads wait between the parts of a decode step, unless the
# environment says (``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``): spin for a short while,
# then sleep. Measured (`kode bench engine --busy`, 1.5B, 2 cores; docs/engine.md, "Busy
# machine"): on a quiet machine PASSIVE (sleep at once) decodes 1.4x slower than spinning
# (90-95 against 65-68 ms/token), because every step has dozens of short waits; with one
# busy process per core, spinning without end (ACTIVE) is 1.8-2.7x slower than PASSIVE.
# A short spin is as fast as spinning on a quiet machine and as PASSIVE under load.
SPIN_COUNT = "10000"


def choose_thread_waiting(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set libgomp's spin count before llama.cpp's library loads (it reads it once), unless
    the user set how OpenMP threads wait."""
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        environ["GOMP_SPINCOUNT"] = SPIN_COUNT
