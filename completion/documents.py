"""Open documents, edited incrementally, addressed by LSP positions.

LSP positions count ``character`` in UTF-16 code units (the default position
encoding). Python strings index code points, so a character outside the Basic
Multilingual Plane (an emoji, say) is one index here and two UTF-16 units there.
Line breaks are ``\\n``, ``\\r\\n`` and ``\\r``, as the LSP specification says.

Text is stored with every lone surrogate (JSON allows ``"\\ud800"``; UTF-8 does not)
replaced by U+FFFD: one UTF-16 unit for one, so every position stays where the editor
has it, and the document can always be encoded into a prompt. One such document used
to break every completion, since others are pulled into each prompt as context.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from kode.backends.errors import DocumentError

LINE_BREAK = re.compile(r"\r\n|\r|\n")
_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (same UTF-16 length).

    >>> scrub("a\\ud800b") == "a\\ufffdb"
    True
    """
    try:
        text.encode("utf-8")  # the common case: one C-speed pass, no regex
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def file_name(uri: str) -> str:
    """What logs call a document: the last segment of its URI (``file:///a/b.py`` ->
    ``b.py``), never its text."""
    return uri.rsplit("/", 1)[-1]


def file_path(uri: str) -> Path | None:
    """The local path of a ``file:`` URI (None for other schemes).

    >>> file_path("file:///home/me/my%20proj/a.py"), file_path("untitled:Untitled-1")
    (PosixPath('/home/me/my proj/a.py'), None)
    """
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    return Path(url2pathname(parsed.path))


@dataclass(frozen=True, slots=True)
class Position:
    """Zero-based line and UTF-16 character offset, as in LSP."""

    line: int
    character: int


@dataclass(frozen=True, slots=True)
class Range:
    start: Position
    end: Position


def utf16_len(text: str) -> int:
    """Length of ``text`` in UTF-16 code units: ``utf16_len("a😀") == 3``."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def utf16_to_index(line: str, character: int) -> int | None:
    """Code-point index in ``line`` of UTF-16 offset ``character``; None if it splits a pair
    or lies past the end of the line.

    Example: in ``"a😀b"`` offsets 0, 1, 3, 4 map to 0, 1, 2, 3; offset 2 is inside 😀.
    """
    if character < 0:
        return None
    units = 0
    for index, ch in enumerate(line):
        if units == character:
            return index
        units += 2 if ord(ch) > 0xFFFF else 1
        if units > character:
            return None
    return len(line) if units == character else None


def split_lines(text: str) -> list[str]:
    """Lines without their terminators; always at least one (possibly empty) line."""
    return LINE_BREAK.split(text)


@dataclass(slots=True)
class Document:
    """One open text document."""

    uri: str
    text: str
    version: int = 0
    language_id: str = "plaintext"
    _line_starts: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.text = scrub(self.text)
        self._reindex()

    def _reindex(self) -> None:
        starts = [0]
        starts.extend(match.end() for match in LINE_BREAK.finditer(self.text))
        self._line_starts = starts

    @property
    def line_count(self) -> int:
        return len(self._line_starts)

    def line(self, number: int) -> str:
        """Text of line ``number`` without its terminator."""
        start = self._line_starts[number]
        if number + 1 < len(self._line_starts):
            end = self._line_starts[number + 1]
            text = self.text[start:end]
            return text[:-2] if text.endswith("\r\n") else text[:-1]
        return self.text[start:]

    def offset_at(self, position: Position, *, strict: bool = True) -> int:
        """String index of an LSP position.

        ``strict``: raise ``DocumentError`` for a position outside the document (what a
        completion request deserves). Otherwise clamp as the LSP specification asks of
        edits: a line past the end means the end of the document, a character past the
        end of its line means the end of that line.
        """
        if position.line < 0 or position.character < 0:
            raise DocumentError(f"negative position {position.line}:{position.character}")
        if position.line >= self.line_count:
            if strict:
                raise DocumentError(
                    f"line {position.line} is outside {self.uri} ({self.line_count} lines)"
                )
            return len(self.text)
        line = self.line(position.line)
        index = utf16_to_index(line, position.character)
        if index is None:
            if strict:
                raise DocumentError(
                    f"character {position.character} is outside line {position.line} "
                    f"of {self.uri} ({utf16_len(line)} UTF-16 units) or splits a character"
                )
            index = _clamp_index(line, position.character)
        return self._line_starts[position.line] + index

    def position_at(self, offset: int) -> Position:
        """LSP position of string index ``offset``."""
        offset = max(0, min(offset, len(self.text)))
        lo, hi = 0, len(self._line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        start = self._line_starts[lo]
        return Position(lo, utf16_len(self.text[start:offset]))

    def apply_change(self, text: str, range_: Range | None = None) -> None:
        """Replace ``range_`` (or the whole text when None) with ``text``.

        A range outside the document is clamped as the LSP specification asks; a
        negative line or character (no client should send one) counts as 0, so the
        edit still lands where the editor most likely made it rather than being lost.
        """
        text = scrub(text)
        if range_ is None:
            self.text = text
        else:
            start = self.offset_at(_non_negative(range_.start), strict=False)
            end = self.offset_at(_non_negative(range_.end), strict=False)
            if end < start:
                start, end = end, start
            self.text = self.text[:start] + text + self.text[end:]
        self._reindex()


def with_selected(
    doc: Document, cursor: Position, range_: Range, text: str
) -> tuple[Document, int]:
    """``doc`` as if the editor's selected completion item were accepted, and the offset
    right after it: the item replaces ``range_``, which must hold ``cursor`` (LSP's
    ``selectedCompletionInfo``; an editor shows inline suggestions only if they extend
    that item). The copy keeps the version; the stored document is not changed.

    >>> doc = Document("file:///a.py", "if n\\n", 3)
    >>> item = Range(Position(0, 3), Position(0, 4))
    >>> copy, offset = with_selected(doc, Position(0, 4), item, "num")
    >>> copy.text[:offset], copy.text[offset:], copy.version, doc.text
    ('if num', '\\n', 3, 'if n\\n')
    """
    start, end = doc.offset_at(range_.start), doc.offset_at(range_.end)
    if not start <= doc.offset_at(cursor) <= end:
        raise DocumentError(
            f"the selected completion item's range {range_.start.line}:"
            f"{range_.start.character}-{range_.end.line}:{range_.end.character} "
            f"does not hold the cursor {cursor.line}:{cursor.character}"
        )
    text = scrub(text)
    copy = Document(doc.uri, doc.text[:start] + text + doc.text[end:], doc.version, doc.language_id)
    return copy, start + len(text)


def _non_negative(position: Position) -> Position:
    if position.line >= 0 and position.character >= 0:
        return position
    return Position(max(0, position.line), max(0, position.character))


def _clamp_index(line: str, character: int) -> int:
    units = 0
    for index, ch in enumerate(line):
        units += 2 if ord(ch) > 0xFFFF else 1
        if units > character:
            return index
    return len(line)


class DocumentStore:
    """The documents a client has open, by URI."""

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}
        self._recency: list[str] = []  # most recently touched last

    def open(self, uri: str, text: str, version: int = 0, language_id: str = "plaintext") -> None:
        self._docs[uri] = Document(uri, text, version, language_id)
        self._touch(uri)

    def change(
        self,
        uri: str,
        version: int,
        changes: list[tuple[str, Range | None]],
        each: Callable[[str, str, Range | None], None] | None = None,
    ) -> Document:
        """Apply content changes in order (LSP ``didChange`` semantics); ``each`` is told
        every change with the text just before it (``before, text, range``)."""
        doc = self.get(uri)
        for text, range_ in changes:
            if each is not None:
                each(doc.text, text, range_)
            doc.apply_change(text, range_)
        doc.version = version
        self._touch(uri)
        return doc

    def close(self, uri: str) -> None:
        self._docs.pop(uri, None)
        if uri in self._recency:
            self._recency.remove(uri)

    def get(self, uri: str) -> Document:
        try:
            return self._docs[uri]
        except KeyError:
            raise DocumentError(f"document is not open: {uri}") from None

    def __contains__(self, uri: object) -> bool:
        return uri in self._docs

    def others(self, uri: str) -> list[Document]:
        """Open documents other than ``uri``, most recently touched first."""
        return [self._docs[u] for u in reversed(self._recency) if u != uri]

    def _touch(self, uri: str) -> None:
        if uri in self._recency:
            self._recency.remove(uri)
        self._recency.append(uri)
