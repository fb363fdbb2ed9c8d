"""The workspace index: what the files of the project define and which words they hold.

Held in memory, never sent anywhere, never logged. Per file it keeps only what retrieval
needs to *choose* text, not the text itself (read back from disk, or from the open
document, for the few files a completion uses):

- the top-level definitions (name -> line, with the definition's first line): Python
  through ``ast``, other languages through a line-pattern fallback;
- for Python, the module's dotted name under its source root, so imports resolve;
- its identifiers, in one inverted index ``word -> [file id]`` for lexical ranking.

Bounded: files over ``max_file_bytes``, binaries (a NUL byte, or not UTF-8), paths that
``.gitignore`` (any level) or ``SKIP_DIRS`` exclude and extensions outside
``CODE_EXTENSIONS`` are skipped; indexing stops at ``max_files`` or ``max_postings``
(each posting is one 8-byte list slot; ``stats()`` reports the estimate).

Thread-safety: ``build`` runs in a worker thread and every method takes the one lock;
``snapshot`` work done under it is short (no I/O).

Never stalls the server's event loop: the files are read and parsed in a low-priority
child process (``_Worker``; ``ast.parse`` holds the interpreter lock for the whole call,
150 ms for a 420 KB file, so parsed in the server it delayed every keystroke arriving
meanwhile), and the server's thread only merges the results, in steps the interpreter
can switch between. What the index keeps is stored so that the garbage collector has
little to walk (``Postings``, ``Definitions``): a full collection over the 1.1 M
objects it held before (a list per word, a ``Definition`` per definition) stopped every
thread for 0.4 s. A file that crashes
the parser takes the child down, not the server: it is skipped and the child restarted.
The child exits with the index (``close``), when the server dies, and after a minute
without work.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import enum
import fnmatch
import itertools
import marshal
import math
import os
import re
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from array import array
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

CODE_EXTENSIONS = frozenset(
    (
        *(".py", ".pyi", ".js", ".jsx", ".mjs", ".ts", ".tsx", ".go", ".rs", ".java", ".kt"),
        *(".c", ".h", ".cc", ".cpp", ".hpp", ".cs", ".rb", ".php", ".swift", ".scala", ".lua"),
        *(".sh", ".zig", ".ex", ".exs", ".hs", ".ml", ".vue", ".svelte"),
    )
)
SKIP_DIRS = frozenset(
    (
        *(".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".tox"),
        *(".mypy_cache", ".ruff_cache", ".pytest_cache", ".idea", ".vscode"),
    )
)
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Definitions in languages without an ``ast`` here: the name after a defining keyword.
_DEF_FALLBACK = re.compile(
    r"^\s*(?:export\s+)?(?:pub(?:\(crate\))?\s+)?(?:async\s+)?(?:static\s+)?"
    r"(?:def|class|function|fn|func|const|let|var|type|interface|struct|enum|trait|impl"
    r"|module|object)\s+\*?([A-Za-z_][A-Za-z0-9_]*)"
)
_SNIFF_BYTES = 8192
RANK_WORDS = 24  # query words walked by ``rank_files``, rarest first
RARE_SHARE = 0.05  # ... among those held by at most this share of the files


class Language(enum.StrEnum):
    PYTHON = "python"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Definition:
    name: str
    line: int  # zero-based
    header: str  # the definition's first line, stripped on the right


class Definitions(Mapping[str, Definition]):
    """A file's definitions by name, held as a ``str -> int`` dict and two tuples (lines,
    headers) of atoms, which the garbage collector does not walk (a ``Definition``
    object per definition it did: 382,000 of them for the standard library). The
    ``Definition`` objects are made when asked for."""

    __slots__ = ("_headers", "_lines", "_slots")

    def __init__(self, items: Iterable[tuple[str, int, str]] = ()) -> None:
        slots: dict[str, int] = {}
        lines: list[int] = []
        headers: list[str] = []
        for name, line, header in items:
            if name not in slots:
                slots[name] = len(headers)
                lines.append(line)
                headers.append(header)
        self._slots, self._lines, self._headers = slots, tuple(lines), tuple(headers)

    @staticmethod
    def of(definitions: Mapping[str, Definition]) -> Definitions:
        return Definitions((d.name, d.line, d.header) for d in definitions.values())

    def __getitem__(self, name: str) -> Definition:
        i = self._slots[name]
        return Definition(name, self._lines[i], self._headers[i])

    def __contains__(self, name: object) -> bool:
        return name in self._slots

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)


@dataclass(slots=True)
class FileEntry:
    path: Path
    file_id: int
    language: Language
    module: str | None  # dotted Python module name under its source root
    definitions: Definitions
    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class IndexLimits:
    max_files: int = 20_000
    max_file_bytes: int = 1_000_000
    max_postings: int = 4_000_000  # ~16 MB of 4-byte ids at most
    worker_nice: int = 10  # the parsing child's niceness: the model's threads come first


@dataclass(slots=True)
class IndexStats:
    files: int = 0
    skipped_ignored: int = 0
    skipped_binary: int = 0
    skipped_large: int = 0
    postings: int = 0
    words: int = 0
    definitions: int = 0
    build_s: float = 0.0
    complete: bool = False  # the first build finished (and was not cut by a limit)
    truncated: bool = False  # a limit stopped indexing

    parsed_in_child: int = 0  # files parsed in the child process
    parsed_here: int = 0  # ... in this process (no child could be started)
    crashed: int = 0  # files skipped because parsing them crashed the child twice
    paused_s: float = 0.0  # how long the build waited for the model to be idle

    @property
    def approx_bytes(self) -> int:
        """Postings (4-byte ids), words (~150 B each with their dict slot and ids),
        definitions (~150 B: the first line, three slots), entries (~800 B).
        Checked against tracemalloc by ``kode bench context --latency-files``."""
        return self.postings * 4 + self.words * 150 + self.definitions * 150 + self.files * 800


# -- .gitignore -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: str
    negate: bool
    dir_only: bool
    anchored: bool  # contains a slash before its end: matched against the relative path


def parse_gitignore(text: str) -> tuple[_Rule, ...]:
    """The rules of one ``.gitignore`` file (comments and blank lines dropped)."""
    rules: list[_Rule] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        if line.startswith("\\"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        rules.append(_Rule(line.lstrip("/"), negate, dir_only, anchored))
    return tuple(rules)


def _match(rule: _Rule, rel: str, name: str) -> bool:
    if not rule.anchored:
        return fnmatch.fnmatchcase(name, rule.pattern)
    if "**" in rule.pattern:
        # ``a/**/b`` also matches ``a/b``; fnmatch's ``*`` crosses slashes already.
        collapsed = rule.pattern.replace("/**/", "/")
        return fnmatch.fnmatchcase(rel, rule.pattern) or fnmatch.fnmatchcase(rel, collapsed)
    return fnmatch.fnmatchcase(rel, rule.pattern)


class Ignore:
    """``.gitignore`` semantics for the patterns kode meets: per-directory files, later
    rules win, ``!`` re-includes, ``dir/`` matches directories only, a pattern with a
    slash is anchored to its file's directory, ``*``/``?``/``[...]``/``**``."""

    def __init__(self) -> None:
        self._rules: list[tuple[str, tuple[_Rule, ...]]] = []  # (base dir relative, rules)

    def add(self, base: str, text: str) -> None:
        self._rules.append((base, parse_gitignore(text)))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        name = rel.rsplit("/", 1)[-1]
        verdict = False
        for base, rules in self._rules:
            if base and not rel.startswith(base + "/"):
                continue
            sub = rel[len(base) + 1 :] if base else rel
            for rule in rules:
                if rule.dir_only and not is_dir:
                    continue
                if _match(rule, sub, name):
                    verdict = not rule.negate
        return verdict

    def scoped(self, base: str) -> Ignore:
        """The rules that apply under ``base`` (cheap: shares the parsed rules)."""
        out = Ignore()
        out._rules = [(b, r) for b, r in self._rules if not b or base == b or base.startswith(b)]
        return out


# -- reading one file -------------------------------------------------------------------


def read_text(path: Path, max_bytes: int) -> str | None:
    """The file's text, or None for a binary, undecodable, huge or unreadable file."""
    try:
        with path.open("rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError:
        return None
    if len(data) > max_bytes or b"\0" in data[:_SNIFF_BYTES]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


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


def module_name(rel: Path) -> str | None:
    """``pkg/sub/mod.py`` -> ``pkg.sub.mod``; ``pkg/__init__.py`` -> ``pkg``."""
    if rel.suffix not in (".py", ".pyi"):
        return None
    parts = list(rel.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


# -- parsing one file, here or in the child ---------------------------------------------

# What the index keeps of one file: (status, characters, mtime, definitions as (name,
# line, header), its words). Plain tuples, lists and strings: they cross the pipe as
# ``marshal`` data.
Parsed = tuple[str, int, float, list[tuple[str, int, str]], list[str]]
OK, MISSING, LARGE, BINARY, CRASHED = "ok", "missing", "large", "binary", "crashed"


def parse_file(path: str, text: str | None, max_bytes: int) -> Parsed:
    """Read ``path`` (unless ``text``, an open document's, is given) and extract what the
    index keeps: definitions (``ast`` for Python) and words."""
    try:
        stat = os.stat(path)
        mtime, size = stat.st_mtime, stat.st_size
    except OSError:
        if text is None:
            return (MISSING, 0, 0.0, [], [])
        mtime, size = 0.0, 0
    if text is None:
        if size > max_bytes:
            return (LARGE, 0, mtime, [], [])
        text = read_text(Path(path), max_bytes)
        if text is None:
            return (BINARY, 0, mtime, [], [])
    elif len(text) > max_bytes:
        return (LARGE, 0, mtime, [], [])
    is_python = path.endswith((".py", ".pyi"))
    found = python_definitions(text) if is_python else fallback_definitions(text)
    items = [(d.name, d.line, d.header) for d in found.values()]
    return (OK, len(text), mtime, items, list(words(text)))


class WorkerGone(Exception):
    """The child stopped (a crash, its idle exit, ``close``) with requests unanswered.
    Not in ``backends/errors.py``'s tree: this file also runs alone as the child, which
    imports nothing of Kode; it never leaves the index (its callers catch it)."""


_HEADER = struct.Struct("<I")
_WINDOW = 8  # requests in flight: paths only, far below a pipe's 64 KB
_READY = b"kode-index-worker\n"
_IDLE_EXIT_S = 60.0
_START_TIMEOUT_S = 30.0
_POLL_S = 0.2  # how often a blocked read looks at ``cancel``
_BATCH = 64  # files per step of a build (an update waits for one step at most)


def _worker_command(parent: int, nice: int) -> list[str]:
    """The child: this file run by path in an isolated interpreter (no current folder on
    ``sys.path``, whose ``ast.py`` could shadow the standard library's; nothing of the
    server imported)."""
    code = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__kode_index_worker__')"
    return [sys.executable, "-I", "-c", code, __file__, str(parent), str(nice)]


class _Worker:
    """The child process that parses files for one index, started on first use.

    ``parse`` sends requests (a path, and the text when it is an open document's) and
    yields each answer as it comes, keeping ``_WINDOW`` requests in flight so that the
    child parses the next file while this process merges the last one. When the child
    dies with requests unanswered, it is restarted and they are sent again; the one it
    was working on, if it kills a second child too, is answered ``CRASHED``."""

    def __init__(self, nice: int) -> None:
        self.nice = nice
        self.lock = threading.Lock()  # one ``parse`` at a time (a build step, an update)
        self._proc: subprocess.Popen[bytes] | None = None
        self.closed = False
        self.unavailable = False  # no child could be started: parse in this process
        self.peak_kb = 0  # the largest peak resident memory of a child that ended
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], _Worker] | None = None

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
                    _send(proc, marshal.dumps((path, text, max_bytes)))
                    if text is not None:
                        break  # a document's text: no more until it is answered
                answer = _receive(proc, cancel)
                if answer is None:  # cancelled while waiting
                    self._stop()
                    return
                yield flight.popleft(), marshal.loads(answer)
            except (WorkerGone, OSError, EOFError, ValueError):
                self._stop()
                if self.closed or self.unavailable:
                    return
                if flight:
                    suspect = flight.popleft()
                    if suspect[0] in retried:
                        yield suspect, (CRASHED, 0, 0.0, [], [])
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
            if _receive_exact(proc, len(_READY), None, _START_TIMEOUT_S) != _READY:
                raise WorkerGone("no handshake")
        except (WorkerGone, OSError):
            self.unavailable = True
            raise
        return proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self.peak_kb = max(self.peak_kb, _peak_kb(proc.pid))
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


def _peak_kb(pid: int) -> int:
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
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _send(proc: subprocess.Popen[bytes], payload: bytes) -> None:
    stdin = proc.stdin
    if stdin is None:
        raise WorkerGone("no pipe")
    view = memoryview(_HEADER.pack(len(payload)) + payload)
    try:
        while view:
            view = view[stdin.write(view) or 0 :]
    except BrokenPipeError as exc:
        raise WorkerGone("pipe closed") from exc


def _receive(proc: subprocess.Popen[bytes], cancel: threading.Event | None) -> bytes | None:
    header = _receive_exact(proc, _HEADER.size, cancel)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    return _receive_exact(proc, size, cancel)


def _receive_exact(
    proc: subprocess.Popen[bytes],
    size: int,
    cancel: threading.Event | None,
    timeout: float | None = None,
) -> bytes | None:
    """``size`` bytes from the child (None when ``cancel`` is set meanwhile); waits in
    ``select`` so that the interpreter lock is free and ``cancel`` is looked at."""
    stdout = proc.stdout
    if stdout is None:
        raise WorkerGone("no pipe")
    fd = stdout.fileno()
    chunks: list[bytes] = []
    got = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    while got < size:
        if cancel is not None and cancel.is_set():
            return None
        if deadline is not None and time.monotonic() > deadline:
            raise WorkerGone("timed out")
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
        (size,) = _HEADER.unpack(read(_HEADER.size))
        path, text, max_bytes = marshal.loads(read(size))
        try:
            result = parse_file(path, text, max_bytes)
        except Exception:  # a bug or an odd file: skip it, go on with the next
            result = (CRASHED, 0, 0.0, [], [])
        payload = marshal.dumps(result)
        write(_HEADER.pack(len(payload)) + payload)


# -- the index --------------------------------------------------------------------------


@dataclass(slots=True)
class _Roots:
    paths: tuple[Path, ...] = ()
    ignores: dict[Path, Ignore] = field(default_factory=dict)


class WorkspaceIndex:
    """Files under the workspace folders: definitions, module names and words."""

    def __init__(self, roots: Iterable[Path] = (), limits: IndexLimits | None = None) -> None:
        self.limits = limits or IndexLimits()
        self._lock = threading.Lock()
        self._roots = _Roots(tuple(Path(r).resolve() for r in roots))
        self._files: dict[Path, FileEntry] = {}
        self._modules: dict[str, Path] = {}
        # word -> ids of the files holding it (``Postings``)
        self._postings: dict[str, Postings] = {}
        self._defined: dict[str, Postings] = {}  # top-level name -> ids of defining files
        self._alive: dict[int, Path] = {}  # file id -> path; ids of replaced files vanish
        self._dead_postings = 0
        self._next_id = 0
        self._versions: dict[Path, int] = {}
        self._worker = _Worker(self.limits.worker_nice)
        self.stats = IndexStats()

    # reading (any thread)

    @property
    def roots(self) -> tuple[Path, ...]:
        return self._roots.paths

    def __len__(self) -> int:
        return len(self._files)

    def entry(self, path: Path) -> FileEntry | None:
        with self._lock:
            return self._files.get(path)

    def version(self, path: Path) -> int:
        """Bumped whenever ``path`` is re-indexed or removed."""
        with self._lock:
            return self._versions.get(path, 0)

    def module_path(self, dotted: str) -> Path | None:
        with self._lock:
            return self._modules.get(dotted)

    def module_of(self, path: Path) -> str | None:
        entry = self.entry(path)
        return None if entry is None else entry.module

    def find_definitions(self, name: str, limit: int = 4) -> list[tuple[Path, Definition]]:
        """Files defining ``name`` at top level (the language-agnostic route)."""
        out: list[tuple[Path, Definition]] = []
        with self._lock:
            for file_id in _ids(self._defined.get(name)):
                path = self._alive.get(file_id)
                entry = None if path is None else self._files.get(path)
                if path is not None and entry is not None and name in entry.definitions:
                    out.append((path, entry.definitions[name]))
                    if len(out) >= limit:
                        break
        return out

    def file_counts(self, names: Iterable[str]) -> dict[str, int]:
        """How many indexed files hold each of ``names`` (as a word). Replaced files
        count until compaction (at most a quarter more): walking a common word's
        postings would cost more than the estimate is worth."""
        with self._lock:
            return {name: _count(self._postings.get(name)) for name in names}

    def rank_files(
        self, query: Iterable[str], *, exclude: Path | None = None, limit: int = 4
    ) -> list[tuple[Path, float]]:
        """Files sharing the most informative words with ``query`` (BM25's idf, no length
        normalisation: windows inside the file are chosen afterwards). Only the
        ``RANK_WORDS`` rarest query words held by at most ``RARE_SHARE`` of the files are
        walked: common words carry little weight, and walking their postings made a
        query on 5,000 files take 50 ms."""
        scores: dict[int, float] = {}
        with self._lock:
            n = max(len(self._files), 1)
            rare = max(int(n * RARE_SHARE), 8)
            found = [
                (_count(ids), ids) for w in set(query) if (ids := self._postings.get(w)) is not None
            ]
            found = sorted((f for f in found if f[0] <= rare), key=lambda f: f[0])[:RANK_WORDS]
            for df, ids in found:
                weight = _idf(df, n)
                for file_id in _ids(ids):
                    scores[file_id] = scores.get(file_id, 0.0) + weight
            ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
            out: list[tuple[Path, float]] = []
            for file_id, score in ranked:
                path = self._alive.get(file_id)
                if path is None or path == exclude:
                    continue
                out.append((path, score))
                if len(out) >= limit:
                    break
        return out

    # building and updating

    def build(
        self, cancel: threading.Event | None = None, pause: Callable[[], float] | None = None
    ) -> IndexStats:
        """Walk every root and index what qualifies; run in a worker thread. The files
        are parsed in the child process, ``_BATCH`` at a time (an update waits at most
        for one batch). ``pause`` is called before each batch and returns when the build
        may go on (the seconds it waited): the language server waits there while the
        model generates, because on a small machine even an idle-priority child slows
        decoding (its threads meet at a barrier many times a step)."""
        started = time.perf_counter()
        try:
            self._build(cancel, pause)
        finally:
            with self._lock:  # also when stopped early: how long it ran
                self.stats.build_s = time.perf_counter() - started
        return self.stats

    def _build(self, cancel: threading.Event | None, pause: Callable[[], float] | None) -> None:
        for root in self.roots:
            paths = self._walk(root)
            while batch := list(itertools.islice(paths, _BATCH)):
                if pause is not None:
                    waited = pause()
                    with self._lock:
                        self.stats.paused_s += waited
                if (cancel is not None and cancel.is_set()) or self._worker.closed:
                    return
                parsed = self._parse([(str(p), None) for p in batch], cancel)
                with contextlib.closing(parsed):
                    for path, result in parsed:
                        if not self._merge(Path(path), root, result):
                            with self._lock:
                                self.stats.truncated = True
                            break
                if self.stats.truncated:
                    break
                if (cancel is not None and cancel.is_set()) or self._worker.closed:
                    return
        with self._lock:
            self.stats.complete = True

    def close(self) -> None:
        """Stop the parsing child (any thread): a build under way ends, updates are
        ignored from now on."""
        self._worker.close()

    @property
    def worker_pid(self) -> int | None:
        """The parsing child's process id while one runs."""
        return self._worker.pid

    @property
    def worker_peak_kb(self) -> int:
        """The parsing child's peak resident memory (KB; the largest of those that ran)."""
        pid = self._worker.pid
        return max(self._worker.peak_kb, 0 if pid is None else _peak_kb(pid))

    def _parse(
        self, requests: list[tuple[str, str | None]], cancel: threading.Event | None = None
    ) -> Generator[tuple[str, Parsed], None, None]:
        """``parse_file`` for each request, in order: in the child process, or here when
        no child can be started (then ``ast.parse`` holds the interpreter lock as it
        did before)."""
        max_bytes = self.limits.max_file_bytes
        todo = [(path, text, max_bytes) for path, text in requests]
        worker = self._worker
        answered = 0
        if not worker.unavailable:
            with worker.lock:
                for (path, _, _), result in worker.parse(todo, cancel):
                    answered += 1
                    self.stats.parsed_in_child += 1
                    yield path, result
        if answered < len(todo) and worker.unavailable and not worker.closed:
            for path, text, limit in todo[answered:]:
                if cancel is not None and cancel.is_set():
                    return
                self.stats.parsed_here += 1
                yield path, parse_file(path, text, limit)

    def update(self, path: Path, text: str | None = None) -> bool:
        """(Re)index one file after a save, a watched change or an edit (``text``: the
        open document's text). Returns whether the file is indexed now."""
        path = Path(path).resolve()
        root = self._root_of(path)
        if root is not None and path.name == ".gitignore":
            self._roots.ignores.pop(root, None)  # re-read on the next check
            return False
        if root is None or self._ignored(path, root):
            self.remove(path)
            return False
        return self._index_path(path, root, text) and self.entry(path) is not None

    def remove(self, path: Path) -> None:
        path = Path(path).resolve()
        with self._lock:
            self._drop(path)

    def _root_of(self, path: Path) -> Path | None:
        for root in self.roots:
            if path == root or root in path.parents:
                return root
        return None

    def _ignored(self, path: Path, root: Path) -> bool:
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS for part in rel.parts[:-1]):
            return True
        if path.suffix not in CODE_EXTENSIONS:
            return True
        ignore = self._ignore_for(root)
        parts = rel.parts
        for i in range(1, len(parts)):
            if ignore.ignored("/".join(parts[:i]), True):
                return True
        return ignore.ignored(rel.as_posix(), False)

    def _ignore_for(self, root: Path) -> Ignore:
        ignore = self._roots.ignores.get(root)
        if ignore is None:
            ignore = Ignore()
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
                if ".gitignore" in filenames:
                    base = Path(dirpath).relative_to(root).as_posix()
                    text = read_text(Path(dirpath) / ".gitignore", 1_000_000) or ""
                    ignore.add("" if base == "." else base, text)
            self._roots.ignores[root] = ignore
        return ignore

    def _walk(self, root: Path) -> Iterator[Path]:
        """Files under ``root`` in a stable (sorted) order, pruning ignored directories."""
        ignore = Ignore()
        self._roots.ignores[root] = ignore
        stack = [root]
        while stack:
            directory = stack.pop()
            rel_dir = directory.relative_to(root).as_posix()
            base = "" if rel_dir == "." else rel_dir
            gitignore = directory / ".gitignore"
            if gitignore.is_file():
                ignore.add(base, read_text(gitignore, 1_000_000) or "")
            try:
                children = sorted(os.scandir(directory), key=lambda e: e.name)
            except OSError:
                continue
            subdirs: list[Path] = []
            for child in children:
                rel = f"{base}/{child.name}" if base else child.name
                try:
                    is_dir = child.is_dir(follow_symlinks=False)
                    is_file = child.is_file(follow_symlinks=False)
                except OSError:
                    continue
                if is_dir:
                    if child.name in SKIP_DIRS or ignore.ignored(rel, True):
                        self.stats.skipped_ignored += 1
                    else:
                        subdirs.append(Path(child.path))
                elif is_file and Path(child.name).suffix in CODE_EXTENSIONS:
                    if ignore.ignored(rel, False):
                        self.stats.skipped_ignored += 1
                    else:
                        yield Path(child.path)
            stack.extend(reversed(subdirs))

    def _index_path(self, path: Path, root: Path, text: str | None = None) -> bool:
        """Index one file; False once a limit is reached (the caller stops walking)."""
        with contextlib.closing(self._parse([(str(path), text)])) as parsed:
            for _, result in parsed:
                return self._merge(path, root, result)
        return True  # closed: nothing indexed

    def _merge(self, path: Path, root: Path, parsed: Parsed) -> bool:
        """Enter one file's ``parse_file`` result; False once a limit is reached."""
        status, size, mtime, items, vocabulary = parsed
        if status != OK:
            if status == LARGE:
                self.stats.skipped_large += 1  # it may have been small before: dropped
            elif status == BINARY:
                self.stats.skipped_binary += 1
            elif status == CRASHED:
                self.stats.crashed += 1
            self.remove(path)
            return True
        rel = path.relative_to(root)
        is_python = path.suffix in (".py", ".pyi")
        definitions = Definitions(items)
        module = _python_module(rel) if is_python else None
        with self._lock:
            growing = path not in self._files
            if growing and len(self._files) >= self.limits.max_files:
                return False
            if self.stats.postings + len(vocabulary) > self.limits.max_postings:
                self._compact()
                if self.stats.postings + len(vocabulary) > self.limits.max_postings:
                    return False
            self._drop(path)
            file_id = self._next_id
            self._next_id += 1
            entry = FileEntry(
                path=path,
                file_id=file_id,
                language=Language.PYTHON if is_python else Language.OTHER,
                module=module,
                definitions=definitions,
                size=size,
                mtime=mtime,
            )
            self._files[path] = entry
            self._alive[file_id] = path
            if module is not None:
                self._modules.setdefault(module, path)
            for word in vocabulary:
                ids = self._postings.get(word)
                if ids is None:
                    self._postings[sys.intern(word)] = file_id
                    self.stats.words += 1
                elif isinstance(ids, int):
                    self._postings[word] = _pair(ids, file_id)
                else:
                    ids += _ID.pack(file_id)
            self.stats.postings += len(vocabulary)
            self.stats.definitions += len(definitions)
            for name in definitions:
                if "." not in name:
                    found = self._defined.get(name)
                    if found is None:
                        self._defined[sys.intern(name)] = file_id
                    elif isinstance(found, int):
                        self._defined[name] = _pair(found, file_id)
                    else:
                        found += _ID.pack(file_id)
            self.stats.files = len(self._files)
            self._versions[path] = self._versions.get(path, 0) + 1
        return True

    def _drop(self, path: Path) -> None:
        """Forget ``path`` (lock held). Its postings stay as dead ids until compaction."""
        entry = self._files.pop(path, None)
        if entry is None:
            return
        self._alive.pop(entry.file_id, None)
        self.stats.definitions -= len(entry.definitions)
        if entry.module is not None and self._modules.get(entry.module) == path:
            del self._modules[entry.module]
        self._versions[path] = self._versions.get(path, 0) + 1
        self.stats.files = len(self._files)
        self._dead_postings += 1
        if self._dead_postings > max(64, len(self._files) // 4):
            self._compact()

    def _compact(self) -> None:
        """Drop postings of files that are gone (lock held)."""
        alive = self._alive
        total = 0
        for table in (self._postings, self._defined):
            for word in list(table):
                ids = [i for i in _ids(table[word]) if i in alive]
                if not ids:
                    del table[word]
                    continue
                table[word] = ids[0] if len(ids) == 1 else bytearray(array("i", ids))
                if table is self._postings:
                    total += len(ids)
        self.stats.postings = total
        self.stats.words = len(self._postings)
        self._dead_postings = 0


# The file ids of a word (or a name's defining files): one id as an ``int`` (most words
# occur in one file), more as a ``bytearray`` of 4-byte ids. Neither is walked by the
# garbage collector (lists and ``array``s are: 700,000 of them for the standard library).
Postings = int | bytearray
_ID = struct.Struct("=i")


def _pair(first: int, second: int) -> bytearray:
    return bytearray(_ID.pack(first) + _ID.pack(second))


def _ids(postings: Postings | None) -> list[int]:
    if postings is None:
        return []
    if isinstance(postings, int):
        return [postings]
    return memoryview(postings).cast("i").tolist()


def _count(postings: Postings | None) -> int:
    if postings is None:
        return 0
    return 1 if isinstance(postings, int) else len(postings) // _ID.size


def _idf(df: int, n: int) -> float:
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


def _python_module(rel: Path) -> str | None:
    """The module name under the workspace folder, or under ``src/`` when there is one."""
    if rel.parts and rel.parts[0] == "src":
        rel = Path(*rel.parts[1:])
    return module_name(rel)


if __name__ == "__kode_index_worker__":
    _worker_main(sys.argv[2:])  # after "-c" and this file
