"""A region's rewrite, decoded greedily with the region's current text as the draft.

``EditStepper`` is a ``steppers.Stepper``: each step verifies the draft's continuation
where the output is (``speculative.edits.CopyDrafter``) in one batch sized from the cost
curve (``EditSizer``), accepts the longest prefix that equals the target's argmax, plus
the target's own next token, and rolls the KV cache back beyond it (``Target.commit``).
With no draft, or when sizing says a draft does not pay, a step is a plain one-row step,
so plain greedy decoding is the same code with an empty draft.

``decode_rewrite`` runs a prompt to its end on any ``Target`` (stop token, stop text,
``max_tokens``, or a cancel, checked before every batch); ``rewrite`` does it on a
llama.cpp context. Lossless: every emitted token is the target's argmax after the tokens
before it. llama.cpp computes a multi-row batch with other kernels than a one-row step,
so logits differ slightly (0.3-0.6 on these quantized CPU kernels) and a near tie could be
picked otherwise; with ``guard_ties`` a batch is cut before any pick whose top two logits
are closer than ``Target.near_tie`` and that pick is made by a one-row step, as ``auto``
does (``steppers.NgramStepper``).
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kode.backends.base import FinishReason, Sampling, SpeculationMethod, SpeculationStats
from kode.backends.errors import ContextOverflow, PrefillAborted
from kode.backends.llama.runtime import LlamaContext
from kode.backends.llama.target import LlamaTarget, Sampler
from kode.backends.speculative import CostCurve, LazyPicks, build_tree, verify
from kode.backends.speculative.edits import CopyDrafter, EditSizer
from kode.backends.steppers import PlainStepper, Target, never
from kode.backends.stop_strings import find_stop


class EditStepper:
    """Copy speculation, one target batch a step (the ``Stepper`` contract).

    ``start``: where the output begins in ``target.tokens`` (the prompt's length);
    ``max_tokens``: no draft reaches past that many output tokens. Stats count draft
    tokens under ``SpeculationMethod.NGRAM`` (copy speculation is prompt lookup whose
    source is the region).
    """

    def __init__(
        self,
        target: Target,
        drafter: CopyDrafter,
        sizer: EditSizer,
        *,
        start: int,
        max_tokens: int | None = None,
        guard_ties: bool = True,
    ) -> None:
        self.target, self.drafter, self.sizer = target, drafter, sizer
        self.start, self.max_tokens, self.guard_ties = start, max_tokens, guard_ties
        self.stats = SpeculationStats(method=SpeculationMethod.NGRAM)
        self.batches: list[int] = []  # rows of each target batch, in order
        self._plain = PlainStepper(target)

    def step(self, root: int) -> list[int]:
        target, stats = self.target, self.stats
        output = [*target.tokens[self.start :], root]
        limit = None if self.max_tokens is None else max(0, self.max_tokens - len(output) - 1)
        proposal = self.drafter.propose(output, self.sizer.max_batch - 1)
        k = self.sizer.size(proposal, limit)
        stats.steps += 1
        if k == 0:
            return self._plain_step(root)
        tree = build_tree(root, [proposal.tokens[:k]], max_rows=k + 1)
        target.evaluate(tree)
        self.batches.append(tree.n_rows)
        result = verify(tree, LazyPicks(tree.n_rows, target.pick))
        accepted = len(result.accepted_tokens)
        self.sizer.observe(proposal.match, k, accepted)
        stats.drafted += k
        tie = self._near_tie(accepted) if self.guard_ties else None
        if tie is None:
            target.commit(tree, accepted, 0)
            stats.accepted += accepted
            return [*result.accepted_tokens, result.next_token]
        stats.near_ties += 1
        if tie == 0:  # the root's own pick is a near tie: evaluate the root alone
            target.commit(tree, -1, 0)
            return self._plain_step(root)
        # Keep what the rows before the tie decided; the tie's row is evaluated alone
        # next step (its token is the next root).
        target.commit(tree, tie - 1, 0)
        stats.accepted += tie - 1
        return list(result.accepted_tokens[:tie])

    def _plain_step(self, root: int) -> list[int]:
        self.batches.append(1)
        return self._plain.step(root)

    def _near_tie(self, accepted: int) -> int | None:
        """The first row of the accepted path (a chain: rows 0..accepted) whose pick is a
        near tie, or None."""
        near = self.target.near_tie
        for row in range(accepted + 1):
            if self.target.margin(row) < near:
                return row
        return None


@dataclass(slots=True)
class Rewrite:
    """What ``decode_rewrite`` made: the tokens (a stop token excluded; the token that
    completed a stop text included), their text (cut before a stop text), why it ended,
    what speculation did, the rows of each batch after the prompt's, and the times
    (``decode_ms``: after the first token, which the prompt's evaluation gives)."""

    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish: FinishReason = FinishReason.LENGTH
    speculation: SpeculationStats = field(default_factory=SpeculationStats)
    batches: list[int] = field(default_factory=list)
    prefill_ms: float = 0.0
    decode_ms: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: tokens after the first per second of ``decode_ms``."""
        made = len(self.tokens) - 1
        return 0.0 if made <= 0 or self.decode_ms <= 0 else made * 1000.0 / self.decode_ms


def decode_rewrite(
    target: Target,
    prompt: Sequence[int],
    draft: Sequence[int],
    curve: CostCurve,
    *,
    max_tokens: int,
    is_stop: Callable[[int], bool],
    piece: Callable[[int], bytes],
    stop_texts: Sequence[str] = (),
    cancelled: Callable[[], bool] = never,
    learn: bool = True,
    guard_ties: bool = True,
    max_batch: int = 64,
) -> Rewrite:
    """Greedy decoding of ``prompt`` on ``target`` with ``draft`` (token ids: the region's
    current text) verified in batches; ``draft=[]`` is plain greedy decoding.

    Ends at a stop token (``is_stop``), a stop text, ``max_tokens`` or when
    ``cancelled()`` turns true (checked during the prompt and before every batch).
    ``learn``: the drafter applies an edit it saw to the rest of the draft
    (``CopyDrafter``); ``max_batch``: rows per verify batch at most.
    """
    out = Rewrite()
    begin = time.perf_counter()
    try:
        target.prefill(prompt, cancelled, 0)
    except PrefillAborted:
        out.finish = FinishReason.CANCELLED
        return out
    out.prefill_ms = (time.perf_counter() - begin) * 1000.0
    begin = time.perf_counter()
    drafter = CopyDrafter(draft, learn=learn)
    stepper = EditStepper(
        target,
        drafter,
        EditSizer(curve, max_batch=max_batch),
        start=len(prompt),
        max_tokens=max_tokens,
        guard_ties=guard_ties,
    )
    out.speculation, out.batches = stepper.stats, stepper.batches
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = [target.pick(-1)]
    try:
        while True:
            for token in pending:
                if is_stop(token):
                    out.finish = FinishReason.END
                    return out
                out.tokens.append(token)
                new = text.decode(piece(token))
                out.text += new
                hit = find_stop(out.text, stop_texts, len(out.text) - len(new))
                if hit is not None:
                    out.text = out.text[: hit[0]]
                    out.finish = FinishReason.END
                    return out
                if len(out.tokens) >= max_tokens:
                    out.finish = FinishReason.LENGTH
                    return out
            if cancelled():
                out.finish = FinishReason.CANCELLED
                return out
            pending = stepper.step(pending[-1])
    finally:
        out.decode_ms = (time.perf_counter() - begin) * 1000.0


def rewrite(
    ctx: LlamaContext,
    prompt: str,
    draft: str,
    curve: CostCurve,
    *,
    max_tokens: int,
    stop_texts: Sequence[str] = (),
    cancelled: Callable[[], bool] = never,
    learn: bool = True,
    guard_ties: bool = True,
    max_batch: int = 64,
) -> Rewrite:
    """``decode_rewrite`` on a llama.cpp context, in a slot of its own for the call
    (what the slot holds stays for the next prompt). ``prompt`` may hold special tokens;
    ``draft`` is plain text, tokenized as such (pass "" for plain greedy decoding).
    Call on the llama.cpp thread (``library.llama_thread``) where other work shares it.
    """
    model = ctx.model
    tokens = model.tokenize(prompt)
    rows = min(max_batch, ctx.n_batch)
    if len(tokens) + max_tokens + 1 > ctx.n_ctx:
        raise ContextOverflow(
            f"prompt ({len(tokens)} tokens) + max_tokens ({max_tokens}) exceeds the "
            f"context window ({ctx.n_ctx})"
        )
    target = LlamaTarget(ctx, Sampler(Sampling()))
    try:
        return decode_rewrite(
            target,
            tokens,
            model.tokenize(draft, special=False) if draft else [],
            curve,
            max_tokens=max_tokens,
            is_stop=model.is_stop,
            piece=model.piece,
            stop_texts=stop_texts,
            cancelled=cancelled,
            learn=learn,
            guard_ties=guard_ties,
            max_batch=rows,
        )
    finally:
        target.release()
