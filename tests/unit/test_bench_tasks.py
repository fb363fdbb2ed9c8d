"""The benchmarks' tasks (``bench/tasks.py``): seeded samples, edit-like lines, random
and real-file spans. Pure: no model."""

from __future__ import annotations

from pathlib import Path

from fakes.projects import SHAPES
from kode.bench import quality, sandbox, tasks
from kode.bench.tasks import EditTask, HumanEvalTask

# -- sampling ----------------------------------------------------------------------------


def test_sample_is_seeded_and_stable() -> None:
    items = list(range(100))
    assert tasks.sample(items, 5, 0) == [49, 97, 53, 5, 33]  # pinned: runs stay comparable
    assert tasks.sample(items, 5, 0) == tasks.sample(items, 5, 0)
    assert tasks.sample(items, 5, 1) != tasks.sample(items, 5, 0)
    assert tasks.sample(items, None, 0) == items
    assert tasks.sample(items[:3], 10, 0) == items[:3]


def test_humaneval_sample_is_pinned() -> None:
    found = tasks.load_humaneval(tasks.humaneval_path("multi"))
    assert len(found) == 5815
    assert [t.task_id for t in tasks.sample(found, 2, 0)] == [
        "MultiLineInfilling/HumanEval/105/L9_L13",
        "MultiLineInfilling/HumanEval/110/L2_L5",
    ]


def test_data_dir_override(tmp_path: Path) -> None:
    assert tasks.data_dir({"KODE_HUMANEVAL_DIR": str(tmp_path)}) == tmp_path


# -- edit-like tasks -----------------------------------------------------------------------


def test_shared_run_and_identifier_chars() -> None:
    line = tasks.words("return self.width * self.height")
    earlier = tasks.words("return self.width + 1")
    assert tasks.longest_shared_run(line, earlier) == ["return", "self", ".", "width"]
    assert tasks.identifier_chars(["self", ".", "x"]) == 5
    assert tasks.longest_shared_run(["a"], ["b"]) == []


def test_edit_candidates_cut_at_the_repeated_line() -> None:
    found = tasks.edit_candidates(SHAPES, name="shapes.py", min_identifier_chars=10)
    assert [t.task_id for t in found] == ["shapes.py:7"]
    task = found[0]
    assert task.middle == "def area(self) -> float:"
    assert task.prefix.endswith("\n    ")  # the cut is after the line's indentation
    assert task.suffix.startswith("\n        return self.side")
    assert task.shared == "def area ( self ) - > float :"
    assert task.prefix + task.middle + task.suffix == SHAPES


def test_edit_candidates_keep_a_window() -> None:
    text = "".join(f"value_{i} = compute_something(alpha, beta)\n" for i in range(60))
    found = tasks.edit_candidates(text, name="w.py", window=5, suffix_lines=2)
    middle = next(t for t in found if t.task_id == "w.py:30")
    assert middle.prefix.count("\n") == 5
    assert middle.suffix.count("\n") == 3  # its own line break and two lines


def test_edit_tasks_are_seeded_and_spread_over_files(tmp_path: Path) -> None:
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(SHAPES + SHAPES)
    files = sorted(tmp_path.glob("*.py"))
    first = tasks.edit_tasks(files, 4, 7, root=tmp_path)
    assert first == tasks.edit_tasks(files, 4, 7, root=tmp_path)
    assert [t.task_id.split(":")[0] for t in first] == ["a.py", "b.py", "a.py", "b.py"]
    assert all(isinstance(t, EditTask) for t in first)


# -- spans ------------------------------------------------------------------------------


def test_random_span_is_seeded_by_the_task_not_the_order() -> None:
    task = tasks.sample(tasks.load_humaneval(tasks.humaneval_path("multi")), 1, 3)[0]
    assert tasks.random_span(task, 0) == tasks.random_span(task, 0)
    assert {tasks.random_span(task, s).task_id for s in range(5)} != {task.task_id}


def test_file_spans_cut_real_files_mid_line(tmp_path: Path) -> None:
    lines = [f"    value_{i} = compute(value_{i - 1}, {i})  # step\n" for i in range(120)]
    path = tmp_path / "big.py"
    path.write_text("".join(lines), encoding="utf-8")
    found = tasks.file_span_tasks([path], 5, 0, before_lines=10, after_lines=5)
    assert len(found) == 5
    text = "".join(lines)
    for task in found:
        assert task.judge is tasks.Judge.EXACT
        whole = task.prompt + task.canonical_solution + task.suffix
        assert whole in text
        assert task.prompt.split("\n")[-1].strip()  # the cursor is after code ...
        assert task.canonical_solution.strip()
        assert task.restores(task.canonical_solution)
        assert not task.restores("")
        assert quality.judge(task, task.canonical_solution, sandbox.Limits()) == "passed"
        assert quality.judge(task, "x", sandbox.Limits()) == "failed"
    assert tasks.file_span_tasks([path], 5, 0, before_lines=10, after_lines=5) == found
    # Whitespace at a line's end does not count; anywhere else it does.
    task = HumanEvalTask("t", "x = (", "\ny = 2\n", "1)", "", "", "", tasks.Judge.EXACT)
    assert task.restores("1)  ") and not task.restores("1 )")


def test_file_lines_start_after_the_indentation_and_end_at_a_line_end(tmp_path: Path) -> None:
    lines = [f"    value_{i} = compute(value_{i - 1}, {i})  # step\n" for i in range(120)]
    path = tmp_path / "big.py"
    path.write_text("".join(lines), encoding="utf-8")
    found = tasks.file_span_tasks([path], 8, 0, before_lines=10, after_lines=5, line_start=True)
    assert len(found) == 8
    text = "".join(lines)
    for task in found:
        assert task.prompt + task.canonical_solution + task.suffix in text
        assert task.prompt.endswith("\n    ")  # the cursor: after the indentation only
        assert task.suffix.startswith("\n")  # nothing after the cursor on its line
        assert task.canonical_solution.startswith("value_")
        assert task.restores(task.canonical_solution)
    assert {t.canonical_solution.count("\n") for t in found} != {0}  # some span lines
    for task in quality.load_set("file-lines", 3, 0):  # the set the bench runs
        assert not task.prompt.rsplit("\n", 1)[-1].strip() and task.suffix.startswith("\n")


def test_javascript_lines_skip_comments_and_open_as_javascript(tmp_path: Path) -> None:
    lines = [
        f"  // step {i}: the running total\n"
        if i % 2
        else f"  total_{i} = add(total_{i - 1}, {i});\n"
        for i in range(120)
    ]
    path = tmp_path / "big.js"
    path.write_text("".join(lines), encoding="utf-8")
    found = tasks.file_span_tasks(
        [path], 6, 0, before_lines=10, after_lines=5, line_start=True, language="javascript"
    )
    assert len(found) == 6
    for task in found:
        assert task.language == "javascript"
        assert task.canonical_solution.startswith("total_")  # never a // comment line
        assert quality.task_uri(task).endswith(".js")
    assert quality.task_uri(HumanEvalTask("T/0", "", "", "", "", "")).endswith("/t_0.py")


def test_stdlib_files_are_large_modules() -> None:
    files = tasks.stdlib_files(3)
    assert len(files) == 3
    sizes = [f.stat().st_size for f in files]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] > 50_000
