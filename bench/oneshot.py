"""``auto`` vs plain decoding as a new user meets them: one ``kode complete`` process per run.

A fresh process has learnt nothing about acceptance, so whatever ``auto`` explores it
pays for within that one completion. For each of a few large files of the standard
library (code nobody here wrote), one edit-like hole is cut: a line that repeats a
pattern from the lines above it is emptied (its indentation kept) and the cursor put
there. Each hole is completed by ``python -m kode.cli.main complete --json`` with
``--speculation auto`` and with ``--speculation none``, alternating which goes first,
for ``--rounds`` rounds. Per hole: the median over rounds of plain's decode ms/token
divided by auto's (above 1: auto is faster), the same for the whole request time, and
whether the two texts are identical. The machine's load (``report.machine_note``) is
recorded with every run: on a shared machine timings are noisy, so rerun it on a quiet one.

    python -m kode.bench.oneshot --model default --rounds 3 --out bench-results/oneshot
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kode.bench import harness, report, tasks

# Large, stable standard-library files (Python 3.11): held out from everything Kode tunes on.
FILES = (
    "argparse.py",
    "typing.py",
    "dataclasses.py",
    "inspect.py",
    "tarfile.py",
    "subprocess.py",
    "pathlib.py",
    "configparser.py",
)
METHODS = ("auto", "none")


@dataclass(frozen=True, slots=True)
class Hole:
    """A file with one line emptied, and where the cursor goes."""

    name: str
    path: Path
    line: int  # 0-based
    character: int
    expected: str  # the line that was removed (for reference only)


@dataclass(slots=True)
class Sample:
    hole: str
    method: str
    round: int
    text: str
    ms_per_token: float
    total_ms: float
    completion_tokens: int
    ran_as: str
    steps: int
    drafted: int
    accepted: int
    near_ties: int
    load: str


def cut_holes(files: list[Path], seed: int, out: Path) -> list[Hole]:
    """One seeded edit-like hole per file (``tasks.edit_candidates``), written to ``out``."""
    rng = random.Random(seed)
    holes = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        found = tasks.edit_candidates(text, name=path.name)
        if not found:
            continue
        task = rng.choice(found)
        line = int(task.task_id.rsplit(":", 1)[1]) - 1
        lines = text.splitlines(keepends=True)
        indent = lines[line][: len(lines[line]) - len(lines[line].lstrip())]
        lines[line] = indent + "\n"
        target = out / "holes" / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(lines), encoding="utf-8")
        holes.append(Hole(path.name, target, line, len(indent), task.middle))
    return holes


def complete(hole: Hole, method: str, model: str, timeout_s: float) -> dict[str, Any]:
    """One fresh ``kode complete --json`` process; its JSON answer."""
    cmd = harness.kode_command(
        "complete",
        str(hole.path),
        "--line",
        str(hole.line),
        "--character",
        str(hole.character),
        "--model",
        model,
        "--speculation",
        method,
        "--json",
    )
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{hole.name} {method}: exit {done.returncode}: {done.stderr[-500:]}")
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@dataclass(frozen=True, slots=True)
class HoleResult:
    hole: str
    rounds: int
    decode_ratio: float | None  # median over rounds of plain ms/token / auto ms/token
    total_ratio: float | None  # the same for the whole request
    identical: bool
    auto_drafted: int
    auto_accepted: int
    near_ties: int
    tokens: float


def summarize(samples: list[Sample]) -> list[HoleResult]:
    """Per hole: median ratios plain/auto (decode ms/token, request time), identical texts."""
    rows = []
    for hole in dict.fromkeys(s.hole for s in samples):
        mine = [s for s in samples if s.hole == hole]
        per_tok, total = [], []
        for r in sorted({s.round for s in mine}):
            pair = {s.method: s for s in mine if s.round == r}
            if set(pair) != set(METHODS):
                continue
            auto, plain = pair["auto"], pair["none"]
            if auto.ms_per_token > 0:
                per_tok.append(plain.ms_per_token / auto.ms_per_token)
            total.append(plain.total_ms / auto.total_ms)
        rows.append(
            HoleResult(
                hole=hole,
                rounds=len(total),
                decode_ratio=statistics.median(per_tok) if per_tok else None,
                total_ratio=statistics.median(total) if total else None,
                identical=len({s.text for s in mine}) == 1,
                auto_drafted=sum(s.drafted for s in mine if s.method == "auto"),
                auto_accepted=sum(s.accepted for s in mine if s.method == "auto"),
                near_ties=sum(s.near_ties for s in mine if s.method == "auto"),
                tokens=statistics.median(s.completion_tokens for s in mine),
            )
        )
    return rows


def render(rows: list[HoleResult]) -> str:
    body = [
        [
            r.hole,
            r.tokens,
            report.fmt(r.decode_ratio, 2, "x"),
            report.fmt(r.total_ratio, 2, "x"),
            "yes" if r.identical else "NO",
            f"{r.auto_accepted}/{r.auto_drafted}",
            r.near_ties,
        ]
        for r in rows
    ]
    table = report.markdown_table(
        [
            "hole",
            "tokens",
            "decode speed auto/none",
            "request auto/none",
            "same text",
            "accepted/drafted",
            "near ties",
        ],
        body,
    )
    decode = [r.decode_ratio for r in rows if r.decode_ratio is not None]
    if decode:
        table += (
            f"\n\nmedian decode ratio {statistics.median(decode):.2f}x, "
            f"lowest {min(decode):.2f}x over {len(decode)} holes"
        )
    total = [r.total_ratio for r in rows if r.total_ratio is not None]
    if total:
        table += f"; median request ratio {statistics.median(total):.2f}x, lowest {min(total):.2f}x"
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kode.bench.oneshot", description=__doc__)
    parser.add_argument("--model", default="default")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--holes", type=int, default=len(FILES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=Path("bench-results/oneshot"))
    args = parser.parse_args(argv)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    args.out.mkdir(parents=True, exist_ok=True)
    holes = cut_holes([stdlib / f for f in FILES[: args.holes]], args.seed, args.out)
    samples: list[Sample] = []
    log = args.out / "runs.jsonl"
    log.unlink(missing_ok=True)
    for r in range(args.rounds):
        for i, hole in enumerate(holes):
            for method in harness.round_order(METHODS, i + r):
                load = report.machine_note()
                answer = complete(hole, method, args.model, args.timeout_s)
                spec = answer["speculation"]
                sample = Sample(
                    hole=hole.name,
                    method=method,
                    round=r,
                    text=str(answer["text"]),
                    ms_per_token=float(answer["ms_per_token"]),
                    total_ms=float(answer["total_ms"]),
                    completion_tokens=int(answer["completion_tokens"]),
                    ran_as=str(spec["method"]),
                    steps=int(spec["steps"]),
                    drafted=int(spec["drafted"]),
                    accepted=int(spec["accepted"]),
                    near_ties=int(spec["near_ties"]),
                    load=load,
                )
                samples.append(sample)
                report.append_jsonl(log, [asdict(sample)])
                print(
                    f"round {r} {hole.name} {method}: {sample.ms_per_token:.1f} ms/token, "
                    f"{sample.total_ms:.0f} ms, drafted {sample.drafted}, "
                    f"accepted {sample.accepted}, load {load}",
                    flush=True,
                )
    table = render(summarize(samples))
    (args.out / "report.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    print(f"machine after: {report.machine_note()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
