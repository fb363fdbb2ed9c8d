"""The recent edits of a workspace, as small before/after hunks of whole lines.

Fed every content change the documents receive (``didChange``: undo and redo arrive as
ordinary changes and are recorded as such), it keeps what a next-edit predictor and its
prompt need: the last few edits, each as the lines it touched before and after, with a
few lines of context around, and where those lines are in the document now. The rules:

1. A change touches whole lines: from the start of the line where it begins to the end
   of the line where it ends (a hunk never holds half a line).
2. A change joins the newest hunk when it is in the same document, comes at most
   ``pause_s`` after that hunk's last change and lies within ``near_lines`` lines of it:
   the hunk grows to cover both (the lines between come along unchanged). Otherwise it
   starts a new hunk. Zed's edit prediction groups the same way (1 s, 8 lines:
   ``LAST_CHANGE_GROUPING_TIME``, ``CHANGE_GROUPING_LINE_SPAN``), so a word typed key by
   key is one hunk, and so is an edit touched up on the next line.
3. A hunk whose lines end as they began (text typed and deleted again, an undo within the
   pause) is dropped: nothing happened there. What it had changed is kept apart, as an
   edit undone (``undone``: the last ``undone`` of them, newest last), so that the edit a
   person took and took back at once is not proposed to them again.
4. Bounded: at most ``per_document`` hunks of one document, ``hunks`` and ``chars``
   (texts and context together) in all; the oldest go first. A hunk larger than
   ``hunk_chars`` is not kept (a paste or a formatter's rewrite is no edit to repeat,
   and no prompt has room for it); the next change starts afresh.
5. Hunks above a change move with it (``start``, ``start_line`` stay true in the current
   document). An older hunk that a later change overlaps keeps its texts as history; its
   place is then only approximate.
6. ``forget(uri)`` drops a document's hunks (on ``didClose``). Nothing here is logged,
   and a hunk's ``repr`` shows no text.

A whole-document change (no range, as full-sync clients send every keystroke) is diffed
against the text before (``diff_changes``) and recorded as the changes it is made of.

    >>> history = EditHistory()
    >>> text = "def area(r):\\n    return 3.14 * r * r\\n"
    >>> for i, ch in enumerate("adius"):  # r -> radius, one key at a time
    ...     position = Position(0, 10 + i)
    ...     history.record("file:///a.py", text, ch, Range(position, position),
    ...                    version=i + 2, now=0.2 * i)
    ...     text = text[:10 + i] + ch + text[10 + i:]
    >>> [hunk] = history.hunks()
    >>> hunk
    Hunk(uri='file:///a.py', start_line=0, version=6)
    >>> hunk.before, hunk.after
    ('def area(r):', 'def area(radius):')
    >>> print(hunk.diff(), end="")
    --- a/a.py
    +++ b/a.py
    @@ -1,2 +1,2 @@
    -def area(r):
    +def area(radius):
         return 3.14 * r * r
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field

from kode.completion.documents import Document, Position, Range, file_name, scrub, split_lines

# Rule 2: Zed's grouping (module docstring). A person's keys come ~120 ms apart; a second
# without one ends a thought, and 8 lines cover an edit and its touch-ups nearby.
PAUSE_S = 1.0
NEAR_LINES = 8


@dataclass(frozen=True, slots=True)
class HistoryLimits:
    """Rule 4's bounds, and rule 2's grouping. ``context_lines``: unchanged lines kept
    above and below each hunk (Zed's history diffs show 3)."""

    hunks: int = 32  # in all (a prompt shows fewer; Zed keeps 10 events, shows 6)
    per_document: int = 16
    chars: int = 32_000  # in all: ~8k tokens, a few times what any prompt will take
    hunk_chars: int = 6_000  # one hunk's texts: Zed's size limit for one history diff
    context_lines: int = 3
    undone: int = 8  # rule 3's edits undone within the pause, kept
    pause_s: float = PAUSE_S
    near_lines: int = NEAR_LINES


@dataclass(frozen=True, slots=True)
class Hunk:
    """One edit: lines ``before`` became lines ``after`` (both without their last line
    break). ``start`` and ``start_line``: where ``after`` begins in the document now (a
    code-point offset, which is a line start, and its 0-based line). ``above``/``below``:
    up to ``context_lines`` unchanged lines around, as they were at the hunk's last
    change. ``first_at``/``last_at``: the times of its first and last change."""

    uri: str
    start_line: int
    start: int = field(repr=False)
    before: str = field(repr=False)
    after: str = field(repr=False)
    above: tuple[str, ...] = field(repr=False)
    below: tuple[str, ...] = field(repr=False)
    version: int
    first_at: float = field(repr=False)
    last_at: float = field(repr=False)

    @property
    def end(self) -> int:
        """Where ``after`` ends in the document now (a code-point offset)."""
        return self.start + len(self.after)

    @property
    def chars(self) -> int:
        """What it costs against the bounds: its texts and context."""
        context = sum(len(line) + 1 for line in (*self.above, *self.below))
        return len(self.before) + len(self.after) + context

    def blocks(self, context: int = 3) -> tuple[str, str]:
        """The lines before and after the edit, each with up to ``context`` unchanged
        lines around: the original/updated pair a prompt shows.

        >>> hunk = _example()
        >>> hunk.blocks(context=1)
        ('def f(n):\\n    return n + 1', 'def f(count):\\n    return n + 1')
        """
        above, below = self._context(context)
        original = "\n".join((*above, self.before, *below))
        updated = "\n".join((*above, self.after, *below))
        return original, updated

    def diff(self, *, path: str | None = None, context: int = 3) -> str:
        """The edit as a compact unified diff (one ``@@`` block), line numbers as in the
        document now. ``path``: the name on the ``---``/``+++`` lines (default: the last
        segment of the URI).

        >>> print(_example().diff(path="src/f.py", context=0), end="")
        --- a/src/f.py
        +++ b/src/f.py
        @@ -1,1 +1,1 @@
        -def f(n):
        +def f(count):
        """
        name = path if path is not None else file_name(self.uri)
        above, below = self._context(context)
        old, new = split_lines(self.before), split_lines(self.after)
        first = self.start_line - len(above) + 1
        lines = [
            f"--- a/{name}",
            f"+++ b/{name}",
            f"@@ -{first},{len(above) + len(old) + len(below)} "
            f"+{first},{len(above) + len(new) + len(below)} @@",
        ]
        lines.extend(" " + line for line in above)
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                lines.extend(" " + line for line in old[i1:i2])
            else:
                lines.extend("-" + line for line in old[i1:i2])
                lines.extend("+" + line for line in new[j1:j2])
        lines.extend(" " + line for line in below)
        return "\n".join(lines) + "\n"

    def _context(self, count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if count <= 0:
            return (), ()
        return self.above[-count:], self.below[:count]


class EditHistory:
    """The recent edits of one workspace (the rules above); every method that records
    takes ``now`` (seconds, monotonic)."""

    def __init__(self, limits: HistoryLimits | None = None) -> None:
        self.limits = limits if limits is not None else HistoryLimits()
        self._hunks: list[Hunk] = []  # oldest first
        self._undone: list[Hunk] = []  # rule 3, oldest first

    def record(
        self,
        uri: str,
        before: str,
        text: str,
        range_: Range | None,
        *,
        version: int,
        now: float,
    ) -> None:
        """One content change as ``Document.apply_change`` applies it: ``range_`` of
        ``before`` (the document's text just before this change) replaced by ``text``, or
        the whole text when ``range_`` is None. The range is clamped as the document
        clamps it.

        >>> history = EditHistory()
        >>> history.record("file:///a.py", "x = 1\\ny = 2\\n", "x = 1\\ny = 3\\n", None,
        ...                version=2, now=0.0)
        >>> [(h.start_line, h.before, h.after) for h in history.hunks()]
        [(1, 'y = 2', 'y = 3')]
        """
        text = scrub(text)
        if range_ is None:
            for start, end, new in diff_changes(before, text):
                self.record_offsets(uri, before, start, end, new, version=version, now=now)
                before = before[:start] + new + before[end:]
            return
        doc = Document(uri, before)
        start = doc.offset_at(_non_negative(range_.start), strict=False)
        end = doc.offset_at(_non_negative(range_.end), strict=False)
        self.record_offsets(uri, doc.text, start, end, text, version=version, now=now)

    def record_offsets(
        self,
        uri: str,
        before: str,
        start: int,
        end: int,
        text: str,
        *,
        version: int,
        now: float,
    ) -> None:
        """One change in code-point offsets of ``before``: ``before[start:end]`` became
        ``text``."""
        start, end = sorted((max(0, min(start, len(before))), max(0, min(end, len(before)))))
        if before[start:end] == text:
            return
        line_start, line_end = _line_start(before, start), _line_end(before, end)
        delta = len(text) - (end - start)
        old_lines = before[line_start:line_end]
        new_lines = before[line_start:start] + text + before[end:line_end]
        line_delta = _breaks(new_lines) - _breaks(old_lines)
        grown = self._grown(uri, before, start, end, text, now)
        if grown is None:
            kept: Hunk | None = None
            region = (line_start, line_end)
            hunk = Hunk(
                uri=uri,
                start_line=_breaks(before[:line_start]),
                start=line_start,
                before=old_lines,
                after=new_lines,
                above=(),
                below=(),
                version=version,
                first_at=now,
                last_at=now,
            )
        else:
            kept, hunk, region = grown
        others = [h for h in self._hunks if h is not kept]
        self._hunks = [
            _moved(h, before, line_start, line_end, delta, line_delta) if h.uri == uri else h
            for h in others
        ]
        if hunk.before == hunk.after:  # rule 3
            if kept is not None and kept.before != kept.after:
                self._undone.append(dataclasses.replace(kept, last_at=now))
                del self._undone[: max(0, len(self._undone) - self.limits.undone)]
            return
        above, below = _context(before, *region, self.limits.context_lines)
        hunk = dataclasses.replace(hunk, above=above, below=below, version=version, last_at=now)
        if len(hunk.before) + len(hunk.after) > self.limits.hunk_chars:
            return  # rule 4: too large to keep
        self._hunks.append(hunk)
        self._bound(uri)

    def forget(self, uri: str) -> None:
        """Drop the hunks of ``uri`` (the document was closed)."""
        self._hunks = [h for h in self._hunks if h.uri != uri]
        self._undone = [h for h in self._undone if h.uri != uri]

    def clear(self) -> None:
        self._hunks.clear()
        self._undone.clear()

    def undone(self, uri: str | None = None) -> tuple[Hunk, ...]:
        """Rule 3's edits undone within the pause (of ``uri`` only, if given), newest
        last: each hunk's ``before`` -> ``after`` is the edit that was taken back."""
        return tuple(h for h in self._undone if uri is None or h.uri == uri)

    def hunks(self, uri: str | None = None) -> tuple[Hunk, ...]:
        """The recent hunks (of ``uri`` only, if given), newest last."""
        return tuple(h for h in self._hunks if uri is None or h.uri == uri)

    def _grown(
        self, uri: str, before: str, start: int, end: int, text: str, now: float
    ) -> tuple[Hunk, Hunk, tuple[int, int]] | None:
        """Rule 2: the newest hunk grown by this change (the hunk it replaces, the grown
        one, the grown region's span in ``before``), or None if it starts a new hunk."""
        if not self._hunks:
            return None
        last = self._hunks[-1]
        if last.uri != uri or now - last.last_at > self.limits.pause_s:
            return None
        if before[last.start : last.end] != last.after:
            return None  # a change was not recorded: the hunk no longer matches
        line_start, line_end = _line_start(before, start), _line_end(before, end)
        if line_end < last.start:
            gap = _breaks(before[line_end : last.start])
        elif line_start > last.end:
            gap = _breaks(before[last.end : line_start])
        else:
            gap = 0
        if gap > self.limits.near_lines:
            return None
        lo, hi = min(last.start, line_start), max(last.end, line_end)
        grown_before = before[lo : last.start] + last.before + before[last.end : hi]
        grown_after = before[lo:start] + text + before[end:hi]
        if len(grown_before) + len(grown_after) > self.limits.hunk_chars:
            return None
        grown = dataclasses.replace(
            last,
            start_line=last.start_line - _breaks(before[lo : last.start]),
            start=lo,
            before=grown_before,
            after=grown_after,
        )
        return last, grown, (lo, hi)

    def _bound(self, uri: str) -> None:
        """Rule 4: drop the oldest hunks beyond the bounds."""
        limits = self.limits
        mine = [h for h in self._hunks if h.uri == uri]
        dropped = {id(h) for h in mine[: max(0, len(mine) - limits.per_document)]}
        self._hunks = [h for h in self._hunks if id(h) not in dropped]
        total = sum(h.chars for h in self._hunks)
        while self._hunks and (len(self._hunks) > limits.hunks or total > limits.chars):
            total -= self._hunks.pop(0).chars


def diff_changes(old: str, new: str) -> list[tuple[int, int, str]]:
    """The changes that turn ``old`` into ``new``, as ``(start, end, text)``: each
    replaces ``[start:end]`` of the text as it stands when it is applied, in order. One
    change for one changed place (a keystroke, a paste); a line diff (difflib) where
    several lines changed apart, each change trimmed to the characters that differ.

    >>> diff_changes("a = 1\\nb = 2\\n", "a = 1\\nb = 20\\n")
    [(11, 11, '0')]
    >>> diff_changes("x(1)\\nkeep\\ny(2)\\n", "x(1, 9)\\nkeep\\ny(2, 9)\\n")
    [(3, 3, ', 9'), (16, 16, ', 9')]
    """
    head = common_prefix(old, new)
    tail = common_suffix(old[head:], new[head:])
    old_mid, new_mid = old[head : len(old) - tail], new[head : len(new) - tail]
    if not old_mid and not new_mid:
        return []
    if _breaks(old_mid) == 0 or _breaks(new_mid) == 0:
        return [(head, head + len(old_mid), new_mid)]
    a, b = _LINE.findall(old_mid), _LINE.findall(new_mid)
    starts = [0]
    for line in a:
        starts.append(starts[-1] + len(line))
    changes: list[tuple[int, int, str]] = []
    shift = head  # where old_mid's offset 0 lies in the text as changed so far
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        piece, text = old_mid[starts[i1] : starts[i2]], "".join(b[j1:j2])
        lead = common_prefix(piece, text)
        trail = common_suffix(piece[lead:], text[lead:])
        start = shift + starts[i1] + lead
        replacement = text[lead : len(text) - trail]
        changes.append((start, start + len(piece) - lead - trail, replacement))
        shift += len(text) - len(piece)
    return changes


# A line with its break (``\r\n``, ``\r`` or ``\n``, as LSP counts them), or a last line
# without one.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def _breaks(text: str) -> int:
    """How many line breaks ``text`` holds (``\\r\\n`` is one)."""
    return text.count("\n") + text.count("\r") - text.count("\r\n")


def _line_start(text: str, index: int) -> int:
    return max(text.rfind("\n", 0, index), text.rfind("\r", 0, index)) + 1


def _line_end(text: str, index: int) -> int:
    """The offset of the break that ends ``index``'s line (or the end of the text)."""
    ends = [i for i in (text.find("\n", index), text.find("\r", index)) if i >= 0]
    return min(ends, default=len(text))


def _context(
    text: str, start: int, end: int, count: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Up to ``count`` whole lines of ``text`` above the line starting at ``start`` and
    below the line ending at ``end``."""
    above: list[str] = []
    position = start
    while len(above) < count and position > 0:
        line_end = position - (2 if text.startswith("\r\n", position - 2) else 1)
        position = _line_start(text, line_end)
        above.append(text[position:line_end])
    below: list[str] = []
    position = end
    while len(below) < count and position < len(text):
        position += 2 if text.startswith("\r\n", position) else 1
        if position == len(text):
            break  # the empty "line" after a final line break is no context
        line_end = _line_end(text, position)
        below.append(text[position:line_end])
        position = line_end
    return tuple(reversed(above)), tuple(below)


def _moved(hunk: Hunk, before: str, start: int, end: int, delta: int, lines: int) -> Hunk:
    """Rule 5: ``hunk`` after lines ``[start:end]`` of ``before`` changed by ``delta``
    characters and ``lines`` lines."""
    if end < hunk.start:
        return dataclasses.replace(
            hunk, start=hunk.start + delta, start_line=hunk.start_line + lines
        )
    if start > hunk.end:
        return hunk
    if start < hunk.start:  # overlapped from above: it now begins where the change does
        return dataclasses.replace(
            hunk, start=start, start_line=hunk.start_line - _breaks(before[start : hunk.start])
        )
    return hunk


def common_prefix(a: str, b: str) -> int:
    """Length of the common prefix (binary search over slices: C-speed comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix(a: str, b: str) -> int:
    """Length of the common suffix (as ``common_prefix``)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _non_negative(position: Position) -> Position:
    if position.line >= 0 and position.character >= 0:
        return position
    return Position(max(0, position.line), max(0, position.character))


def _example() -> Hunk:
    history = EditHistory()
    before = "def f(n):\n    return n + 1\n"
    history.record_offsets("file:///f.py", before, 6, 7, "count", version=1, now=0.0)
    return history.hunks()[0]
