"""Can the 1.5B, prompted in its own tokens, predict a next edit that repeats nothing?

``python -m kode.bench.next_edit_model``: the cases of ``kode bench next-edit``
(``bench/next_edit_cases.py`` cuts them, ``bench/next_edits.py`` replays and scores them;
both are imported, nothing is copied) from the dev repositories only, answered by the
model instead of the model-free finder. For each case (hunks ``1..k`` of a commit's file
applied, the cursor at the end of hunk ``k``'s change, the real next edit hunk ``k + 1``):

1. A prompt in Qwen2.5-Coder's ``<|file_sep|>`` blocks (the layout of Sweep's next-edit
   format, as ``vscode-copilot-chat``'s ``xtab/common/sweep`` and Zed's ``zeta_prompt``
   describe theirs; no text of theirs): the recent edits (the last ``HISTORY`` hunks of
   the sequence, oldest first), the region around the cursor now (``ABOVE`` lines above
   the cursor's line, ``BELOW`` below), and an open ``updated/`` block for the model to
   write the region after the next edit. ``VARIANTS``:

   - ``sweep``: each edit as its own ``{path}.diff`` block, ``original:`` and ``updated:``
     lines; the region as it was before the session (``original/``) and now
     (``current/``).
   - ``cursor``: the file's lines above the region (up to ``CONTEXT`` lines, as a plain
     ``{path}`` block), the edits as one unified diff (``-U0`` hunks with their headers),
     the region now with ``CURSOR`` at the cursor (``current/``).
   - ``chat``: the instruct model's chat turns (``<|im_start|>``): the edits as a unified
     diff and the region with ``CURSOR``, asking for the region with the next edit
     made; the answer opens a code block, which ends it.
   - ``analogy``: the edit made again by analogy, where the model-free finder has no
     pattern (a name that differs from place to place: ``pop("cls", Argument)`` ->
     ``pop("cls", None) or Argument``, then at ``pop("cls", Option)``). The region is not
     around the cursor: it is the lines most like the last hunk's old lines
     (``analogy_region``: as many lines, the most similar by ``difflib``'s ratio, at least
     ``ANALOGY_MIN``, the nearest after the cursor first); the prompt gives the recent
     hunks that replaced lines as ``original:``/``updated:`` examples, then the region's
     ``original:`` and an open ``updated:``. No region, no proposal.

2. Greedy decoding with the region's current text as the draft (``backends/llama/
   rewrite.py``'s ``decode_rewrite``: lossless speculative decoding; here on a
   ``LlamaTarget`` that also records the log-probability of each token it picks), up to
   the region's tokens + ``SLACK``, ended by ``<|file_sep|>``, any control token, or a
   code fence (the instruct model closes the region as a code block; not where the
   region holds one).
3. The output against the region: their common start and end trimmed (characters), the
   rest is the proposal ``(start, end, text)``; an output equal to the region shows
   nothing. Scored by ``next_edits.score`` (exact, location, shown and wrong, reversal).
4. Confidence: the lowest and the mean log-probability of the output tokens that overlap
   the changed characters (for a deletion, the token after it). The gate shows only
   proposals whose lowest log-probability is at least a threshold; the report gives
   exact and shown-and-wrong at each of ``GATES``.

``ms``: wall time from the request (prompt built) to the proposal (tokenize, prefill of
the whole prompt (nothing is cached between cases: each is another file), rewrite,
diff). The load average (1 min) is read before every case and printed beside every
figure. Cases are sampled as ``kode bench next-edit`` samples them (``--seed``, the
repositories in rotation), ``--other`` and ``--repeat`` of each class; ``--max-seconds``
bounds the run (no new case starts after it).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from kode.backends.llama.target import LlamaTarget, Sampler
from kode.backends.speculative import TokenTree
from kode.backends.steppers import Prefilled
from kode.bench.next_edit_cases import OTHER, REPEAT, FileSequence, GitReader
from kode.bench.next_edits import Step, pick, score, steps

if TYPE_CHECKING:
    from collections.abc import Callable

    from kode.backends.llama.runtime import LlamaContext
    from kode.backends.speculative import CostCurve

DEV_REPOS = (
    Path("/work/.mirror/psf+requests/repo"),
    Path("/work/.mirror/pallets+click/repo"),
    Path("/work/.mirror/encode+httpx/repo"),
)
HELD_OUT = ("attrs", "typer", "rich")  # never read here
FILE_SEP = "<|file_sep|>"
FENCE = "```"  # the instruct model's habit: it closes the region as a code block
CURSOR = "<|user_cursor|>"  # plain text to the tokenizer: not one of Qwen's tokens
VARIANTS = ("sweep", "cursor", "chat", "analogy")
CHAT = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\n<|im_start|>user\n{ask}<|im_end|>\n<|im_start|>assistant\n"
    "```{lang}\n"
)
CHAT_ASK = (
    "I am editing {path}. These are my latest edits, oldest first:\n```diff\n{diff}```\n"
    "This is the code around my cursor ({cursor} marks it):\n```\n{region}```\n"
    "Guess the one edit I will make next in this code. Reply with this code, that edit "
    "made and the marker taken out, and nothing else."
)
ABOVE, BELOW = 5, 5
HISTORY = 4  # recent hunks in the prompt
CONTEXT = 20  # lines above the region in the ``cursor`` variant
SLACK = 32  # output tokens beyond the region's
GATES = (None, -0.1, -0.25, -0.5, -1.0, -2.0)
ANALOGY_MIN = 0.6  # difflib ratio of a region to the last hunk's old lines
ANALOGY_AHEAD, ANALOGY_BEHIND = 80, 20  # lines searched after and before the cursor


# -- the prompt and the output (pure) ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Region:
    """``doc[start:end]``: whole lines around the cursor; ``cursor`` within the document."""

    start: int
    end: int
    cursor: int


def line_starts(text: str) -> list[int]:
    """Where each line of ``text`` begins, and ``len(text)`` last."""
    starts = [0]
    at = text.find("\n")
    while at >= 0:
        starts.append(at + 1)
        at = text.find("\n", at + 1)
    if starts[-1] != len(text):
        starts.append(len(text))
    return starts


def region_at(doc: str, cursor: int, above: int = ABOVE, below: int = BELOW) -> Region:
    """The lines from ``above`` lines above the cursor's line to ``below`` below it.

    >>> doc = "".join(f"{i}\\n" for i in range(30))
    >>> r = region_at(doc, doc.index("15"), 2, 1)
    >>> doc[r.start : r.end]
    '13\\n14\\n15\\n16\\n'
    """
    starts = line_starts(doc)
    line = doc.count("\n", 0, cursor)
    first = max(0, line - above)
    last = min(len(starts) - 1, line + below + 1)
    return Region(starts[first], starts[last], cursor)


def analogy_region(doc: str, cursor: int, last: Step) -> Region | None:
    """The lines of ``doc`` most like the old lines of hunk ``last`` (as many of them, a
    ratio of at least ``ANALOGY_MIN``; the nearest after the cursor's line on a tie, then
    the nearest before), not the lines ``last`` wrote; None if none is."""
    old = "".join(last.hunk.old)
    if not old.strip():
        return None  # lines inserted: no old lines to be like
    n = len(last.hunk.old)
    starts = line_starts(doc)
    line = doc.count("\n", 0, cursor)
    written = range(last.line, last.line + max(len(last.hunk.new), 1))
    best: tuple[float, int, int] | None = None  # (-ratio, distance, first line)
    first_lines = [
        *range(line + 1, min(len(starts) - 1, line + ANALOGY_AHEAD)),
        *range(line, max(-1, line - ANALOGY_BEHIND), -1),
    ]
    for order, first in enumerate(first_lines):
        if first + n > len(starts) - 1 or any(first <= w < first + n for w in written):
            continue
        text = doc[starts[first] : starts[first + n]]
        matcher = difflib.SequenceMatcher(None, text, old, False)
        if matcher.real_quick_ratio() < ANALOGY_MIN or matcher.quick_ratio() < ANALOGY_MIN:
            continue
        ratio = matcher.ratio()
        if ratio >= ANALOGY_MIN and text != old and (best is None or (-ratio, order) < best[:2]):
            best = (-ratio, order, first)
    if best is None:
        return None
    first = best[2]
    return Region(starts[first], starts[first + n], cursor)


def _lines(lines: Sequence[str]) -> str:
    text = "".join(lines)
    return text if not text or text.endswith("\n") else text + "\n"


def original_window(old_text: str, applied: Sequence[Step], line: int) -> str:
    """The region's lines as they were before the session: ``line`` (the cursor's, now)
    moved back over the applied hunks above it, ``ABOVE`` and ``BELOW`` around it."""
    shift = sum(len(s.hunk.new) - len(s.hunk.old) for s in applied if s.line <= line)
    old_line = max(0, line - shift)
    lines = old_text.splitlines(keepends=True)
    return _lines(lines[max(0, old_line - ABOVE) : old_line + BELOW + 1])


def unified(path: str, applied: Sequence[Step]) -> str:
    """The applied hunks as one ``-U0`` unified diff of ``path``."""
    out = [f"--- a/{path}\n", f"+++ b/{path}\n"]
    for s in applied:
        a, b, c, d = s.hunk.header
        out.append(f"@@ -{a},{b} +{c},{d} @@\n")
        out += [f"-{line}" for line in _lines(s.hunk.old).splitlines(keepends=True)]
        out += [f"+{line}" for line in _lines(s.hunk.new).splitlines(keepends=True)]
    return "".join(out)


def build_prompt(
    variant: str, path: str, doc: str, region: Region, applied: Sequence[Step], old_text: str
) -> str:
    """The prompt of ``variant`` (module docstring, 1); the model writes the region next."""
    recent = list(applied[-HISTORY:])
    now = doc[region.start : region.end]
    blocks: list[tuple[str, str]] = []
    if variant == "sweep":
        for s in recent:
            body = "original:\n" + _lines(s.hunk.old) + "updated:\n" + _lines(s.hunk.new)
            blocks.append((f"{path}.diff", body))
        line = doc.count("\n", 0, region.cursor)
        blocks.append((f"original/{path}", original_window(old_text, applied, line)))
        blocks.append((f"current/{path}", _lines([now])))
    elif variant == "cursor":
        above = doc[: region.start].splitlines(keepends=True)[-CONTEXT:]
        if above:
            blocks.append((path, _lines(above)))
        blocks.append((f"{path}.diff", unified(path, recent)))
        at = region.cursor - region.start
        blocks.append((f"current/{path}", _lines([now[:at] + CURSOR + now[at:]])))
    elif variant == "analogy":
        for st in recent:
            if st.hunk.old and st.hunk.new:
                body = "original:\n" + _lines(st.hunk.old) + "updated:\n" + _lines(st.hunk.new)
                blocks.append((f"{path}.diff", body))
        head = "".join(f"{FILE_SEP}{name}\n{body}" for name, body in blocks)
        return f"{head}{FILE_SEP}{path}.diff\noriginal:\n{_lines([now])}updated:\n"
    elif variant == "chat":
        at = region.cursor - region.start
        lang = "python" if path.endswith((".py", ".pyi")) else ""
        ask = CHAT_ASK.format(
            path=path, diff=unified(path, recent), cursor=CURSOR,
            region=_lines([now[:at] + CURSOR + now[at:]]),
        )  # fmt: skip
        return CHAT.format(ask=ask, lang=lang)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    head = "".join(f"{FILE_SEP}{name}\n{body}" for name, body in blocks)
    return f"{head}{FILE_SEP}updated/{path}\n"


def normalize(region: str, output: str) -> str:
    """The output as the region's replacement: no cursor marker, the region's final line
    break (one, if the region has one)."""
    text = output.replace(CURSOR, "")
    if region.endswith("\n") and not text.endswith("\n"):
        text += "\n"
    while text.endswith("\n\n") and not region.endswith("\n\n"):
        text = text[:-1]
    return text


def changed(region: str, text: str) -> tuple[int, int, int] | None:
    """``(p, s_region, s_text)``: the common start's length, and where the common end
    begins in ``region`` and in ``text``; None if they are equal.

    >>> changed("a = 1\\nb = 2\\n", "a = 1\\nb = 3\\n")
    (10, 11, 11)
    """
    if region == text:
        return None
    p = 0
    limit = min(len(region), len(text))
    while p < limit and region[p] == text[p]:
        p += 1
    s = 0
    while s < limit - p and region[-1 - s] == text[-1 - s]:
        s += 1
    return p, len(region) - s, len(text) - s


def proposal(region: Region, doc: str, text: str) -> tuple[int, int, str] | None:
    """The edit of ``doc`` that turns the region into ``text`` (normalized), trimmed to
    what differs; None if nothing does, or if ``text`` has fewer than half the region's
    lines (an output cut short, or empty: the model wrote no region)."""
    now = doc[region.start : region.end]
    if text.count("\n") * 2 < now.count("\n"):
        return None  # a cut-short or empty output: no rewrite of the region
    found = changed(now, text)
    if found is None:
        return None
    p, end_now, end_text = found
    return region.start + p, region.start + end_now, text[p:end_text]


def confidence(
    pieces: Sequence[bytes], logprobs: Sequence[float], start: int, end: int
) -> tuple[float, float] | None:
    """Lowest and mean log-probability of the tokens whose bytes overlap output bytes
    ``[start, end)`` (for ``start == end``: the token that holds byte ``start``, else the
    last); None with no tokens."""
    if not pieces:
        return None
    hi = max(end, start + 1)
    chosen: list[float] = []
    at = 0
    for piece, lp in zip(pieces, logprobs, strict=True):
        nxt = at + len(piece)
        if nxt > start and at < hi:
            chosen.append(lp)
        at = nxt
    if not chosen:
        chosen = [logprobs[-1]]
    return min(chosen), statistics.fmean(chosen)


# -- the model ---------------------------------------------------------------------------


class ScoredTarget(LlamaTarget):
    """A ``LlamaTarget`` that records the log-probability of every token it picks, by
    the position that token takes (a pick made again, after a near tie, replaces it)."""

    def __init__(self, ctx: LlamaContext, sampler: Sampler) -> None:
        super().__init__(ctx, sampler)
        self.logprobs: dict[int, float] = {}
        self._n_past: int | None = None
        self._depths: Sequence[int] = ()

    def prefill(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Prefilled:
        self._n_past = None
        return super().prefill(prompt, cancelled, max_drift)

    def evaluate(self, tree: TokenTree) -> None:
        self._n_past, self._depths = len(self.tokens), tree.depths
        super().evaluate(tree)

    def pick(self, row: int) -> int:
        logits = self._logits(row)
        token = self.sampler(logits)
        if self._n_past is None or row < 0:
            position = len(self.tokens)
        else:
            position = self._n_past + self._depths[row] + 1
        z = logits.astype(np.float64)
        top = float(z.max())
        lse = top + float(np.log(np.exp(z - top).sum()))
        self.logprobs[position] = float(z[token]) - lse
        return token


@dataclass(frozen=True, slots=True)
class Answer:
    text: str
    tokens: list[int]
    logprobs: list[float]
    prompt_tokens: int
    prefill_ms: float
    decode_ms: float
    drafted: int
    accepted: int


def answer(ctx: LlamaContext, curve: CostCurve, prompt: str, draft: str) -> Answer:
    """``rewrite``'s steps (tokenize, a slot, ``decode_rewrite``) on a ``ScoredTarget``."""
    from kode.backends.base import Sampling
    from kode.backends.llama.rewrite import decode_rewrite

    model = ctx.model
    tokens = model.tokenize(prompt)
    draft_tokens = model.tokenize(draft, special=False)
    max_tokens = len(draft_tokens) + SLACK
    if len(tokens) + max_tokens + 1 > ctx.n_ctx:
        raise ValueError(f"prompt of {len(tokens)} tokens too long")
    target = ScoredTarget(ctx, Sampler(Sampling()))
    try:
        out = decode_rewrite(
            target,
            tokens,
            draft_tokens,
            curve,
            max_tokens=max_tokens,
            is_stop=model.is_stop,
            piece=model.piece,
            stop_texts=(FILE_SEP,) if FENCE in draft else (FILE_SEP, FENCE),
            max_batch=min(64, ctx.n_batch),
        )
    finally:
        target.release()
    base = len(tokens)
    logprobs = [target.logprobs.get(base + i, 0.0) for i in range(len(out.tokens))]
    spec = out.speculation
    return Answer(
        out.text,
        out.tokens,
        logprobs,
        base,
        out.prefill_ms,
        out.decode_ms,
        spec.drafted,
        spec.accepted,
    )


# -- the cases and the run ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Case:
    seq: FileSequence
    k: int
    klass: str


def collect(
    repos: Sequence[Path],
    counts: dict[str, int],
    *,
    seed: int,
    max_commits: int,
    max_hunks: int,
    per_commit: int,
) -> list[Case]:
    """Cases sampled as ``next_edits.run`` samples them, ``counts[c]`` of class ``c``
    (``pick``'s single limit: each class starts at ``limit - counts[c]``)."""
    limit = max(counts.values())
    have = {klass: limit - n for klass, n in counts.items()}
    readers = [GitReader(path) for path in repos]
    queues = []
    for reader in readers:
        commits = reader.commits()
        random.Random(f"{seed}:{reader.name}").shuffle(commits)
        queues.append(commits)
    cases: list[Case] = []
    total = 0
    try:
        for i in range(max((len(q) for q in queues), default=0)):
            for reader, queue in zip(readers, queues, strict=True):
                if all(n >= limit for n in have.values()) or total >= max_commits:
                    return cases
                if i >= len(queue):
                    continue
                total += 1
                found = list(reader.sequences(queue[i], max_hunks))
                random.Random(f"{seed}:{queue[i]}").shuffle(found)
                room = per_commit
                for seq in found:
                    wanted = pick(seq, have, limit, room)
                    room -= len(wanted)
                    cases += [Case(seq, k, klass) for k, klass in sorted(wanted.items())]
    finally:
        for reader in readers:
            reader.close()
    return cases


@dataclass(frozen=True, slots=True)
class Result:
    variant: str
    repo: str
    commit: str
    file: str
    k: int
    klass: str
    reachable: bool  # the next hunk's lines lie within the region
    shown: bool
    exact: bool
    location: bool
    reversal: bool
    min_logprob: float | None
    mean_logprob: float | None
    ms: float
    prefill_ms: float
    decode_ms: float
    prompt_tokens: int
    output_tokens: int
    drafted: int
    accepted: int
    load: float
    proposal: str | None


def run_case(ctx: LlamaContext, curve: CostCurve, case: Case, variant: str) -> Result:
    seq = case.seq
    cut = steps(seq.old_text, seq.hunks[: case.k + 1])
    target, applied = cut[case.k], cut[: case.k]
    doc = target.before
    load = _load()
    started = time.perf_counter()
    found_region = (
        analogy_region(doc, applied[-1].cursor, applied[-1])
        if variant == "analogy"
        else region_at(doc, applied[-1].cursor)
    )
    region = found_region or Region(0, 0, applied[-1].cursor)
    now = doc[region.start : region.end]
    if found_region is None:
        got = Answer("", [], [], 0, 0.0, 0.0, 0, 0)
        text = now
    else:
        prompt = build_prompt(variant, seq.path, doc, region, applied, seq.old_text)
        got = answer(ctx, curve, prompt, now)
        text = normalize(now, got.text)
    edit = proposal(region, doc, text)
    ms = (time.perf_counter() - started) * 1000.0
    judged = score(target, applied, edit)
    conf = None
    found = changed(now, text)
    if found is not None:
        p, _, end_text = found
        pieces = [ctx.model.piece(t) for t in got.tokens]
        b0 = len(text[:p].encode())
        b1 = len(text[:end_text].encode())
        conf = confidence(pieces, got.logprobs, b0, b1)
    first = doc.count("\n", 0, region.start)
    last = doc.count("\n", 0, region.end)
    hunk_end = target.line + max(len(target.hunk.old), 1)
    return Result(
        variant=variant,
        repo=seq.repo,
        commit=seq.commit,
        file=seq.path,
        k=case.k,
        klass=case.klass,
        reachable=first <= target.line and hunk_end <= max(last, first + 1),
        shown=judged.shown,
        exact=judged.exact,
        location=judged.location,
        reversal=judged.reversal,
        min_logprob=None if conf is None else round(conf[0], 3),
        mean_logprob=None if conf is None else round(conf[1], 3),
        ms=round(ms, 1),
        prefill_ms=round(got.prefill_ms, 1),
        decode_ms=round(got.decode_ms, 1),
        prompt_tokens=got.prompt_tokens,
        output_tokens=len(got.tokens),
        drafted=got.drafted,
        accepted=got.accepted,
        load=load,
        proposal=None if edit is None else edit[2][:300],
    )


# -- the report --------------------------------------------------------------------------


def gated(results: Sequence[Result], gate: float | None) -> tuple[int, int, int]:
    """Exact, located and shown-and-wrong when only proposals with ``min_logprob`` at
    least ``gate`` are shown."""
    exact = located = wrong = 0
    for r in results:
        if not r.shown or (gate is not None and (r.min_logprob or 0.0) < gate):
            continue
        exact += r.exact
        located += r.location
        wrong += not r.exact
    return exact, located, wrong


def report(results: Sequence[Result]) -> list[str]:
    lines = []
    for variant in dict.fromkeys(r.variant for r in results):
        for klass in (OTHER, REPEAT):
            mine = [r for r in results if r.variant == variant and r.klass == klass]
            n = len(mine)
            if not n:
                continue

            def pct(x: int, n: int = n) -> str:
                return f"{x}/{n} ({100.0 * x / n:.0f}%)"

            ms = sorted(r.ms for r in mine)
            loads = [r.load for r in mine]
            lines.append(
                f"{variant:6} {klass:6} reachable {pct(sum(r.reachable for r in mine))}  "
                f"exact {pct(sum(r.exact for r in mine))}  "
                f"location {pct(sum(r.location for r in mine))}  "
                f"shown {pct(sum(r.shown for r in mine))}  "
                f"shown+wrong {pct(sum(r.shown and not r.exact for r in mine))}  "
                f"reversals {sum(r.reversal for r in mine)}  "
                f"ms p50 {_quantile(ms, 0.5):.0f} p95 {_quantile(ms, 0.95):.0f} "
                f"(prefill p50 {statistics.median(r.prefill_ms for r in mine):.0f}, "
                f"prompt p50 {statistics.median(r.prompt_tokens for r in mine):.0f} tok)  "
                f"load1 {min(loads):.2f}-{max(loads):.2f} (median {statistics.median(loads):.2f})"
            )
            gates = []
            for gate in GATES:
                exact, _, wrong = gated(mine, gate)
                name = "none" if gate is None else f">={gate}"
                gates.append(f"{name}: exact {exact}, wrong {wrong}")
            lines.append(f"{'':13} gate min logprob  " + "; ".join(gates))
    return lines


def _quantile(values: Sequence[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _load() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return -1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repos", type=Path, nargs="+", default=list(DEV_REPOS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--other", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-commits", type=int, default=2000)
    parser.add_argument("--max-hunks", type=int, default=12)
    parser.add_argument("--per-commit", type=int, default=4)
    parser.add_argument("--max-seconds", type=float, default=1500.0)
    parser.add_argument("--model", default="default", help="default, small or a GGUF path")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write next_edit_model.json")
    args = parser.parse_args(argv)
    for repo in args.repos:
        if any(name in str(repo).lower() for name in HELD_OUT):
            parser.error(f"{repo}: held out, never read by this bench")

    from kode.backends import models
    from kode.backends.llama.runtime import LlamaContext, LlamaModel
    from kode.backends.speculative import CostCurve
    from kode.backends.speculative.edits import EDIT_CURVE_MS

    began = time.monotonic()
    load_before = os.getloadavg()
    cases = collect(
        args.repos,
        {OTHER: args.other, REPEAT: args.repeat},
        seed=args.seed,
        max_commits=args.max_commits,
        max_hunks=args.max_hunks,
        per_commit=args.per_commit,
    )
    # Interleave the classes so that a run cut by --max-seconds keeps both.
    others = [c for c in cases if c.klass == OTHER]
    repeats = [c for c in cases if c.klass == REPEAT]
    order: list[Case] = []
    while others or repeats:
        order += others[:3] + repeats[:1]
        others, repeats = others[3:], repeats[1:]
    print(f"{len(order)} cases ({sum(c.klass == OTHER for c in order)} other); "
          f"load before {load_before}", file=sys.stderr, flush=True)  # fmt: skip
    path = models.resolve(args.model)
    model = LlamaModel(path)
    ctx = LlamaContext(model, n_ctx=4096, n_batch=512, n_seq_max=2, n_threads=args.threads)
    curve = CostCurve(EDIT_CURVE_MS)
    results: list[Result] = []
    try:
        for i, case in enumerate(order):
            if time.monotonic() - began > args.max_seconds:
                print(f"stopped at --max-seconds after {i} cases", file=sys.stderr)
                break
            for variant in args.variants:
                r = run_case(ctx, curve, case, variant)
                results.append(r)
                print(
                    f"{i:3} {variant:6} {r.klass:6} exact={r.exact:d} loc={r.location:d} "
                    f"shown={r.shown:d} reach={r.reachable:d} lp={r.min_logprob} "
                    f"{r.ms:.0f} ms (prefill {r.prefill_ms:.0f}, {r.prompt_tokens} tok) "
                    f"load {r.load}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        ctx.close()
        model.close()
    lines = report(results)
    load_after = os.getloadavg()
    print("\n".join(lines))
    print(
        f"model {path.name}, {args.threads} threads; load before {load_before}, after {load_after}"
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        data = {
            "setup": {
                "repos": [str(p) for p in args.repos],
                "variants": args.variants,
                "seed": args.seed,
                "model": path.name,
                "threads": args.threads,
                "above": ABOVE,
                "below": BELOW,
                "history": HISTORY,
                "load_before": load_before,
                "load_after": load_after,
            },
            "report": lines,
            "results": [asdict(r) for r in results],
        }
        out = args.out / "next_edit_model.json"
        out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
