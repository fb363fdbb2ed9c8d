"""Whether a fill leaves the document well-formed, for languages Kode can parse itself.

Only Python, with the interpreter's own parser (``compile`` to an AST, never run): a
fill is judged by the top-level statement it makes (the function or class around the
cursor), which keeps the check to about a millisecond on the event loop. In an editor
the document is often broken elsewhere while the user types, so the stop rules compare
(a multi-line fill must parse wherever its first line alone does) rather than trust one
verdict.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

FillCheck = Callable[[str], bool]

_PYTHON = frozenset({"python"})


# A line that starts a top-level statement: code at column 0, not a closing bracket.
_TOP_LEVEL = re.compile(r"^(?=[^\s)\]}])", re.MULTILINE)
# Past this many characters the chunk is not parsed (the check runs on the event loop;
# a whole 3,500-line module took 85-135 ms here under load, a function about 1 ms).
MAX_CHUNK_CHARS = 64_000


def checker(language_id: str, before: str, after: str) -> FillCheck | None:
    """A check of the fill in its top-level statement (from the last line before the
    cursor that starts at column 0 to the next one after it), for a document in
    ``language_id``; None when Kode has no parser for the language or the statement is
    too long to parse on the event loop.

    Example: in ``import os\n\ndef f():\n    |\n\nx = 1\n`` the check parses
    ``def f():\n    <fill>\n\n``.
    """
    if language_id not in _PYTHON:
        return None
    starts = [m.start() for m in _TOP_LEVEL.finditer(before)]
    head = before[starts[-1] :] if starts else before
    first_break = after.find("\n")
    tail = after
    if first_break != -1:
        found = _TOP_LEVEL.search(after, first_break + 1)
        if found is not None:
            tail = after[: found.start()]
    if len(head) + len(tail) > MAX_CHUNK_CHARS:
        return None

    def parses(fill: str) -> bool:
        return python_parses(head + fill + tail)

    return parses


def lazy_checker(language_id: str, before: str, after: str) -> FillCheck | None:
    """``checker``, built on its first use: for rules that seldom need a parse (a
    multi-line fill that opened a block the suffix continues in, ``completion.stops``)."""
    if language_id not in _PYTHON:
        return None
    made: list[FillCheck | None] = []

    def parses(fill: str) -> bool:
        if not made:
            made.append(checker(language_id, before, after))
        check = made[0]
        return check is not None and check(fill)

    return parses


def python_parses(text: str) -> bool:
    """``python_parses("if x:\\n    y = 1\\n") is True``; a stray indent is not."""
    try:
        compile(text, "<fill>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True
