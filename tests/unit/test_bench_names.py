"""``kode bench names``' holes, without a model: each is a closed-set dereference whose
name the file has, judged by what Python says."""

from __future__ import annotations

import ast
import importlib.metadata
import inspect

from kode.bench.names import Options, find_holes, truth


def test_holes_are_closed_set_dereferences_with_their_truth() -> None:
    holes, seen = find_holes(Options(holes=6, packages=("json", "email")))
    assert len(holes) == 6
    assert seen["closed"] == 6 and seen["dereferences"] >= 6
    for hole in holes:
        assert hole.receiver in hole.names.members
        assert hole.expected in hole.truth  # the file's own name exists, as Python says
        assert hole.before.endswith(f"{hole.receiver}.")
        assert hole.names.line == hole.before[hole.before.rfind("\n") + 1 :]
    again, _ = find_holes(Options(holes=6, packages=("json", "email")))
    assert [(h.file, h.line) for h in again] == [(h.file, h.line) for h in holes]  # seeded


def test_an_attribute_the_class_only_annotates_exists() -> None:
    # importlib.metadata.EntryPoint annotates ``value: str`` and sets it through
    # ``vars(self).update(...)``: no ``self.value =`` anywhere, yet ``self.value`` exists.
    source = inspect.getsource(importlib.metadata)
    line = source[: source.index("self.pattern.match(self.value)")].count("\n") + 1
    known = truth("importlib.metadata", ast.parse(source), line, "self")
    assert known is not None and {"value", "group", "load"} <= known
