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

``--lossless N`` measures instead how often two generations decoded in one batch (the
shared engine's two slots) write other text than each alone in a one-slot backend (what
a window ran before): N pairs of real prompts (standard-library files cut at a line's
end), greedy, 32 tokens; where they differ, the reference's top-2 logit gap at the
first differing token (batched rows compute other logits by kernel noise, so only a
near tie may flip).

``--busy`` measures instead how llama.cpp degrades under one busy process per core:
prefill and decode speed for how OpenMP's threads wait (spin, sleep at once, or the
engine's short spin), threads (1, 2) and priority (nice 0, 5), against the quiet machine,
in rounds as well (``--rounds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kode.backends.defaults import ENGINE_SLOTS, KV_MEMORY_MB
from kode.backends.system import SPIN_COUNT, alive, usable_cores
from kode.bench import common, latency

PAUSE_S = 0.05  # between an answer and the next keystroke
STEP_S = 600.0  # the longest one step may take (a model load on a busy machine)
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


# -- processes ----------------------------------------------------------------------------


def engine_pids(folder: Path) -> list[int]:
    """Live ``kode engine run`` processes whose ``XDG_RUNTIME_DIR`` is ``folder``."""
    found = []
    want = f"XDG_RUNTIME_DIR={folder}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            if b"engine" not in cmdline or b"run" not in cmdline:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if want in environ and alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def stop_engines(folder: Path, timeout_s: float = 20.0) -> list[int]:
    """SIGTERM every engine of ``folder``; the pids still running after ``timeout_s``
    (then killed)."""
    pids = engine_pids(folder)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    stubborn = [p for p in pids if alive(p)]
    for pid in stubborn:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return stubborn


def pss_mb(pids: Sequence[int]) -> float:
    """Proportional set size summed over ``pids`` (shared pages split among sharers)."""
    total_kb = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
    return total_kb / 1024.0


# -- a window -------------------------------------------------------------------------------


class Window:
    """One ``kode lsp`` process with a pygls client, as an editor window runs it."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        from pygls.lsp.client import LanguageClient

        self.client = LanguageClient("kode-bench", "0.1.0")
        self.env = env
        self.shown: list[str] = []
        self._n = 0
        self._versions: dict[str, int] = {}
        self._texts: dict[str, str] = {}

        def show(params: Any) -> None:
            self.shown.append(params.message)

        self.client.feature("window/showMessage")(show)

    @property
    def pid(self) -> int:
        server = self.client._server
        assert server is not None
        return int(server.pid)

    async def start(self, options: dict[str, Any]) -> None:
        from lsprotocol import types

        await self.client.start_io(
            sys.executable, "-m", "kode.cli.main", "lsp", cwd=str(common.REPO_ROOT), env=self.env
        )
        await self.client.initialize_async(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(),
                process_id=None,
                root_uri=None,
                initialization_options=options,
            )
        )
        self.client.initialized(types.InitializedParams())

    def open(self, uri: str, text: str) -> None:
        from lsprotocol import types

        self._versions[uri], self._texts[uri] = 1, text
        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=uri, language_id="python", version=1, text=text
                )
            )
        )

    def end_of(self, uri: str) -> tuple[int, int]:
        """The position after the last character of ``uri``."""
        lines = self._texts[uri].split("\n")
        return len(lines) - 1, len(lines[-1].encode("utf-16-le")) // 2

    def type(self, uri: str, text: str) -> None:
        """Append ``text`` to ``uri`` (an incremental ``didChange`` at its end)."""
        from lsprotocol import types

        line, character = self.end_of(uri)
        self._versions[uri] += 1
        self._texts[uri] += text
        at = types.Position(line=line, character=character)
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(
                    uri=uri, version=self._versions[uri]
                ),
                content_changes=[
                    types.TextDocumentContentChangePartial(
                        range=types.Range(start=at, end=at), text=text
                    )
                ],
            )
        )

    def replace(self, uri: str, text: str) -> None:
        """Set the whole text of ``uri`` (a full-document ``didChange``)."""
        from lsprotocol import types

        self._versions[uri] += 1
        self._texts[uri] = text
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(
                    uri=uri, version=self._versions[uri]
                ),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
            )
        )

    def move_cursor(self, uri: str, line: int, character: int) -> None:
        self.client.protocol.notify(
            "kode/didMoveCursor",
            {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}},
        )

    def request(self, uri: str, line: int, character: int) -> asyncio.Future[Any]:
        from lsprotocol import types

        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Invoked
            ),
        )
        self._n += 1
        future = self.client.protocol.send_request(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=f"c{self._n}"
        )
        return asyncio.wrap_future(future)

    async def complete(self, uri: str, line: int, character: int, timeout_s: float) -> str:
        result = await asyncio.wait_for(self.request(uri, line, character), timeout_s)
        items = getattr(result, "items", None) or []
        return str(items[0].insert_text) if items else ""

    async def stats(self) -> dict[str, Any]:
        reply = await asyncio.wait_for(
            self.client.protocol.send_request_async("kode/stats", {}), 60
        )
        plain: dict[str, Any] = latency.plain(reply)
        return plain

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.shutdown_async(None), 20)
            self.client.exit(None)
        server = self.client._server
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.stop(), 20)  # type: ignore[no-untyped-call]
        if server is not None and server.returncode is None:
            server.kill()
            await server.wait()


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
            with open(self.sink, "a", encoding="utf-8") as handle:
                for key in keys:
                    handle.write(json.dumps(asdict(key)) + "\n")


def material(seed: int, round_: int, window: str, n: int) -> str:
    """The ``n`` characters ``window`` types in ``round_``: the same in every condition
    of the round, none of them one the model predicts after the text before it."""
    rng = random.Random(f"{seed}/{round_}/{window}")
    return "".join(rng.choice(TYPED) for _ in range(n))


def conditions_in(round_: int, conditions: Sequence[str]) -> list[str]:
    """The order of ``round_``: forwards in even rounds, backwards in odd ones, so that no
    condition always comes first (a fresh engine state, the first time a prompt is seen)
    or last."""
    return list(conditions) if round_ % 2 == 0 else list(reversed(conditions))


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
        answer = await window.complete(uri, line, character, STEP_S)
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
    await window.complete(uri, line, character, STEP_S)
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
    for condition in conditions_in(round_, conditions):
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
            memory.append(pss_mb([*engine_pids(folder), *(w.pid for w in windows[: n + 1])]))
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
            report.notes.append(f"round {round_} done: {common.machine_note()}")
        counters = (await windows[0].stats()).get("counters")
        report.notes.append(f"shared: window A counters {json.dumps(counters)[:400]}")
    finally:
        await asyncio.gather(*(w.stop() for w in windows))
        left = stop_engines(folder)
        if left:
            report.notes.append(f"engines that ignored SIGTERM: {left}")
        for log in (folder / "st" / "kode").glob("*.log"):
            shutil.copy(log, common.prepare_out(options.out) / f"engine-{first}.log")
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
            memory.append(pss_mb([w.pid for w in windows[: n + 1]]))
        report.first_answer_s["in-process"] = firsts
        report.memory_mb["in-process"] = memory
        cast = Cast(windows[0], windows[1], None, ("", ""))
        await warm_up(cast)
        for round_ in range(first, first + options.rounds):
            report.add(await play_round(cast, round_, IN_PROCESS_CONDITIONS, options))
            report.notes.append(f"round {round_} done: {common.machine_note()}")
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
        return common.median(self.ratios)


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
            this = common.median(by.get((round_, condition, window), []))
            base = common.median(by.get((round_, BASELINE[condition], window), []))
            if this is not None and base:
                ratios.append(this / base)
        out.append(Paired(condition, window, tuple(ratios)))
    return out


def render(report: Report) -> str:
    def ms(values: list[float]) -> str:
        med, p90 = common.median(values), common.percentile(values, 90)
        return f"{common.fmt(med, 0)} / {common.fmt(p90, 0)}"

    lines = [f"# kode bench engine ({report.model})", "", f"- machine: {report.machine}", ""]
    rows = []
    for kind, values in report.first_answer_s.items():
        mem = report.memory_mb.get(kind, [])
        rows.append(
            [
                kind,
                " / ".join(f"{v:.1f}" for v in values),
                " / ".join(f"{v:.0f}" for v in mem),
                f"{mem[-1] / mem[0]:.2f}x" if len(mem) > 1 and mem[0] else common.UNKNOWN,
            ]
        )
    if rows:
        lines.append(
            common.markdown_table(
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
                    common.fmt(common.median(tokens), 0),
                    common.fmt(common.median(gen), 0),
                ]
            )
    lines.append(
        common.markdown_table(
            ["condition", "window", "keys", "median / p90", "tokens (median)", "generation ms"],
            krows,
        )
    )
    prows = []
    for pair in paired(keys):
        spread = (
            f"{min(pair.ratios):.2f}-{max(pair.ratios):.2f}x" if pair.ratios else common.UNKNOWN
        )
        prows.append(
            [
                f"{pair.condition} / {BASELINE[pair.condition]}",
                pair.window.upper(),
                len(pair.ratios),
                common.fmt(pair.median, 2, "x"),
                spread,
                " ".join(f"{r:.2f}" for r in pair.ratios),
            ]
        )
    lines += ["", "Paired: per round, the median keystroke against the same keys alone:", ""]
    lines.append(
        common.markdown_table(
            ["condition", "window", "rounds", "median ratio", "range", "per round"], prows
        )
    )
    lines += ["", *[f"- {note}" for note in report.notes], ""]
    return "\n".join(lines)


def load_keys(path: Path) -> list[Key]:
    if not path.exists():
        return []
    return [Key(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


async def windows_bench(options: Options, earlier: list[Key], sink: Path) -> Report:
    report = Report(model=options.model, machine=common.machine_note(), sink=sink)
    path = options.large or Path(common.stdlib_files(1)[0]).parent / "argparse.py"
    large = (path.resolve().as_uri(), path.read_text())
    first = max((key.round for key in earlier), default=-1) + 1
    if options.in_process:
        await in_process_run(options, report, first)
    else:
        await shared_run(options, report, large, first)
    report.machine += f"; after: {common.machine_note()}"
    return report


# -- the busy machine ---------------------------------------------------------------------

# One fresh process per setting: libgomp reads how its threads wait once, when it loads. The
# prompt is synthetic (no user code); plain decoding, no calibration (a fixed cost curve).
_PROBE = """
import asyncio, json, os, sys
from pathlib import Path
from kode.backends.base import GenerationRequest, SpeculationMethod
from kode.backends.llama.backend import LlamaBackend
from kode.backends.speculative import CostCurve

model, threads, nice = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
os.nice(nice)
text = "".join(f"def step_{i}(value, scale={i}):\\n    return value * scale + {i}\\n\\n"
               for i in range(24))

async def main():
    backend = await LlamaBackend.load(model, n_threads=threads, curve=CostCurve({1: 1.0}))
    request = GenerationRequest(prompt=text, max_tokens=24, speculation=SpeculationMethod.NONE)
    generation = await backend.generate(request)
    async for _ in generation:
        pass
    s = await generation.wait()
    await backend.aclose()
    print(json.dumps({"prefill_tok_s": s.evaluated_prompt_tokens / (s.prefill_ms / 1000),
                      "ms_per_token": s.ms_per_token, "prompt": s.evaluated_prompt_tokens,
                      "tokens": s.completion_tokens}))

asyncio.run(main())
"""


# How OpenMP threads wait, as the environment says it (nothing else of the two is set).
ACTIVE, PASSIVE = "OMP_WAIT_POLICY=ACTIVE", "OMP_WAIT_POLICY=PASSIVE"
SHORT_SPIN = f"GOMP_SPINCOUNT={SPIN_COUNT}"  # the engine's own (backends/system.py)


def busy_configs(cores: int) -> list[tuple[str, str, int, int]]:
    """(load, waiting, threads, nice) for every setting the busy bench runs."""
    configs = [("quiet", waiting, cores, 0) for waiting in (ACTIVE, PASSIVE, SHORT_SPIN)]
    configs += [("busy", waiting, cores, 0) for waiting in (ACTIVE, PASSIVE, SHORT_SPIN)]
    if cores > 1:
        configs.append(("busy", SHORT_SPIN, 1, 0))
    configs.append(("busy", SHORT_SPIN, cores, 5))
    return configs


def probe(model: Path, load: str, waiting: str, threads: int, nice: int) -> dict[str, Any]:
    """One setting in a fresh process, with one busy process per core if ``load`` says."""
    cores = usable_cores()
    hogs = []
    if load == "busy":
        hogs = [
            subprocess.Popen(
                [sys.executable, "-c", "while True: pass"], preexec_fn=common.die_with_parent
            )
            for _ in range(cores)
        ]
    try:
        chosen = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
        env = {k: v for k, v in os.environ.items() if k not in chosen}
        name, _, value = waiting.partition("=")
        env[name] = value
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, str(model), str(threads), str(nice)],
            capture_output=True,
            text=True,
            env=env,
            timeout=STEP_S,
            check=False,
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    row: dict[str, Any] = {"load": load, "waiting": waiting, "threads": threads, "nice": nice}
    if done.returncode != 0:
        return {**row, "failed": done.stderr[-200:]}
    return {**row, **json.loads(done.stdout.strip().splitlines()[-1])}


def busy_slowdowns(results: Sequence[dict[str, Any]], cores: int) -> dict[str, list[float]]:
    """Per round, how much the engine's own setting (a short spin, every core, nice 0) slows
    under the busy processes against the same round's quiet run: prefill (tokens/s,
    quiet / busy) and decode (ms/token, busy / quiet).

    >>> rows = [{"round": 0, "load": "quiet", "waiting": SHORT_SPIN, "threads": 2, "nice": 0,
    ...          "prefill_tok_s": 40.0, "ms_per_token": 50.0},
    ...         {"round": 0, "load": "busy", "waiting": SHORT_SPIN, "threads": 2, "nice": 0,
    ...          "prefill_tok_s": 20.0, "ms_per_token": 125.0}]
    >>> busy_slowdowns(rows, 2)
    {'prefill': [2.0], 'decode': [2.5]}
    """
    out: dict[str, list[float]] = {"prefill": [], "decode": []}
    mine = [
        r
        for r in results
        if (r["waiting"], r["threads"], r["nice"]) == (SHORT_SPIN, cores, 0) and "failed" not in r
    ]
    for round_ in sorted({r["round"] for r in mine}):
        quiet = [r for r in mine if r["round"] == round_ and r["load"] == "quiet"]
        busy = [r for r in mine if r["round"] == round_ and r["load"] == "busy"]
        if quiet and busy:
            out["prefill"].append(quiet[0]["prefill_tok_s"] / busy[0]["prefill_tok_s"])
            out["decode"].append(busy[0]["ms_per_token"] / quiet[0]["ms_per_token"])
    return out


def busy_bench(options: Options) -> str:
    """Prefill and decode under one busy process per core, per thread setting: every
    setting once per round, in the opposite order in odd rounds; rounds add up across
    ``--resume`` runs (``out/busy.jsonl``)."""
    from kode.backends import models

    model = models.resolve(options.model)
    cores = usable_cores()
    path = options.out / "busy.jsonl"
    if not options.resume:
        path.unlink(missing_ok=True)
    results = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    first = max((r["round"] for r in results), default=-1) + 1
    for round_ in range(first, first + options.rounds):
        configs = busy_configs(cores)
        for config in configs if round_ % 2 == 0 else reversed(configs):
            before = os.getloadavg()[0]
            row = {"round": round_, **probe(model, *config), "loadBefore": before}
            row["loadAfter"] = os.getloadavg()[0]
            results.append(row)
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
    rows = []
    for load, waiting, threads, nice in busy_configs(cores):
        mine = [
            r
            for r in results
            if (r["load"], r["waiting"], r["threads"], r["nice"]) == (load, waiting, threads, nice)
            and "failed" not in r
        ]
        rows.append(
            [
                load,
                waiting,
                threads,
                nice,
                len(mine),
                common.fmt(common.median(r["prefill_tok_s"] for r in mine), 0),
                common.fmt(common.median(r["ms_per_token"] for r in mine), 1),
            ]
        )
    table = common.markdown_table(
        ["load", "threads wait", "threads", "nice", "runs", "prefill tok/s", "ms/token"],
        rows,
    )
    slow = busy_slowdowns(results, cores)
    # ``cores`` busy processes and Kode share the cores: Kode's fair share is one process's
    # (cores / (cores + 1) of a core, against every core quiet): cores + 1 times slower.
    fair = float(cores + 1)
    lines = [f"# kode bench engine --busy ({options.model})", "", table]
    lines.append(
        f"Busy against quiet, {SHORT_SPIN} with {cores} threads, per round (a fair share of the "
        f"cores costs {fair:.0f}x):"
    )
    for what, values in slow.items():
        med = common.median(values)
        lines.append(
            f"- {what}: median {common.fmt(med, 2, 'x')} "
            f"({common.fmt(None if med is None else med / fair, 2)} of the fair share); "
            f"per round {' '.join(f'{v:.2f}' for v in values)}"
        )
    failed = [r for r in results if "failed" in r]
    lines += [f"- failed: {r}" for r in failed]
    return "\n".join(lines)


# -- batched decoding against each alone ----------------------------------------------------


def lossless_prompts(n: int, seed: int) -> list[str]:
    """``n`` FIM prompts from the standard library's largest files, each cut at the end of
    a random line (about 1,200 characters before it, 200 after)."""
    rng = random.Random(seed)
    files = common.stdlib_files(max(4, n))
    out = []
    for i in range(n):
        text = files[i % len(files)].read_text(encoding="utf-8")
        cuts = [m for m in range(1200, len(text) - 200) if text[m] == "\n"]
        cut = rng.choice(cuts) + 1
        before, after = text[cut - 1200 : cut], text[cut : cut + 200]
        out.append(f"<|fim_prefix|>{before}<|fim_suffix|>{after}<|fim_middle|>")
    return out


async def lossless_bench(options: Options) -> str:
    from kode.backends import models
    from kode.backends.base import GenerationRequest, SpeculationMethod
    from kode.backends.llama.backend import LlamaBackend
    from kode.backends.llama.target import LlamaTarget
    from kode.backends.speculative import CostCurve

    path = await asyncio.to_thread(models.resolve, options.model)
    prompts = lossless_prompts(2 * options.lossless, options.seed)
    curve = CostCurve({1: 1.0})
    one = await LlamaBackend.load(path, curve=curve)
    two = await LlamaBackend.load(
        path, n_slots=ENGINE_SLOTS, curve=curve, kv_memory_mb=KV_MEMORY_MB
    )

    async def tokens(backend: LlamaBackend, prompt: str) -> list[int]:
        request = GenerationRequest(prompt, 32, speculation=SpeculationMethod.NONE)
        generation = await backend.generate(request)
        return [t async for chunk in generation for t in chunk.token_ids]

    out = common.prepare_out(options.out)
    rows: list[dict[str, Any]] = []
    try:
        for i in range(0, len(prompts), 2):
            pair = prompts[i : i + 2]
            alone = [await tokens(one, p) for p in pair]
            engine_alone = [await tokens(two, p) for p in pair]
            together = await asyncio.gather(*(tokens(two, p) for p in pair))
            for prompt, want, solo, got in zip(pair, alone, engine_alone, together, strict=True):
                row: dict[str, Any] = {"prompt": len(rows), "tokens": len(want)}
                for name, seen in (("engineAlone", solo), ("together", got)):
                    first = next(
                        (k for k, (a, b) in enumerate(zip(seen, want, strict=False)) if a != b),
                        None,
                    )
                    if first is None and len(seen) != len(want):
                        first = min(len(seen), len(want))
                    row[name] = first
                    if first is not None:
                        # The gap of the reference's logits where the texts part; where
                        # the reference stopped there (its stop token is not in ``want``)
                        # the other's token stands in: only the logits before it count.
                        upto = [*want[:first], (want if first < len(want) else seen)[first]]
                        gaps = await one.logit_gaps(prompt, upto)
                        row[name + "Gap"] = round(gaps[first], 3)
                rows.append(row)
            (out / "lossless.json").write_text(json.dumps(rows, indent=1))  # a run cut short
    finally:
        await two.aclose()
        await one.aclose()
    lines = [
        f"# kode bench engine --lossless ({options.model})",
        "",
        f"{len(rows)} prompts, 32 greedy tokens each, against each alone in a one-slot "
        f"backend; a divergence is a near tie if the reference's top-2 gap there is below "
        f"{LlamaTarget.near_tie} logits.",
        "",
    ]
    for name, what in (("together", "two in one batch"), ("engineAlone", "alone, two slots")):
        differ = [r for r in rows if r[name] is not None]
        gaps = [r[name + "Gap"] for r in differ if name + "Gap" in r]
        near = sum(g < LlamaTarget.near_tie for g in gaps)
        at = ", ".join(f"token {r[name]} (gap {r.get(name + 'Gap')})" for r in differ)
        lines.append(
            f"- {what}: {len(rows) - len(differ)}/{len(rows)} texts identical; "
            f"{len(differ)} differ, {near} of them at a near tie{': ' + at if at else ''}"
        )
    lines.append(f"- machine: {common.machine_note()}")
    return "\n".join(lines)


def main(options: Options) -> int:
    out = common.prepare_out(options.out)
    if options.lossless:
        text = asyncio.run(lossless_bench(options))
        (out / "lossless.md").write_text(text + "\n")
        print(text)
        return 0
    if options.busy:
        text = busy_bench(options)
        text += f"\n\n- machine after: {common.machine_note()}"
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
