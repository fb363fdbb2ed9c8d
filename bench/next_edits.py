"""``kode bench next-edit``: next edits replayed from real git history, and scored.

Cases come from ``bench/next_edit_cases.py`` (a commit's hunks in one file, top to
bottom; case ``k`` applies the first ``k`` and asks for hunk ``k + 1``; class ``repeat``
or ``other``, decided from the diff alone). Each file's sequence is replayed through a
``CompletionEngine`` with ``nextEdits`` on and no model (a backend factory that refuses:
the next-edit path needs none today), on a ``ManualClock``:

1. The file before the commit is opened (version 0).
2. Each hunk is one ``didChange`` (``apply_changes``): its lines' old text replaced by the
   new, less what the two share at the start and end (the characters a person changes),
   ``GAP_S`` seconds of the engine's clock after the one before (each hunk is its own
   history hunk, as when a person moves on to the next place).
3. After hunk ``k`` of a kept case, ``engine.next_edit`` is asked at the cursor the
   person has there: the end of the text hunk ``k`` put in (for a deletion, where the text
   was), with the document's version.

Scored per request (the proposal is ``(start, end, text)`` in the document as it is):

- **exact**: the proposal applied to the document gives the document with the real next
  hunk applied, character for character (nothing shown: a miss).
- **location**: the proposal lies within the next hunk's lines: the lines it replaces
  (an end at a line's start belongs to the line before), all within the hunk's old
  lines, or, for a hunk that only inserts lines, the line before the insertion or the
  line after it. Exact counts as located.
- **shown**: any proposal; **shown and wrong**: shown, not exact.
- **reversal**: shown, not exact, within the lines an applied hunk made, and its token
  changes (``token_changes`` of the lines it touches, before and after it) all the
  reverse of that hunk's: it would undo (part of) an edit the person just made.
- **part** (a diagnostic, counted as wrong above): located, not exact, and it leaves
  fewer tokens to change in the hunk's lines (one of two renames on the line, say).
- **later** (a diagnostic, counted as wrong above): not exact, but exactly a later hunk
  of the same file's sequence (right edit, another place than the next one in order).
- **ms**: wall time (``time.perf_counter``) from just before the last hunk's
  ``didChange`` to the answer: recording the edit and predicting, on a quiet thread.

Sampling: the commits of each repository (``--rev``, one parent only) are shuffled by
``--seed`` and read in turn, one from each repository in rotation, until both classes
have ``--limit`` cases or ``--max-commits`` commits were read; at most ``--per-commit``
cases from one commit (its files in a shuffled order), the first ``--max-hunks`` hunks
of a file. The load average (``os.getloadavg``) is printed before and after, beside the
times. ``--out DIR``: ``next_edits.json``, the setup, the table and every case (where it
came from, its class, the proposal and the result; no source beyond the proposal's text).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kode.backends.base import Backend
from kode.bench.next_edit_cases import (
    CLASSES,
    FileSequence,
    GitReader,
    Hunk,
    TokenChange,
    token_changes,
)
from kode.completion.clock import ManualClock
from kode.completion.documents import Range
from kode.completion.edits.history import common_prefix, common_suffix
from kode.completion.engine import CompletionEngine
from kode.completion.settings import Settings, parse

# Seconds of the engine's clock between two hunks: past the history's pause (1 s), so
# every hunk is one history hunk.
GAP_S = 3.0
SETTINGS = {"nextEdits": True, "readAhead": False, "prefetch": False}
PROPOSAL_CHARS = 300  # of a proposal's text kept in the JSON


@dataclass(frozen=True, slots=True)
class Options:
    repos: tuple[Path, ...]
    rev: str = "HEAD"
    limit: int = 150  # cases per class
    seed: int = 0
    max_commits: int = 2000
    max_hunks: int = 12
    per_commit: int = 4
    out: Path | None = None


# -- the replay's steps and the score (pure) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """Hunk ``index`` applied to ``before`` (the document with the hunks above it
    applied): ``before[start:end]`` becomes ``text`` (one change, trimmed), giving
    ``after``. ``line``: where the hunk's old lines begin in ``before``; ``cursor``: the
    end of the change in ``after``."""

    index: int
    hunk: Hunk
    before: str = field(repr=False)
    after: str = field(repr=False)
    line: int
    start: int
    end: int
    text: str = field(repr=False)
    cursor: int


def steps(old_text: str, hunks: Sequence[Hunk]) -> list[Step]:
    """The hunks as the changes a person makes, top to bottom (module docstring, 2).

    >>> from kode.bench.next_edit_cases import cut_hunks
    >>> old, new = "def f(n):\\n    return n\\n", "def f(count):\\n    return count\\n"
    >>> [(s.start, s.end, s.text, s.cursor) for s in steps(old, cut_hunks(old, new,
    ...     [(1, 1, 1, 1), (2, 1, 2, 1)]))]
    [(6, 7, 'count', 11), (25, 26, 'count', 30)]
    """
    out: list[Step] = []
    text, shift = old_text, 0
    for index, hunk in enumerate(hunks):
        line = hunk.start + shift
        region = _line_offset(text, line)
        old, new = "".join(hunk.old), "".join(hunk.new)
        head = common_prefix(old, new)
        tail = common_suffix(old[head:], new[head:])
        start, end = region + head, region + len(old) - tail
        piece = new[head : len(new) - tail]
        after = text[:start] + piece + text[end:]
        out.append(Step(index, hunk, text, after, line, start, end, piece, start + len(piece)))
        text, shift = after, shift + len(hunk.new) - len(hunk.old)
    return out


@dataclass(frozen=True, slots=True)
class Score:
    shown: bool
    exact: bool
    location: bool
    reversal: bool
    part: bool = False  # diagnostic: located, not exact, but a step towards the hunk
    later: bool = False  # diagnostic: not exact, but exactly a later hunk of the sequence


def score(
    target: Step,
    applied: Sequence[Step],
    proposal: tuple[int, int, str] | None,
    later: Sequence[Hunk] = (),
) -> Score:
    """A proposal ``(start, end, text)`` of ``target.before`` (the document now), judged
    against the real next hunk ``target`` (module docstring); ``applied``: the steps
    before it; ``later``: the hunks of the sequence after it (for ``Score.later``).

    >>> from kode.bench.next_edit_cases import cut_hunks
    >>> old, new = "a = n\\nb = n\\n", "a = m\\nb = m\\n"
    >>> first, second = steps(old, cut_hunks(old, new, [(1, 1, 1, 1), (2, 1, 2, 1)]))
    >>> score(second, [first], (10, 11, "m"))
    Score(shown=True, exact=True, location=True, reversal=False, part=False, later=False)
    >>> score(second, [first], (4, 5, "n")).reversal
    True
    """
    if proposal is None:
        return Score(False, False, False, False)
    start, end, text = proposal
    doc = target.before
    result = doc[:start] + text + doc[end:]
    exact = result == target.after
    first, last = _lines(doc, start, end)
    if target.hunk.old:
        lo, hi = target.line, target.line + len(target.hunk.old) - 1
    else:
        lo, hi = max(target.line - 1, 0), target.line
    located = lo <= first and last <= hi
    if exact:
        return Score(True, True, True, False)
    return Score(
        shown=True,
        exact=False,
        location=located,
        reversal=any(_undoes(doc, start, end, text, step) for step in applied),
        part=located and bool(target.hunk.old) and _closer(target, start, end, text),
        later=any(_alone(doc, target, hunk) == result for hunk in later),
    )


def _lines(doc: str, start: int, end: int) -> tuple[int, int]:
    """The first and last line a replacement of ``doc[start:end]`` touches (an end at a
    line's start belongs to the line before)."""
    first, last = doc.count("\n", 0, start), doc.count("\n", 0, end)
    if end > start and doc[end - 1] == "\n":
        last -= 1
    return first, max(first, last)


def _undoes(doc: str, start: int, end: int, text: str, step: Step) -> bool:
    """Whether the proposal lies within the lines ``step`` made (they are above the next
    hunk, so where ``step`` left them) and its token changes all reverse ``step``'s."""
    first, last = _lines(doc, start, end)
    if step.hunk.new:
        lo, hi = step.line, step.line + len(step.hunk.new) - 1
    else:
        lo, hi = max(step.line - 1, 0), step.line
    if not (lo <= first and last <= hi):
        return False
    line_start = doc.rfind("\n", 0, start) + 1
    line_end = doc.find("\n", end)
    line_end = len(doc) if line_end < 0 else line_end
    before = doc[line_start:line_end]
    after = doc[line_start:start] + text + doc[end:line_end]
    changes = token_changes(before, after)
    undo: set[TokenChange] = {(new, old) for old, new in step.hunk.changes()}
    return bool(changes) and all(change in undo for change in changes)


def _closer(target: Step, start: int, end: int, text: str) -> bool:
    """Whether the proposal (within the hunk's old lines) leaves fewer tokens to change
    in those lines than there were."""
    doc = target.before
    region = _line_offset(doc, target.line)
    old = "".join(target.hunk.old)
    want = "".join(target.hunk.new)
    now = old[: start - region] + text + old[end - region :]

    def distance(a: str) -> int:
        return sum(len(x) + len(y) for x, y in token_changes(a, want))

    return distance(now) < distance(old)


def _alone(doc: str, target: Step, hunk: Hunk) -> str:
    """``doc`` with only the later ``hunk`` applied (its lines moved as ``target``'s)."""
    lines = doc.splitlines(keepends=True)
    at = hunk.start + target.line - target.hunk.start
    lines[at : at + len(hunk.old)] = hunk.new
    return "".join(lines)


# -- the replay --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CaseResult:
    repo: str
    commit: str
    file: str
    k: int  # hunks applied before the request
    hunks: int  # in the file's sequence
    klass: str
    cursor: tuple[int, int]
    next: dict[str, int]  # the next hunk: its line now, its old and new line counts
    shown: bool
    exact: bool
    location: bool
    reversal: bool
    part: bool
    later: bool
    ms: float
    proposal: dict[str, Any] | None

    def record(self) -> dict[str, Any]:
        out = asdict(self)
        out["class"] = out.pop("klass")
        return out


async def _no_model(_settings: Settings) -> Backend:
    raise RuntimeError("kode bench next-edit runs no model")


def bench_settings() -> Settings:
    settings, problems = parse(SETTINGS)
    if problems:
        raise RuntimeError("; ".join(problems))
    return settings


async def replay(seq: FileSequence, wanted: dict[int, str]) -> list[CaseResult]:
    """Replay ``seq`` (module docstring) and score the cases ``wanted`` (k -> class)."""
    clock = ManualClock()
    engine = CompletionEngine(_no_model, bench_settings(), clock=clock)
    uri = "file:///bench/" + seq.path
    language = "python" if seq.path.endswith((".py", ".pyi")) else "plaintext"
    engine.documents.open(uri, seq.old_text, 0, language)
    engine.document_opened(uri)
    cut = steps(seq.old_text, seq.hunks[: max(wanted) + 1])
    results: list[CaseResult] = []
    try:
        for step in cut[:-1]:
            k = step.index + 1
            doc = engine.documents.get(uri)
            change = Range(doc.position_at(step.start), doc.position_at(step.end))
            await clock.advance(GAP_S)
            started = time.perf_counter()
            engine.apply_changes(uri, k, [(step.text, change)])
            if k not in wanted:
                continue
            doc = engine.documents.get(uri)
            cursor = doc.position_at(step.cursor)
            edit = await engine.next_edit(uri, cursor, k)
            ms = (time.perf_counter() - started) * 1000.0
            target = cut[k]
            assert doc.text == target.before, "the replay drifted from the diff"
            proposal = None if edit is None else (edit.start, edit.end, edit.text)
            judged = score(target, cut[:k], proposal, seq.hunks[k + 1 :])
            shown = None
            if edit is not None:
                shown = {
                    "range": [
                        [edit.range.start.line, edit.range.start.character],
                        [edit.range.end.line, edit.range.end.character],
                    ],
                    "text": edit.text[:PROPOSAL_CHARS],
                    "kind": edit.kind.value,
                }
            results.append(
                CaseResult(
                    repo=seq.repo,
                    commit=seq.commit,
                    file=seq.path,
                    k=k,
                    hunks=len(seq.hunks),
                    klass=wanted[k],
                    cursor=(cursor.line, cursor.character),
                    next={
                        "line": target.line,
                        "old": len(target.hunk.old),
                        "new": len(target.hunk.new),
                    },
                    shown=judged.shown,
                    exact=judged.exact,
                    location=judged.location,
                    reversal=judged.reversal,
                    part=judged.part,
                    later=judged.later,
                    ms=round(ms, 3),
                    proposal=shown,
                )
            )
    finally:
        await engine.aclose()
    return results


def pick(seq: FileSequence, counts: dict[str, int], limit: int, room: int) -> dict[int, str]:
    """The cases of ``seq`` to replay (k -> class): those of a class not yet at
    ``limit`` (``counts`` is updated), at most ``room``.

    >>> seq = FileSequence("r", "c", "f.py", "", (), ((1, "other"), (2, "repeat"), (3, "other")))
    >>> counts = {"repeat": 0, "other": 1}
    >>> pick(seq, counts, 2, 8), counts
    ({1: 'other', 2: 'repeat'}, {'repeat': 1, 'other': 2})
    """
    chosen: dict[int, str] = {}
    for k, klass in seq.cases:
        if len(chosen) >= room:
            break
        if counts[klass] < limit:
            chosen[k] = klass
            counts[klass] += 1
    return chosen


# -- the report --------------------------------------------------------------------------


def summarize(results: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """One row per class, then all: counts and percentages of requests, times."""
    rows = []
    for klass in (*CLASSES, "all"):
        mine = [r for r in results if klass in ("all", r.klass)]
        n = len(mine)

        def pct(count: int, n: int = n) -> float:
            return round(100.0 * count / n, 1) if n else 0.0

        ms = sorted(r.ms for r in mine)
        rows.append(
            {
                "class": klass,
                "cases": n,
                "exact": sum(r.exact for r in mine),
                "exact_pct": pct(sum(r.exact for r in mine)),
                "location_pct": pct(sum(r.location for r in mine)),
                "shown_pct": pct(sum(r.shown for r in mine)),
                "shown_wrong_pct": pct(sum(r.shown and not r.exact for r in mine)),
                "reversals": sum(r.reversal for r in mine),
                "part": sum(r.part for r in mine),
                "later": sum(r.later for r in mine),
                "p50_ms": round(_quantile(ms, 0.5), 2),
                "p95_ms": round(_quantile(ms, 0.95), 2),
            }
        )
    return rows


def table(rows: Iterable[dict[str, Any]]) -> str:
    head = (
        f"{'class':<7} {'cases':>5} {'exact':>12} {'location':>8} {'shown':>6} "
        f"{'shown+wrong':>11} {'reversals':>9} {'p50 ms':>7} {'p95 ms':>7} "
        f"{'part':>4} {'later':>5}"
    )
    lines = [head]
    for r in rows:
        exact = f"{r['exact']} ({r['exact_pct']:.1f}%)"
        lines.append(
            f"{r['class']:<7} {r['cases']:>5} {exact:>12} {r['location_pct']:>7.1f}% "
            f"{r['shown_pct']:>5.1f}% {r['shown_wrong_pct']:>10.1f}% {r['reversals']:>9} "
            f"{r['p50_ms']:>7.2f} {r['p95_ms']:>7.2f} {r['part']:>4} {r['later']:>5}"
        )
    return "\n".join(lines)


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# -- the run -----------------------------------------------------------------------------


async def run(options: Options) -> tuple[list[CaseResult], dict[str, int], dict[str, str]]:
    """The cases replayed, how many commits of each repository were read, and each
    repository's ``HEAD``."""
    readers = [GitReader(path) for path in options.repos]
    heads = {reader.name: reader.head() for reader in readers}
    queues = []
    for reader in readers:
        commits = reader.commits(options.rev)
        random.Random(f"{options.seed}:{reader.name}").shuffle(commits)
        queues.append(commits)
    counts = dict.fromkeys(CLASSES, 0)
    read = {reader.name: 0 for reader in readers}
    results: list[CaseResult] = []
    total = 0
    try:
        for i in range(max((len(q) for q in queues), default=0)):
            for reader, queue in zip(readers, queues, strict=True):
                if all(c >= options.limit for c in counts.values()):
                    return results, read, heads
                if total >= options.max_commits:
                    return results, read, heads
                if i >= len(queue):
                    continue
                commit = queue[i]
                total += 1
                read[reader.name] += 1
                found = list(reader.sequences(commit, options.max_hunks))
                random.Random(f"{options.seed}:{commit}").shuffle(found)
                room = options.per_commit
                for seq in found:
                    wanted = pick(seq, counts, options.limit, room)
                    if wanted:
                        room -= len(wanted)
                        results.extend(await replay(seq, wanted))
                done = sum(counts.values())
                print(f"\r{total} commits, {done} cases", end="", file=sys.stderr, flush=True)
    finally:
        print(file=sys.stderr)
        for reader in readers:
            reader.close()
    return results, read, heads


def main(options: Options) -> int:
    load_before = _load()
    results, read, heads = asyncio.run(run(options))
    load_after = _load()
    rows = summarize(results)
    print(table(rows))
    commits = ", ".join(f"{name} {n} of {heads[name][:10]}" for name, n in read.items())
    print(f"commits read: {sum(read.values())} ({commits}); rev {options.rev}, seed {options.seed}")
    print(f"load average (1/5/15 min): before {load_before}, after {load_after}")
    kinds: dict[str, list[int]] = {}
    for r in results:
        if r.proposal is not None:
            kind = kinds.setdefault(str(r.proposal["kind"]), [0, 0])
            kind[0] += 1
            kind[1] += r.exact
    if kinds:
        print("shown by kind (exact of shown): " + ", ".join(
            f"{kind} {exact}/{n}" for kind, (n, exact) in sorted(kinds.items())
        ))  # fmt: skip
    if options.out is not None:
        options.out.mkdir(parents=True, exist_ok=True)
        report = {
            "setup": {
                "repos": [str(p) for p in options.repos],
                "rev": options.rev,
                "limit": options.limit,
                "seed": options.seed,
                "max_commits": options.max_commits,
                "max_hunks": options.max_hunks,
                "per_commit": options.per_commit,
                "settings": SETTINGS,
                "gap_s": GAP_S,
                "commits_read": read,
                "heads": heads,
                "load_before": load_before,
                "load_after": load_after,
            },
            "summary": rows,
            "cases": [r.record() for r in results],
        }
        path = options.out / "next_edits.json"
        path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path}")
    return 0


def _line_offset(text: str, line: int) -> int:
    """Where 0-based ``line`` begins in ``text`` (its end if it has fewer lines)."""
    at = 0
    for _ in range(line):
        found = text.find("\n", at)
        if found < 0:
            return len(text)
        at = found + 1
    return at
