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
# Tree-sitter parses a whole document: 64 KB of JavaScript in 2.3 ms here.
MAX_DOCUMENT_CHARS = 256_000


def checker(
    language_id: str, before: str, after: str, *, tree_sitter: bool = True
) -> FillCheck | None:
    """A check of the fill in ``before`` + fill + ``after``, a document in
    ``language_id``; None when Kode has no parser for the language or the document is
    too long to parse on the event loop. ``tree_sitter``: False judges Python alone.

    Python: the fill's top-level statement (from the last line before the cursor that
    starts at column 0 to the next one after it) must compile. Example: in
    ``import os\n\ndef f():\n    |\n\nx = 1\n`` the check parses ``def f():\n    <fill>\n\n``.

    Tree-sitter: the whole document is parsed (a chunk cut at column 0 may begin inside
    a class, where ``this.#x`` is valid and outside it is not), and the fill passes when
    no error lies between the start of the cursor's line and the end of the line after
    the fill, and no more errors lie elsewhere than without it (an unclosed brace shows
    at the end of the file).
    """
    if language_id in _PYTHON:
        return _python_checker(before, after)
    if not tree_sitter:
        return None
    parser = _tree_sitter(language_id)
    if parser is None or len(before) + len(after) > MAX_DOCUMENT_CHARS:
        return None
    return _TreeSitterCheck(parser, before, after)


def has_parser(language_id: str) -> bool:
    """Whether ``checker`` can judge fills in ``language_id``."""
    return language_id in _PYTHON or _tree_sitter(language_id) is not None


def lazy_checker(
    language_id: str, before: str, after: str, *, tree_sitter: bool = True
) -> FillCheck | None:
    """``checker``, built on its first use: for rules that seldom need a parse (a
    multi-line fill that opened a block the suffix continues in, ``completion.stops``)."""
    if not (language_id in _PYTHON or (tree_sitter and has_parser(language_id))):
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


def _python_checker(before: str, after: str) -> FillCheck | None:
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


# Parsers kept, by the client's languageId (any string a client sends): more than the
# languages one person edits in a day, and each parser is small.
PARSERS_KEPT = 64


@functools.lru_cache(maxsize=PARSERS_KEPT)
def _tree_sitter(language_id: str) -> Any | None:
    """The tree-sitter parser for ``language_id``; None without one (or the extra)."""
    if language_id in _NOT_CODE:
        return None
    try:
        from tree_sitter_language_pack import get_parser
    except ImportError:  # the ``structure`` extra is not installed
        return None
    try:
        return get_parser(_GRAMMARS.get(language_id, language_id))  # type: ignore[arg-type]
    except (LookupError, ValueError):
        return None


class _TreeSitterCheck:
    """``checker`` for a tree-sitter language (see there), called like a FillCheck."""

    def __init__(self, parser: Any, before: str, after: str) -> None:
        self._parser = parser
        self._before, self._after = _utf8(before), _utf8(after)
        self._line_start = len(_utf8(before[before.rfind("\n") + 1 :]))
        # The region ends with the line after the fill's last one (its seam to the suffix).
        breaks = [i for i, byte in enumerate(self._after) if byte == 0x0A][:2]
        self._after_span = breaks[-1] if len(breaks) == 2 else len(self._after)
        self._outside: int | None = None  # errors outside the region without a fill

    def __call__(self, fill: str) -> bool:
        inside, outside = self._errors(_utf8(fill))
        if inside:
            return False
        if self._outside is None:
            self._outside = self._errors(b"")[1]
        return outside <= self._outside

    def _errors(self, fill: bytes) -> tuple[int, int]:
        """ERROR and MISSING nodes in the region around ``fill``, and elsewhere."""
        tree = self._parser.parse(self._before + fill + self._after)
        low = len(self._before) - self._line_start
        high = len(self._before) + len(fill) + self._after_span
        inside = outside = 0
        stack = [tree.root_node] if tree.root_node.has_error else []
        while stack:
            node = stack.pop()
            if node.type == "ERROR" or node.is_missing:
                if node.start_byte <= high and node.end_byte >= low:
                    inside += 1
                else:
                    outside += 1
            stack.extend(child for child in node.children if child.has_error or child.is_missing)
        return inside, outside


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")
