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

Stable between keystrokes: the query is the 30 lines before the cursor's 10-line block
(it moves once every ten lines) plus the names the cursor line resolves, so typing
inside a line changes the snippets only when a newly typed name resolves. The snippets'
prompt order is (source, path, line), not score, so a re-ranking with the same set
leaves the cached prompt as it was.

Pure functions over text plus one ``WorkspaceIndex``; the files' text comes from the
``read`` callable (the open document's text if open, else the disk).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass
from pathlib import Path

from kode.completion.templates import Snippet
from kode.completion.workspace import WORD, Definition, WorkspaceIndex, words

ReadText = Callable[[Path], str | None]

BLOCK_LINES = 10  # the query window moves in steps of this many lines
QUERY_LINES = 30  # lines before the block that make the query
WINDOW_LINES = 20  # a lexical window
WINDOW_STRIDE = 10
DEFINITION_CHARS = 700  # one definition excerpt: its header, docstring, first lines
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

    >>> best_window("a = 1\\nb = 2\\nfoo(bar)\\n", {"foo", "bar"}, 100, lines=1)
    (2, 'foo(bar)\\n', 1.0)
    """
    all_lines = text.splitlines(keepends=True)
    best = (0, 0.0)
    stride = max(1, min(WINDOW_STRIDE, lines // 2))
    for start in range(0, max(1, len(all_lines) - lines + stride), stride):
        score = jaccard(words("".join(all_lines[start : start + lines])), query)
        if score > best[1]:
            best = (start, score)
    start = best[0]
    return start, _cut("".join(all_lines[start : start + lines]), max_chars), best[1]


def definition_excerpt(text: str, definition: Definition, max_chars: int) -> str:
    """From the definition's line on: the header and body lines until the next line at
    the same or a lower indentation (the next definition), cut to ``max_chars``."""
    lines = text.splitlines(keepends=True)
    start = definition.line
    if start >= len(lines):
        return ""
    indent = _indent(lines[start])
    end = start + 1
    while end < len(lines):
        line = lines[end]
        if line.strip() and _indent(line) <= indent and not line.lstrip().startswith((")", "]")):
            break
        end += 1
    return _cut("".join(lines[start:end]), max_chars)


def outline(
    definitions: dict[str, Definition], max_chars: int, relevant: Set[str] = frozenset()
) -> str:
    """The first lines of a module's definitions in file order, public names first;
    when they do not all fit, those sharing words with ``relevant`` are kept first."""

    def priority(d: Definition) -> tuple[int, int, int]:
        short = d.name.rsplit(".", 1)[-1]
        private = short.startswith("_") and not short.startswith("__init__")
        overlap = len(_subwords(d.name) & relevant)
        return (int(private), -overlap, d.line)

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


def _subwords(name: str) -> set[str]:
    parts = re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+", name)
    return {p.lower() for p in parts}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _cut(text: str, max_chars: int) -> str:
    """``text`` cut at the last line break within ``max_chars`` (never mid-line unless
    its first line alone is too long)."""
    if len(text) <= max_chars:
        return text
    cut = text.rfind("\n", 0, max_chars)
    return text[: cut + 1] if cut > 0 else text[:max_chars]


# -- the query --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    """What retrieval looks at: the lines before the cursor's block and the cursor line."""

    context: str  # the QUERY_LINES lines before the cursor's BLOCK_LINES block
    near: str  # from the block's first line to the cursor (resolution only)
    file_text: str

    @staticmethod
    def at(text: str, offset: int) -> Query:
        before = text[:offset]
        lines = before.split("\n")
        cursor = len(lines) - 1
        block = cursor - cursor % BLOCK_LINES
        first = max(0, block - QUERY_LINES)
        context = "\n".join(lines[first:block])
        near = "\n".join(lines[block:])
        return Query(context=context, near=near, file_text=text)


# -- retrieval --------------------------------------------------------------------------


class Retriever:
    """Chooses the project context for one cursor from a ``WorkspaceIndex``."""

    def __init__(self, index: WorkspaceIndex, read: ReadText) -> None:
        self.index = index
        self._read = read

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
        candidates = self._definitions(path, query, skipped)
        candidates += self._windows(path, query, skipped)
        return select(candidates, max_chars)

    def _definitions(self, path: Path | None, query: Query, skip: set[Path]) -> list[Retrieved]:
        near_words = WORD.findall(query.context + "\n" + query.near)
        used = set(near_words)
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

        attributes = _ATTRIBUTE.findall(query.context + "\n" + query.near)
        modules_used: dict[Path, float] = {}
        if is_python:
            bindings = python_imports(query.file_text, module, is_package)
            for name, binding in bindings.items():
                if name not in used:
                    continue
                target, attr = self._resolve(binding)
                if target is None or target in skip:
                    continue
                target_entry = self.index.entry(target)
                if target_entry is None:
                    continue
                if attr is not None and attr in target_entry.definitions:
                    add_definition(target, target_entry.definitions[attr], 3.0)
                    continue
                if attr is not None:
                    continue
                uses = near_words.count(name)
                modules_used[target] = modules_used.get(target, 0.0) + uses
                for base, member in attributes:
                    if base == name and member in target_entry.definitions:
                        add_definition(target, target_entry.definitions[member], 2.0)
        # Names used nearby, defined elsewhere in the workspace (any language).
        for name in dict.fromkeys(near_words):
            if len(name) < 4 or name in own or any(k[1] == name for k in seen):
                continue
            for file, definition in self.index.find_definitions(name, limit=2):
                add_definition(file, definition, 1.0)
        for target, weight in sorted(modules_used.items(), key=lambda kv: (-kv[1], str(kv[0])))[:2]:
            target_entry = self.index.entry(target)
            if target_entry is None or not target_entry.definitions:
                continue
            relevant = {w for name in used for w in _subwords(name)}
            text = outline(target_entry.definitions, 1600, relevant)
            snippet = Snippet(self._display(target), text)
            out.append(Retrieved(Source.OUTLINE, target, -1, snippet, weight))
        return out

    def _windows(self, path: Path | None, query: Query, skip: set[Path]) -> list[Retrieved]:
        wanted = words(query.context)
        if len(wanted) < 3:
            return []
        out: list[Retrieved] = []
        for file, _ in self.index.rank_files(wanted, exclude=path, limit=4):
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
    """The best candidates that fit ``max_chars`` (best source, then score, first),
    without two pieces of the same file at the same line, in prompt order (source,
    path, line: the best source last, nearest the cursor)."""
    ranked = sorted(candidates, key=lambda r: (-int(r.source), -r.score, str(r.file), r.line))
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
