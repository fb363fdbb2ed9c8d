"""The next edit where it repeats a whole-line insertion or deletion, found without a model.

A hunk that only inserts lines, or only deletes lines, repeats where the same lines are:

1. **Deletion.** The lines it deleted (compared without their indentation) are deleted
   again where they stand elsewhere, all of them in a row (``config=None,`` dropped from
   one signature, then from the next). Never lines too plain to mean anything (under
   ``MIN_TOKENS`` tokens, or no name, number or string among them: a blank line, ``)``).
2. **Insertion.** The lines it inserted (at most ``MAX_INSERTED``) go in again next to
   another copy of the line they were put next to, the anchor: the line above, or where
   that one is too plain (as rule 1 says), the line below. ``@pytest.mark.network`` put
   above ``@pytest.mark.asyncio`` goes above the next ``@pytest.mark.asyncio``; an
   argument line added after ``max_redirects: int = DEFAULT_MAX_REDIRECTS,`` goes after
   the next one. The lines take the anchor's indentation there (relative to the anchor's
   in the hunk). Where the anchor already has them next to it, nothing.

    >>> from kode.completion.edits.history import EditHistory
    >>> history = EditHistory()
    >>> text = "def f(\\n    a=1,\\n):\\n    pass\\ndef g(\\n        a=1,\\n):\\n    pass\\n"
    >>> history.record_offsets("file:///a.py", text, 15, 15, "\\n    b=2,", version=2, now=0.0)
    >>> text = text[:15] + "\\n    b=2," + text[15:]
    >>> [edit] = line_repeats(history.hunks()[-1], text)
    >>> print(text[: edit[0]] + edit[2] + text[edit[1] :], end="")
    def f(
        a=1,
        b=2,
    ):
        pass
    def g(
            a=1,
            b=2,
    ):
        pass
"""

from __future__ import annotations

import difflib
import re

from kode.completion.edits.history import Hunk, common_prefix, common_suffix

# Rule 1: a line (or lines) with fewer tokens than this, or no word among them, is plain.
MIN_TOKENS = 3
# Rule 2: more lines inserted than this are new code, not an edit to repeat.
MAX_INSERTED = 2
# Rule 3: a line of fewer tokens than this is too plain to change wherever it stands.
MIN_SAME_TOKENS = 2
_TOKEN = re.compile(r"\w+|\S")
_WORD = re.compile(r"\w")
_LINE = re.compile(r"[^\n]*\n|[^\n]+")


def line_repeats(hunk: Hunk, text: str) -> list[tuple[int, int, str]] | None:
    """Where ``hunk`` (an insertion or deletion of whole lines) repeats in ``text``, as
    edits ``(start, end, new text)``, top to bottom; None if the hunk is not one."""
    before, after = hunk.before.split("\n"), hunk.after.split("\n")
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    changes = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    if len(changes) != 1 or changes[0][0] not in ("insert", "delete"):
        return None
    tag, i1, i2, j1, j2 = changes[0]
    lines = _LINE.findall(text)
    if tag == "delete":
        return _deletions(before[i1:i2], lines)
    inserted = after[j1:j2]
    if len(inserted) > MAX_INSERTED or not _meaningful(inserted):
        return []
    above = after[j1 - 1] if j1 > 0 else (hunk.above[-1] if hunk.above else "")
    below = after[j2] if j2 < len(after) else (hunk.below[0] if hunk.below else "")
    if _meaningful([above]):
        found = _insertions(inserted, above, lines, after_anchor=True)
        if _meaningful([below]):  # both anchors where both mean something
            found = [f for f in found if _next_line(text, f[0]).strip() == below.strip()]
        return found
    if _meaningful([below]):
        return _insertions(inserted, below, lines, after_anchor=False)
    return []


def same_lines(hunk: Hunk, text: str) -> list[tuple[int, int, str]]:
    """Rule 3: where ``hunk`` changed one line in its place, each other line of ``text``
    the same as that line was (indentation aside), changed the same way (its own
    indentation kept), as edits ``(start, end, new text)`` of the characters that differ.

    >>> same_lines(_hunk("    ))", "    ), param, ctx)"), "x(\\n  ))\\n")
    [(6, 6, ', param, ctx')]
    >>> same_lines(_hunk("    ],", "    },"), "x = [\\n  ],\\n")
    []
    """
    if "\n" in hunk.before or "\n" in hunk.after:
        return []
    old, new = hunk.before, hunk.after
    indent = _indent(old)
    if not new.startswith(indent) or len(_TOKEN.findall(old)) < MIN_SAME_TOKENS:
        return []
    added = [t for t in _TOKEN.findall(new) if _WORD.match(t)]
    for t in _TOKEN.findall(old):
        if t in added:
            added.remove(t)
    if not _meaningful([old]) and len(added) < 2:
        return []  # ``],`` -> ``},``, ``return True`` -> ``return``: too plain
    key, rest = old.strip(), new[len(indent) :]
    found: list[tuple[int, int, str]] = []
    at = 0
    for line in _LINE.findall(text):
        body = line.rstrip("\r\n")
        if body.strip() == key:
            there = _indent(body)
            start, old_body, new_body = at + len(there), body[len(there) :], rest
            head = common_prefix(old_body, new_body)
            tail = common_suffix(old_body[head:], new_body[head:])
            found.append(
                (start + head, start + len(old_body) - tail, new_body[head : len(new_body) - tail])
            )
        at += len(line)
    return found


def _hunk(before: str, after: str) -> Hunk:
    return Hunk("file:///a.py", 0, 0, before, after, (), (), 1, 0.0, 0.0)


def _deletions(deleted: list[str], lines: list[str]) -> list[tuple[int, int, str]]:
    """Rule 1."""
    if not _meaningful(deleted):
        return []
    want = [line.strip() for line in deleted]
    found: list[tuple[int, int, str]] = []
    offsets = _offsets(lines)
    i = 0
    while i + len(want) <= len(lines):
        if all(lines[i + k].strip() == w for k, w in enumerate(want)):
            found.append((offsets[i], offsets[i + len(want)], ""))
            i += len(want)
        else:
            i += 1
    return found


def _insertions(
    inserted: list[str], anchor: str, lines: list[str], *, after_anchor: bool
) -> list[tuple[int, int, str]]:
    """Rule 2: ``inserted`` after (else before) each other copy of ``anchor``."""
    key, indent = anchor.strip(), _indent(anchor)
    first, last = inserted[0].strip(), inserted[-1].strip()
    offsets = _offsets(lines)
    found: list[tuple[int, int, str]] = []
    for i, line in enumerate(lines):
        if line.strip() != key:
            continue
        if after_anchor:
            if i + 1 < len(lines) and lines[i + 1].strip() == first:
                continue  # it has them already
            if not line.endswith("\n"):
                continue  # the last line, without a break: no layout guessed
            at = offsets[i + 1]
        else:
            if i > 0 and lines[i - 1].strip() == last:
                continue
            at = offsets[i]
        there = _indent(line)
        new = "".join(
            (there + piece[len(indent) :] if piece.startswith(indent) else piece) + "\n"
            for piece in inserted
        )
        found.append((at, at, new))
    return found


def _next_line(text: str, at: int) -> str:
    end = text.find("\n", at)
    return text[at : len(text) if end < 0 else end]


def _meaningful(lines: list[str]) -> bool:
    """Whether ``lines`` are more than plain (rule 1)."""
    tokens = [t for line in lines for t in _TOKEN.findall(line)]
    return len(tokens) >= MIN_TOKENS and any(_WORD.match(t) for t in tokens)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _offsets(lines: list[str]) -> list[int]:
    """Where each of ``lines`` begins, and the end of the last."""
    out = [0]
    for line in lines:
        out.append(out[-1] + len(line))
    return out
