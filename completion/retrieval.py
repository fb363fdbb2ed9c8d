"""Project context for the cursor: which parts of which workspace files enter the prompt.

Three sources, best first (``Source``; the best goes nearest the cursor):

1. **definitions** of the names used around the cursor, resolved through the file's
   Python imports (``import pkg.mod as m`` ... ``m.name``, ``from .mod import name``) to
   indexed files, or, for other languages and unresolved names, looked up by name;
2. **outlines** of the workspace modules the code around the cursor uses: the first line
   of each top-level definition (and of each method), so that the model can see the
   names a module offers when the hole is ``module.<name>``;
3. **windows**: the 20-line window most similar (Jaccard over identifiers) to the lines
   before the cursor, in the files that share the rarest words with them.

Stable between keystrokes: the query is the whole lines before the cursor's line (from a
first line that moves once every ten lines) plus the names the cursor line resolves, so
typing inside a line changes the snippets only when a newly typed name resolves. The snippets'
prompt order is (source, path, line), not score, so a re-ranking with the same set
leaves the cached prompt as it was.

Pure functions over text plus one ``WorkspaceIndex``; the files' text comes from the
``read`` callable (the open document's text if open, else the disk).
"""

from __future__ import annotations

import builtins
import enum
import functools
import keyword
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass
from pathlib import Path

from kode.completion.templates import Snippet
from kode.completion.workspace import WORD, Definition, WorkspaceIndex, words

ReadText = Callable[[Path], str | None]

BLOCK_LINES = 10  # the query's first line moves in steps of this many lines
QUERY_LINES = 30  # at least this many lines before the cursor's line make the query
WINDOW_LINES = 20  # a lexical window
WINDOW_STRIDE = 10
DEFINITION_CHARS = 400  # one definition excerpt: its header, docstring, first lines
# Which candidates win the budget (``Retrieved.score``): a member the code names through
# an import, then the outline of a module it uses, then a definition found by name only,
# then similar windows (their Jaccard score, below 1).
_RANK_IMPORTED = 4.0
_RANK_OUTLINE = 3.0
_RANK_BY_NAME = 1.0
_ANCHOR_WORDS = 6  # query words (the longest) whose places anchor the candidate windows
_MAX_WINDOWS = 8  # windows scored per file
_MATCHES_PER_WORD = 32  # occurrences of one anchor word looked at per file
# Words too common to anchor a window: keywords, builtins and the usual receivers.
COMMON = frozenset(
    {*keyword.kwlist, *dir(builtins), "self", "cls", "this", "args", "kwargs", "value", "name"}
)
MIN_JACCARD = 0.12  # below this a window is noise (skipped: retrieval that cannot help)
_IMPORT_FROM = re.compile(
    r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]+)", re.MULTILINE
)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n#;]+)", re.MULTILINE)
_ATTRIBUTE = re.compile(r"\b([A-Za-z_]\w*)\.([A-Za-z_]\w*)")


class Source(enum.IntEnum):
    """Where a snippet comes from; higher is better and sits nearer the cursor."""

    WINDOW = 1
    OUTLINE = 2
    DEFINITION = 3


@dataclass(frozen=True, slots=True)
class Retrieved:
    """One piece of another file: ``snippet`` for the prompt, ``file`` and ``line`` say
    where it was cut from (for de-duplication and a stable order)."""

    source: Source
    file: Path
    line: int
    snippet: Snippet
    score: float = 0.0

    @property
    def order(self) -> tuple[int, str, int]:
        return (int(self.source), str(self.file), self.line)


@dataclass(frozen=True, slots=True)
class Binding:
    """What a local name of a Python file refers to: a module, or ``attr`` of one."""

    module: str
    attr: str | None = None


# -- Python imports ---------------------------------------------------------------------


def python_imports(text: str, module: str | None, is_package: bool = False) -> dict[str, Binding]:
    """Local names bound by the imports of ``text`` (a module named ``module``).

    >>> b = python_imports("import os.path as p\\nfrom .util import helper as h", "pkg.mod")
    >>> b["p"], b["h"]
    (Binding(module='os.path', attr=None), Binding(module='pkg.util', attr='helper'))
    """
    out: dict[str, Binding] = {}
    for match in _IMPORT.finditer(text):
        for part in match.group(1).split(","):
            name, _, alias = part.strip().partition(" as ")
            name = name.strip()
            if not name or not all(p.isidentifier() for p in name.split(".")):
                continue
            if alias.strip():
                out[alias.strip()] = Binding(name)
            else:
                out[name.split(".")[0]] = Binding(name.split(".")[0])
    for match in _IMPORT_FROM.finditer(text):
        base = resolve_relative(match.group(1), module, is_package)
        if base is None:
            continue
        names = match.group(2).strip().strip("()")
        for part in names.replace("\n", " ").split(","):
            name, _, alias = part.strip().partition(" as ")
            name, alias = name.strip(), alias.strip()
            if name.isidentifier():
                out[alias or name] = Binding(base, name)
    return out


def resolve_relative(spec: str, module: str | None, is_package: bool = False) -> str | None:
    """``from ..x import`` in module ``a.b.c`` -> ``a.x``; absolute names pass through."""
    level = len(spec) - len(spec.lstrip("."))
    rest = spec[level:]
    if level == 0:
        return rest or None
    if module is None:
        return None
    package = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 > len(package):
        return None
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, rest] if rest else base) or None


# -- text helpers -----------------------------------------------------------------------


def jaccard(a: Set[str], b: Set[str]) -> float:
    """|a & b| / |a | b|; 0 for two empty sets."""
    if not a and not b:
        return 0.0
    return len(a & b) / len(a | b)


def best_window(
    text: str, query: Set[str], max_chars: int, lines: int = WINDOW_LINES
) -> tuple[int, str, float]:
    """The ``lines``-line window of ``text`` most similar to ``query`` (first of equals),
    cut to ``max_chars``: (first line, text, Jaccard score).

    Only windows around the places that hold one of the query's longest words (the
    likely rare ones) are scored, at most ``_MAX_WINDOWS`` of them, and the file is never
    split into lines: scoring every window of a 3,000-line file took 25 ms.

    >>> best_window("a = 1\\nb = 2\\nspam(eggs)\\n", {"spam", "eggs"}, 100, lines=1)
    (2, 'spam(eggs)\\n', 1.0)
    """
    best: tuple[int, int, float] | None = None  # (start, end, score)
    for start, end in _candidate_windows(text, query, lines):
        score = jaccard(words(text[start:end]), query)
        if best is None or score > best[2]:
            best = (start, end, score)
    if best is None:
        return 0, "", 0.0
    start, end, score = best
    return text.count("\n", 0, start), _cut(text[start:end], max_chars), score


def _candidate_windows(text: str, query: Set[str], lines: int) -> list[tuple[int, int]]:
    """(start, end) character ranges of whole-line windows worth scoring, in order.

    Anchors are found with ``str.find`` per word (and a word-boundary check): one regular
    expression alternating twelve words took 20-90 ms on a 100 KB file."""
    keys = sorted((w for w in query if len(w) >= 4 and w not in COMMON), key=lambda w: (-len(w), w))
    hits: dict[int, int] = {}  # start of an anchor's line -> anchors on it
    n = len(text)
    for key in keys[:_ANCHOR_WORDS]:
        found, at = 0, text.find(key)
        while at >= 0 and found < _MATCHES_PER_WORD:
            end = at + len(key)
            if (at == 0 or not _is_word(text[at - 1])) and (end == n or not _is_word(text[end])):
                line_start = text.rfind("\n", 0, at) + 1
                hits[line_start] = hits.get(line_start, 0) + 1
                found += 1
            at = text.find(key, end)
    anchors = sorted(hits, key=lambda a: (-hits[a], a))[:_MAX_WINDOWS] if hits else [0]
    windows: set[tuple[int, int]] = set()
    for anchor in anchors:
        start = anchor
        for _ in range(lines // 2):
            if start == 0:
                break
            start = text.rfind("\n", 0, start - 1) + 1
        end = start
        for _ in range(lines):
            nl = text.find("\n", end)
            if nl < 0:
                end = n
                break
            end = nl + 1
        windows.add((start, end))
    return sorted(windows)


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def definition_excerpt(text: str, definition: Definition, max_chars: int) -> str:
    """From the definition's line on: the header and body lines until the next line at
    the same or a lower indentation (the next definition), cut to ``max_chars``. Only
    the part of ``text`` it needs is split into lines."""
    offset = 0
    for _ in range(definition.line):
        offset = text.find("\n", offset) + 1
        if offset == 0:
            return ""
    lines = text[offset : offset + 4 * max_chars].splitlines(keepends=True)
    if not lines:
        return ""
    indent = _indent(lines[0])
    end = 1
    while end < len(lines):
        line = lines[end]
        if line.strip() and _indent(line) <= indent and not line.lstrip().startswith((")", "]")):
            break
        end += 1
    return _cut("".join(lines[:end]), max_chars)


def outline(
    definitions: dict[str, Definition], max_chars: int, relevant: Set[str] = frozenset()
) -> str:
    """The first lines of a module's definitions in file order. When they do not all
    fit, public names are kept first, then those sharing words with ``relevant``, then
    top-level names before methods."""

    def priority(d: Definition) -> tuple[int, int, int, int]:
        short = d.name.rsplit(".", 1)[-1]
        private = short.startswith("_") and not short.startswith("__init__")
        overlap = len(_subwords(d.name) & relevant)
        return (int(private), -overlap, int("." in d.name), d.line)

    chosen: list[Definition] = []
    used = 0
    for d in sorted(definitions.values(), key=priority):
        cost = len(d.header) + 1
        if used + cost > max_chars:
            continue
        chosen.append(d)
        used += cost
    chosen.sort(key=lambda d: d.line)
    return "".join(d.header + "\n" for d in chosen)


@functools.lru_cache(maxsize=8192)
def _subwords(name: str) -> frozenset[str]:
    parts = re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+", name)
    return frozenset(p.lower() for p in parts)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _cut(text: str, max_chars: int) -> str:
    """``text`` cut at the last line break within ``max_chars`` (never mid-line unless
    its first line alone is too long)."""
    if len(text) <= max_chars:
        return text
    cut = text.rfind("\n", 0, max_chars)
    return text[: cut + 1] if cut >= 0 else text[:max_chars]


# -- the query --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    """What retrieval looks at: the whole lines before the cursor's line, from a start
    that moves in steps of ``BLOCK_LINES``, and the cursor line (for resolution only)."""

    context: str  # lines [start of the block QUERY_LINES back, cursor line)
    near: str  # the cursor line up to the cursor
    file_text: str

    @staticmethod
    def at(text: str, offset: int) -> Query:
        before = text[:offset]
        lines = before.split("\n")
        cursor = len(lines) - 1
        first = max(0, cursor - cursor % BLOCK_LINES - QUERY_LINES)
        return Query(context="\n".join(lines[first:cursor]), near=lines[cursor], file_text=text)


# -- retrieval --------------------------------------------------------------------------


class Retriever:
    """Chooses the project context for one cursor from a ``WorkspaceIndex``."""

    def __init__(self, index: WorkspaceIndex, read: ReadText) -> None:
        self.index = index
        self._read = read
        self._outline_chars = 1024

    def retrieve(
        self,
        path: Path | None,
        text: str,
        offset: int,
        max_chars: int,
        *,
        skip: Iterable[Path] = (),
    ) -> list[Retrieved]:
        """Snippets for a cursor at ``offset`` of ``text`` (the file at ``path``, if it is
        in the workspace), at most ``max_chars`` in all, in prompt order. Files in
        ``skip`` (already in the prompt whole) and ``path`` itself are left out."""
        if max_chars <= 0 or len(self.index) == 0:
            return []
        query = Query.at(text, offset)
        skipped = {*skip, *([path] if path is not None else [])}
        self._outline_chars = max_chars // 2
        candidates = self._definitions(path, query, skipped)
        candidates += self._windows(path, query, skipped)
        return select(candidates, max_chars)

    def _definitions(self, path: Path | None, query: Query, skip: set[Path]) -> list[Retrieved]:
        near_text = query.context + "\n" + query.near
        near_words = WORD.findall(near_text)
        near_counts = Counter(near_words)
        used = set(near_counts)
        entry = None if path is None else self.index.entry(path)
        own = entry.definitions if entry is not None else {}
        module = None if entry is None else entry.module
        is_package = path is not None and path.stem == "__init__"
        is_python = path is None or path.suffix in (".py", ".pyi")
        out: list[Retrieved] = []
        seen: set[tuple[Path, str]] = set()

        def add_definition(file: Path, definition: Definition, score: float) -> None:
            if file in skip or (file, definition.name) in seen:
                return
            body = self._read(file)
            if body is None:
                return
            excerpt = definition_excerpt(body, definition, DEFINITION_CHARS)
            if excerpt:
                seen.add((file, definition.name))
                snippet = Snippet(self._display(file), excerpt)
                out.append(Retrieved(Source.DEFINITION, file, definition.line, snippet, score))

        attributes = _ATTRIBUTE.findall(near_text)
        modules_used: dict[Path, float] = {}
        if is_python:
            file_words = Counter(WORD.findall(query.file_text))
            for name, binding in python_imports(query.file_text, module, is_package).items():
                target, attr = self._resolve(binding)
                if target is None or target in skip or target == path:
                    continue
                target_entry = self.index.entry(target)
                if target_entry is None:
                    continue
                if attr is not None:
                    if name in used and attr in target_entry.definitions:
                        add_definition(target, target_entry.definitions[attr], _RANK_IMPORTED)
                    continue
                # A module: its outline, ranked by how often the code near the cursor
                # (else the file) names it; and the members named near the cursor.
                near_uses = near_counts[name]
                # (A module imported and not used yet still counts: its use may be the
                # line being written.)
                weight = near_uses + 1.0 if near_uses else 0.01 * file_words[name]
                modules_used[target] = max(modules_used.get(target, 0.0), weight)
                for base, member in attributes:
                    if base == name and member in target_entry.definitions:
                        add_definition(target, target_entry.definitions[member], _RANK_IMPORTED)
        ranked_modules = sorted(modules_used.items(), key=lambda kv: (-kv[1], str(kv[0])))
        relevant = {w for name in used for w in _subwords(name)}
        for rank, (target, weight) in enumerate(ranked_modules[:2]):
            target_entry = self.index.entry(target)
            if target_entry is None or not target_entry.definitions:
                continue
            text = outline(target_entry.definitions, self._outline_chars, relevant)
            snippet = Snippet(self._display(target), text)
            score = _RANK_OUTLINE - rank * 0.1 + min(weight, 9) * 0.01
            out.append(Retrieved(Source.OUTLINE, target, -1, snippet, score))
        # Names used nearby, defined elsewhere in the workspace (any language).
        found = 0
        for name in dict.fromkeys(near_words):
            if found >= 3:
                break
            if len(name) < 4 or name in own or any(k[1] == name for k in seen):
                continue
            for file, definition in self.index.find_definitions(name, limit=1):
                add_definition(file, definition, _RANK_BY_NAME)
                found += 1
        return out

    def _windows(self, path: Path | None, query: Query, skip: set[Path]) -> list[Retrieved]:
        wanted = words(query.context)
        if len(wanted) < 3:
            return []
        out: list[Retrieved] = []
        for file, _ in self.index.rank_files(wanted, exclude=path, limit=3):
            if file in skip:
                continue
            body = self._read(file)
            if body is None:
                continue
            line, text, score = best_window(body, wanted, 1200)
            if score >= MIN_JACCARD:
                snippet = Snippet(self._display(file), text)
                out.append(Retrieved(Source.WINDOW, file, line, snippet, score))
        out.sort(key=lambda r: -r.score)
        return out[:2]

    def _resolve(self, binding: Binding) -> tuple[Path | None, str | None]:
        """The indexed file a binding refers to, and the attribute looked up in it."""
        if binding.attr is not None:
            submodule = self.index.module_path(f"{binding.module}.{binding.attr}")
            if submodule is not None:
                return submodule, None
        return self.index.module_path(binding.module), binding.attr

    def _display(self, file: Path) -> str:
        for root in self.index.roots:
            if root in file.parents:
                return file.relative_to(root).as_posix()
        return file.name


def select(candidates: Sequence[Retrieved], max_chars: int) -> list[Retrieved]:
    """The best-scored candidates that fit ``max_chars``, without two pieces of the same
    file at the same line, in prompt order (source, path, line: definitions last,
    nearest the cursor)."""
    ranked = sorted(candidates, key=lambda r: (-r.score, str(r.file), r.line))
    chosen: list[Retrieved] = []
    places: set[tuple[Path, int]] = set()
    used = 0
    for item in ranked:
        cost = len(item.snippet.text) + len(item.snippet.path) + 16
        if (item.file, item.line) in places or used + cost > max_chars:
            continue
        chosen.append(item)
        places.add((item.file, item.line))
        used += cost
    chosen.sort(key=lambda r: r.order)
    return chosen
