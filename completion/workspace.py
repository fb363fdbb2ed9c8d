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
"""

from __future__ import annotations

import ast
import enum
import fnmatch
import math
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Iterator
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


@dataclass(slots=True)
class FileEntry:
    path: Path
    file_id: int
    language: Language
    module: str | None  # dotted Python module name under its source root
    definitions: dict[str, Definition]
    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class IndexLimits:
    max_files: int = 20_000
    max_file_bytes: int = 1_000_000
    max_postings: int = 4_000_000  # ~32 MB of list slots at most


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

    @property
    def approx_bytes(self) -> int:
        """Postings (8-byte list slots), words (~100 B each with their dict slot),
        definitions (~250 B: the object, its first line, two dict slots), entries
        (~600 B). Checked against tracemalloc by ``kode bench context --latency-files``."""
        return self.postings * 8 + self.words * 100 + self.definitions * 250 + self.files * 600


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
    except (SyntaxError, ValueError, RecursionError):
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
        self._postings: dict[str, list[int]] = {}
        self._defined: dict[str, list[int]] = {}  # top-level name -> ids of defining files
        self._alive: dict[int, Path] = {}  # file id -> path; ids of replaced files vanish
        self._dead_postings = 0
        self._next_id = 0
        self._versions: dict[Path, int] = {}
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
            for file_id in self._defined.get(name, ()):
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
            return {name: len(self._postings.get(name, ())) for name in names}

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
            found = [(len(ids), ids) for w in set(query) if (ids := self._postings.get(w))]
            found = sorted((f for f in found if f[0] <= rare), key=lambda f: f[0])[:RANK_WORDS]
            for df, ids in found:
                weight = _idf(df, n)
                for file_id in ids:
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

    def build(self, cancel: threading.Event | None = None) -> IndexStats:
        """Walk every root and index what qualifies; run in a worker thread."""
        started = time.perf_counter()
        for root in self.roots:
            for path in self._walk(root):
                if cancel is not None and cancel.is_set():
                    return self.stats
                if not self._index_path(path, root):
                    with self._lock:
                        self.stats.truncated = True
                    break
        with self._lock:
            self.stats.build_s = time.perf_counter() - started
            self.stats.complete = True
        return self.stats

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
        try:
            stat = path.stat()
        except OSError:
            stat = None
        if text is None:
            if stat is None:
                self.remove(path)
                return True
            if stat.st_size > self.limits.max_file_bytes:
                self.stats.skipped_large += 1
                self.remove(path)  # it may have been small before
                return True
            text = read_text(path, self.limits.max_file_bytes)
            if text is None:
                self.stats.skipped_binary += 1
                self.remove(path)
                return True
        elif len(text) > self.limits.max_file_bytes:
            self.stats.skipped_large += 1
            self.remove(path)
            return True
        rel = path.relative_to(root)
        is_python = path.suffix in (".py", ".pyi")
        definitions = python_definitions(text) if is_python else fallback_definitions(text)
        vocabulary = words(text)
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
                size=len(text),
                mtime=stat.st_mtime if stat is not None else 0.0,
            )
            self._files[path] = entry
            self._alive[file_id] = path
            if module is not None:
                self._modules.setdefault(module, path)
            for word in vocabulary:
                ids = self._postings.get(word)
                if ids is None:
                    self._postings[sys.intern(word)] = [file_id]
                    self.stats.words += 1
                else:
                    ids.append(file_id)
            self.stats.postings += len(vocabulary)
            self.stats.definitions += len(definitions)
            for name in definitions:
                if "." not in name:
                    self._defined.setdefault(sys.intern(name), []).append(file_id)
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
        for word in list(self._postings):
            ids = [i for i in self._postings[word] if i in alive]
            if ids:
                self._postings[word] = ids
                total += len(ids)
            else:
                del self._postings[word]
        for name in list(self._defined):
            ids = [i for i in self._defined[name] if i in alive]
            if ids:
                self._defined[name] = ids
            else:
                del self._defined[name]
        self.stats.postings = total
        self.stats.words = len(self._postings)
        self._dead_postings = 0


def _idf(df: int, n: int) -> float:
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


def _python_module(rel: Path) -> str | None:
    """The module name under the workspace folder, or under ``src/`` when there is one."""
    if rel.parts and rel.parts[0] == "src":
        rel = Path(*rel.parts[1:])
    return module_name(rel)
