"""Speculative edits: a region's rewrite decoded plainly and with its text as the draft.

``python -m kode.bench.rewrite --model default``: for regions of 20-30 lines cut from
large files of the standard library (``difflib.py``, ``argparse.py``), a chat prompt asks
Qwen2.5-Coder-Instruct to rename one identifier and answer with the code only; the
expected rewrite is the region with the rename applied. Each region is decoded three
ways back to back in one process, the order rotated by one per region (a slow patch of
the machine lands on every way alike), the prompt's KV entries reused after the first:

    plain    greedy, one token per ``llama_decode`` (``decode_rewrite`` with no draft)
    draft    the region's text as the draft, batches sized from the cost curve
    nolearn  the same without applying a learned edit ahead (``CopyDrafter(learn=False)``)

Printed per region and way: decode tokens/s (tokens after the first, over the time after
the prompt), the ratio to plain, the ratio the same batches would give on issue 49's quiet
curve (``EDIT_CURVE_MS``: on a machine shared with other work one-row steps suffer more
than batched rows, so measured ratios there run above a quiet machine's), whether the
output equals plain's token for token (at a first difference, plain's top-2 logit gap
there, a near tie or not), whether it is the expected rewrite, the batches after the
prompt's, drafted and accepted tokens, the verify batches cut at a near tie, and the load
average (``os.getloadavg``, 1 minute) next to every figure. Run it alone on a quiet
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kode.backends.speculative import CostCurve

CHAT = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\n<|im_start|>user\n{ask}\n\n```python\n{region}```<|im_end|>\n"
    "<|im_start|>assistant\n```python\n"
)
ASK = (
    "Rename the variable `{old}` to `{new}` everywhere in the following code. Reply with "
    "the complete updated code and nothing else."
)
FENCE = "```"
WAYS = ("plain", "draft", "nolearn")


@dataclass(frozen=True, slots=True)
class Region:
    """``lines`` lines of the standard library's ``module`` from the first line that
    holds ``anchor``; the rewrite renames the identifier ``old`` to ``new``."""

    module: str
    anchor: str
    lines: int
    old: str
    new: str

    def text(self) -> str:
        source = Path(stdlib_path(self.module)).read_text(encoding="utf-8").splitlines()
        start = next(i for i, line in enumerate(source) if self.anchor in line)
        return "\n".join(source[start : start + self.lines]) + "\n"

    def expected(self) -> str:
        return re.sub(rf"\b{re.escape(self.old)}\b", self.new, self.text())

    def prompt(self) -> str:
        ask = ASK.format(old=self.old, new=self.new)
        return CHAT.format(ask=ask, region=self.text())

    @property
    def name(self) -> str:
        return f"{self.module}:{self.old}->{self.new}"


REGIONS = (
    Region("difflib", "# Extend the best by non-junk", 24, "besti", "best_i"),
    Region("difflib", "i = j = 0", 24, "tag", "kind"),
    Region("argparse", "# optional argument produces a default", 28, "value", "result"),
    Region("argparse", "def _get_optional_kwargs(self", 30, "msg", "message"),
)


def stdlib_path(module: str) -> str:
    import importlib

    path = importlib.import_module(module).__file__
    assert path is not None
    return path


def load() -> float:
    return round(os.getloadavg()[0], 2)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="default, small or a GGUF path")
    parser.add_argument("--regions", type=int, default=len(REGIONS))
    parser.add_argument("--max-tokens", type=int, default=600)
    parser.add_argument("--max-batch", type=int, default=64, help="rows per verify batch")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--curve",
        choices=("measured", "issue"),
        default="measured",
        help="batch costs measured at start, or issue 49's (1.5B, 2 cores)",
    )
    parser.add_argument("--no-guard", action="store_true", help="no near-tie guard")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)

    from kode.backends import models
    from kode.backends.llama.rewrite import Rewrite, rewrite
    from kode.backends.llama.runtime import LlamaContext, LlamaModel
    from kode.backends.llama.target import calibrate
    from kode.backends.speculative import CostCurve
    from kode.backends.speculative.edits import EDIT_CURVE_MS

    path = models.resolve(args.model)
    print(f"model {path.name}; load before {os.getloadavg()}", flush=True)
    model = LlamaModel(path)
    ctx = LlamaContext(model, n_ctx=4096, n_batch=512, n_seq_max=2, n_threads=args.threads)
    rows: list[dict[str, Any]] = []
    try:
        sizes = (1, 2, 4, 8, 16, 32, 64)
        curve = CostCurve(EDIT_CURVE_MS)
        if args.curve == "measured":
            curve = calibrate(ctx, sizes=sizes, reps=2)
        costs = {n: round(curve.cost(n) * curve.ms_by_rows[1], 1) for n in sizes}
        print(f"batch cost ms ({args.curve}): {costs}  load {load()}", flush=True)
        quiet = CostCurve(EDIT_CURVE_MS)
        header = (
            f"{'region':34} {'way':8} {'tok':>4} {'tok/s':>6} {'ratio':>6} {'quiet':>6} "
            f"{'same':>5} {'exact':>5} {'batches':>7} {'drafted':>7} {'accepted':>8} "
            f"{'ties':>4} {'load':>5}"
        )
        print(header, flush=True)
        for r, region in enumerate(REGIONS[: args.regions]):
            prompt, draft, expected = region.prompt(), region.text() + FENCE, region.expected()
            # Evaluate the prompt once, untimed, so that every way reuses it alike.
            rewrite(ctx, prompt, "", curve, max_tokens=1)
            ways = WAYS[r % len(WAYS) :] + WAYS[: r % len(WAYS)]
            done: dict[str, tuple[Rewrite, float]] = {}
            for way in ways:
                before = load()
                done[way] = (
                    rewrite(
                        ctx,
                        prompt,
                        "" if way == "plain" else draft,
                        curve,
                        max_tokens=args.max_tokens,
                        stop_texts=(FENCE,),
                        learn=way == "draft",
                        guard_ties=not args.no_guard,
                        max_batch=args.max_batch,
                    ),
                    before,
                )
            plain = done["plain"][0]
            plain_quiet = quiet_ms(quiet, plain.batches)
            for way in WAYS:
                out, before = done[way]
                diff = first_difference(out.tokens, plain.tokens)
                gap = None
                if diff is not None and diff < min(len(out.tokens), len(plain.tokens)):
                    gap = top2_gap(ctx, prompt, plain.tokens[: diff + 1])
                spec = out.speculation
                row = {
                    "region": region.name,
                    "way": way,
                    "tokens": len(out.tokens),
                    "tokens_per_s": round(out.tokens_per_s, 2),
                    "ratio": round(out.tokens_per_s / plain.tokens_per_s, 2)
                    if plain.tokens_per_s
                    else None,
                    "quiet_ms": round(quiet_ms(quiet, out.batches), 1),
                    "quiet_ratio": round(plain_quiet / quiet_ms(quiet, out.batches), 2),
                    "same": diff is None,
                    "first_difference": diff,
                    "plain_top2_gap_there": gap,
                    "exact": out.text == expected,
                    "batches": spec.steps,  # after the prompt's
                    "drafted": spec.drafted,
                    "accepted": spec.accepted,
                    "near_ties": spec.near_ties,
                    "decode_ms": round(out.decode_ms, 1),
                    "load_before": before,
                    "load_after": load(),
                    "finish": str(out.finish),
                }
                rows.append(row)
                same = "yes" if diff is None else f"@{diff}"
                print(
                    f"{region.name:34} {way:8} {len(out.tokens):4} {row['tokens_per_s']:6.1f} "
                    f"{row['ratio'] or 0:6.2f} {row['quiet_ratio']:6.2f} {same:>5} "
                    f"{'yes' if row['exact'] else 'no':>5} "
                    f"{row['batches']:7} {spec.drafted:7} {spec.accepted:8} "
                    f"{spec.near_ties:4} {before:5.2f}",
                    flush=True,
                )
                if gap is not None:
                    print(f"    first difference at token {diff}: plain's top-2 gap {gap:.3f}")
        summary = summarize(rows)
        print(json.dumps(summary), flush=True)
        print(f"load after {os.getloadavg()}", flush=True)
        if args.json is not None:
            args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    finally:
        ctx.close()
        model.close()
    return 0


def quiet_ms(curve: CostCurve, batches: Sequence[int]) -> float:
    """What ``batches`` (rows each) would take on ``curve``, in ms."""
    return sum(curve.cost(rows) for rows in batches) * curve.ms_by_rows[1]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per way: total tokens over total decode time (tokens/s), its ratio to plain's, and
    the ratio of the batches' times on the quiet curve."""
    out: dict[str, Any] = {}
    for way in WAYS:
        mine = [r for r in rows if r["way"] == way]
        tokens = sum(r["tokens"] - 1 for r in mine)
        ms = sum(r["decode_ms"] for r in mine)
        out[way] = {
            "tokens_per_s": round(tokens * 1000.0 / ms, 2) if ms else None,
            "same_as_plain": sum(r["same"] for r in mine),
            "exact": sum(r["exact"] for r in mine),
            "regions": len(mine),
            "load_range": [
                min(r["load_before"] for r in mine),
                max(r["load_after"] for r in mine),
            ]
            if mine
            else None,
        }
    base = out["plain"]["tokens_per_s"]
    quiet = {way: sum(r["quiet_ms"] for r in rows if r["way"] == way) for way in WAYS}
    for way in WAYS:
        speed = out[way]["tokens_per_s"]
        out[way]["ratio"] = round(speed / base, 2) if base and speed else None
        out[way]["quiet_ratio"] = round(quiet["plain"] / quiet[way], 2) if quiet[way] else None
    return out


def top2_gap(ctx: Any, prompt: str, tokens: Sequence[int]) -> float:
    """Plain decoding's top-2 logit gap before the last of ``tokens`` (one-row steps)."""
    import numpy as np
    from kode.backends.base import Sampling
    from kode.backends.llama.target import LlamaTarget, Sampler
    from kode.backends.speculative import build_tree

    target = LlamaTarget(ctx, Sampler(Sampling()))
    try:
        target.prefill(ctx.model.tokenize(prompt), lambda: False, 0)
        logits = ctx.logits(-1)
        for token in tokens[:-1]:
            tree = build_tree(token, [], max_rows=1)
            target.evaluate(tree)
            target.commit(tree, 0, 0)
            logits = ctx.logits(0)
        top2 = np.partition(logits, -2)[-2:]
        return float(abs(top2[1] - top2[0]))
    finally:
        target.release()


if __name__ == "__main__":
    sys.exit(main())
