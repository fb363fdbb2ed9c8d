"""``kode bench context``: does project context put the right cross-file name in?

Holes are cut from real multi-module Python packages (the standard library's and the
venv's, never this repository): a one-line statement of module A that uses
``module.NAME`` where ``module`` is a sibling module B of the same package, imported by
A, and NAME is defined at the top of B and written nowhere else in A. NAME is renamed
consistently in a copy of the whole package (``Handler`` -> ``HandlerQuill``), so the
model cannot answer from memory: only context can tell it. The copy is the workspace
folder. The document is A with the hole's line emptied after its indentation; the cursor
sits there, and the answer is the rest of the line.

Conditions (one completion each, greedy, through ``CompletionEngine.complete``):

- ``in-file``: only A is open;
- ``open``: A and an unrelated sibling module open (today's cross-file context);
- ``retrieval``: as ``open``, plus the workspace index over the copy (``retrievalTokens``);
- ``oracle``: as ``open``, plus the defining module open as a tab holding an excerpt from
  NAME's definition on (up to 1,400 characters).

The names monitor (``--names-monitor``, the setting ``namesMonitor``) watches
``retrieval`` alone: the renamed copy is known only to the workspace index, and without
it the analysis reads the installed package, whose names are the old ones.

Metrics on the completion's first line: the renamed name appears in it; it equals the
expected line (whitespace-trimmed); edit similarity (1 - Levenshtein / longer length).

``--latency-files N`` also measures the index alone (no model): build time, memory
(tracemalloc's peak and the index's own estimate) and retrieval time per cursor over
the first N source files of a real tree (the standard library, then site-packages).
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from kode.bench import charts, report
from kode.bench.context_holes import Prepared, collect, hole_key, prepare
from kode.bench.context_index import (
    RETRIEVAL_TOKENS,
    built_index,
    measure_fitted,
    measure_index,
    measure_keystrokes,
)
from kode.bench.report import fmt, markdown_table

CONDITIONS = ("in-file", "open", "retrieval", "oracle")
DEFAULT_PACKAGES = (
    *("logging", "email", "http", "json", "concurrent", "importlib", "unittest", "asyncio"),
    *("xmlrpc", "wsgiref", "urllib", "sqlite3", "httpx", "starlette", "jinja2", "pygls"),
)


@dataclass(frozen=True, slots=True)
class Options:
    model: str = "default"
    holes: int = 24
    seed: int = 0
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    conditions: tuple[str, ...] = CONDITIONS
    retrieval_tokens: int = RETRIEVAL_TOKENS
    max_tokens: int = 48
    latency_files: int = 0  # 0: skip the index measurement
    skip_model: bool = False
    threads: int = 0  # llama.cpp threads; 0: every core
    prefix_tokens: int | None = None  # None: the setting's default
    names_monitor: bool = True  # the setting ``namesMonitor`` (on by default)
    out: Path = Path("results/context")
    resume: bool = False  # keep the results in ``out/partial.jsonl``, run only the rest
    keystrokes: bool = False  # also count snippet changes while the holes' lines are typed
    fitted: bool = False  # also check which holes' names reach the fitted prompt (no model)


@dataclass(slots=True)
class Result:
    hole: str
    condition: str
    renamed: str
    expected: str
    completion: str
    name_hit: bool
    exact: bool
    similarity: float
    prompt_tokens: int = 0
    ms: float = 0.0
    retrieval_ms: float = 0.0
    monitor_fired: int = 0  # dereferences the names monitor held
    error: str = ""


@dataclass(slots=True)
class Row:
    condition: str
    total: int = 0
    names: int = 0
    exact: int = 0
    monitored: int = 0  # holes where the names monitor held a dereference
    similarity: list[float] = field(default_factory=list)
    prompt_tokens: list[float] = field(default_factory=list)


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute one character).

    >>> levenshtein("kitten", "sitting")
    3
    """
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def similarity(a: str, b: str) -> float:
    """1 - edit distance / the longer length; 1.0 for two empty strings."""
    longest = max(len(a), len(b))
    return 1.0 if longest == 0 else 1.0 - levenshtein(a, b) / longest


def score(prepared: Prepared, condition: str, completion: str) -> Result:
    first = completion.split("\n", 1)[0].strip()
    return Result(
        hole=hole_key(prepared.hole),
        condition=condition,
        renamed=prepared.renamed,
        expected=prepared.expected,
        completion=first,
        name_hit=re.search(rf"\b{re.escape(prepared.renamed)}\b", first) is not None,
        exact=first == prepared.expected,
        similarity=similarity(first, prepared.expected),
    )


def summarize(results: Iterable[Result]) -> list[Row]:
    rows: dict[str, Row] = {}
    for r in results:
        row = rows.setdefault(r.condition, Row(r.condition))
        row.total += 1
        row.names += r.name_hit
        row.monitored += r.monitor_fired > 0
        row.exact += r.exact
        row.similarity.append(r.similarity)
        row.prompt_tokens.append(float(r.prompt_tokens))
    order = {c: i for i, c in enumerate(CONDITIONS)}
    return sorted(rows.values(), key=lambda row: order.get(row.condition, 99))


def gap_closed(rows: Sequence[Row], condition: str = "retrieval") -> float | None:
    """Share of the open -> oracle gap on the name metric that ``condition`` closes."""
    got = {r.condition: r.names for r in rows}
    if not {"open", condition, "oracle"} <= got.keys() or got["oracle"] == got["open"]:
        return None
    return (got[condition] - got["open"]) / (got["oracle"] - got["open"])


def render_table(rows: Sequence[Row]) -> str:
    return markdown_table(
        [
            "condition",
            "name in completion",
            "exact line",
            "edit similarity",
            "prompt tokens",
            "monitor held",
        ],
        [
            [
                r.condition,
                report.fmt_ratio(r.names, r.total),
                report.fmt_ratio(r.exact, r.total),
                fmt(report.mean(r.similarity), 2),
                fmt(report.median(r.prompt_tokens), 0),
                report.fmt_ratio(r.monitored, r.total),
            ]
            for r in rows
        ],
    )


def chart(rows: Sequence[Row], path: Path) -> None:
    metrics = [
        ("name in completion", [100.0 * r.names / max(r.total, 1) for r in rows]),
        ("exact line", [100.0 * r.exact / max(r.total, 1) for r in rows]),
        ("edit similarity", [100.0 * (report.mean(r.similarity) or 0.0) for r in rows]),
    ]
    series = {row.condition: [values[k] for _, values in metrics] for k, row in enumerate(rows)}
    with charts.figure(path, (7.5, 4.0)) as ax:
        charts.grouped_bars(ax, [name for name, _ in metrics], series)
        ax.set_ylabel("% of holes (similarity: mean x 100)")
        ax.set_ylim(0, 100)
        ax.set_title("Cross-file holes, renamed names")
        ax.legend()


# -- running ----------------------------------------------------------------------------


async def _complete(
    engine: Any, prepared: Prepared, opened: list[tuple[Path, str]], max_tokens: int
) -> tuple[str, int, int]:
    """Open ``opened`` (oldest first) and the module, complete at the hole, close all:
    the text, its prompt tokens, and the dereferences the names monitor held."""
    uri = (prepared.root / prepared.hole.module).as_uri()
    uris = [path.as_uri() for path, _ in opened]
    try:
        for other, (_, text) in zip(uris, opened, strict=True):
            engine.documents.open(other, text, 0, "python")
        engine.documents.open(uri, prepared.document, 0, "python")
        position = engine.documents.get(uri).position_at(prepared.offset)
        done = await engine.complete(uri, position, max_tokens=max_tokens)
        return done.text, done.stats.prompt_tokens, done.stats.monitor_fired
    finally:
        await engine.cancel(uri)
        for other in [*uris, uri]:
            engine.documents.close(other)


def load_partial(path: Path) -> list[Result]:
    """The results a stopped run wrote to ``path`` (``partial.jsonl``), errors left out
    so that they run again; [] when there is none."""
    results = (Result(**record) for record in report.read_jsonl(path))
    return [result for result in results if not result.error]


async def _one_hole(
    options: Options,
    engine: Any,
    prepared: Prepared,
    bar: Any,
    results: list[Result],
    conditions: Sequence[str],
) -> None:
    sibling = prepared.sibling
    opened = [] if sibling is None else [(sibling, sibling.read_text(encoding="utf-8"))]
    index = built_index(prepared)
    for condition in conditions:
        docs = [] if condition == "in-file" else list(opened)
        if condition == "oracle":
            docs.append((prepared.root / prepared.hole.defining, prepared.defining_excerpt))
        engine.project.index = index if condition == "retrieval" else None
        # The renamed copy is known only to the workspace index: without it the analysis
        # finds the installed package (``ensurepip``, ``curses``, ``sympy``), whose names
        # are the old ones, and the monitor would hold the model to them (set C, oracle:
        # ``ensurepip._main`` for ``_main_vesper``). So it watches ``retrieval`` alone.
        monitored = options.names_monitor and condition == "retrieval"
        engine.update_settings(msgspec.structs.replace(engine.settings, names_monitor=monitored))
        started = time.perf_counter()
        retrieval_ms = 0.0
        if condition == "retrieval":
            uri = (prepared.root / prepared.hole.module).as_uri()
            backend = await engine.backend()
            t0 = time.perf_counter()
            await engine.retrieve(uri, prepared.document, prepared.offset, backend)
            retrieval_ms = (time.perf_counter() - t0) * 1000.0
        try:
            text, prompt_tokens, fired = await _complete(engine, prepared, docs, options.max_tokens)
            result = score(prepared, condition, text)
            result.prompt_tokens, result.monitor_fired = prompt_tokens, fired
        except Exception as exc:  # one broken hole must not end the run
            result = score(prepared, condition, "")
            result.error = f"{type(exc).__name__}: {exc}"
        result.ms = (time.perf_counter() - started) * 1000.0
        result.retrieval_ms = retrieval_ms
        results.append(result)
        await asyncio.to_thread(
            report.append_jsonl, options.out / "partial.jsonl", [asdict(result)]
        )
        bar.update(1)
    engine.project.index = None


async def measure(options: Options) -> tuple[list[Result], dict[str, str]]:
    from kode.completion.backend_factory import BackendPool, load_backend
    from kode.completion.engine import CompletionEngine
    from kode.completion.settings import parse

    facts = {"machine_before": report.machine_note()}
    settings, problems = parse(
        {
            "model": options.model,
            "engine": "inProcess",  # one process measures, no shared engine
            "retrievalTokens": options.retrieval_tokens,
            "movedSuffixDrift": 0,
            "readAhead": False,
            "prefetch": False,
            "threads": options.threads,
            # Only the first line is scored, and greedy decoding writes the same first
            # line whether or not it may go on: stop there.
            "multiline": "never",
            # The full window every time: the latency budget would answer from a short
            # window without any other file once the prefill speed is known.
            "firstAnswerMs": 0,
            **({} if options.prefix_tokens is None else {"prefixTokens": options.prefix_tokens}),
            "namesMonitor": options.names_monitor,
        }
    )
    if problems:
        raise ValueError("; ".join(problems))
    chosen = collect(options.packages, options.holes, options.seed)
    facts["holes"] = str(len(chosen))
    partial = options.out / "partial.jsonl"
    results = load_partial(partial) if options.resume else []
    if not options.resume and partial.exists():
        partial.unlink()
    keys = {hole_key(hole) for hole, _ in chosen}
    results = [r for r in results if r.hole in keys and r.condition in options.conditions]
    done = {(r.hole, r.condition) for r in results}
    todo = [
        (hole, root, [c for c in options.conditions if (hole_key(hole), c) not in done])
        for hole, root in chosen
    ]
    todo = [item for item in todo if item[2]]
    pool = BackendPool(load_backend)
    engine = CompletionEngine(pool.get, settings)
    bar = report.progress(sum(len(conditions) for _, _, conditions in todo), "context")
    try:
        if todo:
            await engine.backend()
        for hole, root, conditions in todo:
            with tempfile.TemporaryDirectory(prefix="kode-context-") as tmp:
                prepared = await asyncio.to_thread(prepare, hole, root, Path(tmp), options.seed)
                bar.set_postfix_str(f"{hole.module} {hole.name}", refresh=False)
                await _one_hole(options, engine, prepared, bar, results, conditions)
    finally:
        bar.close()
        await engine.aclose()
        await pool.aclose()
    facts["machine_after"] = report.machine_note()
    return results, facts


def write_report(
    options: Options,
    results: list[Result],
    facts: dict[str, str],
    index: dict[str, Any] | None,
    typing: dict[str, Any] | None = None,
) -> str:
    """The report (printed whole); the results and the chart written to ``out``."""
    out = report.prepare_out(options.out)
    rows = summarize(results)
    table = render_table(rows) if rows else ""
    closed = gap_closed(rows)
    lines = ["# Project context: cross-file holes with renamed names", ""]
    if rows:
        lines += [
            f"- model: {options.model}; {facts.get('holes')} holes (seed {options.seed}) from "
            f"{', '.join(options.packages)}; retrievalTokens {options.retrieval_tokens}; "
            f"prefixTokens {options.prefix_tokens or 'default'}; threads {options.threads}; "
            f"namesMonitor {'on (retrieval only)' if options.names_monitor else 'off'}; "
            f"greedy, max {options.max_tokens} tokens",
            f"- retrieval closes {fmt(None if closed is None else 100 * closed, 0)}% of the "
            "open -> oracle gap on the name metric",
            report.machine_line(facts),
            "",
            table,
            "",
        ]
    if index is not None:
        lines += ["## Index", "", "```", *(f"{k}: {v}" for k, v in index.items()), "```", ""]
    if typing is not None:
        lines += [
            "## Snippets while the holes' lines are typed (no model)",
            "",
            "```",
            *(f"{k}: {v}" for k, v in typing.items()),
            "```",
            "",
        ]
    text = "\n".join(lines)
    report.write_jsonl(out / "results.jsonl", (asdict(r) for r in results))
    if rows:
        chart(rows, out / "context.png")
    return text


def complete_holes(results: Iterable[Result], conditions: Sequence[str]) -> list[Result]:
    """The results of the holes measured in every one of ``conditions`` (so that the
    counts of two conditions compare the same holes)."""
    results = list(results)
    have: dict[str, set[str]] = {}
    for r in results:
        have.setdefault(r.hole, set()).add(r.condition)
    return [r for r in results if set(conditions) <= have[r.hole]]


def pool(folders: Sequence[Path]) -> str:
    """The tables of earlier runs (``partial.jsonl`` in each folder), each alone and all
    pooled, counting only the holes measured in open, retrieval and oracle; no model."""
    needed = ("open", "retrieval", "oracle")
    lines: list[str] = []
    every: list[Result] = []
    for folder in [*folders, None]:
        if folder is None:
            results, title = every, "pooled"
        else:
            results = load_partial(folder / "partial.jsonl")
            every += results
            title = str(folder)
        rows = summarize(complete_holes(results, needed))
        if not rows:
            lines += [f"## {title}: no hole measured in {', '.join(needed)}", ""]
            continue
        closed = {r.condition: gap_closed(rows, r.condition) for r in rows}
        lines += [
            f"## {title}: {rows[0].total} holes",
            "",
            render_table(rows),
            "",
            *(
                f"{c} closes {fmt(100 * share, 0)}% of the open -> oracle gap (names)"
                for c, share in closed.items()
                if c.startswith("retrieval") and share is not None
            ),
            "",
        ]
    return "\n".join(lines)


def main(options: Options) -> int:
    index = None
    if options.latency_files:
        index = measure_index(options.latency_files, 200, options.seed, options.model)
    typing = measure_keystrokes(options) if options.keystrokes else None
    if options.fitted:
        fitted = measure_fitted(options)
        typing = {**(typing or {}), **fitted}
    results: list[Result] = []
    facts: dict[str, str] = {}
    if not options.skip_model:
        results, facts = asyncio.run(measure(options))
    text = write_report(options, results, facts, index, typing)
    report.publish(options.out, "report.md", text, text, "context.png")
    return 0
