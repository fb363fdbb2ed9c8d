"""Speculative decoding on a llama.cpp context: the runtime half of ``backends/speculative``.

Each ``Stepper`` (``backends.worker.Stepper``) advances a generation by one *target*
call. The contract, shared by every method (the KV cache of sequence 0 holds
``ctx.tokens``; ``root`` is the last emitted token, not yet evaluated)::

    new = stepper.step(root)   # evaluate root (+ drafts) in ONE target batch
    # afterwards: ctx.tokens == old tokens + [root] + new[:-1]   (KV of seq 0 matches)
    #             new[-1] is the next root (the target's own choice, never a draft)

so cancellation, stop tokens and ``max_tokens`` stay the caller's business and a cancel
still stops within one (verify) step. Drafts are verified by sample-and-match: the
target picks its token at every row (argmax when greedy, a sample otherwise) and a
draft token is accepted only if it equals that pick, so the output is exactly what
plain decoding would produce. Target picks are computed lazily, only for the rows on
the accepted path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
from kode.backends.base import SpeculationStats
from kode.backends.llama.runtime import LlamaContext, Row
from kode.backends.speculative import (
    AdaptivePolicy,
    CostCurve,
    LazyPicks,
    Lookahead,
    NgramDrafter,
    TokenTree,
    build_tree,
    draft_chain,
    verify,
)
from kode.backends.speculative.policy import CostTracker

Pick = Callable[[int], int]  # batch output row -> the target's token there


def calibrate(ctx: LlamaContext, sizes: Sequence[int] = (1, 2, 4, 8), reps: int = 2) -> CostCurve:
    """Measure the target's batch cost curve on this machine (ms per batch of n rows).

    Runs on a scratch sequence after a warm-up; leaves sequence 0 untouched.
    """
    seq = ctx.n_seq_max - 1
    ms: dict[int, float] = {}
    base = 100 if ctx.n_ctx > 400 else 1
    ctx.clear_seqs(range(seq, seq + 1))
    ctx.decode([Row(0, base, (seq,), True)])  # warm-up
    for n in sizes:
        best = float("inf")
        for _ in range(reps):
            ctx.clear_seqs(range(seq, seq + 1))
            rows = [Row(220 + i, base + i, (seq,), True) for i in range(n)]
            t = time.perf_counter()
            ctx.decode(rows)
            best = min(best, time.perf_counter() - t)
        ms[n] = best * 1000.0
    ctx.clear_seqs(range(seq, seq + 1))
    # Never let noise say a bigger batch is cheaper than a smaller one.
    floor = 0.0
    for n in sorted(ms):
        floor = ms[n] = max(ms[n], floor)
    return CostCurve(ms)


def timed_decode(ctx: LlamaContext, rows: Sequence[Row], tracker: CostTracker | None) -> None:
    start = time.perf_counter()
    ctx.decode(rows)
    if tracker is not None:
        tracker.record(len(rows), (time.perf_counter() - start) * 1000.0)


class PlainStepper:
    def __init__(self, ctx: LlamaContext, pick: Pick, tracker: CostTracker | None = None) -> None:
        self.ctx, self.pick, self.tracker = ctx, pick, tracker
        self.stats = SpeculationStats(method="none")

    def step(self, root: int) -> list[int]:
        ctx = self.ctx
        timed_decode(ctx, [Row(root, len(ctx.tokens), (0,), True)], self.tracker)
        ctx.tokens.append(root)
        self.stats.steps += 1
        return [self.pick(0)]


def _commit_tree(ctx: LlamaContext, tree: TokenTree, accepted: int, branch: int) -> None:
    """Keep the root and ``accepted`` draft rows of ``branch`` in sequence 0, drop the rest.

    Tree branch b lives in llama sequence b (the prefix was copied there before the batch).
    """
    n_keep = len(ctx.tokens) + 1 + accepted
    if tree.n_branches > 1:
        ctx.seq_keep(branch)  # every cell now belongs to `branch` alone
        if branch != 0:
            ctx.seq_cp(branch, 0)
            ctx.clear_seqs(range(branch, branch + 1))
    ctx.remove(0, n_keep)


def _tree_rows(ctx: LlamaContext, tree: TokenTree) -> list[Row]:
    n_past = len(ctx.tokens)
    for b in range(1, tree.n_branches):
        ctx.seq_cp(0, b)
    rows = []
    for i, token in enumerate(tree.tokens):
        seqs = (0,) if i == 0 else tree.branches[i]
        if i == 0 and tree.n_branches > 1:
            seqs = tuple(range(tree.n_branches))
        rows.append(Row(token, n_past + tree.depths[i], seqs, True))
    return rows


class NgramStepper:
    """Prompt lookup: candidates from the prompt, the suffix, other documents and the text
    generated so far, merged into a token tree and verified in one batch.

    ``policy`` picks the draft length from the measured batch-cost curve and the
    acceptance seen so far; with ``allow_plain`` it may decide that drafting does not pay
    this step (``auto``), otherwise it drafts whenever a candidate exists (``ngram``).
    """

    # In auto mode, one step in this many is plain, to keep the 1-row cost current.
    PROBE_EVERY = 12

    def __init__(
        self,
        ctx: LlamaContext,
        pick: Pick,
        drafter: NgramDrafter,
        policy: AdaptivePolicy,
        *,
        allow_plain: bool,
        max_candidates: int = 3,
        method: str = "ngram",
        tracker: CostTracker | None = None,
    ) -> None:
        self.ctx, self.pick, self.drafter, self.policy = ctx, pick, drafter, policy
        self.allow_plain = allow_plain
        self.max_candidates = max_candidates
        self.tracker = tracker
        self.stats = SpeculationStats(method=method)
        self._plain = PlainStepper(ctx, pick, tracker)

    def step(self, root: int) -> list[int]:
        ctx = self.ctx
        if self.tracker is not None and self.tracker.dirty:
            self.policy.curve = self.tracker.curve()
        history = [*ctx.tokens, root]
        max_draft = self.policy.max_draft
        probe = self.allow_plain and self.stats.steps % self.PROBE_EVERY == self.PROBE_EVERY - 1
        cands = (
            self.drafter.propose(history, max_draft, self.max_candidates)
            if max_draft and not probe
            else []
        )
        longest = max((len(c) for c in cands), default=0)
        k = 0
        if longest:
            if self.allow_plain:
                k = self.policy.draft_len("ngram", limit=longest)
            else:
                k = max(1, self.policy.draft_len("ngram", limit=longest) or 1)
        if k == 0:
            self.policy.observe("none", 0, 0)
            self.stats.steps += 1
            out = self._plain.step(root)
            return out
        cands = [c[:k] for c in cands]
        # The first candidate gets k rows; later ones may add a short side branch.
        extra = min(2, sum(len(c) for c in cands[1:]))
        tree = build_tree(root, cands, max_rows=k + 1 + extra)
        rows = _tree_rows(ctx, tree)
        timed_decode(ctx, rows, self.tracker)
        picks = LazyPicks(len(rows), self.pick)
        result = verify(tree, picks)
        accepted = len(result.accepted_tokens)
        _commit_tree(ctx, tree, accepted, result.branch)
        ctx.tokens.extend([root, *result.accepted_tokens])
        drafted = tree.n_rows - 1
        self.policy.observe("ngram", min(drafted, k), accepted)
        self.stats.steps += 1
        self.stats.drafted += drafted
        self.stats.accepted += accepted
        return [*result.accepted_tokens, result.next_token]


class DraftModelStepper:
    """A small draft model proposes a chain (stopping when unsure); the target verifies it."""

    def __init__(
        self,
        ctx: LlamaContext,
        pick: Pick,
        draft: LlamaContext,
        *,
        max_draft: int = 4,
        p_min: float = 0.6,
    ) -> None:
        self.ctx, self.pick, self.draft = ctx, pick, draft
        self.max_draft = max_draft
        self.p_min = p_min
        self.stats = SpeculationStats(method="draft")

    def _draft_step_factory(self, history: list[int]) -> Callable[[int], tuple[int, float]]:
        draft = self.draft
        first = True

        def step(token: int) -> tuple[int, float]:
            nonlocal first
            if first:
                first = False
                draft.prefill(history, lambda: False)  # reuses the draft's KV prefix
            else:
                draft.decode([Row(token, len(draft.tokens), (0,), True)])
                draft.tokens.append(token)
            logits = draft.logits(-1)
            best = int(np.argmax(logits))
            z = logits - logits[best]
            prob = 1.0 / float(np.exp(z.astype(np.float64)).sum())
            return best, prob

        return step

    def step(self, root: int) -> list[int]:
        ctx = self.ctx
        history = [*ctx.tokens, root]
        chain = draft_chain(self._draft_step_factory(history), root, self.max_draft, self.p_min)
        tree = build_tree(root, [chain] if chain else [], max_rows=len(chain) + 1)
        ctx.decode(_tree_rows(ctx, tree))
        result = verify(tree, LazyPicks(tree.n_rows, self.pick))
        accepted = len(result.accepted_tokens)
        _commit_tree(ctx, tree, accepted, result.branch)
        ctx.tokens.extend([root, *result.accepted_tokens])
        # The draft's KV past the accepted point is stale; the next prefill trims it.
        self.stats.steps += 1
        self.stats.drafted += len(chain)
        self.stats.accepted += accepted
        return [*result.accepted_tokens, result.next_token]


class LookaheadStepper:
    """Lookahead decoding: a Jacobi window and an n-gram pool, verified in one batch."""

    def __init__(self, ctx: LlamaContext, pick: Pick, lookahead: Lookahead) -> None:
        if ctx.n_seq_max < lookahead.max_seqs:
            raise ValueError(f"lookahead needs {lookahead.max_seqs} sequences")
        self.ctx, self.pick, self.la = ctx, pick, lookahead
        self.stats = SpeculationStats(method="lookahead")
        self._started = False

    def step(self, root: int) -> list[int]:
        ctx, la = self.ctx, self.la
        if not self._started:
            la.reset(ctx.tokens)
            self._started = True
        n_past = len(ctx.tokens)
        for s in range(1, la.max_seqs):
            ctx.clear_seqs(range(s, s + 1))
            ctx.seq_cp(0, s)
        plan = la.plan(root)
        rows = [Row(r.token, n_past + r.depth, r.seq_ids, r.want_logits) for r in plan.rows]
        ctx.decode(rows)
        picks = [-1] * len(plan.rows)
        for row in plan.logit_rows:  # llama_get_logits_ith takes the batch row index
            picks[row] = self.pick(row)
        result = la.update(plan, picks)
        accepted = len(result.accepted_tokens)
        n_keep = n_past + 1 + accepted
        ctx.remove(-1, n_keep)
        if accepted:
            ctx.seq_keep(result.keep_seq)
            if result.keep_seq != 0:
                ctx.seq_cp(result.keep_seq, 0)
                ctx.clear_seqs(range(result.keep_seq, result.keep_seq + 1))
        for s in range(1, la.max_seqs):
            ctx.clear_seqs(range(s, s + 1))
        ctx.tokens.extend([root, *result.accepted_tokens])
        self.stats.steps += 1
        self.stats.drafted += plan.n_draft
        self.stats.accepted += accepted
        return [*result.accepted_tokens, result.next_token]
