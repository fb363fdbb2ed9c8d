"""``kode bench latency --scenario places``: every place in large real files, as a person
works: open a file, put the cursor on a line (announced with ``kode/didMoveCursor`` or
not), read for a moment, type the line; jump 200+ lines and do it again; switch to
another file and back.

The files are large modules of the standard library (nobody here wrote them); each
line to type is removed from the document that is opened, its indentation kept. Both
modes (with and without the cursor notification) run in one invocation, each in a fresh
``kode lsp``, so their figures are side by side under the same load. When a
``llama-server`` binary is found (``bench/llama_server.py``), each round also types its
places with llama.vim's client behaviour against it (``bench/llama_vim.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import tarfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kode.bench import charts, harness, report, tasks
from kode.bench.latency import Keystroke, Options, Replay, answer_ms, key_times
from kode.bench.report import fmt, markdown_table

PEER = "llama.vim's way (llama-server /infill)"
DEFAULT_FILES = (Path(argparse.__file__), Path(tarfile.__file__))


@dataclass(frozen=True, slots=True)
class Place:
    """A line to type back: ``body`` goes at ``line``, after ``indent`` characters."""

    file: int  # index into the scenario's files
    line: int
    indent: int
    body: str
    kind: str  # open | jump | switch | back


@dataclass(slots=True)
class Segment:
    place: Place
    keys: list[Keystroke] = field(default_factory=list)


def _candidates(lines: Sequence[str], lo: int, hi: int, max_chars: int) -> list[int]:
    out = []
    for i in range(max(lo, 0), min(hi, len(lines))):
        body = lines[i].strip()
        if 12 <= len(body) <= max_chars and not body.startswith(("#", '"', "'", "@")):
            out.append(i)
    return out


def plan_places(texts: Sequence[str], seed: int, max_chars: int) -> list[Place]:
    """Open file 0 at a line past its first third, jump 200+ lines, switch to file 1,
    come back to file 0 a few lines below the jump (pure, seeded)."""
    a, b = (t.splitlines() for t in texts[:2])

    def pick(lines: list[str], lo: int, hi: int, salt: int) -> int:
        found = _candidates(lines, lo, hi, max_chars)
        if not found:
            raise SystemExit(f"kode bench latency: no line to type in lines {lo}-{hi}")
        return tasks.sample(found, 1, seed * 31 + salt)[0]

    first = pick(a, len(a) // 3, len(a) // 2, 1)
    jump = pick(a, first + 200, first + 600, 2)
    other = pick(b, len(b) // 3, 2 * len(b) // 3, 3)
    back = pick(a, jump + 3, jump + 25, 4)

    def place(file: int, lines: list[str], i: int, kind: str) -> Place:
        indent = len(lines[i]) - len(lines[i].lstrip())
        return Place(file, i, indent, lines[i].strip(), kind)

    return [
        place(0, a, first, "open"),
        place(0, a, jump, "jump"),
        place(1, b, other, "switch"),
        place(0, a, back, "back"),
    ]


def blank(text: str, places: Sequence[Place], file: int) -> str:
    """``text`` with the bodies of this file's places removed (indentation kept)."""
    lines = text.splitlines(keepends=True)
    for p in places:
        if p.file == file:
            ending = lines[p.line][len(lines[p.line].rstrip("\r\n")) :]
            lines[p.line] = lines[p.line][: p.indent] + ending
    return "".join(lines)


class PlacesReplay(Replay):
    async def run(
        self,
        files: Sequence[Path],
        texts: Sequence[str],
        places: Sequence[Place],
        notify: bool,
        open_wait_s: float = 0.0,
        reading: list[dict[str, Any]] | None = None,
    ) -> list[Segment]:
        """Type each place's line. ``open_wait_s``: open the first place's file that
        long before its first key (the cursor announced there, if ``notify``), sampling
        ``kode/stats``'s reading counters into ``reading`` every few seconds."""
        from kode.completion.documents import Document, Position

        opts = self.options
        docs: dict[int, Document] = {}
        segments = []
        if open_wait_s > 0 and places:
            first = places[0]
            uri = files[first.file].resolve().as_uri()
            text = blank(texts[first.file], places, first.file)
            docs[first.file] = Document(uri, text, 1, "python")
            self.open(uri, text)
            if notify:
                self.move_cursor(uri, first.line, first.indent)
            began = time.perf_counter()
            while (left := began + open_wait_s - time.perf_counter()) > 0:
                await asyncio.sleep(min(READING_SAMPLE_S, left))
                if reading is not None:
                    engine = (await self.stats(10)).get("engine") or {}
                    elapsed = round(time.perf_counter() - began, 1)
                    reading.append({"s": elapsed, "tokens": engine.get("tokensRead")})
        for place in places:
            uri = files[place.file].resolve().as_uri()
            if place.file not in docs:
                text = blank(texts[place.file], places, place.file)
                docs[place.file] = Document(uri, text, 1, "python")
                self.open(uri, text)
            doc = docs[place.file]
            at = Position(place.line, place.indent)
            if notify:
                self.move_cursor(uri, at.line, at.character)
            await asyncio.sleep(opts.place_pause_s)
            times = key_times(place.body, opts.cadence_ms, opts.word_pause_ms)
            name = f"{place.kind}:{files[place.file].name}:{place.line + 1}"
            keys = await self.type_line(doc, doc.offset_at(at), place.body, times, name)
            segments.append(Segment(place, keys))
        return segments


async def _one_mode(
    options: Options,
    files: Sequence[Path],
    texts: Sequence[str],
    places: Sequence[Place],
    notify: bool,
    sub: str,
    open_wait_s: float = 0.0,
) -> tuple[list[Segment], dict[str, Any]]:
    replay = PlacesReplay(replace(options, out=options.out / sub))
    report.prepare_out(replay.options.out)
    reading: list[dict[str, Any]] = []
    try:
        await replay.start()
        await replay.warm_up()
        await replay.wait_calibrated()
        segments = await replay.run(files, texts, places, notify, open_wait_s, reading)
        await asyncio.sleep(0.5)
        final = await replay.stats(30)
    finally:
        await replay.stop()
    if reading:
        final = {**final, "reading": reading}
    return segments, final


def first_answer_exact(segment: Segment) -> bool | None:
    """Whether the first suggestion shown at a place (for any key of the line) was the
    rest of the line exactly, as its first line; None if none was shown."""
    for key in segment.keys:
        if key.outcome == "shown" and key.suggestion:
            rest = segment.place.body[key.index + 1 :]
            return key.suggestion.split("\n", 1)[0].rstrip() == rest.rstrip()
    return None


def first_key_ms(segment: Segment) -> float:
    """From the first keystroke at a place to the first suggestion text the editor could
    show there (a partial or a non-empty answer, for that key or any later one while the
    line is typed): what a person waits after starting to type. ``inf`` if none came."""
    if not segment.keys:
        return float("inf")
    start = segment.keys[0].sent
    seen = [
        t
        for k in segment.keys
        for t in (k.partial, k.answered if k.outcome == "shown" else None)
        if t is not None
    ]
    return (min(seen) - start) * 1000.0 if seen else float("inf")


def next_shown_ms(keys: Sequence[Keystroke], i: int) -> float:
    """From key ``i`` to the first suggestion text shown for it or a later key of the
    line (a partial or a non-empty answer): how long a person who typed it waits for a
    suggestion, whether or not they type on meanwhile. ``inf`` if none came."""
    seen = [
        t
        for k in keys[i:]
        for t in (k.partial, k.answered if k.outcome == "shown" else None)
        if t is not None
    ]
    return (min(seen) - keys[i].sent) * 1000.0 if seen else float("inf")


def summary_rows(label: str, segments: Sequence[Segment]) -> list[list[object]]:
    exact = [first_answer_exact(s) for s in segments]
    firsts = [first_key_ms(s) for s in segments]
    first = {
        kind: report.median([first_key_ms(s) for s in segments if s.place.kind == kind])
        for kind in ("open", "jump", "switch", "back")
    }
    keys = [k for s in segments for k in s.keys]
    every = [answer_ms(k) for k in keys]
    waits = [next_shown_ms(s.keys, i) for s in segments for i in range(len(s.keys))]
    # A key after one whose shown suggestion (answer or partial) the user did not type:
    # a new generation; from it to the next suggestion shown on the line.
    missed = [
        next_shown_ms(s.keys, i + 1)
        for s in segments
        for i, prev in enumerate(s.keys[:-1])
        if prev.matched is False
    ]
    return [
        [
            label,
            fmt(first.get("open"), 0, " ms"),
            fmt(first.get("jump"), 0, " ms"),
            fmt(first.get("switch"), 0, " ms"),
            fmt(first.get("back"), 0, " ms"),
            fmt(report.percentile(every, 50), 0, " ms"),
            fmt(report.percentile(every, 95), 0, " ms"),
            fmt(report.percentile(waits, 50), 0, " ms"),
            fmt(report.percentile(waits, 95), 0, " ms"),
            f"{sum(k.outcome == 'shown' for k in keys)}/{len(keys)}",
            f"{fmt(report.percentile(missed, 95), 0, ' ms')} ({len(missed)})",
            fmt(report.percentile(firsts, 50), 0, " ms"),
            fmt(report.percentile(firsts, 95), 0, " ms"),
            f"{sum(e is True for e in exact)}/{len(segments)}",
        ]
    ]


def chart(results: dict[str, list[Segment]], path: Path, title: str) -> None:
    kinds = ["open", "jump", "switch", "back"]
    series = {
        label: [
            min(next((first_key_ms(s) for s in segments if s.place.kind == k), 0.0), 60_000.0)
            for k in kinds
        ]
        for label, segments in results.items()
    }
    with charts.figure(path, (7.5, 4.0)) as ax:
        charts.grouped_bars(ax, kinds, series)
        ax.set_ylabel("first keystroke -> answer (ms)")
        ax.set_yscale("log")
        ax.axhline(1000, color="tab:red", linestyle="--", label="1 s")
        ax.set_title(title)
        ax.legend()


def mode_label(notify: bool, engine: str | None, variant: Variant = ()) -> str:
    label = "with kode/didMoveCursor" if notify else "without"
    label = label if engine is None else f"{engine}, {label}"
    return label + "".join(f", {k}={v}" for k, v in variant)


# One more configuration side by side: settings on top of the run's.
Variant = tuple[tuple[str, Any], ...]
# Reading counters are sampled this often while a file is open before its first place.
READING_SAMPLE_S = 5.0


async def measure(
    options: Options,
    files: Sequence[Path],
    rounds: int,
    engines: Sequence[str] | None = None,
    variants: Sequence[Variant] = (),
    open_wait_s: float = 0.0,
) -> tuple[dict[str, list[Segment]], dict[str, Any]]:
    """Each round's places in each mode (with and without the cursor notification), for
    each of ``engines`` (None: the default engine, unlabelled), then the peer. With
    ``variants``: the run's settings and each variant's, all with the notification."""
    texts = [f.read_text(encoding="utf-8") for f in files]
    from kode.backends import models
    from kode.bench import llama_server, llama_vim

    binary = llama_server.find_binary()
    kinds: list[str | None] = list(engines) if engines else [None]
    modes: list[tuple[str | None, bool, Variant]] = (
        [(engine, True, v) for engine in kinds for v in [(), *variants]]
        if variants
        else [(engine, notify, ()) for engine in kinds for notify in (True, False)]
    )
    results: dict[str, list[Segment]] = {mode_label(n, e, v): [] for e, n, v in modes}
    if binary is not None:
        results[PEER] = []
    facts: dict[str, Any] = {
        "machine_before": report.machine_note(),
        "stats": {},
        "llama_server": str(binary) if binary is not None else "not found",
    }
    for r in range(rounds):
        places = plan_places(texts, options.seed + r, options.max_chars)
        # Alternate which mode goes first, so neither always meets a warmer machine.
        for m, (engine, notify, variant) in harness.round_order(list(enumerate(modes)), r):
            label = mode_label(notify, engine, variant)
            more = (() if engine is None else (("engine", engine),)) + variant
            run_options = replace(options, settings=(*options.settings, *more))
            sub = ("notify" if notify else "plain") + ("" if engine is None else f"-{engine}")
            sub += f"-v{m}" if variants else ""
            segments, final = await _one_mode(
                run_options, files, texts, places, notify, sub, open_wait_s
            )
            results[label] += segments
            facts["stats"][f"{label} round {r}"] = {
                **(final.get("engine") or {}),
                **{k: final[k] for k in ("chunkStore", "reading") if final.get(k)},
            }
        if binary is not None:
            model = await asyncio.to_thread(models.resolve, options.model)
            segments, counters = await llama_vim.replay(
                binary,
                model,
                files,
                texts,
                places,
                pause_s=options.place_pause_s,
                cadence_ms=options.cadence_ms,
                settle_s=options.settle_s,
                seed=options.seed + r,
                log_dir=report.prepare_out(options.out / "llama-server"),
            )
            results[PEER] += segments
            facts["stats"][f"{PEER} round {r}"] = counters
    facts["machine_after"] = report.machine_note()
    return results, facts


def main(
    options: Options,
    files: Sequence[Path] | None,
    rounds: int,
    engines: Sequence[str] | None = None,
    variants: Sequence[Variant] = (),
    open_wait_s: float = 0.0,
) -> int:
    chosen = tuple(files) if files else DEFAULT_FILES
    if len(chosen) < 2:
        raise SystemExit("kode bench latency --scenario places: give two files (--files A B)")
    results, facts = asyncio.run(measure(options, chosen, rounds, engines, variants, open_wait_s))
    out = report.prepare_out(options.out)
    header = [
        "mode",
        "open: 1st key",
        "jump: 1st key",
        "switch: 1st key",
        "back: 1st key",
        "all keys p50",
        "all keys p95",
        "key to next shown p50",
        "key to next shown p95",
        "shown",
        "non-matching keys to next shown p95 (n)",
        "1st key p50",
        "1st key p95",
        "1st answer exact",
    ]
    rows: list[list[object]] = []
    for label, segments in results.items():
        for r in range(rounds):
            rows += summary_rows(f"{label} (round {r})", segments[4 * r : 4 * r + 4])
        rows += summary_rows(f"{label} (all rounds)", segments)
    table = markdown_table(header, rows)
    text = (
        "# Every place: first keystrokes in large real files, through `kode lsp`\n\n"
        f"- model `{options.model}`; files: "
        + ", ".join(f"`{f}` ({len(f.read_text().splitlines())} lines)" for f in chosen)
        + f"; pause before typing {options.place_pause_s:g} s; cadence {options.cadence_ms:g} ms"
        + (
            f" and {options.word_pause_ms:g} ms more before each word after a separator;"
            if options.word_pause_ms
            else ";"
        )
        + f" {rounds} round(s) of 4 places (open, jump 200+ lines, switch file, back)"
        + (f"; the first file open {open_wait_s:g} s before its first key" if open_wait_s else "")
        + "\n"
        f"- workspace folder: {options.workspace or 'none'}; settings: "
        + report.settings_note(options.settings)
        + f"\n{report.machine_line(facts)}\n"
        "- 1st key = from the first keystroke at a place to the first suggestion text shown "
        "there (a partial or an answer, for that key or a later one of the line); all keys "
        "= keystroke -> its answer or first partial (an empty answer counts; a key "
        "superseded before any answer is `inf`); key to next shown = from a keystroke to "
        "the first suggestion text shown for it or a later key of the line (what a person "
        "who typed it waits for, typing on or not); non-matching keys = keys after one "
        "whose shown suggestion the user did not type; 1st key p50/p95 = over every place; "
        "1st answer exact = places whose first suggestion shown was the rest of the line\n"
        f"- peer: {PEER}, `{facts['llama_server']}` (`bench/llama_vim.py`: llama.vim's "
        "requests, 100 ms timer, answer cache and ring of extra chunks; `--cache-reuse "
        "256`); a key typed while its request is in flight sends nothing, so its own "
        "answer is `inf` and the key-to-next-shown columns are the ones to compare\n\n"
        + table
        + "\n\nEngine counters at the end of each run: "
        + "; ".join(f"{k}: {v}" for k, v in facts["stats"].items())
        + "\n"
    )
    report.write_jsonl(
        out / "keystrokes.jsonl",
        (
            {"mode": label, "kind": s.place.kind, **asdict(k), "answer_ms": answer_ms(k)}
            for label, segments in results.items()
            for s in segments
            for k in s.keys
        ),
    )
    chart(results, out / "places.png", f"First keystroke at a place ({options.model})")
    report.publish(out, "report.md", text, table, "places.png")
    return 0


# -- what shorter windows cost: exact lines cut from large real files ----------------------


@dataclass(frozen=True, slots=True)
class Window:
    label: str
    prefix_tokens: int
    suffix_tokens: int


def windows_for(rate: float, budget_ms: float, *horizons_s: float) -> list[Window]:
    """The windows the engine uses at ``rate`` prompt tokens/s: the full default one, the
    one background preparation makes first (each of ``horizons_s`` seconds of evaluation)
    and the one a keystroke gets with nothing prepared (``budget_ms``), split 4:1 as the
    engine does."""
    budget = max(16, int(rate * budget_ms / 1000.0))
    prepared = []
    for horizon_s in horizons_s:
        horizon = int(rate * horizon_s)
        prepared.append(
            Window(
                f"prepared in {horizon_s:g} s ({horizon} tokens)",
                max(16, horizon * 4 // 5),
                min(64, horizon // 5),
            )
        )
    return [
        Window("full (1024 + 64)", 1024, 64),
        *prepared,
        Window(f"unprepared ({budget} tokens)", max(16, budget * 4 // 5), min(64, budget // 5)),
    ]


def line_cases(files: Sequence[Path], n: int, seed: int, max_chars: int) -> list[Place]:
    """``n`` seeded lines to complete, spread over ``files`` (pure)."""
    cases: list[Place] = []
    per_file = max(1, n // len(files))
    for index, path in enumerate(files):
        lines = path.read_text(encoding="utf-8").splitlines()
        found = _candidates(lines, 40, len(lines), max_chars)
        for i in tasks.sample(found, per_file, seed + index):
            indent = len(lines[i]) - len(lines[i].lstrip())
            cases.append(Place(index, i, indent, lines[i].strip(), "line"))
    return cases[:n]


async def window_quality(
    model: str,
    files: Sequence[Path],
    cases: Sequence[Place],
    windows: Sequence[Window],
    overrides: Sequence[tuple[str, Any]] = (),
) -> dict[str, list[bool]]:
    from kode.backends import models
    from kode.backends.llama.backend import LlamaBackend
    from kode.completion.documents import Position
    from kode.completion.engine import CompletionEngine
    from kode.completion.settings import parse

    texts = [f.read_text(encoding="utf-8") for f in files]
    backend = await LlamaBackend.load(await asyncio.to_thread(models.resolve, model))
    results: dict[str, list[bool]] = {w.label: [] for w in windows}
    bar = report.progress(len(cases) * len(windows), "windows")
    try:
        for window in windows:
            settings, problems = parse(
                {
                    "model": model,
                    "prefixTokens": window.prefix_tokens,
                    "suffixTokens": window.suffix_tokens,
                    "snippetTokens": 0,
                    "firstAnswerMs": 0,
                    "readAhead": False,
                    "maxTokens": 48,
                    # Only the first line is scored; greedy decoding writes the same first
                    # line either way, and stopping there saves most of the decoding.
                    "multiline": "never",
                    **dict(overrides),  # --setting KEY=JSON
                }
            )
            assert not problems, problems

            async def factory(_settings: object) -> LlamaBackend:
                return backend

            engine = CompletionEngine(factory, settings)
            for case in cases:
                uri = files[case.file].resolve().as_uri()
                engine.documents.open(uri, blank(texts[case.file], [case], case.file), 1)
                result = await engine.complete(uri, Position(case.line, case.indent))
                engine.documents.close(uri)
                first = result.text.split("\n", 1)[0].rstrip()
                results[window.label].append(first == case.body)
                bar.update(1)
            await engine.aclose()
    finally:
        bar.close()
        await backend.aclose()
    return results


def quality_main(
    model: str,
    files: Sequence[Path] | None,
    n: int,
    seed: int,
    rate: float,
    out: Path,
    horizons: Sequence[float] = (2.5,),
    *,
    full: bool = True,
    settings: Sequence[tuple[str, Any]] = (),
    assembly: Sequence[int] | None = None,
    chunk_lines: int = 32,
    recompute_lines: int = 0,
) -> int:
    chosen = tuple(files) if files else DEFAULT_FILES
    cases = line_cases(chosen, n, seed, 60)
    machine_before = report.machine_note()
    if assembly is not None:
        from kode.bench import assembly as assembly_bench

        scores, store = asyncio.run(
            assembly_bench.assembly_quality(
                model, chosen, cases, assembly, chunk_lines, recompute_lines, settings
            )
        )
        table = markdown_table(
            ["window", "exact line", "prompt tokens evaluated a place", "of the prompt"],
            assembly_bench.table_rows(scores),
        )
        per_place = [
            {
                "file": chosen[case.file].name,
                "line": case.line + 1,
                "expected": case.body,
                **{label: score.lines[i] for label, score in scores.items()},
            }
            for i, case in enumerate(cases)
        ]
        report.write_jsonl(report.prepare_out(out) / "assembly.jsonl", per_place)
        per_token = store["bytes"] / max(1, store["tokens"])
        table += (
            f"\n\nChunk store at the end: {store['chunks']} chunks, {store['tokens']} tokens,"
            f" {store['bytes'] / 1e6:.0f} MB ({per_token:,.0f} bytes a token).\n"
        )
    else:
        windows = windows_for(rate, 1000.0, *horizons)
        if not full:
            windows = windows[1:]
        results = asyncio.run(window_quality(model, chosen, cases, windows, settings))
        rows: list[list[object]] = [
            [label, f"{sum(hits)}/{len(hits)}"] for label, hits in results.items()
        ]
        table = markdown_table(["window", "exact line"], rows)
    out = report.prepare_out(out)
    (out / "windows.md").write_text(
        f"# Exact lines by window size (`{model}`)\n\n- {len(cases)} lines from "
        + ", ".join(f"`{f.name}`" for f in chosen)
        + f" (seed {seed}); windows for {rate:g} prompt tokens/s; settings: "
        + (report.settings_note(settings) or "defaults")
        + "\n- machine: before "
        f"{machine_before}; after {report.machine_note()}\n\n{table}",
        encoding="utf-8",
    )
    print(table)
    return 0
