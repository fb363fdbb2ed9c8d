"""``kode bench names``' holes, without a model: each is a closed-set dereference whose
name the file has, judged by what Python says."""

from __future__ import annotations

from kode.bench.names import Options, find_holes


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
