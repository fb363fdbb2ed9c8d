"""What the windows, the reader and the workspace index keep per document or file is
bounded: by the open documents, by ``READ_MARKS``, by the indexed files."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from kode.backends.base import Backend, PrefillRate
from kode.completion import reading
from kode.completion.documents import DocumentStore
from kode.completion.project.workspace import IndexLimits, WorkspaceIndex
from kode.completion.reading import Reader, fingerprint, regions
from kode.completion.settings import Settings
from kode.completion.windows import Windows


class TokenCounter:
    def count_tokens(self, text: str) -> int:
        return max(1, len(text) // 4)


def test_the_windows_forget_documents_no_longer_open() -> None:
    documents = DocumentStore()
    windows = Windows(Settings, documents, PrefillRate())
    backend = cast(Backend, TokenCounter())
    for i in range(10):
        uri = f"file:///w/doc{i}.py"
        documents.open(uri, "x = 1\n" * 20, 1, "python")
        windows.full(uri, documents.get(uri), 10, backend)
        documents.close(uri)  # closed without ``forget`` (an edit that could not be read)
    kept = "file:///w/kept.py"
    documents.open(kept, "y = 2\n" * 20, 1, "python")
    windows.full(kept, documents.get(kept), 10, backend)
    assert windows.kept_documents() == {kept}


def test_the_reader_remembers_a_bounded_number_of_regions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reading, "READ_MARKS", 8)
    reader = Reader()
    uri = "file:///w/read.py"
    text = "x = 1\n" * 10
    region = reader.next(uri, text)
    assert region is not None
    reader.done(uri, region[1], 10)
    assert reader.next(uri, text) is None  # read once per text
    first = region[1]
    for mark in range(1, 9):  # a long session's edits
        reader.done(uri, first + mark, 10)
    assert reader.next(uri, text) == region  # the oldest mark was dropped: read again
    assert regions(text.splitlines(keepends=True), []) == [(0, 10)]
    assert fingerprint(text) == first


def test_the_workspace_index_keeps_versions_of_indexed_files_only(tmp_path: Path) -> None:
    index = WorkspaceIndex([tmp_path], IndexLimits(in_child=False))
    try:
        kept = tmp_path / "kept.py"
        kept.write_text("def keep():\n    pass\n")
        assert index.update(kept)
        before = index.version(kept.resolve())
        for i in range(50):
            path = tmp_path / f"temp{i}.py"
            path.write_text(f"def t{i}():\n    pass\n")
            assert index.update(path)
            seen = index.version(path.resolve())
            path.unlink()
            index.remove(path)
            assert index.version(path.resolve()) > seen  # removed: grown, not forgotten
            assert index.versions_held() == 1
        assert index.version(kept.resolve()) == before
        kept.write_text("def changed():\n    pass\n")
        assert index.update(kept)
        assert index.version(kept.resolve()) > before
    finally:
        index.close()
