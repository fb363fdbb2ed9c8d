"""Whether a fill leaves the document well-formed, for languages Kode can parse itself.

Only Python, with the interpreter's own parser (``compile`` to an AST, never run): a
fill is judged by the document it makes. In an editor the document is often broken
elsewhere while the user types, so the stop rules compare (does the multi-line fill
parse where its first line alone does not?) rather than trust one verdict.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

FillCheck = Callable[[str], bool]

_PYTHON = frozenset({"python"})


def checker(language_id: str, before: str, after: str) -> FillCheck | None:
    """A check of ``before + fill + after`` for a document in ``language_id``, or None
    when Kode has no parser for the language."""
    if language_id not in _PYTHON:
        return None

    def parses(fill: str) -> bool:
        return python_parses(before + fill + after)

    return parses


def python_parses(text: str) -> bool:
    """``python_parses("if x:\\n    y = 1\\n") is True``; a stray indent is not."""
    try:
        compile(text, "<fill>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True
