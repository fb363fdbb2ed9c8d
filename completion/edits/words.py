"""The next edit where it repeats a change made inside strings or comments.

A string or a comment is one token to ``repeat``'s rules, so a change inside one
(``'https://github.com/'`` -> ``'http://github.com/'``, ``# file (or text)`` ->
``# file (or bytes)``) is, to them, a whole token replaced: it repeats only where the same
whole string stands again. Here the change is read at the level of the words inside
(``\\w+`` runs and single other characters): where each string or comment the hunk changed
had one run of words changed, the same run, with the word before it and the word after it
(or the token's edge), is changed again in the other strings or comments of the same kind
(``'https:`` in ``requests.get('https://github.com/', allow_redirects=False)``).

A changed word that reads as a code name (``MaybeStripAnsi`` -> ``_PagerWriter`` in a
docstring) is also changed where it stands as a name in the code, and in strings and
comments without its neighbours.

Nothing where the words only moved from one line to the next (a comment wrapped anew).
Never a pattern too plain to mean anything: under ``MIN_CHARS`` characters, or no word of
``MIN_WORD`` letters or more among them (``r'`` -> ``b'``).

    >>> from kode.completion.edits.history import EditHistory
    >>> history = EditHistory()
    >>> text = "a = get('https://x.org/')\\nb = get('https://y.org/', 2)\\n"
    >>> history.record_offsets("file:///a.py", text, 8, 24, "'http://x.org/'", version=2, now=0.0)
    >>> text = "a = get('http://x.org/')\\nb = get('https://y.org/', 2)\\n"
    >>> [(s, e, new)] = inner_repeats(history.hunks()[-1], text)
    >>> text[:s] + new + text[e:]
    "a = get('http://x.org/')\\nb = get('http://y.org/', 2)\\n"
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from kode.completion.edits.history import Hunk, common_prefix, common_suffix
from kode.completion.edits.tokens import Kind, Token, tokenize

# A pattern (the changed words with their neighbours) of fewer characters is too plain.
MIN_CHARS = 3
# ... and so is one without a word of this many letters.
MIN_WORD = 3
# A hunk changing more strings or comments than this in distinct ways is a rewrite.
MAX_CHANGES = 3

_WORDS = re.compile(r"\w+|[^\w\s]")
_CODE_NAME = re.compile(r"[^\W\d]\w*")
_PROSE = frozenset({Kind.STRING, Kind.COMMENT})


@dataclass(frozen=True, slots=True)
class _Change:
    """Inside a token of ``kind``: ``old`` (the changed words with their neighbours)
    becomes ``new``; ``at_start``/``at_end``: ``old`` began/ended at the token's edge, and
    must there too; ``name``: the old and new words alone where they read as code names."""

    kind: Kind
    old: str
    new: str
    at_start: bool
    at_end: bool
    name: tuple[str, str] | None


def inner_repeats(
    hunk: Hunk, text: str, tokens: Sequence[Token] | None = None
) -> list[tuple[int, int, str]]:
    """Each place of ``text`` where a change ``hunk`` made inside its strings or comments
    repeats, as (start, end, new text); [] if the hunk changed other tokens too."""
    changes = _changes(hunk)
    if not changes:
        return []
    if tokens is None:
        tokens = tokenize(text, hunk.uri)
    found: list[tuple[int, int, str]] = []
    for token in tokens:
        for change in changes:
            if token.kind is change.kind:
                found.extend(_in_token(change, token))
            elif (
                change.name is not None and token.kind is Kind.NAME and token.text == change.name[0]
            ):
                found.append((token.start, token.end, change.name[1]))
    found.sort()
    out: list[tuple[int, int, str]] = []
    reached = -1
    for start, end, new in found:
        if start < reached:
            continue  # overlapping: the first one stands
        reached = end
        old = text[start:end]
        head = common_prefix(old, new)
        tail = common_suffix(old[head:], new[head:])
        out.append((start + head, end - tail, new[head : len(new) - tail]))
    return out


def _in_token(change: _Change, token: Token) -> list[tuple[int, int, str]]:
    out = []
    for old, new, edges in (
        (change.old, change.new, True),
        *([(change.name[0], change.name[1], False)] if change.name else []),
    ):
        start = 0
        while (at := token.text.find(old, start)) >= 0:
            start = at + 1
            end = at + len(old)
            if edges and change.at_start and at != 0:
                continue
            if edges and change.at_end and end != len(token.text):
                continue
            if _joins(token.text, at, end, old):
                continue
            out.append((token.start + at, token.start + end, new))
    return out


def _joins(text: str, start: int, end: int, old: str) -> bool:
    """Whether ``old`` at ``text[start:end]`` is part of a longer word."""
    before = start > 0 and _is_word(old[0]) and _is_word(text[start - 1])
    after = end < len(text) and _is_word(old[-1]) and _is_word(text[end])
    return before or after


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _changes(hunk: Hunk) -> list[_Change]:
    """The changes inside strings and comments ``hunk`` made, if it changed nothing else."""
    b, a = tokenize(hunk.before, hunk.uri), tokenize(hunk.after, hunk.uri)
    matcher = difflib.SequenceMatcher(None, [t.text for t in b], [t.text for t in a], False)
    changes: list[_Change] = []
    moved: list[list[str]] = [[], []]  # the words of the changed tokens, before and after
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag != "replace" or i2 - i1 != j2 - j1:
            return []
        for old, new in zip(b[i1:i2], a[j1:j2], strict=True):
            if old.kind is not new.kind or old.kind not in _PROSE:
                return []
            moved[0] += re.findall(r"\w+", old.text)
            moved[1] += re.findall(r"\w+", new.text)
            change = _word_change(old.kind, old.text, new.text)
            if change is None:
                return []
            if change not in changes:
                changes.append(change)
    if moved[0] == moved[1]:
        return []  # the same words, wrapped anew: nothing to repeat
    return changes if len(changes) <= MAX_CHANGES else []


def _word_change(kind: Kind, old: str, new: str) -> _Change | None:
    """The one run of words changed between ``old`` and ``new`` (two texts of one token),
    with one word of context on each side, or None (several runs, or too plain).

    >>> c = _word_change(Kind.COMMENT, "# file (or text)", "# file (or bytes)")
    >>> c.old, c.new, c.at_start, c.at_end, c.name
    ('or text)', 'or bytes)', False, False, None)
    >>> _word_change(Kind.STRING, "r'a+'", "b'a+'") is None  # too plain
    True
    """
    wb, wa = list(_WORDS.finditer(old)), list(_WORDS.finditer(new))
    matcher = difflib.SequenceMatcher(None, [m.group() for m in wb], [m.group() for m in wa], False)
    ops = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    if len(ops) != 1:
        return None
    _, i1, i2, j1, j2 = ops[0]
    # one word of context each side, or the token's edge
    start_b = wb[i1 - 1].start() if i1 > 0 else 0
    end_b = wb[i2].end() if i2 < len(wb) else len(old)
    start_a = wa[j1 - 1].start() if j1 > 0 else 0
    end_a = wa[j2].end() if j2 < len(wa) else len(new)
    if new[:start_a] != old[:start_b] or new[end_a:] != old[end_b:]:
        return None  # the context is not what it was (a space changed around it)
    fixed = old[start_b:end_b]
    if len(fixed) < MIN_CHARS or not any(len(w) >= MIN_WORD for w in re.findall(r"\w+", fixed)):
        return None
    name = None
    if i2 - i1 == 1 and j2 - j1 == 1:
        was, now = wb[i1].group(), wa[j1].group()
        if _code_name(was) and _CODE_NAME.fullmatch(now):
            name = (was, now)
    return _Change(kind, fixed, new[start_a:end_a], i1 == 0, i2 == len(wb), name)


def _code_name(word: str) -> bool:
    """Whether ``word`` reads as a name in code rather than a word of prose: a name
    with an underscore, a digit, or a capital past its first letter (``MaybeStripAnsi``,
    ``max_len``), of ``MIN_WORD`` letters or more."""
    if len(word) < MIN_WORD or not _CODE_NAME.fullmatch(word):
        return False
    return "_" in word or any(c.isdigit() for c in word) or any(c.isupper() for c in word[1:])
