"""Speculative decoding on a transformers model: the torch half of ``backends/speculative``.

``CausalLM`` wraps a transformers causal LM and ONE KV cache (a ``DynamicCache``);
``tokens`` mirrors what the cache holds, position by position. Rolling back rejected
drafts is one call, ``crop(n)``. Each ``Stepper`` advances a generation by one *target*
call, with the same contract as the llama.cpp steppers (``root`` is the last emitted
token, not yet evaluated)::

    new = stepper.step(root)   # evaluate root (+ a draft chain) in ONE target forward
    # afterwards: lm.tokens == old tokens + [root] + new[:-1]   (the KV cache matches)
    #             new[-1] is the next root (the target's own choice, never a draft)

Drafts are single chains: one sequence, so the plain causal mask is the right one and
no 4D tree mask is needed (the llama.cpp runtime verifies n-gram *trees* through its
multi-sequence KV cache; a torch tree would need a 4D mask and a KV gather of the
accepted branch). Verification is sample-and-match (the target picks at every row,
argmax or a sample; a draft token is kept while it equals the pick), except for
draft-model drafts under sampling, which use the exact p/q rule (``accept_reject``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch
from kode.backends.base import Sampling, SpeculationStats
from kode.backends.errors import BackendError
from kode.backends.speculative import (
    AdaptivePolicy,
    CostCurve,
    LazyPicks,
    NgramDrafter,
    accept_reject,
    build_tree,
    draft_chain,
    sample_index,
    verify,
)
from kode.backends.speculative.ngram import common_prefix
from transformers import DynamicCache, PreTrainedModel

if TYPE_CHECKING:
    from kode.backends.speculative.policy import CostTracker

Probs = npt.NDArray[np.float64]
# (draft tokens [k], q [k, V], p [k + 1, V], rng) -> (accepted, next token)
AcceptRule = Callable[[Sequence[int], Probs, Probs, np.random.Generator], tuple[int, int]]


def _never() -> bool:
    return False


class PrefillAborted(Exception):
    """A prompt evaluation stopped early because the generation was cancelled."""

    def __init__(self, reused: int) -> None:
        super().__init__("prefill cancelled")
        self.reused = reused


class CausalLM:
    """A transformers causal LM and one KV cache; ``tokens`` mirrors the cache.

    Used from one thread at a time. ``forward`` appends, ``crop`` rolls back, ``prefill``
    reuses the longest common token prefix of the cache and a new prompt.
    """

    def __init__(self, model: PreTrainedModel, *, chunk: int = 256) -> None:
        self.model = model
        self.device = model.device
        self.vocab_size = int(model.config.get_text_config().vocab_size)
        self.chunk = chunk
        self.cache = DynamicCache(config=model.config)
        self.tokens: list[int] = []
        self.calls = 0  # every forward, prompt chunks included

    def reset(self) -> None:
        """Forget the cache."""
        self.cache = DynamicCache(config=self.model.config)
        self.tokens = []

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        """Evaluate ``tokens`` after ``self.tokens``; their float32 logits.

        Shapes: tokens [n] -> logits [n, V] ([1, V] with ``last_only``).
        """
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        try:
            with torch.inference_mode():
                out = self.model(
                    input_ids=ids,
                    cache=self.cache,
                    use_cache=True,
                    logits_to_keep=1 if last_only else 0,
                )
        except BaseException:
            self.reset()  # some layers may hold the new rows and others not
            raise
        self.calls += 1
        self.tokens.extend(tokens)
        logits: torch.Tensor = out.logits[0].float()
        return logits

    def crop(self, n: int) -> None:
        """Keep the first ``n`` cached positions, drop the rest (rejected drafts)."""
        extra = len(self.tokens) - n
        if extra > 0:
            self.cache.crop(-extra)  # transformers 5.x: a negative count of positions to drop
            del self.tokens[n:]

    def prefill(
        self, prompt: Sequence[int], cancelled: Callable[[], bool] = _never
    ) -> tuple[int, torch.Tensor]:
        """Bring the cache to ``prompt``; ``(reused positions, logits after the prompt [V])``.

        Reuses the longest common prefix, but always evaluates at least the last prompt
        token (its logits are needed). ``cancelled`` is checked before every chunk of
        ``self.chunk`` tokens; when it says so, ``PrefillAborted`` is raised.
        """
        if not prompt:
            raise BackendError("empty prompt")
        keep = min(common_prefix(self.tokens, list(prompt)), len(prompt) - 1)
        self.crop(keep)
        logits = None
        for start in range(keep, len(prompt), self.chunk):
            if cancelled():
                raise PrefillAborted(keep)
            logits = self.forward(prompt[start : start + self.chunk], last_only=True)
        assert logits is not None  # keep < len(prompt)
        return keep, logits[-1]

    def synchronize(self) -> None:
        """Wait for queued device work (for timing)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class Picker:
    """The target's (or draft's) choice from logits: argmax when greedy, else temperature
    and top-p sampling with a seeded generator (the same rule as ``llama.Sampler``)."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self.rng = np.random.default_rng(sampling.seed)

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    def probs(self, logits: torch.Tensor) -> Probs:
        """Sampling distributions of logit rows. Shapes: [n, V] -> [n, V] float64.

        Top-p keeps the most likely tokens up to and including the first that brings the
        cumulative probability to ``top_p``.
        """
        s = self.sampling
        p = torch.softmax(logits.double() / max(s.temperature, 1e-6), dim=-1)
        if s.top_p < 1.0:
            ranked, order = torch.sort(p, dim=-1, descending=True)
            keep = (torch.cumsum(ranked, dim=-1) - ranked) < s.top_p  # mass before < top_p
            p = torch.where(torch.zeros_like(keep).scatter(-1, order, keep), p, 0.0)
            p = p / p.sum(dim=-1, keepdim=True)
        out: Probs = p.cpu().numpy()
        return out

    def pick(self, logits: torch.Tensor) -> int:
        """One token from one logit row [V]."""
        if self.greedy:
            return int(torch.argmax(logits))
        return sample_index(self.probs(logits[None])[0], self.rng)


def timed_forward(lm: CausalLM, tokens: Sequence[int], tracker: CostTracker | None) -> torch.Tensor:
    """``lm.forward`` that reports its wall time by rows to ``tracker`` (when given)."""
    if tracker is None:
        return lm.forward(tokens)
    start = time.perf_counter()
    logits = lm.forward(tokens)
    lm.synchronize()
    tracker.record(len(tokens), (time.perf_counter() - start) * 1000.0)
    return logits


def verify_chain(
    lm: CausalLM,
    picker: Picker,
    root: int,
    chain: Sequence[int],
    tracker: CostTracker | None = None,
) -> tuple[list[int], int]:
    """Feed ``[root, *chain]`` in one forward; accept by sample-and-match; crop the rest.

    Returns ``(accepted draft tokens, next token)``; afterwards ``lm.tokens`` ends with
    ``root`` and the accepted tokens.
    """
    n_past = len(lm.tokens)
    logits = timed_forward(lm, [root, *chain], tracker)
    tree = build_tree(root, [list(chain)], max_rows=len(chain) + 1)
    result = verify(tree, LazyPicks(len(chain) + 1, lambda i: picker.pick(logits[i])))
    lm.crop(n_past + 1 + len(result.accepted_tokens))
    return list(result.accepted_tokens), result.next_token


class PlainStepper:
    """One token per target forward."""

    def __init__(self, lm: CausalLM, picker: Picker, tracker: CostTracker | None = None) -> None:
        self.lm, self.picker, self.tracker = lm, picker, tracker
        self.stats = SpeculationStats(method="none")

    def step(self, root: int) -> list[int]:
        logits = timed_forward(self.lm, [root], self.tracker)
        self.stats.steps += 1
        return [self.picker.pick(logits[0])]


class NgramStepper:
    """Prompt lookup: the best n-gram continuation (prompt, suffix, other documents, text
    so far) as a chain, verified in one forward by sample-and-match.

    ``policy`` picks the draft length from the cost curve and the acceptance seen so far;
    with ``allow_plain`` (``auto``) it may decode plainly when drafting does not pay. With
    a ``tracker`` (``auto``), every forward's time updates the cost curve the policy uses,
    and one step in ``PROBE_EVERY`` is plain to keep the 1-row cost current (as on
    llama.cpp).
    """

    PROBE_EVERY = 12

    def __init__(
        self,
        lm: CausalLM,
        picker: Picker,
        drafter: NgramDrafter,
        policy: AdaptivePolicy,
        *,
        allow_plain: bool,
        method: str = "ngram",
        tracker: CostTracker | None = None,
    ) -> None:
        self.lm, self.picker, self.drafter, self.policy = lm, picker, drafter, policy
        self.allow_plain = allow_plain
        self.tracker = tracker
        self.stats = SpeculationStats(method=method)
        self._plain = PlainStepper(lm, picker, tracker)

    def step(self, root: int) -> list[int]:
        if self.tracker is not None and self.tracker.dirty:
            self.policy.curve = self.tracker.curve()
        history = [*self.lm.tokens, root]
        max_draft = self.policy.max_draft
        probe = self.allow_plain and self.stats.steps % self.PROBE_EVERY == self.PROBE_EVERY - 1
        cands = self.drafter.propose(history, max_draft) if max_draft and not probe else []
        longest = len(cands[0]) if cands else 0
        k = 0
        if longest:
            k = self.policy.draft_len("ngram", limit=longest)
            if not self.allow_plain:
                k = max(1, k)
        self.stats.steps += 1
        if k == 0:
            self.policy.observe("none", 0, 0)
            return self._plain.step(root)
        accepted, nxt = verify_chain(self.lm, self.picker, root, cands[0][:k], self.tracker)
        self.policy.observe("ngram", k, len(accepted))
        self.stats.drafted += k
        self.stats.accepted += len(accepted)
        return [*accepted, nxt]


class DraftModelStepper:
    """A smaller model drafts a chain (stopping when its top probability falls below
    ``p_min``); the target verifies it in one forward.

    Greedy: the draft takes its argmax and the target keeps the matching prefix. Sampling:
    the draft *samples* each token from its distribution q, and ``rule`` (the exact p/q
    rule, ``accept_reject``) decides against the target's p. The stop test looks at the
    top probability only, never at the sampled token, so the draft length is a stopping
    time and the rule stays exact. ``rule`` is a parameter so that a test can show that a
    wrong rule is caught.
    """

    def __init__(
        self,
        lm: CausalLM,
        picker: Picker,
        draft: CausalLM,
        *,
        max_draft: int = 4,
        p_min: float = 0.6,
        rule: AcceptRule = accept_reject,
    ) -> None:
        if draft.vocab_size != lm.vocab_size:
            raise BackendError(
                f"draft vocabulary ({draft.vocab_size}) differs from the target's ({lm.vocab_size})"
            )
        self.lm, self.picker, self.draft = lm, picker, draft
        self.max_draft, self.p_min, self.rule = max_draft, p_min, rule
        self.stats = SpeculationStats(method="draft")

    def _draft_step(
        self, history: list[int], qs: list[Probs]
    ) -> Callable[[int], tuple[int, float]]:
        """``draft_chain``'s step: feed one token to the draft, return (token, top prob)."""
        draft, picker = self.draft, self.picker
        first = True

        def step(token: int) -> tuple[int, float]:
            nonlocal first
            if first:
                first = False
                _, logits = draft.prefill(history)  # reuses the draft's KV prefix
            else:
                logits = draft.forward([token])[-1]
            if picker.greedy:
                prob = torch.softmax(logits.double(), dim=-1)
                best = int(torch.argmax(prob))
                return best, float(prob[best])
            q = picker.probs(logits[None])[0]
            qs.append(q)
            return sample_index(q, picker.rng), float(q.max())

        return step

    def step(self, root: int) -> list[int]:
        lm, picker = self.lm, self.picker
        history = [*lm.tokens, root]
        qs: list[Probs] = []
        chain = draft_chain(self._draft_step(history, qs), root, self.max_draft, self.p_min)
        if picker.greedy:
            accepted, nxt = verify_chain(lm, picker, root, chain)
        else:
            n_past = len(lm.tokens)
            p = picker.probs(lm.forward([root, *chain]))  # [k + 1, V]
            q = np.stack(qs[: len(chain)]) if chain else np.empty((0, p.shape[1]))
            a, nxt = self.rule(chain, q, p, picker.rng)
            lm.crop(n_past + 1 + a)
            accepted = chain[:a]
        # The draft's KV past the accepted point is stale; its next prefill trims it.
        self.stats.steps += 1
        self.stats.drafted += len(chain)
        self.stats.accepted += len(accepted)
        return [*accepted, nxt]


def calibrate(lm: CausalLM, sizes: Sequence[int] = (1, 2, 4, 8), reps: int = 2) -> CostCurve:
    """Measure the model's forward cost by rows (ms), on a scratch cache after ~64 tokens.

    Leaves ``lm``'s own cache untouched.
    """
    scratch = CausalLM(lm.model)
    context = [(220 + i) % lm.vocab_size for i in range(64)]
    scratch.forward(context, last_only=True)
    scratch.forward([context[0]])  # warm-up
    ms: dict[int, float] = {}
    for n in sizes:
        best = float("inf")
        for _ in range(reps):
            scratch.crop(len(context))
            scratch.synchronize()
            t = time.perf_counter()
            scratch.forward(context[:n])
            scratch.synchronize()
            best = min(best, time.perf_counter() - t)
        ms[n] = max(best * 1000.0, 1e-3)
    floor = 0.0  # never let noise say a bigger batch is cheaper than a smaller one
    for n in sorted(ms):
        floor = ms[n] = max(ms[n], floor)
    return CostCurve(ms)
