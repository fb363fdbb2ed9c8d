"""Where the shared engine lives: a folder only its user can enter, and names in it.

The folder is ``$XDG_RUNTIME_DIR/kode`` (a per-user tmpfs that systemd empties at log-out),
else ``<tempdir>/kode-<uid>``. Either way it is created mode 0700 and then verified: a
folder someone else owns, or one that others may enter, is refused, since whoever can
reach the socket can read the code the windows send. The socket's name carries Kode's
version and a fingerprint of what the engine loads (model file, context size, threads,
KV memory), so that two versions or two models never share an engine by accident; a
window asking for another model gets an engine of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from kode.backends.defaults import CHUNK_MEMORY_MB, CONTEXT_SIZE, KODE_VERSION, KV_MEMORY_MB
from kode.backends.errors import EngineSetupError

# Linux's limit for a Unix socket path (``sun_path``), terminating NUL included.
_SUN_PATH_MAX = 108


def runtime_dir(environ: dict[str, str] | None = None) -> Path:
    """The engine's folder, created if missing, its owner and mode verified.

    Raises ``EngineSetupError`` (naming the folder and what is wrong) for a folder that is
    a symlink, not a folder, owned by another user, or open to others.
    """
    env = os.environ if environ is None else environ
    base = env.get("XDG_RUNTIME_DIR", "")
    folder = Path(base) / "kode" if base and Path(base).is_dir() else _temp_folder()
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise EngineSetupError(f"cannot create the engine folder {folder}: {exc.strerror}") from exc
    verify_private(folder)
    return folder


def _temp_folder() -> Path:
    return Path(tempfile.gettempdir()) / f"kode-{os.getuid()}"


def verify_private(folder: Path) -> None:
    """Refuse ``folder`` unless it is a real folder of this user that nobody else may use."""
    info = folder.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise EngineSetupError(f"refusing the engine folder {folder}: it is not a plain folder")
    if info.st_uid != os.getuid():
        raise EngineSetupError(
            f"refusing the engine folder {folder}: it belongs to user id {info.st_uid}, "
            f"not to you ({os.getuid()}); remove it or set XDG_RUNTIME_DIR"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise EngineSetupError(
            f"refusing the engine folder {folder}: its mode is {mode:04o}, so other users "
            f"may use it; run: chmod 700 {folder}"
        )


def state_dir(environ: dict[str, str] | None = None) -> Path:
    """Where the engine writes its log: ``$XDG_STATE_HOME/kode`` (``~/.local/state/kode``)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME", "")
    folder = Path(base) / "kode" if base else Path(platformdirs.user_state_dir("kode"))
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


@dataclass(frozen=True, slots=True)
class EnginePlace:
    """The names one engine uses: its socket, its lock file and its log."""

    socket: Path
    lock: Path
    log: Path

    @property
    def name(self) -> str:
        return self.socket.stem


def socket_obstacle(path: Path) -> str | None:
    """What stands at an engine's socket path that an engine cannot clear, in words;
    None when the path is free or holds what an engine replaces (a socket, a dead
    engine's or a live one's; a file, a link, a FIFO: ``unlink`` removes them unread).
    A folder is left to the user: it may hold anything.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> socket_obstacle(folder / "kode.sock") is None
    True
    >>> (folder / "kode.sock").mkdir()
    >>> said = socket_obstacle(folder / "kode.sock")
    >>> said.replace(str(folder), "F")
    "F/kode.sock is a folder, where the engine's socket goes; remove it: rmdir F/kode.sock"
    >>> (folder / "kode.sock").rmdir(); folder.rmdir()
    """
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}, where the engine's socket goes, cannot be looked at ({exc.strerror})"
    if stat.S_ISDIR(info.st_mode):
        return f"{path} is a folder, where the engine's socket goes; remove it: rmdir {path}"
    return None


def clear_socket_path(path: Path) -> None:
    """Make way for an engine's socket (the engine holds its lock: what is there is a
    dead engine's socket, or was put there by mistake). Raises ``EngineSetupError``
    for what it must not remove (``socket_obstacle``)."""
    obstacle = socket_obstacle(path)
    if obstacle is not None:
        raise EngineSetupError(obstacle)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def remove_socket(path: Path) -> None:
    """Remove an engine's socket as it stops; whatever else is there now is not ours."""
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()


def fingerprint(*parts: object) -> str:
    """A short stable digest of what an engine loads (twelve hex digits).

    >>> fingerprint("/m/a.gguf", 4096) == fingerprint("/m/a.gguf", 4096)
    True
    >>> fingerprint("/m/a.gguf", 4096) == fingerprint("/m/b.gguf", 4096)
    False
    """
    text = "\0".join(repr(p) for p in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def engine_place(key: str, folder: Path, logs: Path) -> EnginePlace:
    """The socket, lock and log of the engine whose fingerprint is ``key``."""
    name = f"kode-{KODE_VERSION}-{key}"
    socket = folder / f"{name}.sock"
    if len(os.fsencode(socket)) >= _SUN_PATH_MAX:
        raise EngineSetupError(
            f"the engine socket path {socket} is longer than Unix sockets allow "
            f"({_SUN_PATH_MAX - 1} bytes); set XDG_RUNTIME_DIR to a shorter folder"
        )
    return EnginePlace(socket=socket, lock=folder / f"{name}.lock", log=logs / f"{name}.log")


class EngineLock:
    """The exclusive lock an engine holds for its whole life (``flock`` on a file).

    The kernel drops it when the process dies, however it dies, so a stale lock file
    never blocks a new engine.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, *, write_pid: bool = True, wait_s: float = 0.0) -> bool:
        """Take the lock, trying for up to ``wait_s``; False if another process holds
        it. An engine waits a little: a window's ``lock_is_held`` holds the lock for a
        moment to look, and an engine that took that moment for another engine's lock
        exited, which its window, spawning once, then took for a failed start."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.01)
        self._fd = fd
        if write_pid:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def lock_is_held(path: Path) -> bool:
    """Whether some process (an engine, starting or running) holds the lock at ``path``."""
    probe = EngineLock(path)
    if probe.acquire(write_pid=False):
        probe.release()
        return False
    return True


def holder_pid(path: Path) -> int | None:
    """The pid the engine wrote into its lock file (None if unreadable)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What an engine loads; windows whose configs are equal share one engine."""

    model: Path
    draft: Path | None = None
    n_ctx: int = CONTEXT_SIZE
    threads: int = 0  # 0: the engine's default (measured, see ``server.engine_threads``)
    kv_memory_mb: int = KV_MEMORY_MB
    chunk_memory_mb: int = CHUNK_MEMORY_MB

    def key(self) -> str:
        """The fingerprint in the socket's name: the settings, and the model files'
        identity (size and modification time), so a replaced file gets a new engine."""
        files = [self.model, *([self.draft] if self.draft else [])]
        ids = []
        for path in files:
            try:
                info = path.stat()
                ids.append((str(path.resolve()), info.st_size, info.st_mtime_ns))
            except OSError:
                ids.append((str(path), 0, 0))
        return fingerprint(ids, self.n_ctx, self.threads, self.kv_memory_mb, self.chunk_memory_mb)

    def argv(self) -> list[str]:
        """The ``kode engine run`` arguments that load this config."""
        args = ["--model", str(self.model), "--n-ctx", str(self.n_ctx)]
        args += ["--threads", str(self.threads), "--kv-memory-mb", str(self.kv_memory_mb)]
        args += ["--chunk-memory-mb", str(self.chunk_memory_mb)]
        if self.draft is not None:
            args += ["--draft", str(self.draft)]
        return args


def place_for(config: EngineConfig, environ: dict[str, str] | None = None) -> EnginePlace:
    """Where the engine for ``config`` lives (its folder verified)."""
    return engine_place(config.key(), runtime_dir(environ), state_dir(environ))
