"""Keystroke replay through the real language server, as an editor drives it.

``kode lsp`` runs as a subprocess over stdio; a pygls ``LanguageClient`` plays VS Code:
``didOpen``, then for every typed character an incremental ``didChange`` and a
``textDocument/inlineCompletion`` request, at a fixed cadence (120 ms: a brisk typist).
Like VS Code it sends ``$/cancelRequest`` for the request still in flight when the next
key arrives. The text typed is real: a region cut out of a source file (``examples/``) or
the missing line of a HumanEval task, typed back character by character from where it
was cut (indentation left in place, as an editor's auto-indent would).

Measured per keystroke: the time to first visible text (the response with a suggestion,
or an earlier ``kode/inlineCompletionPartial`` notification, which the client asks for
with ``initializationOptions.partialCompletions``), whether it came before the next key,
and whether the characters typed next equal the start of the suggestion shown (an
accept-rate proxy). From ``kode/stats``: ms per generated token of answered requests, and
decode steps taken after a cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kode.bench import charts, harness, report, tasks
from kode.bench.client import CANCELLED, PARTIAL_METHOD, LspClient, items, plain
from kode.bench.report import fmt, fmt_ratio, markdown_table


@dataclass(frozen=True, slots=True)
class Options:
    model: str = "default"
    cadence_ms: float = 120.0
    files: tuple[Path, ...] | None = None  # None: every file in examples/
    regions: int = 2  # per file
    humaneval: int = 2
    max_chars: int = 60
    speculation: str | None = None
    settings: tuple[tuple[str, Any], ...] = ()  # more server settings (camelCase key, value)
    seed: int = 0
    out: Path = Path("results/latency")
    settle_s: float = 30.0  # wait for the last answer after the last key
    # Before typing a region: one request at the cursor, answered, then this pause (the
    # user clicks into the line and reads). 0 types at once into a file just opened.
    place_pause_s: float = 1.0
    # Places: a pause before each word that follows a separator (``self.|x``, ``= |1``), as
    # a person stops to read the suggestion; 0 types each line through.
    word_pause_ms: float = 0.0
    startup_s: float = harness.STEP_S  # first request: the model loads (may be assembled)
    workspace: Path | None = None  # the workspace folder given to the server (rootUri)
    # The server's debug log (``kode -vv lsp``: which window answered each key, in sizes).
    debug_log: bool = False
    environ: tuple[tuple[str, str], ...] = ()  # more environment for the server process


@dataclass(slots=True)
class Script:
    """One region to type back: open ``text`` (region removed), type ``typed`` at
    ``offset``."""

    name: str
    uri: str
    text: str
    offset: int
    typed: str
    placed_ms: float | None = None  # the placing request's answer time (cold: file just opened)


@dataclass(slots=True)
class Keystroke:
    script: str
    index: int
    char: str
    sent: float  # perf_counter seconds
    next_key: float | None = None  # when the next key was sent (None: the last key)
    answered: float | None = None  # any response (even an empty one)
    partial: float | None = None  # first partial notification
    partial_text: str = ""
    suggestion: str = ""
    outcome: str = "pending"  # shown | empty | cancelled | error | pending
    matched: bool | None = None  # next typed chars == start of the shown suggestion
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def visible_ms(self) -> float | None:
        """Keystroke to first visible text: a partial notification, or a suggestion."""
        times = [self.partial] if self.partial is not None else []
        if self.outcome == "shown" and self.answered is not None:
            times.append(self.answered)
        return (min(times) - self.sent) * 1000.0 if times else None

    @property
    def before_next_key(self) -> bool:
        """Answered (with or without a suggestion) before the next keystroke."""
        if self.answered is None or self.outcome in ("cancelled", "error"):
            return False
        return self.next_key is None or self.answered <= self.next_key


# -- scripts (pure) ---------------------------------------------------------------------


def region_scripts(path: Path, text: str, n: int, seed: int, max_chars: int) -> list[Script]:
    """``n`` seeded lines of ``text`` to retype: the text after each line's indentation
    (lines of 8 to ``max_chars`` characters, comments excluded)."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    candidates = []
    for i, line in enumerate(lines):
        body = line.strip()
        if 8 <= len(body) <= max_chars and not body.startswith(("#", '"""', "'''")):
            candidates.append(i)
    chosen = sorted(tasks.sample(candidates, n, seed))
    out = []
    for i in chosen:
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        body = line.rstrip("\r\n")[indent:]
        offset = starts[i] + indent
        out.append(
            Script(
                name=f"{path.name}:{i + 1}",
                uri=path.resolve().as_uri(),
                text=text[:offset] + text[offset + len(body) :],
                offset=offset,
                typed=body,
            )
        )
    return out


def humaneval_scripts(n: int, seed: int, max_chars: int) -> list[Script]:
    """The missing line of ``n`` seeded single-line HumanEval tasks, typed back."""
    rows = tasks.load_humaneval(tasks.humaneval_path("single"))
    fits = [t for t in rows if 0 < len(t.canonical_solution.strip()) <= max_chars]
    out = []
    for task in tasks.sample(fits, n, seed):
        line = task.canonical_solution.rstrip("\n")
        indent = len(line) - len(line.lstrip())
        name = task.task_id.replace("/", "_")
        out.append(
            Script(
                name=task.task_id,
                uri=f"file:///kode-bench/humaneval/{name}.py",
                text=task.prompt + line[:indent] + "\n" + task.suffix,
                offset=len(task.prompt) + indent,
                typed=line[indent:],
            )
        )
    return out


def mark_matches(keys: Sequence[Keystroke], typed: str) -> None:
    """For every key that showed text (its suggestion, else its partial): do the
    characters typed next equal the start of it (compared over the shorter of the two)?"""
    for key in keys:
        shown = key.suggestion if key.outcome == "shown" else key.partial_text
        if not shown:
            continue
        rest = typed[key.index + 1 :]
        n = min(len(rest), len(shown))
        key.matched = None if n == 0 else rest[:n] == shown[:n]


@dataclass(slots=True)
class Summary:
    keystrokes: int
    shown: int
    answered_before_next: int
    visible_p50: float | None
    visible_p95: float | None
    answer_p50: float | None
    answer_p95: float | None
    visible_partial: int
    ms_per_token: float | None
    matched: int
    match_checked: int
    cancelled: int | None
    steps_after_cancel: int | None
    generations: int | None


def answer_ms(key: Keystroke) -> float:
    """Keystroke to the moment the editor knows what to show: the first partial or the
    answer (an empty one too); ``inf`` when the key was never answered (superseded,
    cancelled, failed): such keys count as slower than any answered one."""
    if key.outcome not in ("shown", "empty") or key.answered is None:
        return math.inf if key.partial is None else (key.partial - key.sent) * 1000.0
    times = [key.answered] if key.partial is None else [key.answered, key.partial]
    return (min(times) - key.sent) * 1000.0


def summarize(keys: Sequence[Keystroke], counters: dict[str, Any] | None) -> Summary:
    visible = [k.visible_ms for k in keys if k.visible_ms is not None]
    answers = [answer_ms(k) for k in keys]
    per_token: list[float] = []
    seen: set[tuple[Any, ...]] = set()
    for k in keys:
        last = k.stats
        n = int(last.get("completionTokens") or 0)
        ident = (last.get("totalMs"), last.get("ttftMs"), n)
        if n >= 2 and ident not in seen:
            seen.add(ident)
            per_token.append((float(last["totalMs"]) - float(last["ttftMs"])) / (n - 1))
    checked = [k for k in keys if k.matched is not None]
    return Summary(
        keystrokes=len(keys),
        shown=sum(k.outcome == "shown" for k in keys),
        answered_before_next=sum(k.before_next_key for k in keys),
        visible_p50=report.percentile(visible, 50),
        visible_p95=report.percentile(visible, 95),
        answer_p50=report.percentile(answers, 50),
        answer_p95=report.percentile(answers, 95),
        visible_partial=sum(k.partial is not None for k in keys),
        ms_per_token=report.median(per_token),
        matched=sum(bool(k.matched) for k in checked),
        match_checked=len(checked),
        cancelled=None if counters is None else counters.get("cancelled"),
        steps_after_cancel=None if counters is None else counters.get("stepsAfterCancel"),
        generations=None if counters is None else counters.get("generations"),
    )


def _ms(value: float | None) -> str:
    if value is not None and math.isinf(value):
        return "never (superseded before an answer)"
    return fmt(value, 0, " ms")


def render_table(label: str, s: Summary, cadence_ms: float) -> str:
    per_cancel = (
        None
        if not s.cancelled or s.steps_after_cancel is None
        else s.steps_after_cancel / s.cancelled
    )
    rows: list[list[object]] = [
        ["keystrokes", s.keystrokes],
        ["keystroke -> answer or first partial, p50 (all keys)", _ms(s.answer_p50)],
        ["keystroke -> answer or first partial, p95 (all keys)", _ms(s.answer_p95)],
        ["keystroke -> first visible text, p50 (keys that showed text)", _ms(s.visible_p50)],
        ["keystroke -> first visible text, p95 (keys that showed text)", _ms(s.visible_p95)],
        ["  of which first seen as a partial", s.visible_partial],
        ["suggestions shown", fmt_ratio(s.shown, s.keystrokes)],
        [
            f"answered before the next key ({cadence_ms:g} ms)",
            fmt_ratio(s.answered_before_next, s.keystrokes),
        ],
        ["ms per generated token (median of answered)", fmt(s.ms_per_token, 1)],
        ["typed text matched the shown suggestion", fmt_ratio(s.matched, s.match_checked)],
        [
            "decode steps after cancel (stepsAfterCancel / cancelled)",
            f"{s.steps_after_cancel}/{s.cancelled} = {fmt(per_cancel, 2)}"
            if s.cancelled is not None
            else report.UNKNOWN,
        ],
        ["generations (server)", s.generations if s.generations is not None else report.UNKNOWN],
    ]
    return f"### {label}\n\n" + markdown_table(["measure", "value"], rows)


def histogram(keys: Sequence[Keystroke], cadence_ms: float, path: Path, title: str) -> None:
    visible = [k.visible_ms for k in keys if k.visible_ms is not None]
    with charts.figure(path, (7.0, 4.0)) as ax:
        if visible:
            ax.hist(visible, bins=min(40, max(5, len(visible) // 2)), color="tab:blue")
        ax.axvline(
            cadence_ms, color="tab:red", linestyle="--", label=f"next key ({cadence_ms:g} ms)"
        )
        ax.set_xlabel("keystroke -> first visible text (ms)")
        ax.set_ylabel("keystrokes")
        ax.set_title(title)
        ax.legend()


# -- the client -------------------------------------------------------------------------


def key_times(body: str, cadence_ms: float, word_pause_ms: float = 0.0) -> list[float]:
    """When each key of ``body`` is typed, in ms from the first: every ``cadence_ms``, and
    ``word_pause_ms`` more before each word that follows a separator (a word character is
    a letter, a digit or ``_``): a person stops after ``self.`` or ``= `` to read.

    >>> key_times("a.b", 100, 1000)
    [0.0, 100.0, 1200.0]
    """

    def word(ch: str) -> bool:
        return ch.isalnum() or ch == "_"

    times, at = [], 0.0
    for i, ch in enumerate(body):
        times.append(at)
        at += cadence_ms
        if word_pause_ms and i + 1 < len(body) and not word(ch) and word(body[i + 1]):
            at += word_pause_ms
    return times


class Replay(LspClient):
    """A pygls client connected to ``kode lsp``, typing as an editor does."""

    def __init__(self, options: Options) -> None:
        super().__init__({**os.environ, **dict(options.environ)})
        self.options = options
        self.current: Keystroke | None = None
        self.by_id: dict[str, Keystroke] = {}
        self._tasks: set[asyncio.Task[None]] = set()

        def on_partial(params: Any) -> None:
            self._on_partial(params)

        self.client.feature(PARTIAL_METHOD)(on_partial)

    def _on_partial(self, params: Any) -> None:
        """Attribute a partial to its request by ``requestId`` (else: the latest key);
        a partial with only whitespace shows nothing and is ignored."""
        now = time.perf_counter()
        data = plain(params)
        key = self.current
        if isinstance(data, dict) and str(data.get("requestId")) in self.by_id:
            key = self.by_id[str(data.get("requestId"))]
        text = data.get("text") if isinstance(data, dict) else None
        if not isinstance(text, str) or not text.strip():
            return  # nothing the editor could draw
        if key is not None and key.partial is None and key.answered is None:
            key.partial = now
            key.partial_text = text

    async def start(
        self,
        options: dict[str, Any] | None = None,
        *,
        args: Sequence[str] = (),
        root_uri: str | None = None,
    ) -> None:
        """``kode lsp`` with the replay's settings. The default shared engine goes when
        this replay's window closes (its idle time 0), so that no benchmark leaves an
        engine running."""
        opts = self.options
        init: dict[str, Any] = {
            "model": opts.model,
            "partialCompletions": True,
            "engineIdleMinutes": 0,
        }
        if opts.speculation:
            init["speculation"] = opts.speculation
        init.update(dict(opts.settings))
        log = str((opts.out / "lsp.log").resolve())
        verbose = ["-vv"] if opts.debug_log else []
        await super().start(
            {**init, **(options or {})},
            args=[*verbose, "lsp", "--log-file", log, *args],
            root_uri=root_uri or self.workspace_uri(),
        )

    def workspace_uri(self) -> str | None:
        workspace = self.options.workspace
        return None if workspace is None else workspace.resolve().as_uri()

    async def warm_up(self) -> None:
        """Load the model with one request on a scratch document (not measured): the
        scripts' files are then read by their first keystroke, as after opening a file."""
        uri = "file:///kode-bench/scratch/warmup.py"
        self.open(uri, "def add(a, b):\n    return ")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.request(uri, 1, 11, "warm-up"), self.options.startup_s)
        self.close(uri)

    async def ask(
        self, uri: str, line: int, character: int, prefix: str
    ) -> tuple[Any, float | None]:
        """One request at the cursor, waited for (up to ``startup_s``): its result and the
        ms it took (None when it failed or timed out)."""
        asked = time.perf_counter()
        with contextlib.suppress(Exception):
            result = await asyncio.wait_for(
                self.request(uri, line, character, self.next_id(prefix)), self.options.startup_s
            )
            return result, (time.perf_counter() - asked) * 1000.0
        return None, None

    def type_char(self, doc: Any, offset: int, ch: str, in_flight: str | None) -> None:
        """Type ``ch`` at ``offset`` of ``doc`` (a ``completion.documents.Document`` kept
        in step with the server's): cancel the request still in flight, as editors do,
        then send the edit as an incremental ``didChange``."""
        from kode.completion.documents import Range

        if in_flight is not None:
            self.cancel(in_flight)
        at = doc.position_at(offset)
        doc.apply_change(ch, Range(at, at))
        doc.version += 1
        self.change(doc.uri, doc.version, ch, (at.line, at.character))

    async def type_line(
        self,
        doc: Any,
        offset: int,
        text: str,
        times_ms: Sequence[float],
        name: str,
        bar: Any = None,
    ) -> list[Keystroke]:
        """Type ``text`` into ``doc`` at ``offset``, key ``i`` ``times_ms[i]`` after the
        first, asking after every key (and cancelling the request still in flight); wait
        up to ``settle_s`` for the answers, then mark which suggestions the keys typed
        next matched."""
        keys: list[Keystroke] = []
        in_flight: tuple[str, asyncio.Future[Any]] | None = None
        pending: list[asyncio.Future[Any]] = []
        start = time.perf_counter()
        for i, ch in enumerate(text):
            delay = start + times_ms[i] / 1000.0 - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if keys:
                keys[-1].next_key = time.perf_counter()
            pending_id = in_flight[0] if in_flight and not in_flight[1].done() else None
            self.type_char(doc, offset, ch, pending_id)
            offset += 1
            key = Keystroke(name, i, ch, sent=time.perf_counter())
            keys.append(key)
            self.current = key
            msg_id = self.next_id("k")
            self.by_id[msg_id] = key
            cursor = doc.position_at(offset)
            future = self.request(doc.uri, cursor.line, cursor.character, msg_id)
            future.add_done_callback(functools.partial(self._answered, key))
            pending.append(future)
            in_flight = (msg_id, future)
            if bar is not None:
                bar.update(1)
        if pending:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.wait(pending), self.options.settle_s)
        self.current = None
        mark_matches(keys, text)
        return keys

    async def replay(self, script: Script, bar: Any) -> list[Keystroke]:
        """Open the script's file, place the cursor (one answered request, then
        ``place_pause_s``), type the region back at ``cadence_ms``, close the file."""
        from kode.completion.documents import Document

        opts = self.options
        doc = Document(script.uri, script.text, 1, "python")
        self.open(script.uri, script.text)
        if opts.place_pause_s > 0:
            at = doc.position_at(script.offset)
            _, script.placed_ms = await self.ask(script.uri, at.line, at.character, "place")
            await asyncio.sleep(opts.place_pause_s)
        times = key_times(script.typed, opts.cadence_ms)
        keys = await self.type_line(doc, script.offset, script.typed, times, script.name, bar)
        self.close(script.uri)
        return keys

    def _answered(self, key: Keystroke, future: asyncio.Future[Any]) -> None:
        key.answered = time.perf_counter()
        if future.cancelled():
            key.outcome = "cancelled"
            return
        exc = future.exception()
        if exc is not None:
            code = getattr(exc, "code", None)
            key.outcome = "cancelled" if code == CANCELLED else "error"
            return
        shown = items(future.result())
        text = shown[0] if shown else ""
        key.suggestion = text
        key.outcome = "shown" if text else "empty"
        if text:
            task = asyncio.ensure_future(self._record_stats(key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _record_stats(self, key: Keystroke) -> None:
        with contextlib.suppress(Exception):
            reply = await self.stats(10)
            counters = reply.get("counters") or {}
            key.stats = dict(counters.get("last") or {})


async def measure(
    options: Options,
) -> tuple[list[Keystroke], dict[str, Any] | None, list[Script], dict[str, str]]:
    files = options.files
    if files is None:
        files = tuple(sorted((tasks.REPO_ROOT / "examples").glob("*.py")))
    scripts: list[Script] = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        scripts += region_scripts(path, text, options.regions, options.seed, options.max_chars)
    if options.humaneval:
        scripts += humaneval_scripts(options.humaneval, options.seed, options.max_chars)
    report.prepare_out(options.out)
    replay = Replay(options)
    keys: list[Keystroke] = []
    counters: dict[str, Any] | None = None
    facts = {"machine_before": report.machine_note()}
    bar = report.progress(sum(len(s.typed) for s in scripts), "latency")
    try:
        await replay.start()
        await replay.warm_up()
        for script in scripts:
            bar.set_postfix_str(script.name, refresh=False)
            keys += await replay.replay(script, bar)
        await asyncio.sleep(0.5)  # let the last stats requests land
        with contextlib.suppress(Exception):
            counters = (await replay.stats(30)).get("counters")
    finally:
        bar.close()
        await replay.stop()
    facts["machine_after"] = report.machine_note()
    return keys, counters, scripts, facts


def write_report(
    options: Options,
    keys: list[Keystroke],
    counters: dict[str, Any] | None,
    scripts: list[Script],
    facts: dict[str, str],
) -> tuple[str, str]:
    """The report's text and its table; the keystrokes and the chart written to ``out``."""
    out = report.prepare_out(options.out)
    summary = summarize(keys, counters)
    table = render_table(f"all ({len(scripts)} regions)", summary, options.cadence_ms)
    text = (
        "# Keystroke latency: replay through `kode lsp`\n\n"
        f"- model: `{options.model}`; cadence {options.cadence_ms:g} ms; "
        + report.settings_note(options.settings)
        + f"{len(scripts)} regions, {len(keys)} keystrokes; "
        "client: pygls over stdio, VS Code-like (didChange + inlineCompletion per key, "
        "$/cancelRequest for the one in flight)\n"
        "- regions: "
        + ", ".join(f"`{s.name}` ({len(s.typed)} chars)" for s in scripts)
        + "\n- "
        + (
            f"before typing each region, one request at the cursor (answered), then a "
            f"{options.place_pause_s:g} s pause, as when the user clicks into the line; "
            "that request's time (the file just opened, its prompt evaluated from "
            "scratch): " + ", ".join(f"{fmt(s.placed_ms, 0, ' ms')}" for s in scripts)
            if options.place_pause_s > 0
            else "typing starts at once after the file is opened (cold)"
        )
        + f"\n{report.machine_line(facts)}\n\n"
        + table
    )
    report.write_jsonl(
        out / "keystrokes.jsonl",
        (
            {**asdict(k), "visible_ms": k.visible_ms, "before_next_key": k.before_next_key}
            for k in keys
        ),
    )
    histogram(keys, options.cadence_ms, out / "latency.png", f"Keystroke latency ({options.model})")
    return text, table


def main(options: Options) -> int:
    keys, counters, scripts, facts = asyncio.run(measure(options))
    text, table = write_report(options, keys, counters, scripts, facts)
    report.publish(options.out, "report.md", text, table, "latency.png")
    return 0
