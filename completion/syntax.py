"""Whether a fill leaves the document well-formed.

Python with the interpreter's own parser (``compile`` to an AST, never run); every
other language an editor names with tree-sitter (``tree-sitter-language-pack``, the
``structure`` extra: its grammars are compiled in, nothing is downloaded), when it is
installed and has a grammar for the language. A fill is judged by the top-level
statement it makes (the function or class around the cursor), which keeps the check to
about a millisecond on the event loop (tree-sitter: a tenth of that). In an editor the
document is often broken elsewhere while the user types, so the stop rules compare (a
multi-line fill must parse wherever its first line alone does) rather than trust one
verdict.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable
from typing import Any

FillCheck = Callable[[str], bool]

_PYTHON = frozenset({"python"})
# LSP language identifiers whose tree-sitter grammar has another name; the others are
# looked up by their own name (``go``, ``rust``, ``typescript``, ``java``, ...).
_GRAMMARS = {
    "typescriptreact": "tsx",
    "javascriptreact": "javascript",
    "shellscript": "bash",
    "objective-c": "objc",
    "c#": "csharp",
}
# Never parsed: prose and data, where "well-formed" says nothing about a fill.
_NOT_CODE = frozenset({"plaintext", "markdown", "json", "jsonc", "yaml", "toml", "csv"})


# A line that starts a top-level statement: code at column 0, not a closing bracket.
_TOP_LEVEL = re.compile(r"^(?=[^\s)\]}])", re.MULTILINE)
# Past this many characters the chunk is not parsed (the check runs on the event loop;
# a whole 3,500-line module took 85-135 ms here under load, a function about 1 ms).
MAX_CHUNK_CHARS = 64_000


def checker(
    language_id: str, before: str, after: str, *, tree_sitter: bool = True
) -> FillCheck | None:
    """A check of the fill in its top-level statement (from the last line before the
    cursor that starts at column 0 to the next one after it), for a document in
    ``language_id``; None when Kode has no parser for the language or the statement is
    too long to parse on the event loop. ``tree_sitter``: False judges Python alone.

    Example: in ``import os\n\ndef f():\n    |\n\nx = 1\n`` the check parses
    ``def f():\n    <fill>\n\n``.
    """
    parse = _parser(language_id if tree_sitter or language_id in _PYTHON else "plaintext")
    if parse is None:
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
        return parse(head + fill + tail)

    return parses


def has_parser(language_id: str) -> bool:
    """Whether ``checker`` can judge fills in ``language_id``."""
    return _parser(language_id) is not None


@functools.cache
def _parser(language_id: str) -> Callable[[str], bool] | None:
    if language_id in _PYTHON:
        return python_parses
    if language_id in _NOT_CODE:
        return None
    grammar = _GRAMMARS.get(language_id, language_id)
    try:
        from tree_sitter_language_pack import get_parser
    except ImportError:  # the ``structure`` extra is not installed
        return None
    try:
        parser: Any = get_parser(grammar)  # type: ignore[arg-type]  # a Literal of names
    except (LookupError, ValueError):
        return None

    def tree_sitter_parses(text: str) -> bool:
        """No ERROR or MISSING node: ``tree_sitter_parses("fn f() {}")`` in Rust."""
        return not parser.parse(text.encode("utf-8", "surrogatepass")).root_node.has_error

    return tree_sitter_parses


def lazy_checker(
    language_id: str, before: str, after: str, *, tree_sitter: bool = True
) -> FillCheck | None:
    """``checker``, built on its first use: for rules that seldom need a parse (a
    multi-line fill that opened a block the suffix continues in, ``completion.stops``)."""
    if _parser(language_id if tree_sitter or language_id in _PYTHON else "plaintext") is None:
        return None
    made: list[FillCheck | None] = []

    def parses(fill: str) -> bool:
        if not made:
            made.append(checker(language_id, before, after, tree_sitter=tree_sitter))
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
