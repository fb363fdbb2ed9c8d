"""The edit history: hunks grouped in time and place, moved with the text, bounded."""

from __future__ import annotations

import ast
import doctest
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from kode.completion.documents import Document, Position, Range
from kode.completion.edits import history as history_module
from kode.completion.edits.history import (
    EditHistory,
    HistoryLimits,
    Hunk,
    diff_changes,
)

URI = "file:///w/a.py"


class Editor:
    """A document typed into as an editor would, each change fed to the history."""

    def __init__(self, text: str, history: EditHistory | None = None, uri: str = URI) -> None:
        self.doc = Document(uri, text)
        self.history = history if history is not None else EditHistory()
        self.now = 0.0

    def change(self, range_: Range | None, text: str, *, after: float = 0.1) -> None:
        self.now += after
        before = self.doc.text
        self.doc.apply_change(text, range_)
        self.doc.version += 1
        self.history.record(
            self.doc.uri, before, text, range_, version=self.doc.version, now=self.now
        )

    def type(self, line: int, character: int, text: str, *, after: float = 0.1) -> None:
        """``text`` typed key by key at ``line``:``character`` (no line breaks in it)."""
        for i, ch in enumerate(text):
            at = Position(line, character + i)
            self.change(Range(at, at), ch, after=after if i == 0 else 0.1)

    def replace(self, line: int, start: int, end: int, text: str, *, after: float = 0.1) -> None:
        self.change(Range(Position(line, start), Position(line, end)), text, after=after)

    def hunks(self) -> tuple[Hunk, ...]:
        return self.history.hunks()


def lines(count: int) -> str:
    return "".join(f"line{i} = {i}\n" for i in range(count))


def assert_in_place(hunk: Hunk, text: str) -> None:
    """The hunk's after text is where it says, at the line it says."""
    assert text[hunk.start : hunk.end] == hunk.after
    assert Document(hunk.uri, text).position_at(hunk.start) == Position(hunk.start_line, 0)


def test_keys_typed_without_a_pause_make_one_hunk() -> None:
    editor = Editor("def f(x):\n    return x\n")
    editor.type(1, 12, " + 1")
    [hunk] = editor.hunks()
    assert (hunk.start_line, hunk.before, hunk.after) == (1, "    return x", "    return x + 1")
    assert_in_place(hunk, editor.doc.text)


def test_a_pause_starts_a_new_hunk_at_the_same_place() -> None:
    editor = Editor("x = 1\n")
    editor.type(0, 5, "0")
    editor.type(0, 6, "0", after=1.5)
    first, second = editor.hunks()
    assert (first.before, first.after) == ("x = 1", "x = 10")
    assert (second.before, second.after) == ("x = 10", "x = 100")


def test_edits_within_eight_lines_group_and_far_ones_do_not() -> None:
    editor = Editor(lines(30))
    editor.replace(2, 8, 9, "two")
    editor.replace(5, 8, 9, "five")  # 3 lines below, within the pause: the same hunk
    editor.replace(25, 9, 11, "many")  # far away: a new one
    near, far = editor.hunks()
    assert near.start_line == 2
    assert near.before.splitlines() == ["line2 = 2", "line3 = 3", "line4 = 4", "line5 = 5"]
    assert near.after.splitlines() == ["line2 = two", "line3 = 3", "line4 = 4", "line5 = five"]
    assert (far.start_line, far.before, far.after) == (25, "line25 = 25", "line25 = many")
    for hunk in (near, far):
        assert_in_place(hunk, editor.doc.text)


def test_an_edit_in_another_document_starts_a_new_hunk() -> None:
    history = EditHistory()
    a, b = Editor("a = 1\n", history, "file:///a.py"), Editor("b = 1\n", history, "file:///b.py")
    a.replace(0, 4, 5, "2")
    b.replace(0, 4, 5, "2")
    a.replace(0, 4, 5, "3")
    assert [h.uri for h in history.hunks()] == ["file:///a.py", "file:///b.py", "file:///a.py"]
    assert [h.uri for h in history.hunks("file:///b.py")] == ["file:///b.py"]


def test_typed_then_deleted_leaves_nothing() -> None:
    editor = Editor("x = 1\n")
    editor.type(0, 5, "23")
    editor.replace(0, 5, 7, "")
    assert editor.hunks() == ()


def test_undo_and_redo_after_a_pause_are_edits_too() -> None:
    editor = Editor("total = n\n")
    editor.replace(0, 8, 9, "count")
    editor.replace(0, 8, 13, "n", after=2.0)  # undo
    editor.replace(0, 8, 9, "count", after=2.0)  # redo
    assert [(h.before, h.after) for h in editor.hunks()] == [
        ("total = n", "total = count"),
        ("total = count", "total = n"),
        ("total = n", "total = count"),
    ]


def test_hunks_move_with_lines_added_and_removed_above() -> None:
    editor = Editor(lines(20))
    editor.replace(15, 9, 11, "fifteen")
    editor.change(Range(Position(1, 0), Position(1, 0)), "new\nlines\nhere\n", after=2.0)
    editor.change(Range(Position(0, 0), Position(1, 0)), "", after=2.0)  # delete line 0
    hunk = editor.hunks()[0]
    assert hunk.start_line == 15 + 3 - 1
    assert_in_place(hunk, editor.doc.text)
    assert editor.doc.line(hunk.start_line) == "line15 = fifteen"


def test_a_line_break_typed_at_the_end_of_an_edited_line_joins_its_hunk() -> None:
    editor = Editor("if x:\n    pass\n")
    editor.type(0, 5, " # y")
    editor.change(Range(Position(0, 9), Position(0, 9)), "\n    ")
    [hunk] = editor.hunks()
    assert (hunk.before, hunk.after) == ("if x:", "if x: # y\n    ")
    assert_in_place(hunk, editor.doc.text)


def test_lsp_ranges_count_utf16_and_windows_line_breaks() -> None:
    editor = Editor('s = "😀"\r\nn = 1\r\n')
    editor.replace(0, 7, 7, "!")  # after the emoji's two UTF-16 units
    editor.replace(1, 4, 5, "2", after=2.0)
    first, second = editor.hunks()
    assert (first.before, first.after) == ('s = "😀"', 's = "😀!"')
    assert (second.start_line, second.before, second.after) == (1, "n = 1", "n = 2")
    assert second.above == ('s = "😀!"',)
    assert_in_place(second, editor.doc.text)


def test_a_whole_document_change_is_diffed_into_its_edits() -> None:
    editor = Editor(lines(30))
    new = editor.doc.text.replace("line3 = 3", "line3 = three").replace("line27 = 27", "line27 = x")
    editor.change(None, new)
    near, far = editor.hunks()
    assert (near.start_line, near.before, near.after) == (3, "line3 = 3", "line3 = three")
    assert (far.start_line, far.before, far.after) == (27, "line27 = 27", "line27 = x")
    # Full-sync keystrokes group as incremental ones do.
    editor.change(None, editor.doc.text.replace("line27 = x", "line27 = xy"))
    assert [h.after for h in editor.hunks()] == ["line3 = three", "line27 = xy"]


def test_diff_changes_rebuild_the_new_text() -> None:
    old = "a\nb\nc\nd\ne\n"
    new = "a\nB\nc\nd\nE\nf\n"
    text = old
    for start, end, replacement in diff_changes(old, new):
        text = text[:start] + replacement + text[end:]
    assert text == new
    assert diff_changes(old, old) == []


@settings(max_examples=60, deadline=None)
@given(
    st.text(alphabet="ab\n😀", max_size=30),
    st.text(alphabet="ab\n😀", max_size=30),
)
def test_diff_changes_always_rebuild_the_new_text(old: str, new: str) -> None:
    text = old
    for start, end, replacement in diff_changes(old, new):
        text = text[:start] + replacement + text[end:]
    assert text == new


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 60), st.integers(0, 4), st.text("xy\n", max_size=4), st.booleans()
        ),
        max_size=12,
    )
)
def test_the_newest_hunk_is_always_where_it_says(
    edits: list[tuple[int, int, str, bool]],
) -> None:
    history = EditHistory(HistoryLimits(hunks=4))
    text, now = "ab\ncd\nef\n" * 4, 0.0
    for start, length, replacement, pause in edits:
        start = min(start, len(text))
        end = min(start + length, len(text))
        now += 2.0 if pause else 0.1
        history.record_offsets(URI, text, start, end, replacement, version=1, now=now)
        text = text[:start] + replacement + text[end:]
        hunks = history.hunks()
        assert len(hunks) <= 4
        if hunks:
            assert_in_place(hunks[-1], text)


def test_bounds_drop_the_oldest() -> None:
    history = EditHistory(HistoryLimits(hunks=3, per_document=2, chars=10_000))
    a, b = Editor(lines(5), history, "file:///a.py"), Editor(lines(5), history, "file:///b.py")
    for i in range(3):
        a.replace(i, 8, 9, "A", after=2.0)
    assert [h.start_line for h in history.hunks()] == [1, 2]  # two a document
    b.replace(0, 8, 9, "B", after=2.0)
    b.replace(1, 8, 9, "B", after=2.0)
    assert [(h.uri[-4:], h.start_line) for h in history.hunks()] == [
        ("a.py", 2),
        ("b.py", 0),
        ("b.py", 1),
    ]


def test_bounds_on_characters() -> None:
    history = EditHistory(HistoryLimits(chars=60, hunk_chars=40, context_lines=0))
    editor = Editor(lines(10), history)
    for i in range(5):
        editor.replace(i, 8, 9, "x" * 9, after=2.0)  # 8 + 16 = 24 characters a hunk
    assert sum(h.chars for h in history.hunks()) <= 60
    assert [h.start_line for h in history.hunks()] == [3, 4]
    editor.replace(8, 8, 9, "y" * 40, after=2.0)  # too large to keep
    assert [h.start_line for h in history.hunks()] == [3, 4]


def test_forget_drops_a_documents_hunks() -> None:
    history = EditHistory()
    a, b = Editor("a\n", history, "file:///a.py"), Editor("b\n", history, "file:///b.py")
    a.replace(0, 0, 1, "A")
    b.replace(0, 0, 1, "B")
    history.forget("file:///a.py")
    assert [h.uri for h in history.hunks()] == ["file:///b.py"]


def test_diff_and_blocks_render_with_context() -> None:
    editor = Editor("import os\n\ndef f(n):\n    return n\n\nprint(f(1))\n")
    editor.replace(2, 6, 7, "count")
    [hunk] = editor.hunks()
    assert hunk.diff(path="pkg/a.py", context=1) == (
        "--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -2,3 +2,3 @@\n \n-def f(n):\n+def f(count):\n"
        "     return n\n"
    )
    assert hunk.diff().splitlines()[2] == "@@ -1,6 +1,6 @@"  # 2 lines above, 3 below
    assert hunk.blocks(context=0) == ("def f(n):", "def f(count):")


def test_no_text_is_logged_or_shown_in_a_repr() -> None:
    editor = Editor("secret = 'hunter2'\n")
    editor.replace(0, 10, 17, "swordfish")
    [hunk] = editor.hunks()
    assert "hunter2" not in repr(hunk) and "swordfish" not in repr(hunk)
    source = Path(history_module.__file__).read_text(encoding="utf-8")
    imported = {
        alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert "logging" not in imported


def test_worked_examples() -> None:
    result = doctest.testmod(history_module)
    assert result.attempted > 0 and result.failed == 0
