"""``kode bench latency --scenario typing``: the first keys typed at a fresh place of a
large real file, as an editor sends them, for each engine side by side.

A place is a line of a large module (standard library by default; nobody here chose
the lines) whose text after its indentation is cut. For each place the client opens
the file without that text, asks once at the cursor and waits for the answer (the
first request: cold), then types the first ``--keys`` characters of the real line at
``--cadence-ms`` a key, asking after every key and cancelling the request still in
flight, as VS Code does. Then it closes the file.

Each configuration runs in a ``kode lsp`` of its own (a shared engine of its own too),
all started at once; each place is typed by one configuration after the other, the
order rotated from place to place, so their figures are side by side under one load:

- ``kode client, <engine>``: Kode's clients: ``kode/didMoveCursor`` when the cursor
  settles at the place, and partial results (``partialCompletions``);
- ``generic client, <engine>``: any LSP client: neither.

Reported per configuration: the share of keys answered before the next key, each
key's wait for a suggestion shown (for it or a later key), the last key's wait, and
the first request's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kode.bench import harness, report
from kode.bench.client import items
from kode.bench.latency import Keystroke, Options, Replay, answer_ms, key_times
from kode.bench.places import next_shown_ms
from kode.bench.report import fmt, markdown_table

ENGINES = ("inProcess", "shared")
# Held-out defaults: large standard-library modules (>= 1,500 lines each).
DEFAULT_MODULES = ("argparse", "imaplib", "tarfile", "http.client")
MIN_LINES = 1500


@dataclass(frozen=True, slots=True)
class Place:
    """Type ``body[:keys]`` at ``line`` of file ``file``, after ``indent`` characters."""

    file: int
    line: int
    indent: int
    body: str

    def name(self, files: Sequence[Path]) -> str:
        return f"{files[self.file].name}:{self.line + 1}"


@dataclass(slots=True)
class PlaceResult:
    place: Place
    first_ms: float | None = None  # the first request's answer time
    first_text: str = ""
    keys: list[Keystroke] = field(default_factory=list)


def plan(texts: Sequence[str], n: int, seed: int, keys: int, max_chars: int) -> list[Place]:
    """``n`` seeded places spread over the files (round robin), each a code line whose
    text after its indentation is ``keys`` to ``max_chars`` characters long, taken from
    the file's second to ninth tenth (not its imports, not its test code at the end).

    >>> text = "".join(f"x{i} = compute_value({i})\\n" for i in range(100))
    >>> [(p.line, p.body) for p in plan([text], 2, 0, 8, 60)]
    [(66, 'x66 = compute_value(66)'), (54, 'x54 = compute_value(54)')]
    """
    per_file: list[list[int]] = []
    for text in texts:
        lines = text.splitlines()
        lo, hi = len(lines) // 10, 9 * len(lines) // 10
        found = []
        for i in range(lo, hi):
            body = lines[i].strip()
            if keys + 4 <= len(body) <= max_chars and not body.startswith(
                ("#", '"', "'", "@", "import ", "from ")
            ):
                found.append(i)
        random.Random(seed * 1009 + len(per_file)).shuffle(found)
        per_file.append(found)
    out: list[Place] = []
    taken = [0] * len(texts)
    while len(out) < n and any(taken[f] < len(per_file[f]) for f in range(len(texts))):
        for f, lines_of in enumerate(per_file):
            if len(out) >= n or taken[f] >= len(lines_of):
                continue
            i = lines_of[taken[f]]
            taken[f] += 1
            line = texts[f].splitlines()[i]
            indent = len(line) - len(line.lstrip())
            out.append(Place(f, i, indent, line.strip()))
    return out


def cut(text: str, place: Place) -> str:
    """``text`` with the place's line emptied after its indentation."""
    lines = text.splitlines(keepends=True)
    line = lines[place.line]
    ending = line[len(line.rstrip("\r\n")) :]
    lines[place.line] = line[: place.indent] + ending
    return "".join(lines)


class TypingReplay(Replay):
    """One configuration's ``kode lsp``, typing one place at a time."""

    async def place(
        self,
        files: Sequence[Path],
        texts: Sequence[str],
        place: Place,
        *,
        notify: bool,
        keys: int,
    ) -> PlaceResult:
        from kode.completion.documents import Document, Position

        opts = self.options
        uri = files[place.file].resolve().as_uri()
        text = cut(texts[place.file], place)
        doc = Document(uri, text, 1, "python")
        self.open(uri, text)
        at = Position(place.line, place.indent)
        if notify:
            self.move_cursor(uri, at.line, at.character)
        result = PlaceResult(place)
        first, result.first_ms = await self.ask(uri, at.line, at.character, "first")
        shown = items(first) if result.first_ms is not None else []
        result.first_text = shown[0] if shown else ""
        if opts.place_pause_s > 0:
            await asyncio.sleep(opts.place_pause_s)
        body = place.body[:keys]
        times = key_times(body, opts.cadence_ms)
        result.keys = await self.type_line(doc, doc.offset_at(at), body, times, place.name(files))
        self.close(uri)
        return result


@dataclass(frozen=True, slots=True)
class Config:
    engine: str
    kode_client: bool
    settings: tuple[tuple[str, Any], ...] = ()  # a variant's own settings

    @property
    def label(self) -> str:
        client = "kode client" if self.kode_client else "generic client"
        extra = "".join(f", {k}={v}" for k, v in self.settings)
        return f"{client}, {self.engine}{extra}"


def configs(
    engines: Sequence[str], variants: Sequence[tuple[tuple[str, Any], ...]] = ()
) -> list[Config]:
    """Kode's client on each engine, a generic client on the default engine (the first
    named, when the default is not among them), then Kode's client on that engine with
    each variant's settings (rules compared side by side, e.g. ``firstAnswerMs``)."""
    out = [Config(e, True) for e in engines]
    default = "shared" if "shared" in engines else engines[0]
    out.append(Config(default, False))
    out += [Config(default, True, variant) for variant in variants]
    return out


async def _start(options: Options, config: Config, runtime: Path) -> TypingReplay:
    """``kode lsp`` for ``config``; a shared engine of its own (its own runtime folder),
    so that no configuration is answered from another's evaluated prompts."""
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in config.label)
    settings = (
        *options.settings,
        *config.settings,
        ("engine", config.engine),
        ("partialCompletions", config.kode_client),
    )
    folder = runtime / slug
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    replay = TypingReplay(
        replace(
            options,
            out=options.out / slug,
            settings=settings,
            environ=(*options.environ, ("XDG_RUNTIME_DIR", str(folder))),
        )
    )
    report.prepare_out(replay.options.out)
    await replay.start()
    await replay.warm_up()
    await replay.wait_calibrated()
    return replay


@dataclass(frozen=True, slots=True)
class Figures:
    keys: int
    before_next: int
    wait_p50: float | None
    wait_p95: float | None
    last_p50: float | None
    first_p50: float | None
    first_max: float | None
    matched: int
    checked: int

    @property
    def share(self) -> float:
        return self.before_next / self.keys if self.keys else 0.0


def figures(results: Sequence[PlaceResult]) -> Figures:
    """What the issue's probe reports: keys answered before the next key, each key's wait
    for a suggestion shown (for it or a later key of the place), the last key's own wait,
    and the first request's time."""
    keys = [k for r in results for k in r.keys]
    waits = [next_shown_ms(r.keys, i) for r in results for i in range(len(r.keys))]
    last = [answer_ms(r.keys[-1]) for r in results if r.keys]
    first = [r.first_ms if r.first_ms is not None else float("inf") for r in results]
    checked = [k for k in keys if k.matched is not None]
    return Figures(
        keys=len(keys),
        before_next=sum(k.before_next_key for k in keys),
        wait_p50=report.percentile(waits, 50),
        wait_p95=report.percentile(waits, 95),
        last_p50=report.percentile(last, 50),
        first_p50=report.percentile(first, 50),
        first_max=max(first, default=None),
        matched=sum(bool(k.matched) for k in checked),
        checked=len(checked),
    )


HEADER = [
    "configuration",
    "keys answered before the next key",
    "key -> suggestion shown p50",
    "p95",
    "last key -> its answer, median",
    "first request, median",
    "slowest first request",
    "typed text matched the suggestion",
]


def row(label: str, f: Figures) -> list[object]:
    return [
        label,
        f"{f.before_next}/{f.keys} ({100 * f.share:.0f}%)",
        fmt(f.wait_p50, 0, " ms"),
        fmt(f.wait_p95, 0, " ms"),
        fmt(f.last_p50, 0, " ms"),
        fmt(f.first_p50, 0, " ms"),
        fmt(f.first_max, 0, " ms"),
        f"{f.matched}/{f.checked}",
    ]


def place_rows(results: dict[str, list[PlaceResult]], files: Sequence[Path]) -> str:
    """Per place and configuration: first request, its suggestion's start, the last key."""
    rows: list[list[object]] = [
        [
            r.place.name(files),
            label,
            fmt(r.first_ms, 0, " ms"),
            repr(r.first_text[:24]),
            repr(r.place.body[:24]),
            f"{sum(k.before_next_key for k in r.keys)}/{len(r.keys)}",
            fmt(answer_ms(r.keys[-1]) if r.keys else None, 0, " ms"),
        ]
        for label, found in results.items()
        for r in found
    ]
    return markdown_table(
        ["place", "configuration", "first", "first suggestion", "the line", "keys in time", "last"],
        rows,
    )


def default_files() -> list[Path]:
    import importlib

    out = []
    for name in DEFAULT_MODULES:
        module = importlib.import_module(name)
        if module.__file__:
            out.append(Path(module.__file__))
    return out


async def measure(
    options: Options,
    files: Sequence[Path],
    engines: Sequence[str],
    places: int,
    keys: int,
    variants: Sequence[tuple[tuple[str, Any], ...]] = (),
) -> tuple[dict[str, list[PlaceResult]], dict[str, Any], list[Place]]:
    """Every configuration's server up at once (each idle while another types), the
    places typed in turn by each, the order rotated from place to place, so that a
    change of the machine's load meets every configuration alike."""
    texts = [f.read_text(encoding="utf-8") for f in files]
    chosen = plan(texts, places, options.seed, keys, options.max_chars)
    facts: dict[str, Any] = {"machine_before": report.machine_note(), "stats": {}}
    kinds = configs(engines, variants)
    results: dict[str, list[PlaceResult]] = {c.label: [] for c in kinds}
    replays: dict[str, TypingReplay] = {}
    with tempfile.TemporaryDirectory(prefix="kode-typing-") as runtime:
        try:
            for config in kinds:
                replays[config.label] = await _start(options, config, Path(runtime))
            bar = report.progress(len(chosen) * len(kinds), "typing")
            for i, place in enumerate(chosen):
                for config in harness.rotated(kinds, i):
                    bar.set_postfix_str(f"{place.name(files)} {config.label}", refresh=False)
                    results[config.label].append(
                        await replays[config.label].place(
                            files, texts, place, notify=config.kode_client, keys=keys
                        )
                    )
                    bar.update(1)
            bar.close()
            await asyncio.sleep(0.5)
            for label, replay in replays.items():
                with contextlib.suppress(Exception):
                    final = await replay.stats(30)
                    facts["stats"][label] = final.get("counters")
        finally:
            for replay in replays.values():
                await replay.stop()
    facts["machine_after"] = report.machine_note()
    return results, facts, chosen


def main(
    options: Options,
    files: Sequence[Path] | None,
    engines: Sequence[str],
    places: int,
    keys: int,
    variants: Sequence[tuple[tuple[str, Any], ...]] = (),
) -> int:
    chosen = list(files) if files else default_files()
    short = [f for f in chosen if len(f.read_text(encoding="utf-8").splitlines()) < MIN_LINES]
    if short:
        print(
            "kode bench latency --scenario typing: files under "
            f"{MIN_LINES} lines: {', '.join(map(str, short))} (measured anyway)"
        )
    for engine in engines:
        if engine not in ENGINES:
            raise SystemExit(f"kode bench latency: unknown engine {engine!r}; known: {ENGINES}")
    results, facts, planned = asyncio.run(measure(options, chosen, engines, places, keys, variants))
    out = report.prepare_out(options.out)
    table = markdown_table(HEADER, [row(label, figures(r)) for label, r in results.items()])
    text = (
        "# Typing at fresh places of large real files, engine by engine\n\n"
        f"- model `{options.model}`; {len(planned)} places over "
        + ", ".join(f"`{f.name}`" for f in chosen)
        + f"; {keys} keys a place at {options.cadence_ms:g} ms, after "
        f"{options.place_pause_s:g} s; seed {options.seed}; settings: "
        + report.settings_note(options.settings)
        + f"\n{report.machine_line(facts)}\n"
        "- key -> suggestion shown: from a key to the first suggestion text shown for it or "
        "a later key of the place (`inf` if none came); last key: the place's last key to "
        "its own answer (an empty answer counts)\n\n"
        + table
        + "\n\n## Per place\n\n"
        + place_rows(results, chosen)
        + "\n\nCounters at the end of each run: "
        + "; ".join(f"{k}: {v}" for k, v in facts["stats"].items())
        + "\n"
    )
    report.write_jsonl(
        out / "keystrokes.jsonl",
        (
            {"configuration": label, **asdict(k), "answer_ms": answer_ms(k)}
            for label, found in results.items()
            for r in found
            for k in r.keys
        ),
    )
    report.publish(out, "report.md", text, table)
    return 0
