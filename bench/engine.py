"""``kode bench engine``: one shared engine for several editor windows (issue #15).

Real ``kode lsp`` processes (pygls clients over stdio, as editors run them), each run in
a folder of its own (``XDG_RUNTIME_DIR``), so the benchmark never meets the user's own
engine and leaves none behind. Measured:

- memory, PSS summed over every Kode process (``/proc/PID/smaps_rollup``), with 1, 2 and
  3 windows on one shared engine (with ``--in-process``: 1 and 2 windows that each load
  the model);
- each window's first answer (from starting ``kode lsp``): the first pays the model load,
  the next ones should not;
- keystrokes, in rounds: every condition of a round types the same keystrokes from the
  same document text (``material``), in the opposite order in odd rounds, and each is
  judged against the same keys alone in the same round (``paired``). Conditions: alone
  (window A, then window C), a busy neighbour (A types while B prepares places of a
  large file, ``kode/didMoveCursor``), two typing (A and C at once); with
  ``--in-process``, alone and two typing with a model per window. Keys are appended to
  ``out/keys.jsonl`` after every round, and ``--resume`` adds rounds, so a long
  measurement runs in slots.

A keystroke here is a character typed at the end of a line, then an inline completion
request; the next one follows the answer after ``PAUSE_S``. One the window answers from
the suggestion it shows (no generation) is recorded but left out of the figures.

``--lossless N`` measures instead how often two generations in one batch write other
text than each alone (``bench/engine_lossless.py``); ``--busy`` how llama.cpp degrades
under one busy process per core (``bench/engine_busy.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kode.bench import engine_busy, engine_lossless, harness, tasks
from kode.bench.client import Window
from kode.bench.report import (
    UNKNOWN,
    append_jsonl,
    fmt,
    machine_note,
    markdown_table,
    median,
    percentile,
    prepare_out,
    read_jsonl,
)

PAUSE_S = 0.05  # between an answer and the next keystroke
TYPED = "zqxjvkwq"  # characters the model does not predict at the cursor
SMALL_DOC = (
    "import math\n\n\n"
    "class Circle:\n"
    "    def __init__(self, radius):\n"
    "        self.radius = radius\n\n"
    "    def area(self):\n"
    "        return math.pi * self.radius ** 2\n\n"
    "    def scaled(self, factor):\n"
    "        value = "
)


@dataclass(frozen=True, slots=True)
class Options:
    model: str = "default"
    keys: int = 6  # keystrokes per window, condition and round
    rounds: int = 3  # rounds this run adds
    large: Path | None = None  # the neighbour's file (default: argparse.py of the stdlib)
    out: Path = Path("results/engine")
    busy: bool = False
    resume: bool = False  # add rounds to those in ``out`` (runs that fit a time slot)
    in_process: bool = False  # rounds with a model per window instead of the shared engine
    seed: int = 0
    lossless: int = 0  # pairs of prompts for the batched-decoding comparison (0: off)


# -- the windows benchmark -------------------------------------------------------------------

# The conditions a round measures, each with the same keystrokes in the same documents.
ALONE = "alone"  # window A types, then window C types, nobody else works
BUSY = "busy neighbour"  # A types while B prepares places of a large file
TWO = "two typing"  # A and C type at once
ALONE_IP = "alone, in-process"  # the same with a model per window
TWO_IP = "two typing, in-process"
SHARED_CONDITIONS = (ALONE, BUSY, TWO)
IN_PROCESS_CONDITIONS = (ALONE_IP, TWO_IP)
BASELINE = {BUSY: ALONE, TWO: ALONE, TWO_IP: ALONE_IP}

# Window C's document: another small file, so that the two windows share no prompt.
OTHER_DOC = (
    "from dataclasses import dataclass\n\n\n"
    "@dataclass\n"
    "class Rectangle:\n"
    "    width: float\n"
    "    height: float\n\n"
    "    def area(self):\n"
    "        return self.width * self.height\n\n"
    "    def scaled(self, factor):\n"
    "        result = "
)


@dataclass(frozen=True, slots=True)
class Key:
    """One keystroke's answer: ``ms`` from the keystroke to the answer, and what the
    generation that made it did (from ``kode/stats``; None for an empty answer)."""

    round: int
    condition: str
    window: str  # "a" or "c"
    index: int
    ms: float
    completion_tokens: int | None = None
    generation_ms: float | None = None
    answer_chars: int = 0
    load: float = 0.0  # one-minute load average when the round began
    typed_ahead: bool = False  # answered from the suggestion shown (no generation): left out


@dataclass(slots=True)
class Report:
    model: str
    machine: str = ""
    first_answer_s: dict[str, list[float]] = field(default_factory=dict)
    memory_mb: dict[str, list[float]] = field(default_factory=dict)
    keys: list[Key] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sink: Path | None = (
        None  # keys are appended here after every round (a run cut short keeps them)
    )

    def add(self, keys: list[Key]) -> None:
        self.keys += keys
        if self.sink is not None:
            append_jsonl(self.sink, (asdict(key) for key in keys))


def material(seed: int, round_: int, window: str, n: int) -> str:
    """The ``n`` characters ``window`` types in ``round_``: the same in every condition
    of the round, none of them one the model predicts after the text before it."""
    rng = random.Random(f"{seed}/{round_}/{window}")
    return "".join(rng.choice(TYPED) for _ in range(n))


async def type_keys(
    window: Window, uri: str, keys: str, round_: int, condition: str, name: str, load: float
) -> list[Key]:
    """Type ``keys`` at the end of ``uri``, one at a time, each answered before the next
    (``PAUSE_S`` later): what each answer took."""
    out = []
    for index, key in enumerate(keys):
        window.type(uri, key)
        line, character = window.end_of(uri)
        start = time.perf_counter()
        answer = await window.complete(uri, line, character, harness.STEP_S)
        ms = (time.perf_counter() - start) * 1000.0
        last = (await window.stats()).get("lastCompletion") or {} if answer else {}
        out.append(
            Key(
                round_,
                condition,
                name,
                index,
                ms,
                last.get("completionTokens"),
                last.get("generationMs"),
                len(answer),
                load,
                bool(last.get("fromCache")),
            )
        )
        await asyncio.sleep(PAUSE_S)
    return out


async def keep_busy(window: Window, uri: str, text: str, stop: asyncio.Event, seed: int) -> None:
    """A neighbour reading ``uri``: the cursor rests at a new place every second, so its
    window keeps preparing places of the large file in the background."""
    rng = random.Random(seed)
    lines = text.split("\n")
    while not stop.is_set():
        line = rng.randrange(len(lines))
        window.move_cursor(uri, line, len(lines[line]))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    # An edit stops the preparation still running or waiting (its KV stays): the next
    # condition starts without the neighbour's leftovers.
    window.replace(uri, text)


async def open_and_answer(window: Window, settings: dict[str, Any], uri: str, text: str) -> float:
    """Start ``window``, open a small document and complete in it: seconds to the answer."""
    start = time.perf_counter()
    await window.start(settings)
    window.open(uri, text)
    line, character = window.end_of(uri)
    await window.complete(uri, line, character, harness.STEP_S)
    return time.perf_counter() - start


@dataclass(slots=True)
class Cast:
    """The windows of one run: ``a`` and ``c`` type, ``b`` (shared runs) reads ahead."""

    a: Window
    c: Window
    b: Window | None
    large: tuple[str, str]
    uri_a: str = "file:///w0/circle.py"
    uri_c: str = "file:///w2/rectangle.py"


async def play_round(
    cast: Cast, round_: int, conditions: Sequence[str], options: Options
) -> list[Key]:
    """Every condition once, each from the same documents with the same keystrokes."""
    keys_a = material(options.seed, round_, "a", options.keys)
    keys_c = material(options.seed, round_, "c", options.keys)
    load = os.getloadavg()[0]
    out: list[Key] = []
    for condition in harness.round_order(conditions, round_):
        cast.a.replace(cast.uri_a, SMALL_DOC)
        cast.c.replace(cast.uri_c, OTHER_DOC)
        await asyncio.sleep(0.5)
        a = type_keys(cast.a, cast.uri_a, keys_a, round_, condition, "a", load)
        c = type_keys(cast.c, cast.uri_c, keys_c, round_, condition, "c", load)
        if condition in (ALONE, ALONE_IP):
            out += await a
            out += await c
        elif condition in (TWO, TWO_IP):
            for got in await asyncio.gather(a, c):
                out += got
        elif condition == BUSY:
            c.close()
            assert cast.b is not None
            uri, text = cast.large
            stop = asyncio.Event()
            busy = asyncio.ensure_future(keep_busy(cast.b, uri, text, stop, options.seed + round_))
            await asyncio.sleep(2.0)  # the neighbour is reading ahead by now
            try:
                out += await a
            finally:
                stop.set()
                await busy
        await asyncio.sleep(0.5)
    return out


async def warm_up(cast: Cast) -> None:
    """One unrecorded keystroke in each typing window, from the documents' first text: the
    engine has their prompts (the first round's first condition would pay for them)."""
    for window, uri, text in ((cast.a, cast.uri_a, SMALL_DOC), (cast.c, cast.uri_c, OTHER_DOC)):
        window.replace(uri, text)
        await type_keys(window, uri, TYPED[0], -1, "warm-up", "-", 0.0)


def _settings(options: Options, engine: str) -> dict[str, Any]:
    return {"model": options.model, "maxTokens": 32, "workspaceIndex": False, "engine": engine}


async def shared_run(options: Options, report: Report, large: tuple[str, str], first: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="kode-b-", dir="/tmp"))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(folder), "XDG_STATE_HOME": str(folder / "st")}
    settings = _settings(options, "shared")
    windows = [Window(env) for _ in range(3)]
    docs = [("file:///w0/circle.py", SMALL_DOC), ("file:///w1/circle.py", SMALL_DOC)]
    docs.append(("file:///w2/rectangle.py", OTHER_DOC))
    try:
        firsts, memory = [], []
        for n, (window, (uri, text)) in enumerate(zip(windows, docs, strict=True)):
            firsts.append(await open_and_answer(window, settings, uri, text))
            await asyncio.sleep(1.0)
            memory.append(
                harness.pss_mb([*harness.engine_pids(folder), *(w.pid for w in windows[: n + 1])])
            )
        report.first_answer_s["shared"] = firsts
        report.memory_mb["shared"] = memory
        process = (await windows[1].stats()).get("engineProcess") or {}
        report.notes.append(f"shared: windows answered by {process}")
        uri, text = large
        windows[1].open(uri, text)
        cast = Cast(windows[0], windows[2], windows[1], large)
        await warm_up(cast)
        for round_ in range(first, first + options.rounds):
            report.add(await play_round(cast, round_, SHARED_CONDITIONS, options))
            report.notes.append(f"round {round_} done: {machine_note()}")
        counters = (await windows[0].stats()).get("counters")
        report.notes.append(f"shared: window A counters {json.dumps(counters)[:400]}")
    finally:
        await asyncio.gather(*(w.stop() for w in windows))
        left = harness.stop_engines(folder)
        if left:
            report.notes.append(f"engines that ignored SIGTERM: {left}")
        for log in (folder / "st" / "kode").glob("*.log"):
            shutil.copy(log, prepare_out(options.out) / f"engine-{first}.log")
        shutil.rmtree(folder, ignore_errors=True)


async def in_process_run(options: Options, report: Report, first: int) -> None:
    settings = _settings(options, "inProcess")
    windows = [Window() for _ in range(2)]
    docs = [("file:///w0/circle.py", SMALL_DOC), ("file:///w2/rectangle.py", OTHER_DOC)]
    try:
        firsts, memory = [], []
        for n, (window, (uri, text)) in enumerate(zip(windows, docs, strict=True)):
            firsts.append(await open_and_answer(window, settings, uri, text))
            await asyncio.sleep(1.0)
            memory.append(harness.pss_mb([w.pid for w in windows[: n + 1]]))
        report.first_answer_s["in-process"] = firsts
        report.memory_mb["in-process"] = memory
        cast = Cast(windows[0], windows[1], None, ("", ""))
        await warm_up(cast)
        for round_ in range(first, first + options.rounds):
            report.add(await play_round(cast, round_, IN_PROCESS_CONDITIONS, options))
            report.notes.append(f"round {round_} done: {machine_note()}")
    finally:
        await asyncio.gather(*(w.stop() for w in windows))


# -- the figures ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Paired:
    """A condition against its baseline, round by round and window by window: each
    ratio divides the median of a round's keystrokes by the median of the same
    keystrokes typed by the same window in the same round without the competition."""

    condition: str
    window: str
    ratios: tuple[float, ...]  # one per round, in round order

    @property
    def median(self) -> float | None:
        return median(self.ratios)


def paired(keys: Sequence[Key]) -> list[Paired]:
    """Per condition and window, the per-round ratios against ``BASELINE``.

    >>> k = [Key(0, ALONE, "a", 0, 100.0), Key(0, ALONE, "a", 1, 300.0),
    ...      Key(0, TWO, "a", 0, 300.0), Key(0, TWO, "a", 1, 500.0),
    ...      Key(1, ALONE, "a", 0, 1000.0), Key(1, TWO, "a", 0, 1500.0)]
    >>> [(p.condition, p.window, p.ratios) for p in paired(k)]
    [('two typing', 'a', (2.0, 1.5))]
    """
    keys = [key for key in keys if not key.typed_ahead]
    by: dict[tuple[int, str, str], list[float]] = {}
    for key in keys:
        by.setdefault((key.round, key.condition, key.window), []).append(key.ms)
    out = []
    seen = sorted({(key.condition, key.window) for key in keys if key.condition in BASELINE})
    for condition, window in seen:
        ratios = []
        for round_ in sorted({key.round for key in keys}):
            this = median(by.get((round_, condition, window), []))
            base = median(by.get((round_, BASELINE[condition], window), []))
            if this is not None and base:
                ratios.append(this / base)
        out.append(Paired(condition, window, tuple(ratios)))
    return out


def render(report: Report) -> str:
    def ms(values: list[float]) -> str:
        med, p90 = median(values), percentile(values, 90)
        return f"{fmt(med, 0)} / {fmt(p90, 0)}"

    lines = [f"# kode bench engine ({report.model})", "", f"- machine: {report.machine}", ""]
    rows = []
    for kind, values in report.first_answer_s.items():
        mem = report.memory_mb.get(kind, [])
        rows.append(
            [
                kind,
                " / ".join(f"{v:.1f}" for v in values),
                " / ".join(f"{v:.0f}" for v in mem),
                f"{mem[-1] / mem[0]:.2f}x" if len(mem) > 1 and mem[0] else UNKNOWN,
            ]
        )
    if rows:
        lines.append(
            markdown_table(
                [
                    "engine",
                    "first answer per window (s)",
                    "PSS with 1/2/3 windows (MB)",
                    "last/one",
                ],
                rows,
            )
        )
    keys = [key for key in report.keys if not key.typed_ahead]
    rounds = sorted({key.round for key in keys})
    lines += [
        "",
        f"Keystrokes the model must answer, {len(rounds)} rounds (ms; pooled over rounds; "
        f"{len(report.keys) - len(keys)} answered from the suggestion shown left out):",
        "",
    ]
    krows = []
    for condition in dict.fromkeys(key.condition for key in keys):
        for window in ("a", "c"):
            mine = [k for k in keys if k.condition == condition and k.window == window]
            if not mine:
                continue
            tokens = [k.completion_tokens for k in mine if k.completion_tokens is not None]
            gen = [k.generation_ms for k in mine if k.generation_ms is not None]
            krows.append(
                [
                    condition,
                    window.upper(),
                    len(mine),
                    ms([k.ms for k in mine]),
                    fmt(median(tokens), 0),
                    fmt(median(gen), 0),
                ]
            )
    lines.append(
        markdown_table(
            ["condition", "window", "keys", "median / p90", "tokens (median)", "generation ms"],
            krows,
        )
    )
    prows = []
    for pair in paired(keys):
        spread = f"{min(pair.ratios):.2f}-{max(pair.ratios):.2f}x" if pair.ratios else UNKNOWN
        prows.append(
            [
                f"{pair.condition} / {BASELINE[pair.condition]}",
                pair.window.upper(),
                len(pair.ratios),
                fmt(pair.median, 2, "x"),
                spread,
                " ".join(f"{r:.2f}" for r in pair.ratios),
            ]
        )
    lines += ["", "Paired: per round, the median keystroke against the same keys alone:", ""]
    lines.append(
        markdown_table(
            ["condition", "window", "rounds", "median ratio", "range", "per round"], prows
        )
    )
    lines += ["", *[f"- {note}" for note in report.notes], ""]
    return "\n".join(lines)


def load_keys(path: Path) -> list[Key]:
    return [Key(**record) for record in read_jsonl(path)]


async def windows_bench(options: Options, earlier: list[Key], sink: Path) -> Report:
    report = Report(model=options.model, machine=machine_note(), sink=sink)
    path = options.large or Path(tasks.stdlib_files(1)[0]).parent / "argparse.py"
    large = (path.resolve().as_uri(), path.read_text())
    first = max((key.round for key in earlier), default=-1) + 1
    if options.in_process:
        await in_process_run(options, report, first)
    else:
        await shared_run(options, report, large, first)
    report.machine += f"; after: {machine_note()}"
    return report


def main(options: Options) -> int:
    out = prepare_out(options.out)
    if options.lossless:
        text = asyncio.run(engine_lossless.lossless_bench(options))
        (out / "lossless.md").write_text(text + "\n")
        print(text)
        return 0
    if options.busy:
        text = engine_busy.busy_bench(options)
        text += f"\n\n- machine after: {machine_note()}"
        (out / "busy.md").write_text(text + "\n")
        print(text)
        return 0
    keys_path = out / "keys.jsonl"
    if not options.resume:
        keys_path.unlink(missing_ok=True)
        for old in out.glob("run-*.json"):
            old.unlink()
    earlier = load_keys(keys_path)
    report = asyncio.run(windows_bench(options, earlier, keys_path))
    first = max((key.round for key in earlier), default=-1) + 1
    report.sink = None
    (out / f"run-{first}.json").write_text(json.dumps(asdict(report), indent=2, default=str))
    whole = Report(model=options.model, keys=[*earlier, *report.keys])
    for path in sorted(out.glob("run-*.json"), key=lambda p: int(p.stem.split("-")[1])):
        run = json.loads(path.read_text())
        whole.machine += f"{'; ' if whole.machine else ''}{path.stem}: {run['machine']}"
        for kind, values in run["first_answer_s"].items():
            whole.first_answer_s.setdefault(kind, values)
            whole.memory_mb.setdefault(kind, run["memory_mb"][kind])
        whole.notes += [f"{path.stem}: {note}" for note in run["notes"]]
    text = render(whole)
    (out / "engine.md").write_text(text)
    print(text)
    return 0
