"""``kode bench next-edit`` without git: cutting a commit's diff into cases, their class,
and the score of a proposal, on tiny synthetic diffs (the git reader is in
tests/process/test_bench_next_edits_git.py)."""

from __future__ import annotations

import asyncio
import difflib
import itertools
import re

from kode.bench.next_edit_cases import (
    MAX_HUNK_LINES,
    OTHER,
    REPEAT,
    FileSequence,
    applied,
    classify,
    cut_hunks,
    parse_diff,
    sequence,
    token_changes,
)
from kode.bench.next_edits import CaseResult, Step, pick, replay, score, steps, summarize

RENAME_OLD = """\
def area(n):
    total = 2

    if n > 10:
        print("big")

    return total + n
"""


def headers(old: str, new: str) -> list[tuple[int, int, int, int]]:
    """git's ``-U0`` hunk headers for ``old`` -> ``new`` (difflib's diff, read back)."""
    diff = "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), "a/f.py", "b/f.py", n=0
        )
    )
    return parse_diff("diff --git a/f.py b/f.py\n" + diff)["f.py"]


def renamed(text: str, old: str, new: str) -> str:
    return re.sub(rf"\b{old}\b", new, text)


def test_parse_diff_reads_each_files_hunks_and_leaves_out_added_and_deleted_files() -> None:
    diff = """\
diff --git a/a.py b/a.py
index 1..2 100644
--- a/a.py
+++ b/a.py
@@ -2 +2 @@ def f():
-    x = 1
+    x = 2
@@ -10,2 +9,0 @@
-gone
-gone too
diff --git a/new.py b/new.py
new file mode 100644
--- /dev/null
+++ b/new.py
@@ -0,0 +1 @@
+hello
diff --git a/old.py b/old.py
deleted file mode 100644
--- a/old.py
+++ /dev/null
@@ -1 +0,0 @@
-bye
"""
    assert parse_diff(diff) == {"a.py": [(2, 1, 2, 1), (10, 2, 9, 0)]}


def test_hunks_are_cut_from_the_texts_and_apply_back_to_the_new_text() -> None:
    old = "a\nb\nc\nd\ne"  # no last line break
    new = "a\nB\nc\nx\ny\nd\nE"
    hunks = cut_hunks(old, new, headers(old, new))
    assert [(h.start, h.old, h.new) for h in hunks] == [
        (1, ("b\n",), ("B\n",)),
        (3, (), ("x\n", "y\n")),  # inserted before line 3 ("d")
        (4, ("e",), ("E",)),
    ]
    assert applied(old, hunks) == new
    assert cut_hunks(old, new, [(40, 1, 40, 1)]) == []  # headers that do not fit: nothing


def test_token_changes_ignore_white_space_and_see_each_repeated_substitution() -> None:
    assert token_changes("x = f(n) + n\n", "x = f(count) + count\n") == (
        (("n",), ("count",)),
        (("n",), ("count",)),
    )
    assert token_changes("f(a)", "f(a, timeout=t)") == (((), (",", "timeout", "=", "t")),)
    assert token_changes("x  =  'a b'", "x = 'a b'") == ()
    assert token_changes("s = 'a b'", "s = 'a c'") == ((("'a b'",), ("'a c'",)),)


def test_a_continued_rename_is_a_repeat_and_a_new_change_is_other() -> None:
    new = renamed(RENAME_OLD, "n", "count")
    seq = sequence("r", "c", "f.py", RENAME_OLD, new, headers(RENAME_OLD, new), max_hunks=12)
    assert seq is not None
    assert [h.start for h in seq.hunks] == [0, 3, 6]
    assert seq.cases == ((1, REPEAT), (2, REPEAT))
    # A hunk with a change not made before is other; the rename after it repeats.
    mixed = new.replace("count > 10", "count > 20")
    seq = sequence("r", "c", "f.py", RENAME_OLD, mixed, headers(RENAME_OLD, mixed), 12)
    assert seq is not None
    assert classify(seq.hunks, 1) == OTHER  # (n -> count, 10 -> 20) after the rename alone
    assert classify(seq.hunks, 2) == REPEAT


def test_white_space_alone_is_other_and_a_large_next_hunk_is_no_case() -> None:
    old = "a = 1\n\nb = 2\nc = 3\n"
    new = "a = 1\n\nb  =  2\nc = 3\n"
    spaced = "A = 1\n\nb  =  2\nc = 3\n"
    seq = sequence("r", "c", "f.py", old, spaced, headers(old, spaced), 12)
    assert seq is not None and seq.cases == ((1, OTHER),)
    assert sequence("r", "c", "f.py", old, new, headers(old, new), 12) is None  # one hunk
    # A block of MAX_HUNK_LINES + 1 changed lines is applied, never asked for.
    count = MAX_HUNK_LINES + 1
    big = "x = 0\n\n" + "".join(f"y{i} = {i}\n" for i in range(count)) + "\nz = 1\n"
    grown = "x = 9\n\n" + "".join(f"y{i} = -{i}\n" for i in range(count)) + "\nz = 2\n"
    seq = sequence("r", "c", "f.py", big, grown, headers(big, grown), 12)
    assert seq is not None and len(seq.hunks) == 3
    assert seq.cases == ((2, OTHER),)


def test_files_that_are_not_kept() -> None:
    old, new = "a = 1\nb = 2\nc = 3\n", "a = 2\nb = 2\nc = 4\n"
    assert sequence("r", "c", "f.py", old, new, headers(old, new), 12) is not None
    assert sequence("r", "c", "f.png", old, new, headers(old, new), 12) is None
    crlf_old, crlf_new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
    assert sequence("r", "c", "f.py", crlf_old, crlf_new, [(1, 1, 1, 1), (3, 1, 3, 1)], 12) is None


def test_max_hunks_bounds_the_sequence() -> None:
    old = "".join(f"v{i} = n\n\n" for i in range(10))
    new = renamed(old, "n", "m")
    seq = sequence("r", "c", "f.py", old, new, headers(old, new), max_hunks=4)
    assert seq is not None and len(seq.hunks) == 4
    assert [k for k, _ in seq.cases] == [1, 2, 3]


def test_steps_make_the_trimmed_change_and_put_the_cursor_after_it() -> None:
    old = "def f(n):\n\n    return n\n\nx = 1\n"
    new = "def f(count):\n\n    return count\n\n"
    cut = steps(old, cut_hunks(old, new, headers(old, new)))
    assert [(s.line, s.text, s.before[s.start : s.end]) for s in cut] == [
        (0, "count", "n"),
        (2, "count", "n"),
        (4, "", "x = 1\n"),
    ]
    assert cut[0].after[cut[0].cursor - 5 : cut[0].cursor] == "count"
    assert cut[-1].after == new
    for a, b in itertools.pairwise(cut):
        assert a.after == b.before


def two_renames() -> tuple[str, list[Step]]:
    old = "a = n\nb = 1\nc = n + n\n\nd = n\n"
    new = "a = m\nb = 1\nc = m + m\n\nd = m\n"
    return old, steps(old, cut_hunks(old, new, headers(old, new)))


def test_score_exact_location_and_shown_and_wrong() -> None:
    _, (first, second, third) = two_renames()
    doc = second.before  # "a = m\nb = 1\nc = n + n\nd = n\n"
    nothing = score(second, [first], None)
    assert not (nothing.shown or nothing.exact or nothing.location or nothing.reversal)
    line = doc.index("c = n + n")
    whole = score(second, [first], (line, line + 9, "c = m + m"))
    assert whole.shown and whole.exact and whole.location and not whole.part
    # One use of two on the line: located, not exact, a step towards it.
    one = score(second, [first], (line + 4, line + 5, "m"))
    assert one.shown and not one.exact and one.location and one.part and not one.later
    # Right edit at the place after the next one: wrong, located elsewhere, ``later``.
    d = doc.index("d = n") + 4
    ahead = score(second, [first], (d, d + 1, "m"), [third.hunk])
    assert ahead.shown and not ahead.exact and not ahead.location and ahead.later
    # Something else within the lines: located, wrong.
    other = score(second, [first], (line, line + 1, "e"))
    assert other.location and not other.exact and not other.part


def test_a_whole_line_replacement_that_equals_the_hunk_is_exact() -> None:
    _, (first, second, _) = two_renames()
    doc = second.before
    line = doc.index("c = n + n")
    assert score(second, [first], (line, line + 10, "c = m + m\n")).exact


def test_reversal_is_undoing_an_applied_hunk_within_its_lines() -> None:
    _, (first, second, _) = two_renames()
    doc = second.before
    undo = score(second, [first], (4, 5, "n"))  # a = m -> a = n, where the person renamed
    assert undo.reversal and not undo.exact
    # The same reversed change elsewhere is wrong, but undoes no applied hunk.
    elsewhere = doc.index("b = 1")
    assert not score(second, [first], (elsewhere, elsewhere, "m")).reversal
    # A change within the applied lines that is not the reverse is no reversal.
    assert not score(second, [first], (4, 5, "q")).reversal


def test_location_of_a_hunk_that_only_inserts_lines() -> None:
    old = "a(1)\nb = 2\nc = 3\n"
    new = "a(1, t)\nb = 2\nnew = 4\nc = 3\n"
    first, second = steps(old, cut_hunks(old, new, headers(old, new)))
    assert second.hunk.old == () and second.line == 2
    at = second.before.index("c = 3")
    right = score(second, [first], (at, at, "new = 4\n"))
    assert right.exact and right.location
    near = score(second, [first], (at, at, "other = 4\n"))  # the line after the insertion
    assert near.location and not near.exact
    far = score(second, [first], (0, 1, "z"))
    assert not far.location


def test_pick_fills_each_class_up_to_its_limit_and_the_commits_room() -> None:
    seq = FileSequence("r", "c", "f.py", "", (), ((1, OTHER), (2, REPEAT), (3, REPEAT), (4, OTHER)))
    counts = {REPEAT: 0, OTHER: 0}
    assert pick(seq, counts, limit=1, room=8) == {1: OTHER, 2: REPEAT}
    assert counts == {REPEAT: 1, OTHER: 1}
    counts = {REPEAT: 0, OTHER: 0}
    assert pick(seq, counts, limit=5, room=3) == {1: OTHER, 2: REPEAT, 3: REPEAT}


def result(klass: str, shown: bool, exact: bool, ms: float) -> CaseResult:
    return CaseResult(
        repo="r", commit="c", file="f.py", k=1, hunks=2, klass=klass, cursor=(0, 0),
        next={"line": 1, "old": 1, "new": 1}, shown=shown, exact=exact, location=exact,
        reversal=False, part=False, later=False, ms=ms, proposal=None,
    )  # fmt: skip


def test_summarize_counts_percent_of_requests() -> None:
    rows = summarize(
        [
            result(REPEAT, True, True, 1.0),
            result(REPEAT, True, False, 2.0),
            result(REPEAT, False, False, 3.0),
            result(REPEAT, False, False, 4.0),
            result(OTHER, False, False, 5.0),
        ]
    )
    by = {row["class"]: row for row in rows}
    assert by[REPEAT]["exact_pct"] == 25.0
    assert by[REPEAT]["shown_pct"] == 50.0
    assert by[REPEAT]["shown_wrong_pct"] == 25.0
    assert by[OTHER]["exact"] == 0 and by[OTHER]["cases"] == 1
    assert by["all"]["cases"] == 5 and by["all"]["p50_ms"] == 3.0


def test_replay_through_the_engine_proposes_the_continued_rename() -> None:
    old = "def f(n):\n    x = 1\n    y = 2\n    return n\n"
    new = "def f(count):\n    x = 1\n    y = 2\n    return count\n"
    seq = sequence("r", "c", "f.py", old, new, headers(old, new), 12)
    assert seq is not None and seq.cases == ((1, REPEAT),)
    [case] = asyncio.run(replay(seq, dict(seq.cases)))
    assert case.shown and case.exact and case.location and not case.reversal
    assert case.cursor == (0, 11)  # after "count" on the def line
    assert case.next == {"line": 3, "old": 1, "new": 1}
    assert case.proposal is not None and case.proposal["text"] == "count"
    assert case.record()["class"] == REPEAT and case.ms > 0
