"""Decoding methods, written once over any local engine's ``Target``.

A ``Target`` is one generation's view of an engine's KV cache and sampler: llama.cpp's
multi-sequence context (``backends/llama/target.py``) or a transformers model with one
croppable cache (``backends/torch/target.py``). Each ``Stepper`` advances a generation by
one *target* call, with one contract for every method (``root`` is the last emitted
token, not yet evaluated)::

    new = stepper.step(root)   # evaluate root (+ drafts) in ONE target batch
    # afterwards: target.tokens == old tokens + [root] + new[:-1]   (the KV cache matches)
    #             new[-1] is the next root (the target's own choice, never a draft)

so cancellation, stop tokens and ``max_tokens`` stay the caller's business and a cancel
still stops within one (verify) step. Drafts are verified by sample-and-match: the
target picks its token at every row (argmax when greedy, a sample otherwise) and a draft
token is accepted only if it equals that pick, so the output is exactly what plain
decoding would produce; picks are computed lazily, only for rows on the accepted path.
Draft-model chains sampled from the draft's own distribution ``q`` use the exact p/q
rule (``accept_reject``) instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt
from kode.backends.base import SpeculationMethod, SpeculationStats
from kode.backends.heal_index import HealIndex
from kode.backends.speculative import (
    AdaptivePolicy,
    CostCurve,
    CostTracker,
    LazyPicks,
    NgramDrafter,
    TokenTree,
    Verification,
    accept_reject,
    build_tree,
    verify,
)

Probs = npt.NDArray[np.float64]
# (draft tokens [k], q [k, V], p [k + 1, V], rng) -> (accepted, next token)
AcceptRule = Callable[[Sequence[int], Probs, Probs, np.random.Generator], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class Prefilled:
    """What a prompt evaluation reused: ``reused`` positions kept from the cache, of them
    ``moved`` entries that only moved after an edit (llama.cpp's moved-tail reuse)."""

    reused: int
    moved: int = 0


@runtime_checkable
class ChunkTarget(Protocol):
    """A target whose engine keeps evaluated chunks of text (llama.cpp's
    ``kv_chunks.Assembler``): a window may be assembled from them, a text read into them.
    """

    def assemble_steps(
        self, prompt: Sequence[int], cancelled: Callable[[], bool]
    ) -> Generator[None, None, int]:
        """Bring the cache to the window of ``prompt`` from stored chunks where that
        pays (before ``prefill_steps``, which then evaluates the rest); returns the
        prompt tokens taken without evaluation (0: nothing done)."""
        ...

    def read_steps(
        self, prompt: Sequence[int], cancelled: Callable[[], bool]
    ) -> Generator[None, None, int]:
        """Read ``prompt`` (whole lines) into the chunk store; returns the tokens
        evaluated."""
        ...


class Target(Protocol):
    """One generation's view of an engine: its KV cache and its sampler.

    ``evaluate`` runs one batch (a token tree after ``tokens``); ``pick(row)`` is the
    target's choice after row ``row`` of that batch (``pick(-1)`` after ``prefill``: the
    first generated token); ``commit`` keeps the root and the accepted rows of one branch
    and drops the rest. Between ``evaluate`` and ``commit``, ``tokens`` is unspecified.
    """

    @property
    def trees(self) -> bool:
        """Whether a batch may hold several branches (else drafts are single chains)."""
        ...

    @property
    def tokens(self) -> list[int]:
        """What the KV cache holds, position by position."""
        ...

    @property
    def rng(self) -> np.random.Generator:
        """The sampler's generator (shared with a sampling draft model)."""
        ...

    def prefill(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Prefilled:
        """Bring the cache to ``prompt`` (always evaluating its last token); raises
        ``PrefillAborted`` when ``cancelled()`` turns true."""
        ...

    def prefill_steps(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Generator[None, None, Prefilled]:
        """``prefill`` that pauses (yields) between prompt batches, so that other
        generations of the same engine may step there; never after its last batch, whose
        logits ``pick(-1)`` reads. An engine that cannot interleave never pauses."""
        ...

    def release(self) -> None:
        """The generation ended: give back what it held of the engine (a llama.cpp
        slot); what the cache holds stays for the next prompt."""
        ...

    def evaluate(self, tree: TokenTree) -> None: ...

    def pick(self, row: int) -> int: ...

    def margin(self, row: int) -> float:
        """How far the pick after row ``row`` is ahead of the runner-up, in logits
        (greedy); ``inf`` when sampling (no pick is a tie to guard)."""
        ...

    @property
    def near_tie(self) -> float:
        """The margin below which a verify batch's pick may differ from a one-row step's
        on this engine's kernels (logits)."""
        ...

    def pick_among(self, row: int, allowed: Sequence[int]) -> int:
        """``pick(row)`` restricted to the token ids ``allowed`` (token healing)."""
        ...

    def probs(self, rows: int) -> Probs:
        """Sampling distributions after the first ``rows`` rows of the last batch [rows, V]."""
        ...

    def commit(self, tree: TokenTree, accepted: int, branch: int) -> None: ...

    def synchronize(self) -> None:
        """Wait for queued device work (for timing)."""
        ...


@dataclass(frozen=True, slots=True)
class Draft:
    """A draft model's chain; ``q`` [k, V] when it was sampled (exact p/q rule), else None
    (the draft's argmax: sample-and-match)."""

    tokens: list[int]
    q: Probs | None = None


class DraftModel(Protocol):
    """A smaller model that drafts a chain after ``history`` (its last token the root),
    at most ``max_draft`` tokens, stopping when its top probability falls below ``p_min``."""

    def draft(self, history: list[int], max_draft: int, p_min: float) -> Draft: ...


class Stepper(Protocol):
    """One target step of a decoding method: from the last token, the tokens it yields."""

    stats: SpeculationStats

    def step(self, root: int) -> list[int]: ...


R = TypeVar("R")


def never() -> bool:
    """The abort test of work nothing cancels."""
    return False


def drain_steps(steps: Generator[None, None, R]) -> R:
    """Run a generator that pauses between steps (``prefill_steps``) to its end at once;
    what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: R = done.value
            return result


def timed_evaluate(target: Target, tree: TokenTree, tracker: CostTracker | None) -> None:
    """``target.evaluate`` that reports its wall time by rows to ``tracker`` (when given)."""
    if tracker is None:
        target.evaluate(tree)
        return
    start = time.perf_counter()
    target.evaluate(tree)
    target.synchronize()
    tracker.record(tree.n_rows, (time.perf_counter() - start) * 1000.0)


def measure_curve(
    reset: Callable[[], None],
    batch: Callable[[int], None],
    sizes: Sequence[int] = (1, 2, 4, 8),
    reps: int = 2,
) -> CostCurve:
    """The batch-cost curve: best of ``reps`` timings of ``batch(n)`` (ms), ``reset()``
    (untimed) before each. The engine warms up and cleans up around it."""
    ms: dict[int, float] = {}
    for n in sizes:
        best = float("inf")
        for _ in range(reps):
            reset()
            start = time.perf_counter()
            batch(n)
            best = min(best, time.perf_counter() - start)
        ms[n] = max(best * 1000.0, 1e-3)
    return CostCurve(ms)


def heal(
    target: Target,
    index: HealIndex,
    text: bytes,
    limit: int,
    cancelled: Callable[[], bool],
) -> list[int]:
    """The first tokens of a generation that must spell ``text`` (token healing), right
    after ``prefill``: each is the target's pick among the tokens that fit
    (``HealIndex.allowed``), one plain step per token until ``text`` is spelled, ``limit``
    tokens are made or ``cancelled()``. The result has the shape of a stepper's: every
    token but the last is evaluated and in the cache, the last is the next root.

    Example: ``text = b"pro"`` may give ``[process]`` (one token, nothing evaluated) or
    ``[p, ro]`` (``p`` evaluated, ``ro`` the root). Should no token fit (a vocabulary
    without single bytes), the unconstrained pick is returned and the caller sees a
    generation that does not spell ``text``.
    """
    out: list[int] = []
    row = -1  # the prompt's last row
    while True:
        allowed = index.allowed(text)
        out.append(target.pick_among(row, allowed) if allowed else target.pick(row))
        text = index.rest(text, out[-1]) if allowed else b""
        if not text or len(out) >= limit or cancelled():
            return out
        tree = build_tree(out[-1], [], max_rows=1)
        target.evaluate(tree)
        target.commit(tree, 0, 0)
        row = 0


class PlainStepper:
    """One token per target call (``method``: what the stats say ran; ``auto`` when it
    chose plain decoding)."""

    def __init__(
        self,
        target: Target,
        tracker: CostTracker | None = None,
        method: SpeculationMethod = SpeculationMethod.NONE,
    ) -> None:
        self.target, self.tracker = target, tracker
        self.stats = SpeculationStats(method=method)

    def step(self, root: int) -> list[int]:
        tree = build_tree(root, [], max_rows=1)
        timed_evaluate(self.target, tree, self.tracker)
        token = self.target.pick(0)
        self.target.commit(tree, 0, 0)
        self.stats.steps += 1
        return [token]


def step_each(steps: Sequence[tuple[Target, int]]) -> list[int]:
    """``Engine.step_together`` for an engine that evaluates one generation per batch:
    a plain step of each in turn."""
    return [PlainStepper(target).step(root)[0] for target, root in steps]


class NgramStepper:
    """Prompt lookup: candidates from the prompt, the suffix, other documents and the text
    generated so far, merged into a token tree (a single chain where the target verifies
    chains only) and verified in one batch.

    ``policy`` picks the draft length from the batch-cost curve and the acceptance seen so
    far; with ``allow_plain`` (``auto``) it may decide that drafting does not pay this
    step, and on a machine where drafting pays only at a high acceptance
    (``AdaptivePolicy.cautious``) it decodes plainly throughout; otherwise (``ngram``) it
    drafts whenever a candidate exists. With a ``tracker`` every batch's time updates the
    curve the policy uses, and one step in ``PROBE_EVERY`` is plain to keep the 1-row cost
    current. ``auto`` leaves a near-tie pick in a verify batch to a one-row step.
    """

    PROBE_EVERY = 12

    def __init__(
        self,
        target: Target,
        drafter: NgramDrafter,
        policy: AdaptivePolicy,
        *,
        allow_plain: bool,
        method: SpeculationMethod = SpeculationMethod.NGRAM,
        tracker: CostTracker | None = None,
    ) -> None:
        self.target, self.drafter, self.policy = target, drafter, policy
        self.allow_plain = allow_plain
        self.max_candidates = 3 if target.trees else 1
        self.tracker = tracker
        self.stats = SpeculationStats(method=method)
        self._plain = PlainStepper(target, tracker)
        self._untimed = PlainStepper(target)

    def step(self, root: int) -> list[int]:
        policy, stats = self.policy, self.stats
        if self.allow_plain and policy.cautious:
            # auto where drafts must be accepted at a high rate to pay (a CPU): plain
            # decoding, the same text as `none` (see ``AdaptivePolicy``); untimed, so
            # that one-row times alone never talk the curve out of it.
            stats.steps += 1
            return self._untimed.step(root)
        if self.tracker is not None and self.tracker.dirty:
            policy.curve = self.tracker.curve()
        probe = self.allow_plain and stats.steps % self.PROBE_EVERY == self.PROBE_EVERY - 1
        cands: list[list[int]] = []
        if policy.max_draft and not probe:
            history = [*self.target.tokens, root]
            cands = self.drafter.propose(history, policy.max_draft, self.max_candidates)
        k = self._draft_len(max((len(c) for c in cands), default=0))
        stats.steps += 1
        if k == 0:
            policy.observe(SpeculationMethod.NONE, 0, 0)
            return self._plain.step(root)
        cands = [c[:k] for c in cands]
        # The first candidate gets k rows; later ones may add a short side branch.
        extra = min(2, sum(len(c) for c in cands[1:]))
        tree = build_tree(root, cands, max_rows=k + 1 + extra)
        timed_evaluate(self.target, tree, self.tracker)
        result = verify(tree, LazyPicks(tree.n_rows, self.target.pick))
        accepted = len(result.accepted_tokens)
        drafted = tree.n_rows - 1
        tie = self._near_tie(result) if self.allow_plain else None
        policy.observe(
            SpeculationMethod.NGRAM,
            min(drafted, k),
            accepted if tie is None else min(accepted, tie),
        )
        stats.drafted += drafted
        if tie is None:
            self.target.commit(tree, accepted, result.branch)
            stats.accepted += accepted
            return [*result.accepted_tokens, result.next_token]
        stats.near_ties += 1
        if tie == 0:  # even the root's pick is a near tie: evaluate the root alone
            self.target.commit(tree, -1, result.branch)
            stats.steps += 1
            return self._plain.step(root)
        # Keep what the rows before the tie decided; the tie's row is evaluated alone
        # next step (its token becomes the next root).
        self.target.commit(tree, tie - 1, result.branch)
        stats.accepted += tie - 1
        return list(result.accepted_tokens[:tie])

    def _near_tie(self, result: Verification) -> int | None:
        """The first position on the accepted path whose pick is a near tie (its top two
        logits within ``Target.near_tie``), or None.

        A verify batch computes its rows with other kernels than a one-row step, so their
        logits differ (llama.cpp's quantized kernels here: up to 0.3-0.6, on the 0.5B, 60
        rows, median 0.32). Where the top two are closer than that, the batch may pick what
        plain decoding would not; ``auto`` must not change the text, so such a pick is
        left to a one-row step.
        """
        path = (0, *result.accepted_rows)
        near = self.target.near_tie
        for i, row in enumerate(path):
            if self.target.margin(row) < near:
                return i
        return None

    def _draft_len(self, longest: int) -> int:
        if not longest:
            return 0
        if self.allow_plain:
            return self.policy.draft_len(SpeculationMethod.NGRAM, limit=longest)
        return max(1, self.policy.draft_len(SpeculationMethod.NGRAM, limit=longest))


class DraftModelStepper:
    """A smaller model drafts a chain; the target verifies it in one batch.

    A greedy draft (``q`` None) is verified by sample-and-match. A sampled draft is
    judged by ``rule`` (the exact p/q rule, ``accept_reject``) against the target's
    distributions; the draft's stop test looks at its top probability only, never at
    the sampled token, so the draft length is a stopping time and the rule stays exact.
    ``rule`` is a parameter so that a test can show that a wrong rule is caught.
    """

    def __init__(
        self,
        target: Target,
        draft: DraftModel,
        *,
        max_draft: int = 4,
        p_min: float = 0.6,
        rule: AcceptRule = accept_reject,
    ) -> None:
        self.target, self.draft = target, draft
        self.max_draft, self.p_min, self.rule = max_draft, p_min, rule
        self.stats = SpeculationStats(method=SpeculationMethod.DRAFT)

    def step(self, root: int) -> list[int]:
        target = self.target
        draft = self.draft.draft([*target.tokens, root], self.max_draft, self.p_min)
        chain = draft.tokens
        tree = build_tree(root, [chain] if chain else [], max_rows=len(chain) + 1)
        target.evaluate(tree)
        if draft.q is None:
            result = verify(tree, LazyPicks(tree.n_rows, target.pick))
            accepted, nxt, branch = list(result.accepted_tokens), result.next_token, result.branch
        else:
            a, nxt = self.rule(chain, draft.q, target.probs(tree.n_rows), target.rng)
            accepted, branch = chain[:a], 0
        target.commit(tree, len(accepted), branch)
        # The draft's KV past the accepted point is stale; its next prefill trims it.
        self.stats.steps += 1
        self.stats.drafted += len(chain)
        self.stats.accepted += len(accepted)
        return [*accepted, nxt]
