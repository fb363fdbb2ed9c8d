"""The worked examples in the docstrings of Kode's pure modules run, and hold."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "kode.backends.daemon.paths",
    "kode.backends.daemon.scheduler",
    "kode.backends.kv_reuse",
    "kode.backends.llama.kv_chunks",
    "kode.backends.latest",
    "kode.backends.monitor",
    "kode.bench.load",
    "kode.completion.clock",
    "kode.completion.documents",
    "kode.completion.outline",
    "kode.completion.index_worker",
    "kode.completion.members",
    "kode.completion.preparation",
    "kode.completion.reading",
    "kode.completion.receivers",
    "kode.completion.windows",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0
    assert result.failed == 0
