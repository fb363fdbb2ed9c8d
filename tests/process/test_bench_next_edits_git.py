"""``kode bench next-edit`` on a tiny git repository made here: the reader finds the
commit's hunks through ``git``, and the run writes every case to its JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from kode.bench.next_edit_cases import GitReader
from kode.bench.next_edits import Options, main

BEFORE = "def f(n):\n    x = 1\n\n    y = 2\n    return n\n\n\nprint(f(3))\n"
AFTER = "def f(count):\n    x = 1\n\n    y = 2\n    return count\n\n\nprint(f(4))\n"


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "proj"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "m.py").write_text(BEFORE, encoding="utf-8")
    (repo / "notes.bin").write_bytes(b"\x00\x01")
    git(repo, "add", "m.py", "notes.bin")
    git(repo, "commit", "-q", "-m", "first")
    (repo / "m.py").write_text(AFTER, encoding="utf-8")
    git(repo, "commit", "-q", "-a", "-m", "rename")
    return repo


def test_the_reader_cuts_the_commits_sequence(repo: Path) -> None:
    reader = GitReader(repo)
    try:
        [commit] = reader.commits()  # the root commit has no parent: left out
        [seq] = reader.sequences(commit, max_hunks=12)
    finally:
        reader.close()
    assert reader.name == "proj"
    assert seq.path == "m.py" and seq.old_text == BEFORE
    assert [h.start for h in seq.hunks] == [0, 4, 7]
    assert seq.cases == ((1, "repeat"), (2, "other"))


def test_a_run_writes_every_case(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(Options(repos=(repo,), limit=5, out=out)) == 0
    printed = capsys.readouterr().out
    assert "commits read: 1 (proj 1 of " in printed and "load average" in printed
    report = json.loads((out / "next_edits.json").read_text(encoding="utf-8"))
    assert report["setup"]["commits_read"] == {"proj": 1}
    cases = {case["k"]: case for case in report["cases"]}
    assert cases[1]["class"] == "repeat" and cases[1]["exact"]  # return n -> return count
    assert cases[1]["proposal"]["text"] == "count"
    assert cases[2]["class"] == "other" and not cases[2]["exact"]
    rows = {row["class"]: row for row in report["summary"]}
    assert rows["repeat"]["exact_pct"] == 100.0 and rows["all"]["cases"] == 2
