"""The worked examples in the docstrings of Kode's modules run, and hold: every module
whose source has one (``>>>``) is found, so a new module's examples run without a list
to keep (the torch path's modules are left out: importing torch takes seconds)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("lsp", "completion", "backends", "bench", "serve", "cli")
SKIP = ("backends/torch/",)


def with_examples() -> list[str]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SKIP) or ">>> " not in path.read_text(encoding="utf-8"):
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found.append("kode." + ".".join(parts))
    return found


MODULES = with_examples()


def test_the_known_examples_are_found() -> None:
    for name in ("kode.backends.daemon.scheduler", "kode.completion.edits.repeat"):
        assert name in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0
    assert result.failed == 0
