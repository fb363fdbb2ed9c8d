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

NONE = "none"  # the method name for plain decoding


def expected_tokens(accept: float, k: int) -> float:
    """Mean tokens per step for a chain draft of ``k`` tokens, per-token acceptance ``a``.

    Example:
        >>> expected_tokens(0.5, 2)  # 1 + 0.5 + 0.25
        1.75
    """
    if accept >= 1.0:
        return float(k + 1)
    return (1.0 - accept ** (k + 1)) / (1.0 - accept)


class CostCurve:
    """Relative cost of a target decode batch of n rows (``cost(1) == 1.0``), from measurements.

    Linear between measured points, linear beyond the last two (never decreasing). With a
    single point every row costs a full step.

    Example:
        >>> c = CostCurve({1: 90, 2: 120, 4: 165, 8: 380, 16: 600})
        >>> round(c.cost(3), 3), round(c.cost(32), 3)  # (120+165)/2/90, 600+(600-380)*2 /90
        (1.583, 11.556)
    """

    def __init__(self, ms_by_rows: Mapping[int, float]) -> None:
        if 1 not in ms_by_rows:
            raise ValueError("the curve needs the cost of a 1-row batch")
        if any(n < 1 for n in ms_by_rows) or any(ms <= 0 for ms in ms_by_rows.values()):
            raise ValueError(f"rows must be >= 1 and costs > 0: {dict(ms_by_rows)}")
        base = ms_by_rows[1]
        self.ms_by_rows = dict(ms_by_rows)
        self._rows = sorted(ms_by_rows)
        self._cost = [ms_by_rows[n] / base for n in self._rows]

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
    """Picks the speculation method and draft length with the best expected speed.

    Call ``choose`` (or ``draft_len``) before each target step and ``observe`` after it,
    for plain steps too (method ``"none"``): every observation ages all estimates by one
    step. A method not drafted for ``probe_every`` steps is probed with ``k = 1`` when
    nothing else pays and a 2-row batch costs at most ``probe_max_cost``.

    Example:
        >>> pol = AdaptivePolicy(CostCurve({1: 1, 2: 1.4, 4: 2.0, 8: 4.5}), ["ngram"],
        ...                      prior_accept=0.9)
        >>> pol.draft_len("ngram")  # E(3) = 3.44 tokens for cost(4) = 2.0 steps
        3
        >>> for _ in range(20):
        ...     pol.observe("ngram", drafted=3, accepted=0)
        >>> pol.draft_len("ngram")
        0
    """

    def __init__(
        self,
        curve: CostCurve,
        methods: Sequence[str],
        max_draft: int = 8,
        prior_accept: float = 0.6,
        min_gain: float = 1.05,
        *,
        prior_weight: float = 4.0,
        decay: float = 0.9,
        probe_every: int = 32,
        probe_max_cost: float = 1.5,
    ) -> None:
        if max_draft < 0 or probe_every < 1:
            raise ValueError(f"need max_draft >= 0 and probe_every >= 1: {max_draft=}")
        if NONE in methods:
            raise ValueError(f"{NONE!r} is plain decoding, not a method")
        self.curve = curve
        self.max_draft = max_draft
        self.min_gain = min_gain
        self.probe_every = probe_every
        self.probe_max_cost = probe_max_cost
        self.stats = {m: AcceptanceStats(prior_accept, prior_weight, decay) for m in methods}
        self._idle = dict.fromkeys(methods, 0)  # steps since the method last drafted

    def expected_speedup(self, method: str, k: int, match_quality: float | None = None) -> float:
        """Expected speed of drafting ``k`` tokens with ``method``, relative to plain decoding.

        Example: acceptance 0.9, curve ``{1: 1, 2: 1.4, 4: 2.0}``, k = 3:
        ``(1 + .9 + .81 + .729) / 2.0 = 1.72``.
        """
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        return expected_tokens(self._accept(method, match_quality), k) / self.curve.cost(k + 1)

    def draft_len(
        self, method: str, match_quality: float | None = None, limit: int | None = None
    ) -> int:
        """Best draft length k (<= ``limit`` and ``max_draft``) for ``method`` now; 0 means
        decode plainly (the best expected speed is below ``min_gain`` x plain).

        ``match_quality`` in [0, 1] (e.g. matched n-gram length / max_n) scales this step's
        acceptance estimate by ``0.75 + 0.5 * match_quality`` (0.5 leaves it unchanged).

        Example: see the class docstring.
        """
        kmax = self.max_draft if limit is None else min(limit, self.max_draft)
        k, speed = self._best(self._accept(method, match_quality), kmax)
        return k if speed >= self.min_gain else 0

    def choose(
        self, available: Mapping[str, int], match_quality: Mapping[str, float] | None = None
    ) -> tuple[str, int]:
        """The ``(method, k)`` with the best expected speed, or ``("none", 0)``.

        ``available``: method -> draft tokens it can offer this step (0 = none).

        Example:
            >>> pol = AdaptivePolicy(CostCurve({1: 1, 2: 1.2, 4: 1.6}), ["ngram", "draft"])
            >>> pol.stats["draft"].observe(drafted=4, accepted=4)
            >>> pol.choose({"ngram": 4, "draft": 4})
            ('draft', 4)
        """
        best, best_k, best_speed = NONE, 0, 0.0
        for method, n in available.items():
            if method == NONE or n <= 0:
                continue
            q = None if match_quality is None else match_quality.get(method)
            k, speed = self._best(self._accept(method, q), min(n, self.max_draft))
            if speed > best_speed:
                best, best_k, best_speed = method, k, speed
        if best_k > 0 and best_speed >= self.min_gain:
            return best, best_k
        if self.curve.cost(2) <= self.probe_max_cost:
            stale = [
                (self._idle[m], m)
                for m, n in available.items()
                if m != NONE and n > 0 and self._idle[m] >= self.probe_every
            ]
            if stale:
                return max(stale)[1], 1
        return NONE, 0

    def observe(self, method: str, drafted: int, accepted: int) -> None:
        """Record one target step: ``accepted`` of ``drafted`` tokens from ``method``."""
        if method != NONE and method not in self.stats:
            raise ValueError(f"unknown method {method!r}; known: {sorted(self.stats)}")
        for m, stats in self.stats.items():
            if m == method:
                stats.observe(drafted, accepted)
            else:
                stats.relax()
            self._idle[m] = 0 if m == method and drafted > 0 else self._idle[m] + 1

    def _accept(self, method: str, match_quality: float | None) -> float:
        """Acceptance estimate for this step, capped below 1."""
        try:
            a = self.stats[method].estimate
        except KeyError:
            raise ValueError(f"unknown method {method!r}; known: {sorted(self.stats)}") from None
        if match_quality is not None:
            a *= 0.75 + 0.5 * min(max(match_quality, 0.0), 1.0)
        return min(a, 0.99)

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

    def __init__(self, calibrated: Mapping[int, float], alpha: float = 0.2) -> None:
        self.ms = dict(calibrated)
        self.alpha = alpha
        self._dirty = False

    def record(self, rows: int, ms: float) -> None:
        old = self.ms.get(rows)
        self.ms[rows] = ms if old is None else (1 - self.alpha) * old + self.alpha * ms
        self._dirty = True

    def curve(self) -> CostCurve:
        floor, smooth = 0.0, {}
        for n in sorted(self.ms):
            floor = smooth[n] = max(self.ms[n], floor)
        self._dirty = False
        return CostCurve(smooth)

    @property
    def dirty(self) -> bool:
        return self._dirty
