"""What the workspace index's parsing child runs, and the parent's side of it.

Reading one workspace file (``read_file``) never blocks and never reads what is not a
regular file: the path is looked at first (``lstat``: a FIFO, socket, device, folder or
link is skipped, never opened: opening a FIFO waits for a writer, for good; opening a
device can have effects), then opened with ``O_NONBLOCK | O_NOFOLLOW`` and looked at
again (``fstat``: what was swapped in between is skipped too), and read up to a size
bound. What is skipped is said by a status, which the index counts (``IndexStats``).

Parsing (``parse_file``: definitions through ``ast`` for Python, a line-pattern
fallback for other languages, and the words) runs in a low-priority child process
(``IndexWorker``): ``ast.parse`` holds the interpreter lock for the whole call, 150 ms
for a 420 KB file, so parsed in the server it delayed every keystroke arriving
meanwhile. A file that crashes the parser takes the child down, not the server; a
parse that does not answer within ``timeout_s`` (a read stuck in a hung filesystem) is
abandoned and the child replaced; either way the file is retried once, then skipped.

This file is the child's program too, run by path in an isolated interpreter: it
imports nothing but the standard library, and loads the framing rule of its pipes
(``backends/framing.py``, stdlib only, the same rule as the engine socket's) by path.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import errno
import importlib.util
import marshal
import os
import re
import select
import stat
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING


def _load_by_path(relative: str) -> ModuleType:
    """A standard-library-only module of Kode, loaded from its file under the package's
    folder: the child imports no Kode package (``_worker_command``)."""
    path = Path(__file__).parents[2] / relative
    spec = importlib.util.spec_from_file_location(f"_kode_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING or __name__ != "__kode_index_worker__":
    from kode.backends import framing
else:  # the child, run by path
    framing = _load_by_path("backends/framing.py")

WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Definitions in languages without an ``ast`` here: the name after a defining keyword.
_DEF_FALLBACK = re.compile(
    r"^\s*(?:export\s+)?(?:pub(?:\(crate\))?\s+)?(?:async\s+)?(?:static\s+)?"
    r"(?:def|class|function|fn|func|const|let|var|type|interface|struct|enum|trait|impl"
    r"|module|object)\s+\*?([A-Za-z_][A-Za-z0-9_]*)"
)
_SNIFF_BYTES = 8192


@dataclass(frozen=True, slots=True)
class Definition:
    name: str
    line: int  # zero-based
    header: str  # the definition's first line, stripped on the right


# -- reading one file -------------------------------------------------------------------

# What ``read_file`` and ``parse_file`` found. Plain strings: they cross the pipe as
# ``marshal`` data.
OK, MISSING, LARGE, BINARY = "ok", "missing", "large", "binary"
SPECIAL = "special"  # not a regular file: a FIFO, socket, device, folder or link
UNREADABLE = "unreadable"  # no permission, or the read failed
CRASHED = "crashed"  # parsing it crashed the child twice
TIMED_OUT = "timed out"  # parsing it did not answer in time, twice

# Never block in ``open`` (a FIFO), never follow a link at the end of the path (the
# index keeps resolved paths: a link there now was swapped in), never take a terminal.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


def read_file(path: str | Path, max_bytes: int) -> tuple[str, bytes, float]:
    """``(status, contents, mtime)`` of the regular file at ``path``: ``OK`` with its
    bytes, else ``MISSING``, ``SPECIAL``, ``LARGE`` (over ``max_bytes``) or
    ``UNREADABLE`` with none. Never blocks on what is not a regular file.

    >>> import shutil, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> os.mkfifo(os.path.join(folder, "pipe.py"))  # no writer: ``open`` would wait
    >>> read_file(os.path.join(folder, "pipe.py"), 100)[0]
    'special'
    >>> read_file(os.path.join(folder, "gone.py"), 100)[0]
    'missing'
    >>> shutil.rmtree(folder)
    """
    try:
        seen = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return MISSING, b"", 0.0
    except OSError:  # a folder on the way that may not be entered, a loop, a long name
        return UNREADABLE, b"", 0.0
    if not stat.S_ISREG(seen.st_mode):
        return SPECIAL, b"", seen.st_mtime
    if seen.st_size > max_bytes:
        return LARGE, b"", seen.st_mtime
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return MISSING, b"", 0.0
    except OSError as exc:  # ELOOP: a link was swapped in since ``lstat``
        return (SPECIAL if exc.errno == errno.ELOOP else UNREADABLE), b"", seen.st_mtime
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # swapped in since ``lstat``
            return SPECIAL, b"", info.st_mtime
        if info.st_size > max_bytes:
            return LARGE, b"", info.st_mtime
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:  # a regular file's read never waits for a writer
            chunk = os.read(fd, max_bytes + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError:
        return UNREADABLE, b"", seen.st_mtime
    finally:
        os.close(fd)
    if got > max_bytes:  # it grew since ``fstat``
        return LARGE, b"", info.st_mtime
    return OK, b"".join(chunks), info.st_mtime


def decode(data: bytes) -> str | None:
    """The text of a file's bytes; None for a binary (a NUL byte early on) or one that
    is not UTF-8."""
    if b"\0" in data[:_SNIFF_BYTES]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_text(path: str | Path, max_bytes: int) -> str | None:
    """The file's text, or None for a binary, undecodable, huge or unreadable file, or
    one that is not a regular file (``read_file``)."""
    status, data, _ = read_file(path, max_bytes)
    return decode(data) if status == OK else None


def python_definitions(text: str) -> dict[str, Definition]:
    """Top-level functions, classes and assigned names, and the methods of top-level
    classes (as ``Class.method``), with their first lines. Falls back to the line
    patterns when the file does not parse (a file being edited)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # MemoryError: nesting
        return fallback_definitions(text)
    lines = text.splitlines()
    out: dict[str, Definition] = {}

    def add(name: str, lineno: int) -> None:
        if name not in out and 0 < lineno <= len(lines):
            out[name] = Definition(name, lineno - 1, lines[lineno - 1].rstrip())

    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            add(node.name, node.lineno)
        elif isinstance(node, ast.ClassDef):
            add(node.name, node.lineno)
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    add(f"{node.name}.{item.name}", item.lineno)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    add(target.id, node.lineno)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            add(node.target.id, node.lineno)
    return out


def fallback_definitions(text: str) -> dict[str, Definition]:
    out: dict[str, Definition] = {}
    for number, line in enumerate(text.splitlines()):
        match = _DEF_FALLBACK.match(line)
        if match and match.group(1) not in out:
            out[match.group(1)] = Definition(match.group(1), number, line.rstrip())
    return out


def words(text: str) -> set[str]:
    """Identifiers of two or more characters (the lexical vocabulary)."""
    return {w for w in WORD.findall(text) if len(w) > 1}


# -- parsing one file, here or in the child ---------------------------------------------

# What the index keeps of one file: (status, characters, mtime, definitions as (name,
# line, header), its words). Plain tuples, lists and strings: they cross the pipe as
# ``marshal`` data.
Parsed = tuple[str, int, float, list[tuple[str, int, str]], list[str]]


def parse_file(path: str, text: str | None, max_bytes: int) -> Parsed:
    """Read ``path`` (unless ``text``, an open document's, is given) and extract what the
    index keeps: definitions (``ast`` for Python) and words."""
    if text is None:
        status, data, mtime = read_file(path, max_bytes)
        if status != OK:
            return (status, 0, mtime, [], [])
        text = decode(data)
        if text is None:
            return (BINARY, 0, mtime, [], [])
    else:
        try:
            mtime = os.stat(path).st_mtime  # never blocks, whatever is there
        except OSError:
            mtime = 0.0
        if len(text) > max_bytes:
            return (LARGE, 0, mtime, [], [])
    is_python = path.endswith((".py", ".pyi"))
    found = python_definitions(text) if is_python else fallback_definitions(text)
    items = [(d.name, d.line, d.header) for d in found.values()]
    return (OK, len(text), mtime, items, list(words(text)))


class WorkerGone(Exception):
    """The child stopped (a crash, its idle exit, ``close``) with requests unanswered.
    Internal to this module's pipe (the child's program imports nothing of Kode, so
    not in ``backends/errors.py``); never leaves ``IndexWorker``."""


class ParseTimeout(WorkerGone):
    """The child did not answer (or take a request) within its time: it is replaced."""


_WINDOW = 8  # requests in flight: paths only, far below a pipe's 64 KB
_READY = b"kode-index-worker\n"
_IDLE_EXIT_S = 60.0
_START_TIMEOUT_S = 30.0
_POLL_S = 0.2  # how often a blocked read looks at ``cancel``
_REAP_S = 0.5  # how long ending a child waits for it before a thread reaps it


def _worker_command(parent: int, nice: int) -> list[str]:
    """The child: this file run by path in an isolated interpreter (no current folder on
    ``sys.path``, whose ``ast.py`` could shadow the standard library's; nothing of the
    server imported)."""
    code = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__kode_index_worker__')"
    return [sys.executable, "-I", "-c", code, __file__, str(parent), str(nice)]


class IndexWorker:
    """The child process that parses files for one index, started on first use.

    ``parse`` sends requests (a path, and the text when it is an open document's) and
    yields each answer as it comes, keeping ``_WINDOW`` requests in flight so that the
    child parses the next file while this process merges the last one. When the child
    dies with requests unanswered, or takes more than ``timeout_s`` to answer the next
    one (or to take a request), it is ended, a new one started and they are sent again;
    the one it was working on, if the same happens to a second child, is answered
    ``CRASHED`` or ``TIMED_OUT``."""

    def __init__(self, nice: int, timeout_s: float, *, child: bool = True) -> None:
        self.nice = nice
        self.timeout_s = timeout_s
        self.lock = threading.Lock()  # one ``parse`` at a time (a build step, an update)
        self._proc: subprocess.Popen[bytes] | None = None
        self.closed = False
        # no child could be started (or ``child`` is False): parse in this process
        self.unavailable = not child
        self.peak_kb = 0  # the largest peak resident memory of a child that ended
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], IndexWorker] | None = None

    def parse(
        self,
        requests: Iterable[tuple[str, str | None, int]],
        cancel: threading.Event | None = None,
    ) -> Generator[tuple[tuple[str, str | None, int], Parsed], None, None]:
        """Answers in the order of ``requests``; fewer when cancelled or closed, or when
        no child can be started (``unavailable``)."""
        flight: collections.deque[tuple[str, str | None, int]] = collections.deque()
        try:
            yield from self._parse(collections.deque(requests), flight, cancel)
        finally:
            if flight:  # stopped early: the child's answers would be out of step
                self._stop()

    def _parse(
        self,
        pending: collections.deque[tuple[str, str | None, int]],
        flight: collections.deque[tuple[str, str | None, int]],
        cancel: threading.Event | None,
    ) -> Iterator[tuple[tuple[str, str | None, int], Parsed]]:
        retried: set[str] = set()
        while pending or flight:
            if self.closed or (cancel is not None and cancel.is_set()):
                return
            try:
                proc = self._ensure()
                while pending and len(flight) < _WINDOW:
                    request = pending.popleft()
                    flight.append(request)
                    path, text, max_bytes = request
                    _send(proc, marshal.dumps((path, text, max_bytes)), self.timeout_s)
                    if text is not None:
                        break  # a document's text: no more until it is answered
                answer = _receive(proc, cancel, self.timeout_s)
                if answer is None:  # cancelled while waiting
                    self._stop()
                    return
                yield flight.popleft(), marshal.loads(answer)
            except (WorkerGone, OSError, EOFError, ValueError) as exc:
                self._stop()
                if self.closed or self.unavailable:
                    return
                if flight:
                    suspect = flight.popleft()
                    if suspect[0] in retried:
                        why = TIMED_OUT if isinstance(exc, ParseTimeout) else CRASHED
                        yield suspect, (why, 0, 0.0, [], [])
                    else:
                        retried.add(suspect[0])
                        flight.appendleft(suspect)
                pending.extendleft(reversed(flight))
                flight.clear()

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        try:
            proc = subprocess.Popen(
                _worker_command(os.getpid(), self.nice),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                bufsize=0,
                start_new_session=True,  # no terminal's Ctrl-C; parent death: ``watch``
            )
        except OSError:
            self.unavailable = True
            raise
        self._proc = proc
        self._finalizer = weakref.finalize(self, _kill, proc)
        try:
            deadline = time.monotonic() + _START_TIMEOUT_S
            if _receive_exact(proc, len(_READY), None, deadline) != _READY:
                raise WorkerGone("no handshake")
        except (WorkerGone, OSError):
            self.unavailable = True
            raise
        return proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self.peak_kb = max(self.peak_kb, peak_kb(proc.pid))
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is not None:
            _kill(proc)

    def close(self) -> None:
        """Stop the child (any thread); a ``parse`` under way ends. Its pipes are closed
        by the thread that reads them (their numbers could be reused under it)."""
        self.closed = True
        if self.lock.acquire(blocking=False):
            try:
                self._stop()
            finally:
                self.lock.release()
            return
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()  # the parsing thread reads the end of output and cleans up

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return None if proc is None or proc.poll() is not None else proc.pid


def peak_kb(pid: int) -> int:
    """A process's peak resident memory in KB (Linux's ``VmHWM``), 0 when unknown."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """End the child without waiting long: one stuck in the kernel (a read of a hung
    network filesystem) dies only when that read returns, so a thread reaps it then."""
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=_REAP_S)
    except subprocess.TimeoutExpired:
        threading.Thread(target=proc.wait, name="kode-index-reaper", daemon=True).start()


def _send(proc: subprocess.Popen[bytes], payload: bytes, timeout: float) -> None:
    """Write one request; a child that takes none of it for ``timeout`` is stuck (a
    document's text is larger than the pipe holds)."""
    stdin = proc.stdin
    if stdin is None:
        raise WorkerGone("no pipe")
    fd = stdin.fileno()
    os.set_blocking(fd, False)
    view = memoryview(framing.frame(payload))
    deadline = time.monotonic() + timeout
    try:
        while view:
            if time.monotonic() > deadline:
                raise ParseTimeout("the child takes no request")
            _, ready, _ = select.select([], [fd], [], _POLL_S)
            if ready:
                view = view[os.write(fd, view) :]
    except (BrokenPipeError, BlockingIOError) as exc:
        raise WorkerGone("pipe closed") from exc


def _receive(
    proc: subprocess.Popen[bytes], cancel: threading.Event | None, timeout: float
) -> bytes | None:
    """One answer (None when ``cancel`` is set meanwhile), within ``timeout``."""
    deadline = time.monotonic() + timeout
    header = _receive_exact(proc, framing.HEADER.size, cancel, deadline)
    if header is None:
        return None
    return _receive_exact(proc, framing.length(header), cancel, deadline)


def _receive_exact(
    proc: subprocess.Popen[bytes],
    size: int,
    cancel: threading.Event | None,
    deadline: float | None = None,
) -> bytes | None:
    """``size`` bytes from the child (None when ``cancel`` is set meanwhile); waits in
    ``select`` so that the interpreter lock is free and ``cancel`` is looked at.
    Raises ``ParseTimeout`` once ``deadline`` (``time.monotonic``) passes."""
    stdout = proc.stdout
    if stdout is None:
        raise WorkerGone("no pipe")
    fd = stdout.fileno()
    chunks: list[bytes] = []
    got = 0
    while got < size:
        if cancel is not None and cancel.is_set():
            return None
        if deadline is not None and time.monotonic() > deadline:
            raise ParseTimeout("no answer in time")
        ready, _, _ = select.select([fd], [], [], _POLL_S)
        if not ready:
            continue
        chunk = os.read(fd, min(size - got, 1 << 20))
        if not chunk:
            raise WorkerGone("end of output")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def lower_priority(nice: int) -> None:
    """Make this process yield the cores to the model. Niceness alone did not: the
    model's threads meet at a barrier after every small piece of a decode step, so any
    delay in waking one of them costs the whole step, and (measured with the 1.5B on two
    cores, one decode thread beside an index build of the standard library, 80 ms/token
    alone) a child at nice 10 cost 273 ms/token; also lowering its scheduling
    autogroup (``/proc/self/autogroup``: the child has a session, so a group, of its
    own, and a niceness counts only within its group) 169-187; the ``SCHED_IDLE``
    policy on top, which any waking normal thread preempts at once, 116 (each at the
    build's start). Over a whole build, decoding without a pause, the idle child still
    cost 123-158 ms/token: a lower priority spreads the child's work out more than it
    removes it, so the language server also holds the build while its model generates
    (``WorkspaceIndex.build``'s ``pause``). Best effort: a kernel without autogroups, or
    one that refuses, leaves what it can."""
    with contextlib.suppress(OSError):
        os.nice(nice)
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as group:
        group.write(str(nice))
    with contextlib.suppress(OSError, AttributeError):  # SCHED_IDLE: Linux only
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _worker_main(argv: list[str]) -> None:
    """The child's loop: answer each request with ``parse_file``'s result; exit at the end
    of input, when the parent is gone, or after ``_IDLE_EXIT_S`` without a request."""
    parent, nice = int(argv[0]), int(argv[1])
    lower_priority(nice)

    def watch() -> None:  # the parent killed: its pipe may live on in a forked child
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    stdin = os.fdopen(sys.stdin.fileno(), "rb", buffering=0, closefd=False)
    stdout = os.fdopen(sys.stdout.fileno(), "wb", buffering=0, closefd=False)
    fd = stdin.fileno()

    def read(size: int) -> bytes:
        chunks: list[bytes] = []
        got = 0
        while got < size:
            ready, _, _ = select.select([fd], [], [], _IDLE_EXIT_S)
            if not ready:
                os._exit(0)  # idle: the parent starts another when it needs one
            chunk = os.read(fd, size - got)
            if not chunk:
                os._exit(0)
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[stdout.write(view) :]

    write(_READY)
    while True:
        path, text, max_bytes = marshal.loads(read(framing.length(read(framing.HEADER.size))))
        try:
            result = parse_file(path, text, max_bytes)
        except Exception:  # a bug or an odd file: skip it, go on with the next
            result = (CRASHED, 0, 0.0, [], [])
        payload = marshal.dumps(result)
        write(framing.frame(payload))


if __name__ == "__kode_index_worker__":
    _worker_main(sys.argv[2:])  # after "-c" and this file
