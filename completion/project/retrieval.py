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
typing inside a line changes the snippets only when a newly typed name resolves. The
snippets' prompt order is their score, the best last, nearest the cursor (ties by path
and line): the scores come from the same lines as the choice, so an order changes
where the set does (``kode bench context --keystrokes``: the same keystrokes change the
snippets as with the order by source and path).

Pure functions over text plus one ``WorkspaceIndex``; the files' text comes from the
``read`` callable (the open document's text if open, else the disk).
"""

from __future__ import annotations

import builtins
import enum
import keyword
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass
from pathlib import Path

from kode.completion.project.index_worker import WORD, Definition, words
from kode.completion.project.outline import (
    CHARS,
    Measure,
    Member,
    MemberFacts,
    outline_line,
    outline_lines,
    rank_members,
    render_outline,
    subwords,
)
from kode.completion.project.workspace import WorkspaceIndex
from kode.completion.templates import Snippet

ReadText = Callable[[Path], str | None]


BLOCK_LINES = 10  # the query's first line moves in steps of this many lines
QUERY_LINES = 30  # at least this many lines before the cursor's line make the query
WINDOW_LINES = 20  # a lexical window
WINDOW_STRIDE = 10
DEFINITION_CHARS = 400  # one definition excerpt: its header, docstring, first lines
AFTER_LINES = 6  # whole lines after the cursor's line that join the outline's query
NEAR_LINES = 12  # the context's last lines, which weigh fully in the outline's query
OUTLINE_MODULES = 6  # imported workspace modules whose members compete for the outline
OUTLINE_SHARE = 0.6  # the most of the budget the outline takes (imported definitions first)
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
    """Where a snippet comes from; higher is better (``Retrieved.score`` ranks by it)."""

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
    def order(self) -> tuple[float, str, int]:
        """Prompt order: the best last, nearest the cursor (the score, then where)."""
        return (self.score, str(self.file), self.line)


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
    after: str = ""  # the AFTER_LINES whole lines after the cursor's line

    @staticmethod
    def at(text: str, offset: int) -> Query:
        before = text[:offset]
        lines = before.split("\n")
        cursor = len(lines) - 1
        first = max(0, cursor - cursor % BLOCK_LINES - QUERY_LINES)
        end = text.find("\n", offset)
        after = "" if end < 0 else "\n".join(text[end + 1 :].split("\n", AFTER_LINES)[:AFTER_LINES])
        return Query(
            context="\n".join(lines[first:cursor]), near=lines[cursor], file_text=text, after=after
        )

    def nearness(self) -> dict[str, float]:
        """Each name of the lines around the cursor's line (not the line itself), weighed
        by how near they are: a use ``d`` lines away counts ``2 ** (-d / NEAR_LINES)``.
        So of the modules a file uses, those of the last lines rank first (sympy's
        ``from . import type_f`` just above the cursor, below six other modules used
        twice each further up); before, every use counted 1 wherever it was.

        >>> q = Query.at("a.x\\na.y\\nb.z\\n\\n", 12)
        >>> {k: round(v, 2) for k, v in q.nearness().items() if k in "ab"}
        {'a': 1.73, 'b': 0.94}
        """
        out: dict[str, float] = {}
        lines = self.context.split("\n")
        after = self.after.split("\n") if self.after else []
        for distance, line in [
            *((len(lines) - i, text) for i, text in enumerate(lines)),
            *((i + 1, text) for i, text in enumerate(after)),
        ]:
            weight = 2.0 ** (-distance / NEAR_LINES)
            for word in WORD.findall(line):
                out[word] = out.get(word, 0.0) + weight
        return out

    def relevance(self) -> dict[str, float]:
        """Sub-words (``subwords``) of the names around the cursor line, the line itself
        left out so that typing in it changes nothing: 1.0 for the last ``NEAR_LINES``
        lines before it and the lines after it, 0.5 further up.

        >>> q = Query.at("import os\\n\\ndef close_all(loop):\\n    \\n    return", 36)
        >>> sorted(q.relevance().items())
        [('all', 1.0), ('close', 1.0), ('loop', 1.0), ('os', 1.0)]
        """
        lines = self.context.split("\n")
        weights: dict[str, float] = {}
        for text, weight in (
            ("\n".join(lines[:-NEAR_LINES]), 0.5),
            ("\n".join(lines[-NEAR_LINES:]) + "\n" + self.after, 1.0),
        ):
            for word in set(WORD.findall(text)):
                if word in COMMON:
                    continue
                for part in subwords(word):
                    if len(part) >= 2:
                        weights[part] = max(weights.get(part, 0.0), weight)
        return weights


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
        budget: int,
        *,
        skip: Iterable[Path] = (),
        measure: Measure = CHARS,
    ) -> list[Retrieved]:
        """Snippets for a cursor at ``offset`` of ``text`` (the file at ``path``, if it is
        in the workspace), at most ``budget`` in all as ``measure`` counts (characters
        unless told; the engine counts the model's tokens), in prompt order. Files in
        ``skip`` (already in the prompt whole) and ``path`` itself are left out.

        The budget goes first to the definitions of the members the code near the cursor
        names through imports, up to what leaves half of it for the outline; then to the
        outline of the imported modules (their most relevant members, ``rank_members``,
        at most ``OUTLINE_SHARE`` of the budget); then to definitions found by name and
        similar windows."""
        if budget <= 0 or len(self.index) == 0:
            return []
        query = Query.at(text, offset)
        skipped = {*skip, *([path] if path is not None else [])}
        imported, by_name, modules = self._definitions(path, query, skipped)
        members = self._members(modules, query)
        shown = {(r.file, r.line) for r in imported}
        members = [m for m in members if (m.file, m.definition.line) not in shown]
        half = budget // 2
        outline_need = 0
        if sum(len(outline_line(m.definition)) for m in members) < half * measure.most_chars:
            for m in members:  # it may need less than half: count as far as half
                if outline_need >= half:
                    break
                outline_need += measure.text(outline_line(m.definition))
        else:
            outline_need = half  # sure to need it all, known without counting
        first = select(imported, budget - min(outline_need, half), measure)
        used = _cost(first, measure)
        outline_budget = min(budget - used, int(budget * OUTLINE_SHARE))
        outlines = self._outlines(members, outline_budget, measure)
        used += _cost(outlines, measure)
        if budget - used <= measure.header(""):
            return sorted([*first, *outlines], key=lambda r: r.order)  # full: no windows
        rest = select([*by_name, *self._windows(path, query, skipped)], budget - used, measure)
        return sorted([*first, *outlines, *rest], key=lambda r: r.order)

    def _definitions(
        self, path: Path | None, query: Query, skip: set[Path]
    ) -> tuple[list[Retrieved], list[Retrieved], dict[Path, MemberFacts]]:
        """Definitions of the names near the cursor: those resolved through imports and
        those found by name; and the imported workspace modules, for the outline."""
        near_text = query.context + "\n" + query.near
        near_words = WORD.findall(near_text)
        used = set(near_words)
        around = query.nearness()
        entry = None if path is None else self.index.entry(path)
        own = entry.definitions if entry is not None else {}
        module = None if entry is None else entry.module
        is_package = path is not None and path.stem == "__init__"
        is_python = path is None or path.suffix in (".py", ".pyi")
        imported: list[Retrieved] = []
        by_name: list[Retrieved] = []
        seen: set[tuple[Path, str]] = set()

        def add_definition(
            into: list[Retrieved], file: Path, definition: Definition, score: float
        ) -> None:
            if file in skip or (file, definition.name) in seen:
                return
            body = self._read(file)
            if body is None:
                return
            excerpt = definition_excerpt(body, definition, DEFINITION_CHARS)
            if excerpt:
                seen.add((file, definition.name))
                snippet = Snippet(self._display(file), excerpt)
                into.append(Retrieved(Source.DEFINITION, file, definition.line, snippet, score))

        attributes = _ATTRIBUTE.findall(near_text)
        modules: dict[Path, MemberFacts] = {}
        if is_python:
            file_attributes = _ATTRIBUTE.findall(query.file_text)
            file_words = Counter(WORD.findall(query.file_text))
            for name, binding in python_imports(query.file_text, module, is_package).items():
                target, attr = self._resolve(binding)
                if target is None or target in skip or target == path:
                    continue
                target_entry = self.index.entry(target)
                if target_entry is None:
                    continue
                definitions = target_entry.definitions
                if attr is not None:
                    if name in used and attr in definitions:
                        add_definition(imported, target, definitions[attr], _RANK_IMPORTED)
                    continue
                # A module: its members compete for the outline, weighted by how often
                # and how near the cursor the code around it (else the file) names it; a
                # module imported and not used yet still counts: its use may be the line
                # being written.
                uses = around.get(name, 0.0)
                weight = uses + 1.0 if uses else 0.01 * file_words[name]
                lines = {
                    definitions[m].line
                    for b, m in file_attributes
                    if b == name and m in definitions
                }
                known = modules.get(target, MemberFacts())
                modules[target] = MemberFacts(
                    max(known.weight, weight), known.used_lines | frozenset(lines)
                )
                for base, member in attributes:
                    if base == name and member in definitions:
                        add_definition(imported, target, definitions[member], _RANK_IMPORTED)
        # Names used nearby, defined elsewhere in the workspace (any language).
        found = 0
        for name in dict.fromkeys(near_words):
            if found >= 3:
                break
            if len(name) < 4 or name in own or any(k[1] == name for k in seen):
                continue
            for file, definition in self.index.find_definitions(name, limit=1):
                add_definition(by_name, file, definition, _RANK_BY_NAME)
                found += 1
        return imported, by_name, modules

    def _members(self, modules: dict[Path, MemberFacts], query: Query) -> list[Member]:
        """The top-level members of the (at most ``OUTLINE_MODULES``) imported modules the
        code uses most, ranked (``rank_members``)."""
        ranked = sorted(modules.items(), key=lambda kv: (-kv[1].weight, str(kv[0])))
        candidates: list[tuple[Path, Definition]] = []
        for target, _ in ranked[:OUTLINE_MODULES]:
            target_entry = self.index.entry(target)
            if target_entry is not None:
                candidates += [
                    (target, d) for n, d in target_entry.definitions.items() if "." not in n
                ]
        counts = self.index.file_counts({d.name for _, d in candidates})
        facts = {
            target: MemberFacts(fact.weight, fact.used_lines, counts)
            for target, fact in ranked[:OUTLINE_MODULES]
        }
        file_words = set(WORD.findall(query.file_text))
        return rank_members(candidates, query.relevance(), facts, file_words)

    def _outlines(
        self, members: Sequence[Member], budget: int, measure: Measure = CHARS
    ) -> list[Retrieved]:
        """One outline snippet per module, holding its best members that fit."""
        if budget <= 0:
            return []
        best: dict[Path, float] = {}
        for m in members:
            best.setdefault(m.file, m.score)
        out: list[Retrieved] = []
        chosen = outline_lines(members, budget, self._display, measure)
        for file, definitions in chosen.items():
            snippet = Snippet(self._display(file), render_outline(definitions))
            out.append(
                Retrieved(Source.OUTLINE, file, -1, snippet, _RANK_OUTLINE + 0.01 * best[file])
            )
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


def _cost(items: Iterable[Retrieved], measure: Measure = CHARS) -> int:
    """What ``select`` counts for ``items``."""
    return sum(measure.piece(r.snippet) for r in items)


def select(
    candidates: Sequence[Retrieved], budget: int, measure: Measure = CHARS
) -> list[Retrieved]:
    """The best-scored candidates that fit ``budget``, without two pieces of the same
    file at the same line, in prompt order (``Retrieved.order``: the best last, nearest
    the cursor)."""
    ranked = sorted(candidates, key=lambda r: (-r.score, str(r.file), r.line))
    chosen: list[Retrieved] = []
    places: set[tuple[Path, int]] = set()
    used = 0
    for item in ranked:
        if (item.file, item.line) in places or measure.cannot_fit(item.snippet, budget - used):
            continue  # sure not to fit: not worth counting its tokens (~1 us a character)
        cost = measure.piece(item.snippet)
        if used + cost > budget:
            continue
        chosen.append(item)
        places.add((item.file, item.line))
        used += cost
    chosen.sort(key=lambda r: r.order)
    return chosen
