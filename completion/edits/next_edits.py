"""Next edits: the edit the user will make next, from the edits they just made.

The engine feeds every content change here (``changed``: each change with the text just
before it), and asks for the next edit at a cursor (``predict``). What is proposed:

1. An edit that repeats the last one where it repeats (``repeat.propose_repeat``: the
   other uses of a name just renamed, the next call of a function whose arguments just
   changed), found without the model.
2. Nothing otherwise: saying nothing beats saying something wrong (the model's
   prediction of an edit that repeats nothing is not made yet; docs/next-edits.md says
   where it stands).
3. Never for a document version that has moved on: a proposal names the version it was
   made for, and the protocol layer answers nothing for a request about another.

The history is bounded (``history.HistoryLimits``), dropped with its document
(``forget``), and never logged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kode.completion.documents import DocumentStore, Position, Range
from kode.completion.edits.history import EditHistory, HistoryLimits
from kode.completion.edits.repeat import RepeatKind, propose_repeat


@dataclass(frozen=True, slots=True)
class NextEdit:
    """Replace ``range`` of document ``uri`` (at ``version``) with ``text``; ``start``,
    ``end``: the same range in code points of that version's text."""

    uri: str
    version: int
    range: Range
    text: str
    start: int
    end: int
    kind: RepeatKind

    def on_line(self, line: int) -> bool:
        """Whether it replaces text of line ``line`` only (what a standard inline
        completion item with a ``range`` can show)."""
        return self.range.start.line == line and self.range.end.line == line


class NextEdits:
    """The edit history of one workspace and the predictions made from it."""

    def __init__(
        self,
        documents: DocumentStore,
        now: Callable[[], float],
        limits: HistoryLimits | None = None,
    ) -> None:
        self.documents = documents
        self._now = now
        self.history = EditHistory(limits)
        self.proposed = 0  # next edits proposed (``kode/stats``)

    def changed(self, uri: str, before: str, text: str, range_: Range | None, version: int) -> None:
        """One content change of ``uri``: ``range_`` of ``before`` (None: all of it)
        became ``text``, making ``version``."""
        self.history.record(uri, before, text, range_, version=version, now=self._now())

    def forget(self, uri: str) -> None:
        self.history.forget(uri)

    def predict(self, uri: str, position: Position) -> NextEdit | None:
        """The next edit in ``uri`` for a cursor at ``position`` (rules 1-2), or None.
        Raises ``DocumentError`` for a document that is not open or a position outside it."""
        doc = self.documents.get(uri)
        cursor = doc.offset_at(position)
        found = propose_repeat(
            self.history.hunks(), uri, doc.text, cursor, self.history.undone(uri)
        )
        if found is None:
            return None
        self.proposed += 1
        return NextEdit(
            uri=uri,
            version=doc.version,
            range=Range(doc.position_at(found.start), doc.position_at(found.end)),
            text=found.text,
            start=found.start,
            end=found.end,
            kind=found.kind,
        )
