"""The benchmarks' harness (``bench/report.py``, ``bench/harness.py``, ``bench/charts.py``)
and the ``kode bench`` command line. Pure but for one short process; no model."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from kode.backends.system import alive
from kode.bench import charts, harness, quality, report
from kode.cli import bench as cli_bench

# -- statistics ----------------------------------------------------------------------------


def test_percentile_and_median() -> None:
    assert report.percentile([1, 2, 3, 4], 50) == 2.5
    assert report.percentile([5], 95) == 5
    assert report.percentile([], 50) is None
    assert report.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 95) == pytest.approx(4.8)
    assert report.median([3, 1, 2]) == 2
    assert report.mean([]) is None


def test_pairwise_speedups_compare_the_same_prompt() -> None:
    plain = {"a": 100.0, "b": 60.0, "c": 90.0}
    method = {"a": 50.0, "b": 60.0, "d": 10.0}
    assert report.pairwise_speedups(plain, method) == [2.0, 1.0]
    assert report.median(report.pairwise_speedups(plain, method)) == 1.5
    assert report.pairwise_speedups({"a": 0.0}, {"a": 1.0}) == []


def test_first_divergence_and_rotation() -> None:
    assert report.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert report.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert report.first_divergence([1, 2], [1, 2, 3]) == 2
    assert harness.rotated(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert harness.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert harness.rotated([], 3) == []


# -- reports -------------------------------------------------------------------------------


def test_markdown_table() -> None:
    table = report.markdown_table(["a", "b"], [[1, "x|y"], ["2", None]])
    assert table == "| a | b |\n|---|---|\n| 1 | x\\|y |\n| 2 | None |\n"
    with pytest.raises(ValueError, match="cells"):
        report.markdown_table(["a"], [[1, 2]])
    assert report.fmt(None) == report.UNKNOWN
    assert report.fmt(1.234, 2, "x") == "1.23x"
    assert report.fmt_ratio(3, 4) == "3/4 (75%)"
    assert report.fmt_ratio(0, 0) == report.UNKNOWN


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
    args = _parse(["bench", "load", "--through-router", "--users", "6", "--seconds", "20"])
    assert (args.through_router, args.users, args.seconds) == (True, 6, 20.0)
    assert args.func is cli_bench.run
    args = _parse(["bench", "latency", "--scenario", "windows", "--assembly", "0,8, 32"])
    assert (args.assembly, args.chunk_lines, args.recompute_lines) == ((0, 8, 32), 32, 0)
    assert _parse(["bench", "latency"]).assembly is None
    for bad in ("", "8,x", "-1"):
        with pytest.raises(SystemExit):
            _parse(["bench", "latency", "--assembly", bad])


def test_load_bench_refuses_unbounded_or_ambiguous_runs(capsys: pytest.CaptureFixture[str]) -> None:
    def run(*argv: str) -> int:
        return cli_bench.run(_parse(["bench", "load", *argv]))

    assert run("--url", "http://127.0.0.1:9", "--through-router") == 2
    assert "one of --url, --spawn-server, --through-router" in capsys.readouterr().err
    assert run("--through-router", "--users", "0") == 2
    assert run("--through-router", "--seconds", "3600") == 2
    assert "--users must be 1 to 100, --seconds 1 to 600" in capsys.readouterr().err


# -- runs, files, processes, charts ----------------------------------------------------------


def test_rounds_alternate_the_order() -> None:
    assert harness.round_order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert harness.round_order(["a", "b", "c"], 3) == ["c", "b", "a"]


def test_records_are_appended_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "run" / "keys.jsonl"
    assert report.read_jsonl(path) == []
    report.append_jsonl(path, [{"round": 0, "ms": 1.5}])
    report.append_jsonl(path, ({"round": r, "text": "é"} for r in (1, 2)))
    assert report.read_jsonl(path) == [
        {"round": 0, "ms": 1.5},
        {"round": 1, "text": "é"},
        {"round": 2, "text": "é"},
    ]


def test_report_lines_and_publish(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.settings_note([("maxTokens", 8), ("engine", "shared")]) == (
        "`maxTokens`=8; `engine`='shared'; "
    )
    facts = {"machine_before": "2 cores", "machine_after": "2 cores, busy"}
    assert report.machine_line(facts) == "- machine: before 2 cores; after 2 cores, busy"
    report.publish(tmp_path / "out", "report.md", "# title\n\n| a |\n", "| a |", "c.png")
    assert (tmp_path / "out" / "report.md").read_text() == "# title\n\n| a |\n"
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "| a |",
        f"report: {tmp_path / 'out' / 'report.md'}  chart: {tmp_path / 'out' / 'c.png'}",
    ]
    report.publish(tmp_path / "out", "other.md", "x", "t")
    assert capsys.readouterr().out.splitlines() == ["t", f"report: {tmp_path / 'out' / 'other.md'}"]


def test_stop_kills_a_process_that_ignores_sigterm() -> None:
    program = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", program], stdout=subprocess.PIPE, text=True,
        preexec_fn=harness.die_with_parent,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        harness.stop(proc, timeout_s=0.2)
        assert proc.returncode == -9  # SIGKILL: SIGTERM was ignored, its 60 s not waited
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_busy_processes_end_with_the_block() -> None:
    with harness.busy_processes(2) as hogs:
        pids = [hog.pid for hog in hogs]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
    assert not any(alive(pid) for pid in pids)


def test_grouped_bars_centre_each_group_on_its_tick(tmp_path: Path) -> None:
    path = tmp_path / "bars.png"
    with charts.figure(path, (4.0, 3.0)) as ax:
        charts.grouped_bars(ax, ["x", "y"], {"a": [1.0, 2.0], "b": [3.0, 4.0]})
        centres = sorted(round(p.get_x() + p.get_width() / 2, 3) for p in ax.patches)
        ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert centres == [-0.2, 0.2, 0.8, 1.2]
    assert ticks == ["x", "y"]
    assert path.read_bytes()[:4] == b"\x89PNG"
