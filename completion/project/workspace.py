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
(each posting is one 8-byte list slot; ``stats()`` reports the estimate). Whatever
the workspace holds, nothing here waits on it: what is not a regular file (a FIFO, a
socket, a device) is never opened and folders that may not be entered are passed by,
each counted (``skipped_special``, ``skipped_unreadable``); a parse that does not
answer in ``parse_timeout_s`` is given up (``index_worker``).

Thread-safety: ``build`` runs in a worker thread and every method takes the one lock;
``snapshot`` work done under it is short (no I/O).

Never stalls the server's event loop: the files are read and parsed in a low-priority
child process (``index_worker.IndexWorker``), and the server's thread only merges the
results, in steps the interpreter can switch between. What the index keeps is stored
so that the garbage collector has little to walk (``Postings``, ``Definitions``): a
full collection over the 1.1 M objects it held before (a list per word, a
``Definition`` per definition) stopped every thread for 0.4 s. The child exits with
the index (``close``), when the server dies, and after a minute without work.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import math
import struct
import sys
import threading
import time
from array import array
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kode.completion.project.index_worker import (
    BINARY,
    CRASHED,
    LARGE,
    OK,
    SPECIAL,
    TIMED_OUT,
    UNREADABLE,
    Definition,
    IndexWorker,
    Parsed,
    parse_file,
    peak_kb,
)
from kode.completion.project.workspace_files import (
    IGNORED,
    Ignore,
    is_ignored,
    module_name,
    read_ignores,
    resolve_path,
    walk,
)

RANK_WORDS = 24  # query words walked by ``rank_files``, rarest first
RARE_SHARE = 0.05  # ... among those held by at most this share of the files
_BATCH = 64  # files per step of a build (an update waits for one step at most)


class Language(enum.StrEnum):
    PYTHON = "python"
    OTHER = "other"


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
    # The most one file's parse may take before the child is replaced (a 1 MB file
    # parses in ~0.4 s; the child is at the idle priority, so a busy machine slows it).
    parse_timeout_s: float = 30.0
    # False: parse in this process, as when no child can be started (``parsed_here``); for
    # tests that must start no process.
    in_child: bool = True


@dataclass(slots=True)
class IndexStats:
    files: int = 0
    skipped_ignored: int = 0
    skipped_binary: int = 0
    skipped_large: int = 0
    skipped_special: int = 0  # FIFOs, sockets, devices: never opened
    skipped_unreadable: int = 0  # files and folders that may not be read
    postings: int = 0
    words: int = 0
    definitions: int = 0
    build_s: float = 0.0
    complete: bool = False  # the first build finished (and was not cut by a limit)
    truncated: bool = False  # a limit stopped indexing

    parsed_in_child: int = 0  # files parsed in the child process
    parsed_here: int = 0  # ... in this process (no child could be started)
    crashed: int = 0  # files skipped because parsing them crashed the child twice
    timed_out: int = 0  # ... because parsing them did not answer in time, twice
    paused_s: float = 0.0  # how long the build waited for the model to be idle
    updates: int = 0  # files read again after a change (saves, watched files, edits)

    @property
    def approx_bytes(self) -> int:
        """Postings (4-byte ids), words (~150 B each with their dict slot and ids),
        definitions (~150 B: the first line, three slots), entries (~800 B).
        Checked against tracemalloc by ``kode bench context --latency-files``."""
        return self.postings * 4 + self.words * 150 + self.definitions * 150 + self.files * 800


# -- the index --------------------------------------------------------------------------


@dataclass(slots=True)
class _Roots:
    paths: tuple[Path, ...] = ()
    ignores: dict[Path, Ignore] = field(default_factory=dict)


# A file not indexed, by ``parse_file``'s status: the ``IndexStats`` field counting it.
_SKIP_COUNTERS = {
    IGNORED: "skipped_ignored",
    LARGE: "skipped_large",
    BINARY: "skipped_binary",
    SPECIAL: "skipped_special",
    UNREADABLE: "skipped_unreadable",
    CRASHED: "crashed",
    TIMED_OUT: "timed_out",
}


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
        # A file's version is the count of changes to the index when it last changed;
        # only indexed files are kept (a removed one's is ``_removed``): the dictionary is
        # bounded by the files indexed, not by every path ever removed.
        self._changes = 0
        self._versions: dict[Path, int] = {}
        self._removed = 0  # the count at the latest removal
        self._worker = IndexWorker(
            self.limits.worker_nice, self.limits.parse_timeout_s, child=self.limits.in_child
        )
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
        """Grows whenever ``path`` is re-indexed or removed (that of a file not indexed
        may grow when another is removed)."""
        with self._lock:
            return self._versions.get(path, self._removed)

    def versions_held(self) -> int:
        """Files whose version is kept: the indexed ones."""
        with self._lock:
            return len(self._versions)

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
            ignore = self._roots.ignores[root] = Ignore()
            paths = walk(root, ignore, self._skipped)
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
        return max(self._worker.peak_kb, 0 if pid is None else peak_kb(pid))

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
        resolved = resolve_path(path)
        if resolved is None:
            return False
        path = resolved
        root = self._root_of(path)
        if root is not None and path.name == ".gitignore":
            self._roots.ignores.pop(root, None)  # re-read on the next check
            return False
        if root is None or self._ignored(path, root):
            self.remove(path)
            return False
        indexed = self._index_path(path, root, text)
        self.stats.updates += 1  # after the merge: what a query finds now reflects it
        return indexed and self.entry(path) is not None

    def remove(self, path: Path) -> None:
        resolved = resolve_path(path)
        if resolved is not None:
            with self._lock:
                self._drop(resolved)

    def _root_of(self, path: Path) -> Path | None:
        for root in self.roots:
            if path == root or root in path.parents:
                return root
        return None

    def _ignored(self, path: Path, root: Path) -> bool:
        ignore = self._roots.ignores.get(root)
        if ignore is None:
            ignore = self._roots.ignores[root] = read_ignores(root)
        return is_ignored(path, root, ignore)

    def _index_path(self, path: Path, root: Path, text: str | None = None) -> bool:
        """Index one file; False once a limit is reached (the caller stops walking)."""
        with contextlib.closing(self._parse([(str(path), text)])) as parsed:
            for _, result in parsed:
                return self._merge(path, root, result)
        return True  # closed: nothing indexed

    def _merge(self, path: Path, root: Path, parsed: Parsed) -> bool:
        """Enter one file's ``parse_file`` result; False once a limit is reached."""
        status, size, mtime, items, vocabulary = parsed
        if status != OK:  # it may have been indexed before: dropped
            with self._lock:
                self._skipped(status)
                self._drop(path)
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
            self._changes += 1
            self._versions[path] = self._changes
        return True

    def _skipped(self, status: str) -> None:
        """Count a file that is not indexed, by why (``parse_file``'s status)."""
        counter = _SKIP_COUNTERS.get(status)
        if counter is not None:
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)

    def _drop(self, path: Path) -> None:
        """Forget ``path`` (lock held). Its postings stay as dead ids until compaction."""
        entry = self._files.pop(path, None)
        if entry is None:
            return
        self._alive.pop(entry.file_id, None)
        self.stats.definitions -= len(entry.definitions)
        if entry.module is not None and self._modules.get(entry.module) == path:
            del self._modules[entry.module]
        self._changes += 1
        self._versions.pop(path, None)
        self._removed = self._changes
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
