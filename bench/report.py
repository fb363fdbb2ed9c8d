"""Figures and reports, one rule each: statistics over measurements, the cells and
markdown tables of every report, the files a run writes and the lines it prints.

Everything here is pure but ``progress`` (a bar on stderr) and ``publish`` (writes the
report, prints the table); unit-tested in ``tests/test_bench_tasks.py``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kode.backends.system import usable_cores

UNKNOWN = "–"  # shown for a value that could not be measured


# -- statistics -------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear between order statistics (numpy's
    default); None for no values. ``percentile([1, 2, 3, 4], 50) == 2.5``."""
    data = sorted(values)
    if not data:
        return None
    if len(data) == 1:
        return data[0]
    rank = (len(data) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(data) - 1)
    if rank == lo or math.isinf(data[hi]):  # inf marks "never": no interpolating into it
        return data[lo] if rank == lo else data[hi]
    return data[lo] + (data[hi] - data[lo]) * (rank - lo)


def median(values: Iterable[float]) -> float | None:
    return percentile(values, 50.0)


def mean(values: Iterable[float]) -> float | None:
    data = list(values)
    return sum(data) / len(data) if data else None


def pairwise_speedups(base: dict[str, float], other: dict[str, float]) -> list[float]:
    """``base[k] / other[k]`` for every key measured (positive) in both, in key order.

    Each ratio compares two runs on the same prompt, so prompts of different lengths or
    difficulty do not mix: ``pairwise_speedups({"a": 100, "b": 60}, {"a": 50})`` ==
    ``[2.0]``.
    """
    return [base[k] / other[k] for k in sorted(base) if k in other and base[k] > 0 and other[k] > 0]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token sequences differ (a shorter one
    differs where it ends); None if they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# -- cells and tables -------------------------------------------------------------------


def fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    """A number for a table; ``UNKNOWN`` for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return UNKNOWN
    return f"{value:.{digits}f}{suffix}"


def fmt_ratio(num: int, den: int) -> str:
    """``"3/4 (75%)"``; ``UNKNOWN`` when nothing was counted."""
    if den == 0:
        return UNKNOWN
    return f"{num}/{den} ({100.0 * num / den:.0f}%)"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table; ``|`` inside cells is escaped."""

    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    out = [
        "| " + " | ".join(cell(h) for h in headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row has {len(row)} cells, expected {len(headers)}")
        out.append("| " + " | ".join(cell(c) for c in row) + " |")
    return "\n".join(out) + "\n"


def settings_note(settings: Iterable[tuple[str, Any]]) -> str:
    """The settings a run was given, as its report lists them:
    ``settings_note([("maxTokens", 8)]) == "`maxTokens`=8; "``."""
    return "".join(f"`{k}`={v!r}; " for k, v in settings)


def machine_note() -> str:
    """Cores and load averages, for the report: other processes skew every timing."""
    cores = usable_cores()
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return f"{cores} cores"
    return f"{cores} cores, load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min)"


def machine_line(facts: Mapping[str, Any]) -> str:
    """The report's machine line from a run's facts (``machine_before``/``_after``)."""
    return f"- machine: before {facts.get('machine_before')}; after {facts.get('machine_after')}"


# -- files and output -------------------------------------------------------------------


def prepare_out(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def append_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Add records to ``path`` as they are measured: a run cut short keeps them, and a
    run with ``--resume`` starts from them (``read_jsonl``)."""
    prepare_out(path.parent)
    with open(path, "a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of ``path`` (none when it does not exist)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def progress(total: int, desc: str) -> Any:
    """A tqdm bar on stderr (the tables go to stdout)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, leave=True)


def publish(out: Path, name: str, text: str, table: str, chart: str | None = None) -> None:
    """Write the report ``out/name`` and print its table, then where the report (and the
    chart ``out/chart``, when one was drawn) lie."""
    prepare_out(out)
    (out / name).write_text(text, encoding="utf-8")
    print(table)
    where = f"report: {out / name}"
    print(where if chart is None else f"{where}  chart: {out / chart}")
