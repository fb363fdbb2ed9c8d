"""A transformers causal LM as a ``steppers.Target``, and its draft model.

``CausalLM`` wraps a transformers causal LM and ONE KV cache (a ``DynamicCache``);
``tokens`` mirrors what the cache holds, position by position. Rolling back rejected
drafts is one call, ``crop(n)``. Drafts are single chains: one sequence, so the plain
causal mask is the right one and no 4D tree mask is needed (the llama.cpp target
verifies n-gram *trees* through its multi-sequence KV cache; a torch tree would need a
4D mask and a KV gather of the accepted branch).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

import numpy as np
import torch
from kode.backends.base import Sampling
from kode.backends.errors import BackendError, PrefillAborted
from kode.backends.kv_reuse import common_prefix
from kode.backends.speculative import CostCurve, TokenTree, draft_chain, sample_index
from kode.backends.steppers import Draft, Prefilled, Probs, measure_curve, never
from transformers import DynamicCache, PreTrainedModel


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
        self, prompt: Sequence[int], cancelled: Callable[[], bool] = never
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


class TorchTarget:
    """One generation's view of a ``CausalLM``: its cache and a ``Picker``. Chains only
    (one sequence: the plain causal mask is the right one)."""

    trees = False

    def __init__(self, lm: CausalLM, picker: Picker) -> None:
        self.lm, self.picker = lm, picker
        self._logits: torch.Tensor | None = None  # rows of the last batch [n, V]
        self._n_past = 0

    @property
    def tokens(self) -> list[int]:
        return self.lm.tokens

    @property
    def rng(self) -> np.random.Generator:
        return self.picker.rng

    def prefill(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Prefilled:
        """``CausalLM.prefill`` (exact prefix reuse only: ``max_drift`` is llama.cpp's)."""
        reused, logits = self.lm.prefill(prompt, cancelled)
        self._logits = logits[None]
        return Prefilled(reused)

    def prefill_steps(
        self, prompt: Sequence[int], cancelled: Callable[[], bool], max_drift: int
    ) -> Generator[None, None, Prefilled]:
        """``prefill`` in one go: one cache serves one generation at a time."""
        done = self.prefill(prompt, cancelled, max_drift)
        yield from ()  # a generator that never pauses
        return done

    def release(self) -> None:
        """Nothing to give back: the engine has one cache (``TorchEngine.width`` 1)."""

    def evaluate(self, tree: TokenTree) -> None:
        if tree.n_branches > 1:
            raise ValueError("the torch target verifies chains only")
        self._n_past = len(self.lm.tokens)
        self._logits = self.lm.forward(tree.tokens)

    def _rows(self) -> torch.Tensor:
        if self._logits is None:
            raise BackendError("no batch evaluated yet")
        return self._logits

    def pick(self, row: int) -> int:
        return self.picker.pick(self._rows()[row])

    @property
    def near_tie(self) -> float:
        """In fp32 a batch and a one-row step differ by float rounding only, judged at
        1e-3 as ``kode bench speculation`` does; half precision rounds far coarser (0.5
        assumed, not measured here)."""
        return 1e-3 if self.lm.model.dtype == torch.float32 else 0.5

    def margin(self, row: int) -> float:
        if not self.picker.greedy:
            return float("inf")
        top2 = torch.topk(self._rows()[row].float(), 2).values
        return float(top2[0] - top2[1])

    def pick_among(self, row: int, allowed: Sequence[int]) -> int:
        logits = self._rows()[row]
        ids = torch.as_tensor(list(allowed), dtype=torch.long, device=logits.device)
        masked = torch.full_like(logits, float("-inf"))
        masked[ids] = logits[ids]
        return self.picker.pick(masked)

    def probs(self, rows: int) -> Probs:
        return self.picker.probs(self._rows()[:rows])

    def commit(self, tree: TokenTree, accepted: int, branch: int) -> None:
        self.lm.crop(self._n_past + 1 + accepted)

    def synchronize(self) -> None:
        self.lm.synchronize()


class TorchDraft:
    """A smaller transformers model drafting a chain: its argmax when greedy, else samples
    from its distribution q (with the target's generator) for the exact p/q rule."""

    def __init__(self, lm: CausalLM, picker: Picker) -> None:
        self.lm, self.picker = lm, picker

    def draft(self, history: list[int], max_draft: int, p_min: float) -> Draft:
        lm, picker = self.lm, self.picker
        qs: list[Probs] = []
        first = True

        def step(token: int) -> tuple[int, float]:
            """``draft_chain``'s step: feed one token, return (token, top probability)."""
            nonlocal first
            if first:
                first = False
                _, logits = lm.prefill(history)  # reuses the draft's KV prefix
            else:
                logits = lm.forward([token])[-1]
            if picker.greedy:
                prob = torch.softmax(logits.double(), dim=-1)
                best = int(torch.argmax(prob))
                return best, float(prob[best])
            q = picker.probs(logits[None])[0]
            qs.append(q)
            return sample_index(q, picker.rng), float(q.max())

        chain = draft_chain(step, history[-1], max_draft, p_min)
        if picker.greedy:
            return Draft(chain)
        q = np.stack(qs[: len(chain)]) if chain else np.empty((0, lm.vocab_size))
        return Draft(chain, q)


def calibrate(lm: CausalLM, sizes: Sequence[int] = (1, 2, 4, 8), reps: int = 2) -> CostCurve:
    """Measure the model's forward cost by rows (ms), on a scratch cache after ~64 tokens.

    Leaves ``lm``'s own cache untouched.
    """
    scratch = CausalLM(lm.model)
    context = [(220 + i) % lm.vocab_size for i in range(64)]
    scratch.forward(context, last_only=True)
    scratch.forward([context[0]])  # warm-up

    def reset() -> None:
        scratch.crop(len(context))
        scratch.synchronize()

    def batch(n: int) -> None:
        scratch.forward(context[:n])
        scratch.synchronize()

    return measure_curve(reset, batch, sizes, reps)
