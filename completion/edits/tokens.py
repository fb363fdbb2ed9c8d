"""The tokens the next-edit finders compare: names, numbers, strings, comments, symbols.

One lexer for every language: whitespace is left out, a string is one token, and so is a
comment where the document's extension says how one is written (``comment_style``).
"""

from __future__ import annotations

import enum
import re
from typing import NamedTuple


class Kind(enum.Enum):
    NAME = "name"
    NUMBER = "number"
    STRING = "string"
    COMMENT = "comment"
    SYMBOL = "symbol"


_KINDS: dict[str | None, Kind] = {kind.value: kind for kind in Kind}


class Token(NamedTuple):
    text: str
    start: int
    end: int
    kind: Kind


# Strings first (a name inside one is no use of it), then comments (a name there is none
# either; a comment is one token), names (any language's letters), numbers, the operators
# whose characters belong together, any other character.
_STRING = r"""\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"(?:\\.|[^"\\\r\n])*"|'(?:\\.|[^'\\\r\n])*'"""
_REST = r"""
  | (?P<name>[^\W\d]\w*)
  | (?P<number>\d[\w.]*)
  | (?P<symbol>==|!=|<=|>=|->|=>|::|:=|\?\.|\*\*|//|&&|\|\||<<|>>|[-+*/%&|^]=|\S)
"""
_COMMENTS = {
    "": "",
    "#": r"| (?P<comment>\#[^\r\n]*)",
    "//": r"| (?P<comment>//[^\r\n]*|/\*[\s\S]*?\*/)",
}
_LEXERS = {
    style: re.compile(f"(?P<string>{_STRING}) {comment} {_REST}", re.VERBOSE)
    for style, comment in _COMMENTS.items()
}
# Comment syntax by a document's extension (none where unknown: Markdown's ``#`` heads a
# title, not a comment).
_HASH = (".py", ".pyi", ".pyx", ".sh", ".bash", ".toml", ".cfg", ".ini", ".yml", ".yaml",
         ".rb", ".pl", ".r", ".cmake", ".conf", ".tf")  # fmt: skip
_SLASH = (".js", ".jsx", ".ts", ".tsx", ".mjs", ".c", ".h", ".cc", ".cpp", ".hpp", ".java",
          ".go", ".rs", ".cs", ".kt", ".swift", ".scala", ".dart", ".php", ".zig")  # fmt: skip


def tokenize(text: str, uri: str = "") -> list[Token]:
    """The tokens of ``text``, whitespace left out; a comment, where the extension of
    ``uri`` says how one is written, is one token.

    >>> [t.text for t in tokenize('größe = f(x, "a b") + 1.5')]
    ['größe', '=', 'f', '(', 'x', ',', '"a b"', ')', '+', '1.5']
    >>> [t.text for t in tokenize("x = 1  # uses x", "file:///a.py")]
    ['x', '=', '1', '# uses x']
    """
    lexer = _LEXERS[comment_style(uri)]
    kinds = _KINDS
    return [Token(m.group(), m.start(), m.end(), kinds[m.lastgroup]) for m in lexer.finditer(text)]


def comment_style(uri: str) -> str:
    """How a comment begins in document ``uri``: ``#``, ``//`` (or ``/*``), or "" (unknown)."""
    name = uri.rsplit("/", 1)[-1].lower()
    if name.endswith(_HASH):
        return "#"
    if name.endswith(_SLASH):
        return "//"
    return ""
