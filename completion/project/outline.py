"""What a snippet costs in the prompt (``Measure``), and the outline of imported workspace
modules: their members ranked by what the code around the cursor points to, and the best
that fit a budget, one header line each. Pure functions; ``retrieval.py`` uses them to
choose the project context."""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass
from pathlib import Path

from kode.completion.project.index_worker import WORD, Definition
from kode.completion.templates import Snippet

HEADER_CHARS = 100  # one outline line at most
_MAX_MISFITS = 8  # outline members in a row that do not fit: the outline is full


@dataclass(frozen=True, slots=True)
class Measure:
    """What the budget counts: a snippet's ``text`` and its framing (``header``, the
    ``<|file_sep|>`` line naming ``path``). ``CHARS`` counts characters (a rough stand-in:
    Python runs ~3.3 characters a token, an outline of numeric constants fewer); the
    engine counts the model's tokens (``Measure.tokens``), so that what is chosen is what
    fits, and the context need not cut the best pieces afterwards."""

    text: Callable[[str], int]
    header: Callable[[str], int]
    # At most this many characters per unit: a text longer than ``room * most_chars``
    # cannot fit ``room``, known without counting it (Qwen2.5 counts every digit and
    # most words of code as one or two tokens: ~3.3 characters a token for Python).
    most_chars: int = 1

    @staticmethod
    def tokens(count: Callable[[str], int]) -> Measure:
        """Real tokens: the framing costs what ``context._project_snippets`` charges."""
        return Measure(count, _token_header, _MOST_CHARS_PER_TOKEN)

    def cannot_fit(self, snippet: Snippet, room: int) -> bool:
        """Whether ``snippet`` is sure not to fit ``room`` (``piece`` not counted)."""
        left = room - self.header(snippet.path)
        return left <= 0 or len(snippet.text) > left * self.most_chars

    def piece(self, snippet: Snippet) -> int:
        return self.text(snippet.text) + self.header(snippet.path)


def _char_header(path: str) -> int:
    return len(path) + 16


def _token_header(_path: str) -> int:
    return SNIPPET_HEADER_TOKENS


SNIPPET_HEADER_TOKENS = 8  # the file header a snippet costs in the prompt (context.py too)
_MOST_CHARS_PER_TOKEN = 8  # long runs of indentation are single tokens; code averages 3.3
CHARS = Measure(len, _char_header)


@dataclass(frozen=True, slots=True)
class Member:
    """A top-level definition of an imported workspace module, a candidate outline line."""

    file: Path
    definition: Definition
    score: float = 0.0


@dataclass(frozen=True, slots=True)
class MemberFacts:
    """What ranks a module's members besides the code around the cursor."""

    weight: float = 0.0  # how much the code around the cursor uses the module
    used_lines: frozenset[int] = frozenset()  # lines of the members this file names
    files_with: dict[str, int] | None = None  # name -> indexed files holding it


def rank_members(
    members: Sequence[tuple[Path, Definition]],
    relevant: dict[str, float],
    facts: dict[Path, MemberFacts],
    file_words: Set[str] = frozenset(),
) -> list[Member]:
    """Top-level members of the imported modules, best first, for the outline.

    The name is not written yet when the hole is ``module.<name>``, so what can point
    to it is the code around the cursor: the score is the sum, over the name's
    sub-words found there (``relevant``'s weights), of their rarity among all the
    candidates' names (idf), plus a third of that for the header's other sub-words (its
    parameters, its value). Then small terms: the name is written in other files of the
    workspace (it is the module's API; a private name only counts when it is), it is
    defined within 5 lines of a member this file already uses (families of constants and
    helpers), the module is used near the cursor; and a name this file already writes
    is worth less (the model sees it).

    >>> p = Path("m.py")
    >>> ms = [(p, Definition(n, i, f"def {n}():")) for i, n in enumerate(
    ...     ["get_task", "all_tasks", "_helper", "cancel_timer"])]
    >>> [m.definition.name for m in rank_members(ms, {"cancel": 1.0, "all": 1.0,
    ...     "tasks": 1.0, "loop": 1.0}, {p: MemberFacts()})]
    ['all_tasks', 'cancel_timer', 'get_task', '_helper']
    """
    if not members:
        return []
    parts = {d.name: subwords(d.name) for _, d in members}
    df = Counter(part for name_parts in parts.values() for part in name_parts)
    n = len(members)

    def idf(part: str) -> float:
        return math.log(1.0 + n / df.get(part, 1))

    out: list[Member] = []
    for file, d in members:
        fact = facts.get(file, MemberFacts())
        own = parts[d.name]
        score = sum(idf(p) * relevant[p] for p in own if p in relevant)
        header = _header_parts(d.header) - own
        score += sum(idf(p) * relevant[p] for p in header if p in relevant) / 3
        elsewhere = max(((fact.files_with or {}).get(d.name, 1)) - 1, 0)
        score += 0.5 * math.log1p(elsewhere)
        if d.name.startswith("_") and not elsewhere:
            score -= 1.0
        if any(abs(d.line - line) <= 5 for line in fact.used_lines):
            score += 1.0
        if d.name in file_words:
            score -= 0.5
        score += 0.5 * math.log1p(fact.weight)
        out.append(Member(file, d, score))
    out.sort(key=lambda m: (-m.score, str(m.file), m.definition.line))
    return out


def outline_lines(
    members: Iterable[Member],
    budget: int,
    label: Callable[[Path], str] = Path.as_posix,
    measure: Measure = CHARS,
) -> dict[Path, list[Definition]]:
    """The best members that fit ``budget`` (one header line each, cut to
    ``HEADER_CHARS``; a file's ``label`` framing once per file, as ``select`` counts
    them), per file in file order. Shorter members further down the ranking fill what a
    longer one left, until ``_MAX_MISFITS`` in a row do not fit (counting a member's
    tokens is the cost: ~70 us each with Qwen2.5's tokenizer)."""
    chosen: dict[Path, list[Definition]] = {}
    labels: dict[Path, int] = {}
    used = misfits = 0
    for member in members:
        if budget - used < 2 or misfits >= _MAX_MISFITS:
            break
        file = member.file
        line = outline_line(member.definition)
        if len(line) > (budget - used) * measure.most_chars:
            misfits += 1  # sure not to fit, known without counting
            continue
        cost = measure.text(line)
        if file not in chosen:
            if file not in labels:
                labels[file] = measure.header(label(file))
            cost += labels[file]
        if used + cost > budget:
            misfits += 1
            continue
        misfits = 0
        chosen.setdefault(file, []).append(member.definition)
        used += cost
    for definitions in chosen.values():
        definitions.sort(key=lambda d: d.line)
    return chosen


def render_outline(definitions: Iterable[Definition]) -> str:
    """One line per definition: its header, cut to ``HEADER_CHARS``."""
    return "".join(outline_line(d) for d in definitions)


def outline_line(definition: Definition) -> str:
    """A definition's line in an outline: its header, cut to ``HEADER_CHARS``."""
    return definition.header[:HEADER_CHARS].rstrip() + "\n"


@functools.lru_cache(maxsize=8192)
def _header_parts(header: str) -> frozenset[str]:
    return frozenset(p for w in WORD.findall(header) for p in subwords(w))


@functools.lru_cache(maxsize=8192)
def subwords(name: str) -> frozenset[str]:
    parts = re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+", name)
    return frozenset(p.lower() for p in parts)
