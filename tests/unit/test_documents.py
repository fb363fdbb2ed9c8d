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
    scrub,
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


# Issue #14: random edits at random UTF-16 positions, with lone surrogates and NULs.

_text = st.text(
    alphabet=st.one_of(
        st.characters(codec=None),  # any code point, lone surrogates included
        st.sampled_from(["\n", "\r", "\x00", "😀", "é"]),
    ),
    max_size=12,
)


def _edits() -> st.SearchStrategy[list[tuple[int, int, int, int, str, bool]]]:
    return st.lists(
        st.tuples(
            st.integers(-2, 6),
            st.integers(-3, 14),
            st.integers(-2, 6),
            st.integers(-3, 14),
            _text,
            st.booleans(),
        ),
        max_size=8,
    )


def _utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


@given(_text, _edits())
def test_fuzz_edits_never_break_the_store(
    initial: str, edits: list[tuple[int, int, int, int, str, bool]]
) -> None:
    """Whatever the client sends, the store keeps a text that encodes as UTF-8, keeps
    the editor's UTF-16 length for each line, and places valid edits exactly."""
    store = DocumentStore()
    store.open("file:///f.py", initial, 1)
    doc = store.get("file:///f.py")
    expected = initial
    for version, (l1, c1, l2, c2, new, valid) in enumerate(edits, start=2):
        if valid:  # a position the editor could send: from an offset in our text
            a, b = sorted((abs(l1 * 7 + c1) % (len(doc.text) + 1), abs(c2) % (len(doc.text) + 1)))
            if doc.text[a - 1 : a + 1] == "\r\n" or doc.text[b - 1 : b + 1] == "\r\n":
                continue  # between \r and \n is no LSP position
            start, end = doc.position_at(a), doc.position_at(b)
            assert doc.offset_at(start) == a and doc.offset_at(end) == b
            expected = doc.text[:a] + scrub(new) + doc.text[b:]
        rng = Range(start, end) if valid else Range(Position(l1, c1), Position(l2, c2))
        store.change("file:///f.py", version, [(new, rng)])
        doc.text.encode("utf-8")  # never raises: lone surrogates are gone
        if valid:
            assert doc.text == expected
        assert doc.version == version
        for number in range(doc.line_count):  # every line end is a valid position
            line = doc.line(number)
            assert doc.offset_at(Position(number, utf16_len(line))) >= 0


def test_a_lone_surrogate_keeps_utf16_positions() -> None:
    doc = Document("file:///s.py", "a\ud800b\n\udc00😀c")
    assert doc.text == "a\ufffdb\n\ufffd😀c"
    assert doc.offset_at(Position(1, 3)) == len("a\ufffdb\n\ufffd😀")  # 1 + 2 units
    doc.apply_change("\ud83d", Range(Position(0, 3), Position(0, 3)))
    assert doc.line(0) == "a\ufffdb\ufffd"


def test_a_negative_position_in_an_edit_counts_as_zero() -> None:
    doc = Document("file:///n.py", "abc\ndef")
    doc.apply_change("Z", Range(Position(0, -1), Position(0, 1)))
    assert doc.text == "Zbc\ndef"
    doc.apply_change("Y", Range(Position(-5, 0), Position(1, 1)))
    assert doc.text == "Yef"
