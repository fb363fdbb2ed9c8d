"""Which files of the workspace the index reads, found without waiting on any of them.

A walk of the folders (``walk``) in a stable order, pruning ``SKIP_DIRS`` and what
``.gitignore`` files (any level) exclude, keeping the ``CODE_EXTENSIONS``. It takes the
kind of each entry from ``scandir`` (no call per file): links are not followed (a
loop, a link to ``/``), and a FIFO, socket or device is counted and never opened
(opening a FIFO waits for a writer, for good); a folder that may not be entered is
counted and passed by. ``.gitignore`` files are read as any file is
(``index_worker.read_file``: a regular file, never a link, within a size bound).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kode.completion.project.index_worker import MISSING, OK, SPECIAL, UNREADABLE, decode, read_file

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
IGNORED = "ignored"  # what ``walk`` reports besides ``read_file``'s statuses
_GITIGNORE_BYTES = 1_000_000

Skipped = Callable[[str], None]  # told why an entry is not indexed (a status)


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


# -- module names ----------------------------------------------------------------------


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


# -- the walk ---------------------------------------------------------------------------


def walk(root: Path, ignore: Ignore, skipped: Skipped) -> Iterator[Path]:
    """Files under ``root`` in a stable (sorted) order, pruning ignored directories and
    adding the ``.gitignore`` rules met on the way to ``ignore``; what is passed by is
    told to ``skipped`` (``IGNORED``, ``SPECIAL``, ``UNREADABLE``)."""
    stack = [root]
    while stack:
        directory = stack.pop()
        rel_dir = directory.relative_to(root).as_posix()
        base = "" if rel_dir == "." else rel_dir
        _add_gitignore(ignore, base, directory, skipped)
        try:
            children = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            skipped(UNREADABLE)
            continue
        subdirs: list[Path] = []
        for child in children:
            rel = f"{base}/{child.name}" if base else child.name
            try:  # the kind ``scandir`` read with the name: no further call
                is_dir = child.is_dir(follow_symlinks=False)
                is_file = child.is_file(follow_symlinks=False)
                is_link = child.is_symlink()
            except OSError:
                continue
            if is_dir:
                if child.name in SKIP_DIRS or ignore.ignored(rel, True):
                    skipped(IGNORED)
                else:
                    subdirs.append(Path(child.path))
            elif Path(child.name).suffix not in CODE_EXTENSIONS or is_link:
                continue
            elif ignore.ignored(rel, False):
                skipped(IGNORED)
            elif not is_file:
                skipped(SPECIAL)  # a FIFO, socket or device
            else:
                yield Path(child.path)
        stack.extend(reversed(subdirs))


def read_ignores(root: Path) -> Ignore:
    """Every ``.gitignore`` rule under ``root`` (an update's check, between builds)."""
    ignore = Ignore()
    for dirpath, dirnames, filenames in os.walk(root):  # links to folders not followed
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        if ".gitignore" in filenames:
            base = Path(dirpath).relative_to(root).as_posix()
            _add_gitignore(ignore, "" if base == "." else base, Path(dirpath), lambda _s: None)
    return ignore


def is_ignored(path: Path, root: Path, ignore: Ignore) -> bool:
    """Whether the index leaves ``path`` (under ``root``) out: a skipped folder on its
    way, an extension that is not code's, or a ``.gitignore`` rule."""
    rel = path.relative_to(root)
    if any(part in SKIP_DIRS for part in rel.parts[:-1]):
        return True
    if path.suffix not in CODE_EXTENSIONS:
        return True
    parts = rel.parts
    for i in range(1, len(parts)):
        if ignore.ignored("/".join(parts[:i]), True):
            return True
    return ignore.ignored(rel.as_posix(), False)


def _add_gitignore(ignore: Ignore, base: str, directory: Path, skipped: Skipped) -> None:
    status, data, _ = read_file(directory / ".gitignore", _GITIGNORE_BYTES)
    if status == OK:
        ignore.add(base, decode(data) or "")
    elif status != MISSING:
        skipped(status)  # a FIFO named .gitignore, one that may not be read, a huge one


def resolve_path(path: Path) -> Path | None:
    """``path`` with its links resolved; None for a link loop (a ``RuntimeError`` in
    Python 3.11, an ``OSError`` later) or a path that cannot be looked at."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        return None
