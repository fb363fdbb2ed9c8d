"""A llama.cpp context as a ``steppers.Target``, its draft model, and lookahead decoding.

A generation holds one ``Slot`` of the context; the slot's own sequence (its 0) holds
``slot.tokens``. A token tree's branch b is evaluated in the slot's sequence b (the
prefix is copied there before the batch), so one batch verifies several n-gram
candidates; ``commit`` keeps the accepted branch in the slot's own sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

import numpy as np
import numpy.typing as npt
from kode.backends.base import Sampling, SpeculationMethod, SpeculationStats
from kode.backends.errors import BackendError
from kode.backends.guided import Guide
from kode.backends.kv_reuse import prefix_reach
from kode.backends.llama.kv_chunks import Assembler
from kode.backends.llama.runtime import LlamaContext, Row, Slot
from kode.backends.speculative import CostCurve, Lookahead, TokenTree, draft_chain
from kode.backends.steppers import Draft, Prefilled, Probs, drain_steps, measure_curve


class Sampler:
    """Picks the next token from logits: argmax when greedy, else temperature + top-p."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self.rng = np.random.default_rng(sampling.seed)

    def probs(self, logits: npt.NDArray[np.float32]) -> Probs:
        """The sampling distribution of one logit row [V] (float64). Top-p keeps the most
        likely tokens up to the first that brings the cumulative probability to ``top_p``."""
        s = self.sampling
        z = logits.astype(np.float64) / max(s.temperature, 1e-6)
        z -= z.max()
        p: Probs = np.exp(z)
        p /= p.sum()
        if s.top_p < 1.0:
            order = np.argsort(-p)
            cum = np.cumsum(p[order])
            keep = order[: int(np.searchsorted(cum, s.top_p) + 1)]
            q = np.zeros_like(p)
            q[keep] = p[keep]
            p = q / q.sum()
        return p

    def __call__(self, logits: npt.NDArray[np.float32]) -> int:
        if self.sampling.greedy:
            return int(np.argmax(logits))
        p = self.probs(logits)
        return int(self.rng.choice(len(p), p=p))


class LlamaTarget:
    """One generation's view of a ``LlamaContext``: the slot it claims when its prompt
    comes (``prefill_steps``) and holds until ``release``, and a ``Sampler``; with a
    ``guide``, every pick is made under the names monitor's mask for its row."""

    trees = True

    def __init__(
        self,
        ctx: LlamaContext,
        sampler: Sampler,
        guide: Guide | None = None,
        assembler: Assembler | None = None,
    ) -> None:
        self.ctx, self.sampler, self.guide = ctx, sampler, guide
        self.assembler = assembler
        self._slot: Slot | None = None

    @property
    def slot(self) -> Slot:
        if self._slot is None:
            raise BackendError("the generation has no slot before its prompt")
        return self._slot

    @property
    def tokens(self) -> list[int]:
        return self.slot.tokens

    @property
    def rng(self) -> np.random.Generator:
        return self.sampler.rng

    def prefill(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Prefilled:
        return drain_steps(self.prefill_steps(prompt, cancelled, max_drift))

    def prefill_steps(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Generator[None, None, Prefilled]:
        if self._slot is None:
            self._slot = self.ctx.claim(prompt)
        slot = self._slot
        reused = yield from slot.prefill_steps(prompt, cancelled, max_drift=max_drift)
        if self.guide is not None:
            self.guide.prompt()
        return Prefilled(reused, 0 if slot.last_move is None else slot.last_move.length)

    def assemble_steps(
        self, prompt: Sequence[int], cancelled: Callable[[], bool]
    ) -> Generator[None, None, int]:
        if self.assembler is None:
            return 0
        if self._slot is None:
            self._slot = self.ctx.claim(prompt)
        slot = self._slot
        held = min(prefix_reach(slot.tokens, prompt, slot.stale_from), len(prompt) - 1)
        return (yield from self.assembler.prefill_steps(slot, prompt, held, cancelled))

    def read_steps(
        self, prompt: Sequence[int], cancelled: Callable[[], bool]
    ) -> Generator[None, None, int]:
        if self.assembler is None:
            return 0
        if self._slot is None:
            self._slot = self.ctx.claim_scratch()
        return (yield from self.assembler.read_steps(self._slot, prompt, cancelled))

    def release(self) -> None:
        if self._slot is not None:
            self.ctx.release(self._slot)
            self._slot = None

    def evaluate(self, tree: TokenTree) -> None:
        slot = self.slot
        n_past = len(slot.tokens)
        for b in range(1, tree.n_branches):
            slot.copy(0, b)
        rows = []
        for i, token in enumerate(tree.tokens):
            branches = (0,) if i == 0 else tree.branches[i]
            if i == 0 and tree.n_branches > 1:
                branches = tuple(range(tree.n_branches))
            seqs = tuple(slot.seq(b) for b in branches)
            rows.append(Row(token, n_past + tree.depths[i], seqs, True))
        self.ctx.decode(rows)
        self.expect(tree)

    def expect(self, tree: TokenTree) -> None:
        """The last batch holds ``tree`` from its row 0 (what the guide judges rows by)."""
        if self.guide is not None:
            self.guide.tree(tree)

    def extend(self, tokens: Sequence[int]) -> None:
        """``tokens`` joined the slot's own sequence (their KV entries are there)."""
        self.slot.tokens.extend(tokens)
        if self.guide is not None:
            self.guide.commit(tokens)

    def _logits(self, row: int) -> npt.NDArray[np.float32]:
        logits = self.ctx.logits(row)
        return logits if self.guide is None else self.guide.logits(row, logits)

    def pick(self, row: int) -> int:
        return self.sampler(self._logits(row))

    def pick_batched(self, row: int, root: int) -> int:
        """The pick after ``root``, evaluated at row ``row`` of a batch of several
        generations' plain steps; ``root`` then joins the slot's sequence."""
        if self.guide is not None:
            self.guide.rows({row: (root,)})
        token = self.pick(row)
        self.extend([root])
        return token

    # A verify batch's logits differ from a one-row step's by up to 0.3-0.6 on these
    # quantized CPU kernels (0.5B, 60 rows, with and without weight repacking).
    near_tie = 1.0

    def margin(self, row: int) -> float:
        if not self.sampler.sampling.greedy:
            return float("inf")
        top2 = np.partition(self._logits(row), -2)[-2:]
        return float(abs(top2[1] - top2[0]))

    def pick_among(self, row: int, allowed: Sequence[int]) -> int:
        """Among ``allowed`` and what the guide allows; ``allowed`` alone where none is
        both (the healed text is the user's: it is spelled whatever the monitor says)."""
        ids = np.asarray(allowed, dtype=np.intp)
        logits = self._logits(row)
        if not np.isfinite(logits[ids]).any():
            logits = self.ctx.logits(row)
        masked = np.full_like(logits, -np.inf)
        masked[ids] = logits[ids]
        return self.sampler(masked)

    def probs(self, rows: int) -> Probs:
        return np.stack([self.sampler.probs(self._logits(i)) for i in range(rows)])

    def commit(self, tree: TokenTree, accepted: int, branch: int) -> None:
        """Keep the root and ``accepted`` rows of ``branch`` in the slot's own sequence,
        drop the rest."""
        slot = self.slot
        n_keep = len(slot.tokens) + 1 + accepted
        if tree.n_branches > 1:
            slot.keep(branch)  # every cell of the slot now belongs to `branch` alone
            if branch != 0:
                slot.copy(branch, 0)
                slot.clear(branch)
        slot.remove(0, n_keep)
        self.extend([tree.tokens[r] for r in tree.branch_rows(branch)[: accepted + 1]])

    def synchronize(self) -> None:
        """llama_decode returns when the batch is done."""


class LlamaDraft:
    """A small llama.cpp model drafting its argmax chain (verified by sample-and-match)."""

    def __init__(self, ctx: LlamaContext) -> None:
        self.ctx = ctx
        self.slot = ctx.slots[0]  # the draft's context serves one generation at a time

    def draft(self, history: list[int], max_draft: int, p_min: float) -> Draft:
        draft, slot = self.ctx, self.slot
        first = True

        def step(token: int) -> tuple[int, float]:
            nonlocal first
            if first:
                first = False
                slot.prefill(history, lambda: False)  # reuses the draft's KV prefix
            else:
                draft.decode([Row(token, len(slot.tokens), (slot.base,), True)])
                slot.tokens.append(token)
            logits = draft.logits(-1)
            best = int(np.argmax(logits))
            z = logits - logits[best]
            return best, 1.0 / float(np.exp(z.astype(np.float64)).sum())

        return Draft(draft_chain(step, history[-1], max_draft, p_min))


def calibrate(ctx: LlamaContext, sizes: Sequence[int] = (1, 2, 4, 8), reps: int = 2) -> CostCurve:
    """Measure the target's batch cost curve on this machine (ms per batch of n rows).

    Runs on the last scratch sequence of the first slot after a warm-up; leaves every
    slot's own sequence untouched.
    """
    seq = ctx.slots[0].seq(ctx.n_seq_max - 1)
    scratch = range(seq, seq + 1)
    base = 100 if ctx.n_ctx > 400 else 1
    ctx.clear_seqs(scratch)
    ctx.decode([Row(0, base, (seq,), True)])  # warm-up

    def batch(n: int) -> None:
        ctx.decode([Row(220 + i, base + i, (seq,), True) for i in range(n)])

    curve = measure_curve(lambda: ctx.clear_seqs(scratch), batch, sizes, reps)
    ctx.clear_seqs(scratch)
    return curve


class LookaheadStepper:
    """Lookahead decoding: a Jacobi window and an n-gram pool, verified in one batch.

    llama.cpp only: the window's rows live in several KV sequences at once.
    """

    def __init__(self, target: LlamaTarget, lookahead: Lookahead) -> None:
        if target.ctx.n_seq_max < lookahead.max_seqs:
            raise ValueError(f"lookahead needs {lookahead.max_seqs} sequences")
        self.target, self.la = target, lookahead
        self.ctx, self.slot, self.pick = target.ctx, target.slot, target.pick
        self.stats = SpeculationStats(method=SpeculationMethod.LOOKAHEAD)
        self._started = False

    def step(self, root: int) -> list[int]:
        slot, la = self.slot, self.la
        if not self._started:
            la.reset(slot.tokens)
            self._started = True
        n_past = len(slot.tokens)
        for s in range(1, la.max_seqs):
            slot.clear(s)
            slot.copy(0, s)
        plan = la.plan(root)
        rows = [
            Row(r.token, n_past + r.depth, tuple(slot.seq(s) for s in r.seq_ids), r.want_logits)
            for r in plan.rows
        ]
        self.ctx.decode(rows)
        self.target.expect(plan.tree)  # plan rows 0 .. tree.n_rows - 1 are its rows
        picks = [-1] * len(plan.rows)
        for row in plan.logit_rows:  # llama_get_logits_ith takes the batch row index
            picks[row] = self.pick(row)
        result = la.update(plan, picks)
        accepted = len(result.accepted_tokens)
        n_keep = n_past + 1 + accepted
        slot.remove(-1, n_keep)
        if accepted:
            slot.keep(result.keep_seq)
            if result.keep_seq != 0:
                slot.copy(result.keep_seq, 0)
                slot.clear(result.keep_seq)
        for s in range(1, la.max_seqs):
            slot.clear(s)
        self.target.extend([root, *result.accepted_tokens])
        self.stats.steps += 1
        self.stats.drafted += plan.n_draft
        self.stats.accepted += accepted
        return [*result.accepted_tokens, result.next_token]
