"""`kode bench context`'s pure parts on a fixture package: hole mining, renaming, metrics,
summary. No model."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest
from kode.bench import context as bench
from kode.bench import context_holes as holemod


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    write(tmp_path, "pkg/__init__.py", "")
    write(
        tmp_path,
        "pkg/shapes.py",
        "def circle_area(r):\n    return 3.14 * r * r\n\n\nclass Square:\n    pass\n",
    )
    write(
        tmp_path,
        "pkg/report.py",
        "from . import shapes\n\n\ndef describe(r):\n    area = shapes.circle_area(r)\n"
        "    box = shapes.Square()\n    box2 = shapes.Square()\n    return area\n",
    )
    write(tmp_path, "pkg/other.py", "def unrelated():\n    return 1\n")
    return tmp_path


def test_holes_use_a_sibling_modules_name_written_once(source: Path) -> None:
    holes = holemod.find_holes(source, "pkg")
    # Square is written twice in report.py, so only circle_area makes a hole.
    assert [(h.module, h.defining, h.name, h.line) for h in holes] == [
        ("pkg/report.py", "pkg/shapes.py", "circle_area", 4)
    ]


def test_prepare_renames_in_the_whole_copy_and_cuts_the_line(
    source: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    [hole] = holemod.find_holes(source, "pkg")
    work = tmp_path_factory.mktemp("work")
    prepared = holemod.prepare(hole, source, work, seed=0)
    assert prepared.renamed.startswith("circle_area_") and prepared.renamed != "circle_area"
    shapes = (work / "pkg/shapes.py").read_text()
    assert f"def {prepared.renamed}(r):" in shapes and "circle_area(" not in shapes
    assert prepared.expected == f"area = shapes.{prepared.renamed}(r)"
    assert prepared.document[: prepared.offset].endswith("def describe(r):\n    ")
    assert prepared.renamed not in prepared.document
    assert prepared.defining_excerpt.startswith(f"def {prepared.renamed}(r):")
    assert prepared.sibling is not None and prepared.sibling.name == "other.py"
    assert "circle_area(" in (source / "pkg/shapes.py").read_text()  # the source is untouched


def test_new_names_keep_the_style_and_avoid_taken_names() -> None:
    rng = random.Random(0)
    assert holemod.new_name("Handler", set(), rng).startswith("Handler")
    assert holemod.new_name("NOTSET", set(), rng).startswith("NOTSET_")
    snake = holemod.new_name("make_id", set(), rng)
    assert snake.startswith("make_id_") and snake.islower()
    taken = {f"Handler{s}" for s in holemod._SUFFIXES[1:]}
    assert holemod.new_name("Handler", taken, rng) == f"Handler{holemod._SUFFIXES[0]}"


def test_metrics_and_gap() -> None:
    assert bench.levenshtein("kitten", "sitting") == 3
    assert bench.similarity("", "") == 1.0 and bench.similarity("abc", "abd") == pytest.approx(
        2 / 3
    )
    assert holemod.rename("a.Foo(Foo_x, Foo)", "Foo", "Bar") == "a.Bar(Foo_x, Bar)"
    rows = [
        bench.Row("open", total=10, names=2),
        bench.Row("retrieval", total=10, names=7),
        bench.Row("oracle", total=10, names=8),
    ]
    assert bench.gap_closed(rows) == pytest.approx(5 / 6)
    assert bench.gap_closed(rows[:2]) is None


def test_choose_spreads_over_packages_and_modules() -> None:
    holes = [holemod.Hole("a", f"a/m{i % 2}.py", "a/d.py", f"n{i}", i) for i in range(10)]
    holes += [holemod.Hole("b", "b/m.py", "b/d.py", f"k{i}", i) for i in range(3)]
    chosen = holemod.choose(holes, 6, seed=1)
    assert len(chosen) == 6
    assert {h.package for h in chosen} == {"a", "b"}
    per_module: dict[str, int] = {}
    for h in chosen:
        per_module[h.module] = per_module.get(h.module, 0) + 1
    assert max(per_module.values()) <= 2


def test_pool_counts_only_holes_measured_in_every_condition(tmp_path: Path) -> None:
    def result(hole: str, condition: str, hit: bool) -> str:
        r = bench.Result(hole, condition, "n2", "x = m.n2()", "", hit, False, 0.5)
        return json.dumps(dataclasses.asdict(r))

    tune, held = tmp_path / "tune", tmp_path / "held"
    tune.mkdir()
    held.mkdir()
    (tune / "partial.jsonl").write_text(
        "\n".join(
            [
                result("a.py:1", "open", False),
                result("a.py:1", "retrieval", True),
                result("a.py:1", "oracle", True),
                result("b.py:1", "retrieval", True),  # no open or oracle: left out
            ]
        )
    )
    (held / "partial.jsonl").write_text(
        "\n".join(
            [
                result("c.py:1", "open", False),
                result("c.py:1", "retrieval", False),
                result("c.py:1", "oracle", True),
            ]
        )
    )
    text = bench.pool([tune, held])
    assert f"## {tune}: 1 holes" in text and f"## {held}: 1 holes" in text
    pooled = text.split("## pooled: 2 holes")[1]
    assert "| retrieval | 1/2 (50%) |" in pooled and "| oracle | 2/2 (100%) |" in pooled
    assert "retrieval closes 50% of the open -> oracle gap" in pooled


class _RecordingEngine:
    """As much of ``CompletionEngine`` as ``_one_hole`` uses: each completion records the
    ``namesMonitor`` setting and whether the workspace index was there."""

    def __init__(self, settings: Any) -> None:
        from types import SimpleNamespace

        self._settings = settings
        self.project = SimpleNamespace(index=None)
        self.seen: list[tuple[bool, bool]] = []

        class Docs:
            def open(self, uri: str, text: str, version: int, language: str) -> None:
                pass

            def get(self, uri: str) -> object:
                return SimpleNamespace(position_at=lambda offset: offset)

            def close(self, uri: str) -> None:
                pass

        self.documents = Docs()

    @property
    def settings(self) -> Any:
        return self._settings

    def update_settings(self, settings: Any) -> None:
        self._settings = settings

    async def backend(self) -> object:
        return object()

    async def retrieve(self, *args: object) -> None:
        return None

    async def complete(self, uri: str, position: object, max_tokens: int) -> object:
        from types import SimpleNamespace

        self.seen.append((self._settings.names_monitor, self.project.index is not None))
        return SimpleNamespace(text="", stats=SimpleNamespace(prompt_tokens=0, monitor_fired=0))

    async def cancel(self, uri: str) -> None:
        return None


@pytest.mark.parametrize("monitor", [True, False])
async def test_names_monitor_watches_only_the_condition_with_the_workspace(
    source: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    monitor: bool,
) -> None:
    # Without the workspace index the analysis finds the installed package, whose names
    # are the old ones: the monitor would hold the oracle to them (set C, 2026-12-07).
    from kode.completion.settings import Settings

    [hole] = holemod.find_holes(source, "pkg")
    prepared = holemod.prepare(hole, source, tmp_path_factory.mktemp("work"), seed=0)
    monkeypatch.setattr(bench, "built_index", lambda prepared: object())  # no index worker
    engine = _RecordingEngine(Settings(names_monitor=monitor))
    options = bench.Options(names_monitor=monitor, out=tmp_path_factory.mktemp("out"))
    bar = type("Bar", (), {"update": lambda self, n: None})()
    results: list[bench.Result] = []
    await bench._one_hole(options, engine, prepared, bar, results, bench.CONDITIONS)
    assert [r.condition for r in results] == list(bench.CONDITIONS)
    assert engine.seen == [
        (monitor and condition == "retrieval", condition == "retrieval")
        for condition in bench.CONDITIONS
    ]
