"""``kode next-edit``: the next edit after the edits of a diff, in-process (no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kode.cli.main import main

BEFORE = "def scale(n, k):\n    total = n * k\n    return total + n\n"
AFTER = BEFORE.replace("scale(n,", "scale(count,")
DIFF = """--- a/shapes.py
+++ b/shapes.py
@@ -1,3 +1,3 @@
-def scale(n, k):
+def scale(count, k):
     total = n * k
     return total + n
"""


@pytest.fixture
def edited(tmp_path: Path) -> tuple[Path, Path]:
    source, history = tmp_path / "shapes.py", tmp_path / "edits.diff"
    source.write_text(AFTER, encoding="utf-8")
    history.write_text(DIFF, encoding="utf-8")
    return source, history


def test_the_renamed_parameter_is_proposed_at_its_next_use(
    edited: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    source, history = edited
    args = [str(source), "--line", "0", "--character", "16", "--history", str(history)]
    assert main(["next-edit", *args, "--json"]) == 0
    [edit] = json.loads(capsys.readouterr().out)["edits"]
    assert edit["range"] == {
        "start": {"line": 1, "character": 12},
        "end": {"line": 1, "character": 13},
    }
    assert edit["text"] == "count"
    assert main(["next-edit", *args]) == 0
    assert capsys.readouterr().out == "1:12-1:13 rename: 'count'\n"


def test_a_history_that_does_not_end_at_the_file_is_refused(
    edited: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    source, history = edited
    history.write_text(DIFF.replace("+def scale(count, k):", "+def scale(other, k):"))
    args = [str(source), "--line", "0", "--character", "0", "--history", str(history)]
    assert main(["next-edit", *args]) == 1
    assert "does not end at shapes.py's text" in capsys.readouterr().err


def test_no_repeat_no_edit(edited: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    source, history = edited
    history.write_text(DIFF.replace("+def scale(count, k):", "+def scale(n, k):  # first"))
    source.write_text(BEFORE.replace("k):", "k):  # first", 1))
    args = [str(source), "--line", "0", "--character", "0", "--history", str(history)]
    assert main(["next-edit", *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"edits": []}
