"""The next edit where it repeats a recent one, found without a model.

People repeat edits: they rename a name, then fix its other uses; they add an argument to
one call, then to the next. Where a recent hunk of the history is such an edit, the next
one is found by matching tokens (issue 49, item 2: "propose it without the model"). Each
recent hunk of the last one's document is a template, the last one first; for each, the
first rule that applies:

0. **Lines.** The hunk only inserted or only deleted whole lines: ``lines.line_repeats``.
1. **Rename.** Every token the hunk changed is one name replaced by another, the same
   pair each time (``n`` -> ``count``), and the edit looks like a rename rather than a
   fix of one use: the new name is new to the document (and neither name begins the
   other: ``coun`` may be ``count`` half typed), or the edit is at a binding
   (``count =``, ``def f(count)``, ``let count``; not an import line: ``import typing``
   -> ``import json`` replaced a module), or another recent hunk made the same rename.
   Proposed: the old name at another use, a whole name (renaming ``n`` leaves ``number``
   alone), a member only where the edited one was one (``obj.n`` is not the local
   ``n``; ``self.n`` follows ``self`` only; both where both were renamed, and
   ``self.n = n`` follows its parameter), never in a string or a comment.
2. **Substitution.** The tokens the hunk changed, with their context, become a pattern.
   A change inside a call's brackets takes the whole call (``foo(a)`` -> ``foo(a, b)``;
   ``self.`` before it too: ``self.state.foo(`` is another call); any other takes one
   token of context before it (and one after, for an insertion), and where it ended its
   line, matches only where one ends a line (``deps = sphinx`` is not ``sphinx-build``).
   A bracket's contents found unchanged in the result are a hole that matches any
   contents: the whole list where it was kept whole (so the added argument is appended
   to ``foo(x, y)`` too), else one argument. Spaces the hunk replaced (``a b`` ->
   ``a-b``) are replaced too. Lines added after a token or two of context are new code,
   no pattern; lines added in a rewrite repeat where the replaced text has the hunk's
   layout. Proposed: the pattern's next match, with the holes' text carried over; a
   match already in the result's form is skipped. Where that pattern matches nowhere,
   narrower context is tried (``_Context``: the replaced tokens alone, then the one
   token after them), only where the replaced tokens name something alone.
3. **Words.** A hunk that changed only strings or comments: the words changed inside
   them, with their neighbours (``words.inner_repeats``).

Where the last hunk has none of these, or no match: the same line elsewhere changed the
same way (``lines.same_lines``).

Where: the nearest place after the cursor (one holding the cursor counts), from any
template, the newer first at one place; else, for a rename of the last hunk, the nearest
before it. The places of one statement are one edit (``a(n, n)`` -> ``a(m, m)``), and
those on adjacent lines too where the hunk was made so. Never a span a recent hunk
changed; never an edit that undoes a recent hunk (its changed tokens that hunk's,
reversed); nothing after an undo (the last hunk reverses the one before it; a redo also
reads as one); never an edit the person took back at once (``undone``). Nothing, rather
than something wrong, when no template repeats, when a
pattern is too generic (under two fixed tokens, or no name, number or string among
them), or when the history does not match the text. Offsets are code points into the
text given.

    >>> from kode.completion.edits.history import EditHistory
    >>> history = EditHistory()
    >>> text = "def f(n):\\n    total = n * 2\\n    return n + total\\n"
    >>> history.record_offsets("file:///a.py", text, 6, 7, "count", version=2, now=0.0)
    >>> text = "def f(count):\\n    total = n * 2\\n    return n + total\\n"
    >>> edit = propose_repeat(history.hunks(), "file:///a.py", text, cursor=12)
    >>> edit.kind.value, edit.start, text[edit.start:edit.end], edit.text
    ('rename', 26, 'n', 'count')

    >>> history = EditHistory()
    >>> text = "a = area(w)\\nb = area(w2, h2)\\n"
    >>> history.record_offsets("file:///b.py", text, 10, 10, ", unit", version=2, now=0.0)
    >>> text = "a = area(w, unit)\\nb = area(w2, h2)\\n"
    >>> edit = propose_repeat(history.hunks(), "file:///b.py", text, cursor=17)
    >>> edit.kind.value, text[:edit.start] + edit.text + text[edit.end:]
    ('substitution', 'a = area(w, unit)\\nb = area(w2, h2, unit)\\n')
"""

from __future__ import annotations

import bisect
import difflib
import enum
import keyword
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kode.completion.edits.history import Hunk, common_prefix, common_suffix
from kode.completion.edits.lines import line_repeats, same_lines
from kode.completion.edits.tokens import Kind, Token, tokenize
from kode.completion.edits.words import inner_repeats

# How many hunks back a rename is confirmed, and an undone edit looked for.
RECENT = 8
# A pattern longer than this (in tokens) is a rewrite, not an edit to repeat.
MAX_PATTERN = 48
# A change that adds lines repeats only where it replaced at least this many tokens
# (a statement rewritten); lines added after a token of context are new code.
MIN_REWRITE = 4
# Repeats on adjacent lines are proposed as one edit of at most this many lines.
GROUP_LINES = 4
# A hunk of at most this many changes apart is tried change by change.
MAX_CHANGES = 3
# Places kept on each side of the cursor (the filters and the grouping look at no more).
WINDOW = 64
# A hole spans at most this many tokens (one call's arguments, not a file).
MAX_HOLE = 200


class RepeatKind(enum.Enum):
    RENAME = "rename"
    SUBSTITUTION = "substitution"
    LINES = "lines"
    WORDS = "words"  # a change inside strings or comments (``words.inner_repeats``)


@dataclass(frozen=True, slots=True)
class RepeatEdit:
    """Replace ``[start:end]`` of the text with ``text`` (the smallest such edit)."""

    start: int
    end: int
    text: str
    kind: RepeatKind


_PAIRS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = frozenset(_PAIRS.values())
_MEMBER = frozenset({".", "->", "::", "?."})
# Names that are no rename's subject: keywords of Python and of the usual C-like languages.
_KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | {
    "self", "cls", "this", "super", "true", "false", "null", "nil", "undefined", "new",
    "function", "func", "fn", "var", "let", "const", "mut", "static", "public", "private",
    "protected", "struct", "enum", "interface", "impl", "switch", "default", "do", "goto",
    "int", "float", "double", "char", "bool", "void", "string", "typeof", "instanceof",
    "package", "extends", "implements", "throw", "throws", "catch", "go", "defer", "chan",
}  # fmt: skip
# A name is bound after these, or before ``=`` / ``:=``, or on a line that begins with
# one of ``_HEADERS`` (a parameter list, a loop variable).
_BINDERS = frozenset({"def", "class", "let", "var", "const", "mut", "fn", "func", "function",
                      "as", "struct", "enum", "type", "interface", "import"})  # fmt: skip
_HEADERS = frozenset({"def", "async", "fn", "func", "function", "class", "for", "lambda",
                      "pub", "static", "export"})  # fmt: skip
_ASSIGN = frozenset({"=", ":="})
_IMPORTS = frozenset({"import", "from"})
# A member of these is the object's own: ``self.n`` renamed is no rename of ``other.n``.
_OWN = frozenset({"self", "this", "cls"})


def propose_repeat(
    hunks: Sequence[Hunk], uri: str, text: str, cursor: int, undone: Sequence[Hunk] = ()
) -> RepeatEdit | None:
    """The edit that repeats one of the recent ``hunks`` (newest last) in ``text`` (the
    current text of document ``uri``, the cursor at code-point offset ``cursor``), or None.
    ``undone``: edits taken back at once (``EditHistory.undone``); none is proposed again
    unless a hunk made since has made it anew."""
    if not hunks:
        return None
    last, recent = hunks[-1], hunks[-RECENT:-1]
    core = _core(last.before, last.after, last.uri)
    if not core[0] and not core[1]:
        return None  # only whitespace changed
    earlier = [h for h in recent if h.uri == last.uri]
    if earlier and _core(earlier[-1].before, earlier[-1].after, last.uri) == (core[1], core[0]):
        return None  # an undo (or a redo): the user is going back and forth
    if uri == last.uri and text[last.start : last.end] != last.after:
        return None  # the history is not of this text
    tokens = tokenize(text, uri)
    templates = [last, *reversed(earlier)]  # newest first
    zones = [
        _changed_span(h) for h in templates if h.uri == uri and text[h.start : h.end] == h.after
    ]
    reversals = {
        (h_core[1], h_core[0])
        for h_core in (_core(h.before, h.after, h.uri) for h in hunks[-RECENT:])
    }
    for u in undone[-RECENT:]:  # taken back, unless made again since
        u_core = _core(u.before, u.after, u.uri)
        if not any(
            h.last_at > u.last_at and _core(h.before, h.after, h.uri) == u_core for h in hunks
        ):
            reversals.add(u_core)
    ahead: list[tuple[int, int, RepeatEdit]] = []
    behind: list[RepeatEdit] = []
    memo: _Memo = {}  # a pattern's matches: recent hunks often make the same edit
    window = _lines_back(text, cursor, GROUP_LINES)
    depths: list[int] = []
    undoes: dict[tuple[str, str], bool] = {}

    def undoing(old: str, new: str) -> bool:
        if (old, new) not in undoes:
            undoes[old, new] = _core(old, new, uri) in reversals
        return undoes[old, new]

    for age, template in enumerate(templates):
        others = [h for h in templates if h is not template]
        found = _repeats(
            template, others, text, tokens, memo, same=template.uri == uri, last=not age
        )

        def kept(e: RepeatEdit) -> bool:
            return not any(
                e.start <= z_end and e.end >= z_start for z_start, z_end in zones
            ) and not undoing(text[e.start : e.end], e.text)

        # Only the places near the cursor, and the nearest before it, can be proposed: the
        # filters and the grouping look at those (a file may hold thousands of matches).
        found.sort(key=lambda e: (e.start, e.end))
        split = bisect.bisect_left([e.start for e in found], window)
        edits = [*_first(reversed(found[:split]), kept)][::-1] + _first(found[split:], kept)
        if edits and not depths:
            depths = _depths(tokens)
        # a change inside comments joins the next line's only (each line is a comment)
        lines = _on_lines(template) or any(e.kind is RepeatKind.WORDS for e in edits)
        for edit in _grouped(edits, text, tokens, lines=lines, depths=depths):
            if edit.end >= cursor:
                ahead.append((edit.start, age, edit))
            elif age == 0 and edit.kind is RepeatKind.RENAME:
                behind.append(edit)  # a rename reaches every use, above too
    if ahead:
        return min(ahead, key=lambda item: item[:2])[2]
    return max(behind, key=lambda e: e.start, default=None)


def _first(edits: Iterable[RepeatEdit], keep: Callable[[RepeatEdit], bool]) -> list[RepeatEdit]:
    """The first ``WINDOW`` of ``edits`` that ``keep`` keeps."""
    out: list[RepeatEdit] = []
    for edit in edits:
        if keep(edit):
            out.append(edit)
            if len(out) >= WINDOW:
                break
    return out


def _lines_back(text: str, at: int, count: int) -> int:
    """Where the line ``count`` lines above the one holding offset ``at`` begins."""
    start = text.rfind("\n", 0, at)
    for _ in range(count):
        if start < 0:
            break
        start = text.rfind("\n", 0, start)
    return start + 1


def _repeats(
    template: Hunk,
    others: Sequence[Hunk],
    text: str,
    tokens: Sequence[Token],
    memo: _Memo,
    *,
    same: bool,
    last: bool,
) -> list[RepeatEdit]:
    """Each place where ``template`` repeats (lines inserted or deleted: ``lines``; else
    rule 1, else rule 2), not yet grouped."""
    found_lines = line_repeats(template, text)
    if found_lines is not None:
        return [RepeatEdit(start, end, new, RepeatKind.LINES) for start, end, new in found_lines]
    rename = _rename(template, others, tokens, same=same)
    if rename is not None:
        old, new, member, receiver = rename
        return [
            RepeatEdit(t.start, t.end, new, RepeatKind.RENAME)
            for i, t in enumerate(tokens)
            if t.kind is Kind.NAME
            and t.text == old
            and (
                (
                    (member is None or _is_member(tokens, i) == member)
                    and (not receiver or (i > 1 and tokens[i - 2].text == receiver))
                )
                or (member is False and _stored(tokens, i))
            )
        ]
    found = []
    for context in _Context:
        pattern = _pattern(template.before, template.after, template.uri, context)
        found = [] if pattern is None else _matches(pattern, text, tokens, memo)
        if found:
            break
    if not found and (inner := inner_repeats(template, text, tokens)):
        return [RepeatEdit(start, end, new, RepeatKind.WORDS) for start, end, new in inner]
    if not found:
        found = _each_change(template, text, tokens, memo)
    if not found and last:  # too plain a pattern, or none: the same line elsewhere
        found = same_lines(template, text)
    return [RepeatEdit(start, end, new, RepeatKind.SUBSTITUTION) for start, end, new in found]


def _matches(
    pattern: _Pattern, text: str, tokens: Sequence[Token], memo: _Memo
) -> list[tuple[int, int, str]]:
    if pattern not in memo:
        memo[pattern] = pattern.matches(text, tokens)
    return memo[pattern]


def _each_change(
    hunk: Hunk, text: str, tokens: Sequence[Token], memo: _Memo
) -> list[tuple[int, int, str]]:
    """Where a hunk of two or three changes apart (``Dict`` -> ``MutableMapping`` and
    ``Coroutine[...]`` -> ``Awaitable[...]`` on one line) has no pattern as a whole: each
    change as its own pattern, proposed only where all of them match in one statement
    (one of them alone is a part of the edit, and often not one to make)."""
    b, a = tokenize(hunk.before, hunk.uri), tokenize(hunk.after, hunk.uri)
    matcher = difflib.SequenceMatcher(None, [t.text for t in b], [t.text for t in a], False)
    changes = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    if not 2 <= len(changes) <= MAX_CHANGES:
        return []
    parts: list[list[tuple[int, int, str]]] = []
    for _, i1, i2, j1, j2 in changes:
        start = b[i1 - 1].end if i1 > 0 else 0
        end = b[i2 - 1].end if i2 > i1 else start
        new = hunk.after[a[j1 - 1].end if j1 > 0 else 0 : a[j2 - 1].end] if j2 > j1 else ""
        if i2 > i1 and j2 > j1:  # a replacement: from the first token replaced, not the space
            start, new = b[i1].start, hunk.after[a[j1].start : a[j2 - 1].end]
        pattern = _pattern(hunk.before, hunk.before[:start] + new + hunk.before[end:], hunk.uri)
        if pattern is None:
            return []
        parts.append(_matches(pattern, text, tokens, memo))
    edits = [
        RepeatEdit(start, end, new, RepeatKind.SUBSTITUTION)
        for part in parts
        for start, end, new in part
    ]
    return [
        (group.start, group.end, group.text)
        for group in _grouped(edits, text, tokens)
        if all(any(group.start <= s and e <= group.end for s, e, _ in part) for part in parts)
    ]


def _grouped(
    edits: Sequence[RepeatEdit],
    text: str,
    tokens: Sequence[Token],
    *,
    lines: bool = False,
    depths: Sequence[int] = (),
) -> list[RepeatEdit]:
    """The edits, those of one statement made one: on one line, or on the lines of one
    bracketed expression (``lines``: on adjacent lines, as the hunk repeated was made),
    up to ``GROUP_LINES`` lines (a person repeats an edit at every place of a statement
    in one go; a diff shows them as one hunk).

    >>> text = "a = n + n\\nb = f(n,\\n      n)\\nc = n\\n"
    >>> edits = [RepeatEdit(i, i + 1, "m", RepeatKind.RENAME) for i in (4, 8, 16, 25, 32)]
    >>> [(e.start, e.end, e.text) for e in _grouped(edits, text, tokenize(text))]
    [(4, 9, 'm + m'), (16, 26, 'm,\\n      m'), (32, 33, 'm')]
    """
    out: list[RepeatEdit] = []
    first_line = 0
    starts = [t.start for t in tokens]
    line, counted = 0, 0
    for edit in sorted(edits, key=lambda e: (e.start, e.end)):
        line += text.count("\n", counted, edit.start)
        counted = edit.start
        if out:
            prev = out[-1]
            if edit.start < prev.end:
                continue  # overlapping matches: the first one stands
            between = text[prev.end : edit.start]
            if "\n" in between and not depths and not lines:
                depths = _depths(tokens)
            lo, hi = bisect.bisect_left(starts, prev.end), bisect.bisect_left(starts, edit.start)
            joined = "\n" not in between or (
                between.count("\n") <= 1 if lines else min(depths[lo : hi + 1]) > 0
            )
            if joined and (line - first_line < GROUP_LINES):
                out[-1] = RepeatEdit(
                    prev.start, edit.end, prev.text + between + edit.text, prev.kind
                )
                continue
        out.append(edit)
        first_line = line
    return out


def _on_lines(hunk: Hunk) -> bool:
    """Whether ``hunk`` changed several lines, each in its place (none added or removed).

    >>> _on_lines(_example_hunk("a = n\\nb = n", "a = m\\nb = m"))
    True
    >>> _on_lines(_example_hunk("a = n\\nb = n", "a = m\\nb = n"))
    False
    """
    before, after = hunk.before.split("\n"), hunk.after.split("\n")
    if len(before) != len(after):
        return False
    return sum(b != a for b, a in zip(before, after, strict=True)) > 1


def _example_hunk(before: str, after: str) -> Hunk:
    return Hunk("file:///a.py", 0, 0, before, after, (), (), 1, 0.0, 0.0)


def _depths(tokens: Sequence[Token]) -> list[int]:
    """How many brackets are open before each token (and after the last)."""
    out, depth = [], 0
    for token in tokens:
        out.append(depth)
        if token.text in _PAIRS:
            depth += 1
        elif token.text in _CLOSERS:
            depth = max(0, depth - 1)
    out.append(depth)
    return out


def _rename(
    last: Hunk, recent: Sequence[Hunk], tokens: Sequence[Token], *, same: bool
) -> tuple[str, str, bool | None, str] | None:
    """Rule 1: (old name, new name, whether it is a member (None: both were renamed), the
    receiver where it is the object's own (``self.n``: ``self``; else "")) if the hunk is
    a rename;
    ``tokens``: the document's, ``same``: whether it is the hunk's document."""
    renamed = _renamed(last.before, last.after, last.uri)
    if renamed is None:
        return None
    (old, new), sites, after = renamed
    if old in _KEYWORDS or new in _KEYWORDS:
        return None
    members = {_is_member(after, i) for i in sites}
    # New to the document: not used outside the hunk (anywhere, in another document). A
    # name that one is the start of the other (``coun`` for ``count``) may be half typed
    # or half deleted: that alone is no rename.
    fresh = not (new.startswith(old) or old.startswith(new)) and not any(
        t.kind is Kind.NAME and t.text == new and not (same and last.start <= t.start < last.end)
        for t in tokens
    )
    bound = any(_binds(after, i, last.after) for i in sites)
    confirmed = any(
        (r := _renamed(h.before, h.after, h.uri)) is not None and r[0] == (old, new) for h in recent
    )
    if not (fresh or bound or confirmed):
        return None
    if not confirmed and any(_line_head(after, i, last.after) in _IMPORTS for i in sites):
        return None  # an import replaced by another (``typing`` -> ``json``) renames nothing
    receivers = {after[i - 2].text if i > 1 and members == {True} else "" for i in sites}
    receiver = receivers.pop() if len(receivers) == 1 else ""
    return (
        old,
        new,
        members.pop() if len(members) == 1 else None,
        receiver if receiver in _OWN else "",
    )


def _renamed(
    before: str, after: str, uri: str
) -> tuple[tuple[str, str], list[int], list[Token]] | None:
    """The one (old, new) name pair if every changed token is a name replaced by another,
    with the indexes of the new names among ``after``'s tokens (and those tokens)."""
    b, a = tokenize(before, uri), tokenize(after, uri)
    matcher = difflib.SequenceMatcher(None, [t.text for t in b], [t.text for t in a], False)
    pairs: set[tuple[str, str]] = set()
    sites: list[int] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag != "replace" or i2 - i1 != j2 - j1:
            return None
        for old, new, j in zip(b[i1:i2], a[j1:j2], range(j1, j2), strict=True):
            if old.kind is not Kind.NAME or new.kind is not Kind.NAME:
                return None
            pairs.add((old.text, new.text))
            sites.append(j)
    if len(pairs) != 1:
        return None
    return pairs.pop(), sites, a


def _binds(tokens: Sequence[Token], i: int, text: str) -> bool:
    """Whether name ``tokens[i]`` is bound there: after a binding keyword, before ``=``,
    or on a line that begins with a header keyword (``def``, ``for``...)."""
    if i > 0 and tokens[i - 1].text in _BINDERS:
        return True
    if i + 1 < len(tokens) and tokens[i + 1].text in _ASSIGN:
        return True
    return _line_head(tokens, i, text) in _HEADERS


def _line_head(tokens: Sequence[Token], i: int, text: str) -> str:
    """The first token of the line ``tokens[i]`` is on."""
    line_start = max(text.rfind("\n", 0, tokens[i].start), text.rfind("\r", 0, tokens[i].start))
    return next(t for t in tokens if t.start > line_start).text


def _stored(tokens: Sequence[Token], i: int) -> bool:
    """Whether ``tokens[i]`` is the attribute of ``self.x = x`` (a parameter stored under
    its own name: renaming the one renames the other)."""
    return (
        1 < i < len(tokens) - 2
        and tokens[i - 1].text in _MEMBER
        and tokens[i - 2].text in _OWN
        and tokens[i + 1].text == "="
        and tokens[i + 2].text == tokens[i].text
    )


def _is_member(tokens: Sequence[Token], i: int) -> bool:
    return i > 0 and tokens[i - 1].text in _MEMBER


class _Hole(NamedTuple):
    """A pattern's hole: ``whole``, a bracket's contents; else one argument."""

    slot: int
    whole: bool


_Element = str | _Hole
_Span = tuple[int, int]  # tokens [first, end) that one element of a pattern matched


class _Mode(enum.Enum):
    """What the changed part of a pattern does: tokens replaced by others, tokens deleted,
    or tokens inserted where there were none."""

    REPLACE = "replace"
    DELETE = "delete"
    INSERT = "insert"


@dataclass(frozen=True, slots=True)
class _Pattern:
    """Rule 2: tokens (and holes) to find, the tokens they become, and the new text of
    the part that changes (the elements between the ``head`` and ``tail`` both share):
    ``texts`` of the hunk's, with the text each hole of ``slots`` took between them. Only
    that part is rewritten, so a match keeps its own layout around it. An insertion goes right
    after the shared head, or right before the shared tail where the hunk put it there
    (``= fetch`` -> ``= await fetch``)."""

    before: tuple[_Element, ...]
    after: tuple[_Element, ...]
    head: int
    tail: int
    mode: _Mode
    texts: tuple[str, ...]  # one more than ``slots``
    slots: tuple[int, ...]
    before_tail: bool = False
    line_end: bool = False  # the hunk's match ended its line: so must another
    # Where it adds lines: the line breaks of the text it replaced (a match must have as
    # many: the layout it rewrites is the hunk's); else -1.
    breaks: int = -1

    def matches(self, text: str, tokens: Sequence[Token]) -> list[tuple[int, int, str]]:
        """Each place the pattern matches and is not in its result's form yet, as the
        edit (start, end, new text)."""
        closers = _closers(tokens)
        found = []
        for i, token in enumerate(tokens):
            if token.text != self.before[0]:
                continue
            spans = _match(self.before, tokens, closers, i)
            if spans is None or (self.line_end and not _ends_line(text, tokens[spans[-1][1] - 1])):
                continue
            if _match(self.after, tokens, closers, i) is None:
                edit = self._edit(text, tokens, spans)
                if self.breaks < 0 or _breaks(text[edit[0] : edit[1]]) == self.breaks:
                    found.append(edit)
        return found

    def _edit(
        self, text: str, tokens: Sequence[Token], spans: Sequence[_Span]
    ) -> tuple[int, int, str]:
        holes = {
            e.slot: span for e, span in zip(self.before, spans, strict=True) if isinstance(e, _Hole)
        }
        new = self.texts[0]
        for slot, piece in zip(self.slots, self.texts[1:], strict=True):
            first, end = holes[slot]
            new += text[tokens[first].start : tokens[end - 1].end] + piece
        last = len(self.before) - self.tail  # the first element of the shared tail
        head_end = (
            tokens[spans[self.head - 1][1] - 1].end if self.head else tokens[spans[0][0]].start
        )
        tail_start = tokens[spans[last][0]].start if self.tail else tokens[spans[-1][1] - 1].end
        if self.mode is _Mode.REPLACE:
            return tokens[spans[self.head][0]].start, tokens[spans[last - 1][1] - 1].end, new
        if self.mode is _Mode.DELETE:
            return head_end, tail_start, new
        at = tail_start if self.before_tail else head_end
        return at, at, new


_Memo = dict[_Pattern, list[tuple[int, int, str]]]


class _Context(enum.Enum):
    """What a pattern takes around the tokens a hunk changed, tried in this order until
    one matches: ``AROUND``, the innermost call holding them, else one token before (and
    one after, for an insertion); ``NONE``, nothing (``value: typing.AnyStr`` ->
    ``value: StrOrBytes`` in a signature repeats in another signature, and at each
    ``typing.AnyStr`` of ``Tuple[typing.AnyStr, typing.AnyStr]``); ``AFTER``, the one token
    after them (``= await fetch`` -> ``= fetch`` repeats at ``await fetch`` with no ``=``
    before it). The last two only where the tokens replaced or deleted name something
    alone: two or more of them with a name among them, or a deleted name."""

    AROUND = "around"
    NONE = "none"
    AFTER = "after"


def _pattern(
    before: str, after: str, uri: str = "", context: _Context = _Context.AROUND
) -> _Pattern | None:
    """Rule 2's pattern of the edit ``before`` -> ``after``, or None if it has none."""
    b, a = tokenize(before, uri), tokenize(after, uri)
    same_head, same_tail = _trim([t.text for t in b], [t.text for t in a])
    if same_head == len(b) == len(a):
        return None
    closers = _closers(b)
    end = len(b) - same_tail
    if context is _Context.AROUND:
        lo, hi = _extent(b, closers, same_head, end)
    else:
        taken = b[same_head:end]  # the tokens replaced or deleted
        inserted = len(a) - same_tail - same_head
        named = any(t.kind is Kind.NAME for t in taken)
        if not named or not (len(taken) >= 2 or (inserted == 0 and context is _Context.AFTER)):
            return None
        if context is _Context.AFTER:
            if end >= len(b):
                return None
            lo, hi = same_head, end + 1
        elif inserted <= 0:
            return None
        else:
            lo, hi = same_head, end
    hi_a = hi + len(a) - len(b)
    if not lo < hi <= lo + MAX_PATTERN:
        return None
    holes = _holes(b, closers, lo, hi, [t.text for t in a[lo:hi_a]])
    fixed = [t for i, t in enumerate(b[lo:hi], lo) if not any(s <= i < e for s, e, *_ in holes)]
    if len(fixed) < 2 or all(t.kind is Kind.SYMBOL for t in fixed):
        return None
    by_b = {s: (e, n, whole) for n, (s, e, _, _, whole) in enumerate(holes)}
    by_a = {lo + s: (lo + e, n, whole) for n, (_, _, s, e, whole) in enumerate(holes)}
    eb, spans_b = _elements(b, lo, hi, by_b)
    ea, spans_a = _elements(a, lo, hi_a, by_a)
    head, tail = _trim(eb, ea)
    if head == len(eb) == len(ea):
        return None  # the change was inside what the holes take

    def gap(text: str, tokens: Sequence[Token], spans: Sequence[_Span]) -> tuple[int, int]:
        """The characters of ``text`` between the shared head and tail."""
        if not spans:
            return 0, 0
        start = tokens[spans[head - 1][1] - 1].end if head else tokens[spans[0][0]].start
        end = tokens[spans[len(spans) - tail][0]].start if tail else tokens[spans[-1][1] - 1].end
        return start, end

    a_start, a_end = gap(after, a, spans_a)
    b_start, b_end = gap(before, b, spans_b)
    replaced = spans_b[len(eb) - tail - 1][1] - spans_b[head][0] if head < len(eb) - tail else 0
    adds = _breaks(after[a_start:a_end]) > _breaks(before[b_start:b_end])
    if adds and replaced < MIN_REWRITE:
        return None  # lines added after a token or two: new code, not an edit to repeat
    if head < len(eb) - tail and head < len(ea) - tail:
        mode = _Mode.REPLACE
        a_start = a[spans_a[head][0]].start
        a_end = a[spans_a[len(ea) - tail - 1][1] - 1].end
    else:
        mode = _Mode.DELETE if head == len(ea) - tail else _Mode.INSERT
    texts: list[str] = []
    slots: list[int] = []
    position = a_start
    for s, (e, slot, _) in sorted(by_a.items()):
        if a_start <= a[s].start and a[e - 1].end <= a_end:
            texts.append(after[position : a[s].start])
            slots.append(slot)
            position = a[e - 1].end
    texts.append(after[position:a_end])
    before_tail = False
    if mode is _Mode.INSERT:  # less the spaces the gap already had
        space = before[b_start:b_end]
        lead = common_prefix(space, texts[0])
        texts[0] = texts[0][lead:]
        trail = common_suffix(space[lead:], texts[-1])
        texts[-1] = texts[-1][: len(texts[-1]) - trail]
        before_tail = bool(lead) and not trail
        if space and not lead and not trail:  # the spaces replaced (a b -> a-b): all of it
            mode = _Mode.DELETE
    line_end = b[hi - 1].text not in _CLOSERS and _ends_line(before, b[hi - 1])
    breaks = _breaks(before[b_start:b_end]) if adds else -1
    return _Pattern(
        eb, ea, head, tail, mode, tuple(texts), tuple(slots), before_tail, line_end, breaks
    )


def _ends_line(text: str, token: Token) -> bool:
    """Whether ``token`` is the last of its line in ``text``."""
    rest = text[token.end : token.end + 200].lstrip(" \t")
    return not rest or rest[0] in "\r\n"


def _extent(b: Sequence[Token], closers: Sequence[int], head: int, end: int) -> tuple[int, int]:
    """The tokens of ``b`` the pattern takes around the changed ones ``[head:end]``: the
    innermost call holding them (its name, a member sign before it, its brackets), else
    one token before (and one after, for an insertion)."""
    for o in range(min(head, len(b)) - 1, 0, -1):
        if b[o].text in _PAIRS and closers[o] >= end and b[o - 1].kind is Kind.NAME:
            lo = o - 1
            if lo > 0 and b[lo - 1].text in _MEMBER:
                lo -= 1
                if lo > 0 and b[lo - 1].text in _OWN:
                    lo -= 1  # the receiver: ``self.send(`` is not ``self.state.send(``
            return lo, closers[o] + 1
    lo = max(head - 1, 0)
    return lo, (end + 1 if end == head and end < len(b) else end)


def _holes(
    b: Sequence[Token], closers: Sequence[int], lo: int, hi: int, after: Sequence[str]
) -> list[tuple[int, int, int, int, bool]]:
    """The holes of ``b[lo:hi]`` as (start, end in ``b``, start, end in ``after``, whole):
    the contents of its outermost brackets, or of their arguments, that ``after`` holds
    unchanged exactly once."""
    found: list[tuple[int, int, int, int, bool]] = []
    i = lo
    while i < hi:
        close = closers[i]
        if b[i].text not in _PAIRS or not i + 1 < close < hi:
            i += 1
            continue
        runs = [(i + 1, close, True)]
        if _find_once(after, [t.text for t in b[i + 1 : close]]) is None:
            runs = [(s, e, False) for s, e in _arguments(b, closers, i + 1, close)]
        for s, e, whole in runs:
            at = _find_once(after, [t.text for t in b[s:e]])
            if at is None or any(
                at < a_end and a_start < at + e - s for *_, a_start, a_end, _ in found
            ):
                continue
            found.append((s, e, at, at + e - s, whole))
        i = close + 1
    return found


def _arguments(
    b: Sequence[Token], closers: Sequence[int], start: int, end: int
) -> list[tuple[int, int]]:
    """The arguments in ``b[start:end]`` (split at commas outside inner brackets)."""
    spans, first, i = [], start, start
    while i < end:
        if b[i].text in _PAIRS and closers[i] > i:
            i = closers[i] + 1
            continue
        if b[i].text == ",":
            spans.append((first, i))
            first = i + 1
        i += 1
    spans.append((first, end))
    return [(s, e) for s, e in spans if e > s]


def _elements(
    tokens: Sequence[Token], lo: int, hi: int, holes: dict[int, tuple[int, int, bool]]
) -> tuple[tuple[_Element, ...], list[_Span]]:
    """``tokens[lo:hi]`` as pattern elements, holes where ``holes`` (start -> end, slot,
    whole) says, with the tokens each element stands for."""
    out: list[_Element] = []
    spans: list[_Span] = []
    i = lo
    while i < hi:
        if i in holes:
            end, slot, whole = holes[i]
            out.append(_Hole(slot, whole))
        else:
            end = i + 1
            out.append(tokens[i].text)
        spans.append((i, end))
        i = end
    return tuple(out), spans


def _match(
    pattern: Sequence[_Element], tokens: Sequence[Token], closers: Sequence[int], at: int
) -> list[_Span] | None:
    """The tokens each element of ``pattern`` matched, matching at token ``at``; None if
    it does not match there. A hole tries each place it may end, shortest first."""

    def go(k: int, j: int, spans: list[_Span]) -> list[_Span] | None:
        if k == len(pattern):
            return spans
        element = pattern[k]
        if isinstance(element, str):
            if j < len(tokens) and tokens[j].text == element:
                return go(k + 1, j + 1, [*spans, (j, j + 1)])
            return None
        for end in _hole_ends(tokens, closers, j, element.whole):
            found = go(k + 1, end, [*spans, (j, end)])
            if found is not None:
                return found
        return None

    return go(0, at, [])


def _hole_ends(
    tokens: Sequence[Token], closers: Sequence[int], start: int, whole: bool
) -> list[int]:
    """Where a hole starting at ``start`` may end: before a comma (``whole``: any, else
    the first) or before the closing bracket, holding at least one token."""
    ends: list[int] = []
    i = start
    while i < min(len(tokens), start + MAX_HOLE):
        text = tokens[i].text
        if text in _PAIRS:
            if closers[i] < 0:
                break
            i = closers[i] + 1
            continue
        if text in _CLOSERS or text == ";":
            if text != ";" and i > start and tokens[i - 1].text != ",":
                ends.append(i)  # not after a trailing comma: that layout is not guessed
            break
        if text == ",":
            if i > start:
                ends.append(i)
            if not whole:
                break
        i += 1
    return ends


def _closers(tokens: Sequence[Token]) -> list[int]:
    """For each opening bracket, the index of the one that closes it (-1: none)."""
    out = [-1] * len(tokens)
    stack: list[int] = []
    for i, token in enumerate(tokens):
        if token.text in _PAIRS:
            stack.append(i)
        elif token.text in _CLOSERS and stack and _PAIRS[tokens[stack[-1]].text] == token.text:
            out[stack.pop()] = i
    return out


def _find_once(haystack: Sequence[str], needle: Sequence[str]) -> int | None:
    """Where ``needle`` occurs in ``haystack``, if it occurs exactly once."""
    n = len(needle)
    at = [i for i in range(len(haystack) - n + 1) if list(haystack[i : i + n]) == list(needle)]
    return at[0] if n and len(at) == 1 else None


def _trim(b: Sequence[object], a: Sequence[object]) -> tuple[int, int]:
    """How many items ``b`` and ``a`` share at the start, then at the end."""
    shortest = min(len(b), len(a))
    head = 0
    while head < shortest and b[head] == a[head]:
        head += 1
    tail = 0
    while tail < shortest - head and b[-1 - tail] == a[-1 - tail]:
        tail += 1
    return head, tail


def _core(before: str, after: str, uri: str = "") -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The tokens an edit changed: ``before``'s and ``after``'s, less what they share."""
    b, a = [t.text for t in tokenize(before, uri)], [t.text for t in tokenize(after, uri)]
    head, tail = _trim(b, a)
    return tuple(b[head : len(b) - tail]), tuple(a[head : len(a) - tail])


def _changed_span(hunk: Hunk) -> tuple[int, int]:
    """The characters the hunk changed, as a span of the document now."""
    head = common_prefix(hunk.before, hunk.after)
    tail = common_suffix(hunk.before[head:], hunk.after[head:])
    return hunk.start + head, hunk.end - tail


def _breaks(text: str) -> int:
    return text.count("\n") + text.count("\r") - text.count("\r\n")


def _nearest(edits: Sequence[RepeatEdit], cursor: int) -> RepeatEdit | None:
    """The first edit that ends at or after the cursor, else the last before it."""
    ahead = [e for e in edits if e.end >= cursor]
    if ahead:
        return min(ahead, key=lambda e: e.start)
    return max(edits, key=lambda e: e.start, default=None)
