"""Documents: UTF-16 positions and incremental edits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kode.backends.errors import DocumentError
from kode.completion.documents import (
    Document,
    DocumentStore,
    Position,
    Range,
    utf16_len,
    utf16_to_index,
)


def test_utf16_offsets_count_surrogate_pairs() -> None:
    line = "a😀b"
    assert utf16_len(line) == 4
    assert [utf16_to_index(line, c) for c in range(5)] == [0, 1, None, 2, 3]
    assert utf16_to_index(line, 5) is None


def test_offset_at_maps_lsp_positions_across_line_breaks() -> None:
    doc = Document("file:///a.py", "x = 1\r\ny = '😀z'\nlast")
    assert doc.line_count == 3
    assert doc.line(1) == "y = '😀z'"
    # After the emoji (2 UTF-16 units) comes 'z'.
    assert doc.text[doc.offset_at(Position(1, 7))] == "z"
    assert doc.offset_at(Position(2, 4)) == len(doc.text)
    assert doc.position_at(doc.offset_at(Position(1, 7))) == Position(1, 7)


@pytest.mark.parametrize(
    "position",
    [Position(3, 0), Position(0, 6), Position(1, 6), Position(-1, 0)],
)
def test_positions_outside_the_document_are_errors(position: Position) -> None:
    doc = Document("file:///a.py", "x = 1\n😀\nz")
    with pytest.raises(DocumentError):
        doc.offset_at(position)


def test_edits_clamp_out_of_range_positions_as_lsp_says() -> None:
    doc = Document("file:///a.py", "abc\ndef")
    doc.apply_change("!", Range(Position(0, 99), Position(0, 99)))
    assert doc.text == "abc!\ndef"
    doc.apply_change("?", Range(Position(9, 0), Position(9, 0)))
    assert doc.text == "abc!\ndef?"


def test_incremental_changes_apply_in_order() -> None:
    store = DocumentStore()
    store.open("file:///m.py", "def f():\n    pass\n", 1, "python")
    doc = store.change(
        "file:///m.py",
        2,
        [
            ("return 1", Range(Position(1, 4), Position(1, 8))),
            ("😀 ", Range(Position(0, 0), Position(0, 0))),
            ("g", Range(Position(0, 7), Position(0, 8))),  # 'f' sits after 😀 (2 units) + "def "
        ],
    )
    assert doc.text == "😀 def g():\n    return 1\n"
    assert doc.version == 2
    store.change("file:///m.py", 3, [("whole", None)])
    assert store.get("file:///m.py").text == "whole"


def test_store_rejects_unknown_documents_and_orders_others_by_recency() -> None:
    store = DocumentStore()
    with pytest.raises(DocumentError):
        store.get("file:///nope.py")
    for name in "abc":
        store.open(f"file:///{name}.py", name)
    store.change("file:///a.py", 1, [("A", None)])
    assert [d.uri for d in store.others("file:///b.py")] == ["file:///a.py", "file:///c.py"]
    store.close("file:///a.py")
    assert "file:///a.py" not in store


_texts = st.text(alphabet=st.sampled_from("ab\n\r😀é "), max_size=30)


@given(_texts, st.data())
def test_random_edit_matches_string_splice(text: str, data: st.DataObject) -> None:
    doc = Document("file:///x", text)
    i = data.draw(st.integers(0, len(text)))
    j = data.draw(st.integers(i, len(text)))
    # Never split a \r\n pair: LSP positions cannot address its middle.
    if 0 < i < len(text) and text[i - 1 : i + 1] == "\r\n":
        i -= 1
    if 0 < j < len(text) and text[j - 1 : j + 1] == "\r\n":
        j += 1
    insert = data.draw(_texts)
    start, end = doc.position_at(i), doc.position_at(j)
    assert doc.offset_at(start) == i and doc.offset_at(end) == j
    doc.apply_change(insert, Range(start, end))
    assert doc.text == text[:i] + insert + text[j:]
