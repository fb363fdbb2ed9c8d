"""When to speculate, and how far: expected tokens per step against the batch-cost curve.

A draft of ``k`` tokens is verified in one target batch of ``k + 1`` rows. If each draft
token is accepted with probability ``a`` (independently, stopping at the first miss), a
step yields on average ``E(k) = 1 + a + .. + a^k = (1 - a^(k+1)) / (1 - a)`` tokens and
costs ``cost(k + 1)`` single steps, so its speed relative to plain decoding is::

    speedup(k) = E(k) / cost(k + 1)

On a GPU ``cost`` stays near 1 for small batches and long drafts pay; on a 2-core CPU
``cost(8)`` is about 4, so only well-accepted short drafts do. The policy keeps a running
acceptance estimate per method (``AcceptanceStats``), picks the ``k`` that maximises the
speedup, and decodes plainly unless the best one beats plain by ``min_gain``.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from kode.backends.base import SpeculationMethod


def expected_tokens(accept: float, k: int) -> float:
    """Mean tokens per step for a chain draft of ``k`` tokens, per-token acceptance ``a``.

    Example:
        >>> expected_tokens(0.5, 2)  # 1 + 0.5 + 0.25
        1.75
    """
    if accept >= 1.0:
        return float(k + 1)
    return (1.0 - accept ** (k + 1)) / (1.0 - accept)


def break_even(curve: CostCurve, max_draft: int, min_gain: float) -> float:
    """The lowest per-token acceptance at which a draft of 1..``max_draft`` tokens is
    expected to reach ``min_gain`` x plain speed on ``curve`` (1.0: never).

    Example: on the 2-core CPU a 2-row batch costs 1.4 steps, so one drafted token must
    be accepted with ``a >= 1.05 * 1.4 - 1 = 0.47``; on a GPU-like curve far less.
        >>> round(break_even(CostCurve({1: 1, 2: 1.4, 4: 2.0, 8: 4.5}), 8, 1.05), 2)
        0.47
        >>> round(break_even(CostCurve({1: 90, 2: 100, 4: 110}), 8, 1.05), 2)
        0.17
    """

    def pays(a: float) -> bool:
        return any(
            expected_tokens(a, k) / curve.cost(k + 1) >= min_gain for k in range(1, max_draft + 1)
        )

    lo, hi = 0.0, 0.999
    if not pays(hi):
        return 1.0
    for _ in range(30):  # expected_tokens grows with a: bisect
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if pays(mid) else (mid, hi)
    return hi


class CostCurve:
    """Relative cost of a target decode batch of n rows (``cost(1) == 1.0``), from measurements.

    Linear between measured points, linear beyond the last two. Never decreasing: noise
    must not say a bigger batch is cheaper than a smaller one, so each measurement is
    raised to the largest one before it (``ms_by_rows`` holds the raised values). With a
    single point every row costs a full step.

    Example:
        >>> c = CostCurve({1: 90, 2: 120, 4: 165, 8: 380, 16: 600})
        >>> round(c.cost(3), 3), round(c.cost(32), 3)  # (120+165)/2/90, 600+(600-380)*2 /90
        (1.583, 11.556)
        >>> CostCurve({1: 30, 2: 28, 4: 40}).ms_by_rows  # 2 rows measured cheaper than 1
        {1: 30, 2: 30, 4: 40}
    """

    def __init__(self, ms_by_rows: Mapping[int, float], *, fixed: bool = False) -> None:
        """``fixed``: never updated from measurements (``CostTracker``): tests and
        benchmarks that need choices independent of the machine's load."""
        self.fixed = fixed
        if 1 not in ms_by_rows:
            raise ValueError("the curve needs the cost of a 1-row batch")
        if any(n < 1 for n in ms_by_rows) or any(ms <= 0 for ms in ms_by_rows.values()):
            raise ValueError(f"rows must be >= 1 and costs > 0: {dict(ms_by_rows)}")
        self._rows = sorted(ms_by_rows)
        self.ms_by_rows: dict[int, float] = {}
        floor = 0.0
        for n in self._rows:
            floor = self.ms_by_rows[n] = max(ms_by_rows[n], floor)
        base = self.ms_by_rows[1]
        self._cost = [self.ms_by_rows[n] / base for n in self._rows]

    def cost(self, rows: int) -> float:
        """Cost of a batch of ``rows`` rows, in single-row steps.

        Example: ``CostCurve({1: 1, 2: 1.4, 4: 2.0}).cost(3) == 1.7``.
        """
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        xs, ys = self._rows, self._cost
        if len(xs) == 1:
            return float(rows)
        i = bisect.bisect_left(xs, rows)
        if i < len(xs) and xs[i] == rows:
            return ys[i]
        if i == len(xs):  # beyond the last point: extend the last segment
            slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
            return ys[-1] + slope * (rows - xs[-1])
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)


class AcceptanceStats:
    """Running estimate of one method's per-token acceptance probability.

    Counts accepted tokens (successes) and accepted tokens plus the first miss (trials),
    both decayed by ``decay`` per step (an exponential moving average), and blends them
    with ``prior_weight`` pseudo-trials at ``prior``: ``(s + w*prior) / (t + w)``. When a
    method stops being used its counts keep decaying (``relax``) and the estimate returns
    to the prior, so it gets another chance.

    Example:
        >>> s = AcceptanceStats(prior=0.5, prior_weight=2.0, decay=1.0)
        >>> s.observe(drafted=4, accepted=4)  # 4 successes in 4 trials
        >>> s.estimate  # (4 + 1) / (4 + 2)
        0.8333333333333334
        >>> s.observe(drafted=4, accepted=1)  # 1 success, then a miss
        >>> s.estimate  # (5 + 1) / (6 + 2)
        0.75
    """

    def __init__(self, prior: float = 0.6, prior_weight: float = 4.0, decay: float = 0.9) -> None:
        if not 0.0 <= prior <= 1.0 or prior_weight <= 0.0 or not 0.0 < decay <= 1.0:
            raise ValueError(f"need 0<=prior<=1, prior_weight>0, 0<decay<=1: {prior=} {decay=}")
        self.prior = prior
        self.prior_weight = prior_weight
        self.decay = decay
        self.successes = 0.0
        self.trials = 0.0

    @property
    def estimate(self) -> float:
        """Current per-token acceptance probability."""
        w = self.prior_weight
        return (self.successes + w * self.prior) / (self.trials + w)

    def observe(self, drafted: int, accepted: int) -> None:
        """One step: ``accepted`` of ``drafted`` chain tokens were confirmed."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got {accepted=} {drafted=}")
        self.relax()
        self.successes += accepted
        self.trials += accepted + (1 if accepted < drafted else 0)

    def relax(self) -> None:
        """One step without an observation: old evidence fades toward the prior."""
        self.successes *= self.decay
        self.trials *= self.decay


class AdaptivePolicy:
    """Picks the draft length with the best expected speed for each speculation method.

    Call ``draft_len`` before each target step and ``observe`` after it, for plain steps
    too (method ``NONE``): every observation ages all estimates by one step.

    Where the curve makes drafting pay only at a high acceptance (``break_even`` above
    ``cautious_above``: a CPU, where a 2-row batch costs 1.4-1.7 steps) the policy is
    *cautious*, and ``auto`` decodes plainly there (``NgramStepper``). Measured on the
    2-core machine: one-shot ``kode complete`` runs lost 6-25% while the prior's optimism
    was unlearned; drafting only on long, agreed n-gram matches still changed one text in
    18 (verify batches compute logits 0.3-0.6 apart from one-row steps, and the cache they
    leave moves later near ties), for an oracle ceiling of 1.06-1.14x there.

    Example:
        >>> pol = AdaptivePolicy(CostCurve({1: 1, 2: 1.4, 4: 2.0, 8: 4.5}),
        ...                      [SpeculationMethod.NGRAM], prior_accept=0.9)
        >>> pol.draft_len(SpeculationMethod.NGRAM)  # E(3) = 3.44 tokens for cost(4) = 2.0
        3
        >>> for _ in range(20):
        ...     pol.observe(SpeculationMethod.NGRAM, drafted=3, accepted=0)
        >>> pol.draft_len(SpeculationMethod.NGRAM)
        0
        >>> cpu = AdaptivePolicy(CostCurve({1: 1, 2: 1.68, 4: 2.8, 8: 6.38}),
        ...                      [SpeculationMethod.NGRAM], prior_accept=0.9)
        >>> cpu.cautious  # break-even acceptance 0.76: auto decodes plainly
        True
    """

    def __init__(
        self,
        curve: CostCurve,
        methods: Sequence[SpeculationMethod],
        max_draft: int = 8,
        prior_accept: float = 0.6,
        min_gain: float = 1.05,
        *,
        prior_weight: float = 4.0,
        decay: float = 0.9,
        cautious_above: float = 0.35,
    ) -> None:
        if max_draft < 0:
            raise ValueError(f"need max_draft >= 0: {max_draft=}")
        if SpeculationMethod.NONE in methods or SpeculationMethod.AUTO in methods:
            raise ValueError("'none' and 'auto' are not drafting methods")
        self.curve = curve
        self.max_draft = max_draft
        self.min_gain = min_gain
        self.stats = {m: AcceptanceStats(prior_accept, prior_weight, decay) for m in methods}
        self.cautious_above = cautious_above
        self._break_even: tuple[CostCurve, float] | None = None

    @property
    def cautious(self) -> bool:
        """Whether drafting pays only at an acceptance above ``cautious_above`` here."""
        if self._break_even is None or self._break_even[0] is not self.curve:
            self._break_even = (self.curve, break_even(self.curve, self.max_draft, self.min_gain))
        return self._break_even[1] > self.cautious_above

    def draft_len(self, method: SpeculationMethod, limit: int | None = None) -> int:
        """Best draft length k (<= ``limit`` and ``max_draft``) for ``method`` now; 0 means
        decode plainly (the best expected speed is below ``min_gain`` x plain). ``auto``
        asks only where the policy is not ``cautious``.

        Example: see the class docstring.
        """
        accept = self._accept(method)
        kmax = self.max_draft if limit is None else min(limit, self.max_draft)
        k, speed = self._best(accept, kmax)
        return k if speed >= self.min_gain else 0

    def observe(self, method: SpeculationMethod, drafted: int, accepted: int) -> None:
        """Record one target step: ``accepted`` of ``drafted`` tokens from ``method``."""
        if method is not SpeculationMethod.NONE and method not in self.stats:
            raise ValueError(f"unknown method {method!r}; known: {sorted(self.stats)}")
        for m, stats in self.stats.items():
            if m is method:
                stats.observe(drafted, accepted)
            else:
                stats.relax()

    def _accept(self, method: SpeculationMethod) -> float:
        """Acceptance estimate for this step, capped below 1."""
        try:
            stats = self.stats[method]
        except KeyError:
            raise ValueError(f"unknown method {method!r}; known: {sorted(self.stats)}") from None
        return min(stats.estimate, 0.99)

    def _best(self, accept: float, kmax: int) -> tuple[int, float]:
        """``(k, speedup)`` maximising the speedup over 1 <= k <= kmax; ``(0, 1.0)`` if kmax < 1."""
        best_k, best_speed = 0, 1.0 / self.curve.cost(1)
        for k in range(1, kmax + 1):
            speed = expected_tokens(accept, k) / self.curve.cost(k + 1)
            if speed > best_speed or best_k == 0:
                best_k, best_speed = k, speed
        return best_k, best_speed


class CostTracker:
    """The batch-cost curve as the machine delivers it now, not only at load time.

    Starts from the calibrated curve; every timed target call updates an exponential
    moving average of ms per batch size, and ``curve()`` rebuilds the relative curve from
    them. When other processes compete for the cores, multi-row batches get relatively
    dearer (llama.cpp's threads wait on each other) and the policy sees it within a few
    steps.
    """

    def __init__(
        self, calibrated: Mapping[int, float], alpha: float = 0.2, *, fixed: bool = False
    ) -> None:
        self.ms = dict(calibrated)
        self.alpha = alpha
        self.fixed = fixed  # the calibrated curve stays as given
        self._dirty = False

    def record(self, rows: int, ms: float) -> None:
        if self.fixed:
            return
        old = self.ms.get(rows)
        self.ms[rows] = ms if old is None else (1 - self.alpha) * old + self.alpha * ms
        self._dirty = True

    def curve(self) -> CostCurve:
        self._dirty = False
        return CostCurve(self.ms)

    @property
    def dirty(self) -> bool:
        return self._dirty
