"""``kode complete`` reads the source files people have (issue #14: Latin-1 was refused)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kode.cli.main import main
from kode.cli.source import read_source


def test_utf8_with_and_without_bom_and_latin1(tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_bytes("name = 'café'\n".encode())
    assert read_source(path)[0] == "name = 'café'\n"
    path.write_bytes("\ufeffname = 'café'\n".encode())
    assert read_source(path)[0] == "name = 'café'\n"
    path.write_bytes("name = 'café'\n".encode("latin-1"))
    assert read_source(path)[0] == "name = 'café'\n"


def test_kode_complete_reads_a_latin1_file_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "old.py"
    src.write_bytes("# -*- coding: latin-1 -*-\nnom = 'été'\n".encode("latin-1"))
    argv = ["complete", str(src), "--line", "1", "--character", "0"]
    assert main([*argv, "--model", str(tmp_path / "none.gguf")]) == 1
    err = capsys.readouterr().err
    assert "is not UTF-8; read it as Latin-1" in err
    assert "model file not found" in err  # it got past reading the file
    assert "cannot read" not in err
