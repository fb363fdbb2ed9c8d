"""Speculative edits: decode a rewritten region with its current text as the draft.

A next edit rewrites a region that is mostly text already there, so the region's current
tokens are the draft (copy speculation): while the output follows them, long runs are
verified in one batch each; where the model writes something new, it decodes alone until
its output meets the draft again. Three pure pieces, all exact whatever the drafts hold
(the runtime accepts a draft token only where it equals the target's own choice)::

    CopyDrafter  aligns the output so far with the draft and proposes the draft's
                 continuation from there (and learns the edit it saw, to apply it ahead)
    batch_len    how many draft tokens the next batch should verify, from the batch-cost
                 curve and the expected acceptance
    EditSizer    that choice with the acceptance estimated from the alignment and the run

Why long batches: measured on the 2-core dev machine (1.5B, llama-cpp-python, after 600
cached tokens), one ``llama_decode`` costs 38 ms for 1 row, 91 for 4, 199 for 8, 237 for
16, 405 for 32, 802 for 64, 1,617 for 128 (``EDIT_CURVE_MS``): from 32 rows on about 12.6
ms a row, 3.0x cheaper than one at a time, while 8 rows cost 5.2 steps. Short drafts barely
pay here; runs of 16-32 copied tokens do.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from kode.backends.speculative.ngram import NgramIndex, index_ngrams
from kode.backends.speculative.policy import AcceptanceStats, CostCurve, expected_tokens

# ms per llama_decode of n rows after 600 cached tokens (1.5B, 2 threads, quiet machine,
# median of 3; issue 49): the curve the tests and the doctests size batches with.
EDIT_CURVE_MS: dict[int, float] = {
    1: 38.0,
    4: 91.0,
    8: 199.0,
    16: 237.0,
    32: 405.0,
    64: 802.0,
    128: 1617.0,
}


@dataclass(frozen=True, slots=True)
class Proposal:
    """The draft's continuation after the output so far.

    ``tokens``: what the draft (with the edits learned so far) says comes next; empty
    where the output is not aligned with the draft or the draft is used up. ``start``:
    the draft position they continue from (where the output left the draft, when not
    aligned). ``match``: how many output tokens just before agree with the draft (the
    evidence for the alignment: 0 at the very start).
    """

    tokens: tuple[int, ...]
    start: int
    match: int


@dataclass(frozen=True, slots=True)
class Substitution:
    """An edit seen in the output: where the draft held ``old``, the output wrote ``new``."""

    old: tuple[int, ...]
    new: tuple[int, ...]


def apply_substitutions(tokens: Sequence[int], subs: Sequence[Substitution]) -> list[int]:
    """``tokens`` with every occurrence of a substitution's ``old`` replaced by its ``new``,
    left to right, the earliest-listed substitution first where several start at one place.

    Example:
        >>> apply_substitutions([1, 2, 3, 1, 2], [Substitution((1, 2), (7,))])
        [7, 3, 7]
    """
    out: list[int] = []
    i, n = 0, len(tokens)
    while i < n:
        for sub in subs:
            k = len(sub.old)
            if tokens[i] == sub.old[0] and tuple(tokens[i : i + k]) == sub.old:
                out.extend(sub.new)
                i += k
                break
        else:
            out.append(tokens[i])
            i += 1
    return out


class CopyDrafter:
    """Copy speculation over one draft (a region's current tokens).

    The output is read token by token against a *cursor* in the draft:

    1. While the output token equals the draft's at the cursor, the cursor moves on (the
       output follows the draft). Where a learned substitution's ``old`` starts at the
       cursor, its ``new`` is expected first, the draft's own token second.
    2. At a difference the output has left the draft at the cursor (the *anchor*); from
       then on, after every output token, the last ``n`` output tokens (``max_n`` down to
       ``min_n``) are looked up in the draft's n-gram index, as vLLM's n-gram proposer
       does. Of the occurrences, the first whose continuation starts at or after the
       anchor wins (a rewrite moves forward through its region; vLLM takes the latest
       occurrence, which in a region is often a later line with the same tokens); where
       none does, the latest before it (an edit that repeats an earlier line). A single
       token counts only within ``max_edit`` tokens after the anchor. The cursor goes to
       the continuation.
    3. With ``learn`` on, the span between leaving and rejoining the draft is learned as
       a ``Substitution`` (``draft[anchor:rejoin]`` became the output between) once the
       output has followed the draft again for ``trust`` tokens; proposals apply it
       ahead (``apply_substitutions``): a rename seen once is drafted at its other uses.
       The draft itself is never rewritten, so its index still finds the old text
       wherever the output keeps it.

    ``propose`` reads only the tokens appended since the last call (an output that is
    not an extension of the last one is read again from the start), so the proposal is a
    function of the draft and the output alone.

    Example:
        >>> d = CopyDrafter([10, 11, 12, 13, 14, 15], min_n=1, max_n=2)
        >>> d.propose([10, 11], max_len=3)  # follows the draft
        Proposal(tokens=(12, 13, 14), start=2, match=2)
        >>> d.propose([10, 11, 99], max_len=3)  # left the draft at 12: nothing to propose
        Proposal(tokens=(), start=2, match=0)
        >>> d.propose([10, 11, 99, 13], max_len=3)  # 13 found after the anchor: rejoined
        Proposal(tokens=(14, 15), start=4, match=1)

        A rename learned at its first use is drafted at the next ones:
        >>> d = CopyDrafter([5, 1, 6, 1, 7, 1, 8], min_n=1, max_n=2, trust=1)
        >>> d.propose([5, 2, 3, 6], max_len=8)  # 1 became 2 3; 6 rejoins the draft
        Proposal(tokens=(2, 3, 7, 2, 3, 8), start=3, match=1)
        >>> d.propose([5, 2, 3, 6, 1, 7], max_len=8)  # not here: the draft's text goes on
        Proposal(tokens=(2, 3, 8), start=5, match=3)
    """

    def __init__(
        self,
        draft: Sequence[int],
        *,
        min_n: int = 1,
        max_n: int = 4,
        learn: bool = True,
        trust: int = 2,
        max_edit: int = 16,
    ) -> None:
        """``trust``: output tokens that must follow the draft again before the edit
        just seen is learned; ``max_edit``: the longest span (either side) learned."""
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n=} {max_n=}")
        self.min_n, self.max_n = min_n, max_n
        self.learn, self.trust, self.max_edit = learn, trust, max_edit
        self.draft = list(draft)
        self._index: NgramIndex = {}
        index_ngrams(self._index, self.draft, 0, min_n, max_n)
        self.substitutions: list[Substitution] = []  # the latest learned first
        self._reset()

    def _reset(self) -> None:
        self.substitutions.clear()
        self._out: list[int] = []
        self.cursor: int | None = 0  # the draft position the output has reached
        self._inside: tuple[int, ...] = ()  # what is left of a substitution being written
        self._entered = 0  # the output position where that substitution began
        self._after = 0  # the draft position after its ``old``
        self.match = 0  # output tokens just before that agree with the draft (or its edits)
        self._anchor = 0  # the draft position where the output last left the draft
        self._left_at = 0  # the output position where it did
        self._pending: tuple[int, int] | None = None  # (draft, output) ends of an edit

    def propose(self, output: Sequence[int], max_len: int) -> Proposal:
        """The draft's next ``max_len`` tokens after ``output`` (see the class docstring).

        Shapes: output [L] -> Proposal with 0 <= len(tokens) <= max_len.
        """
        out = self._out
        m = len(out)
        if len(output) < m or list(output[:m]) != out:
            self._reset()
            out, m = self._out, 0
        for token in output[m:]:
            self._read(token)
        if self.cursor is None:
            return Proposal((), self._anchor, 0)
        return Proposal(tuple(self._ahead(max(0, max_len))), self.cursor, self.match)

    def _substitution_at(self, pos: int) -> Substitution | None:
        """The latest-learned substitution whose ``old`` starts at draft position ``pos``."""
        draft = self.draft
        for sub in self.substitutions:
            k = len(sub.old)
            if draft[pos] == sub.old[0] and tuple(draft[pos : pos + k]) == sub.old:
                return sub
        return None

    def _ahead(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the output is expected to go on with (rule 1)."""
        assert self.cursor is not None
        out = list(self._inside[:limit])
        start = self._after if self._inside else self.cursor
        # An ``old`` that starts within the next ``limit`` tokens ends within ``max_edit``.
        tail = self.draft[start : start + limit + self.max_edit]
        return (out + apply_substitutions(tail, self.substitutions))[:limit]

    def _read(self, token: int) -> None:
        """Advance the alignment by one output token."""
        self._out.append(token)
        if self._follow(token):
            self.match += 1
        else:
            cur = self.cursor
            if cur is not None and (self.match >= self.trust or self._pending is None):
                # Leaving an alignment that held (not one just guessed): an edit starts.
                self._anchor = cur
                self._left_at = self._entered if self._inside else len(self._out) - 1
            self.cursor, self.match, self._pending, self._inside = None, 0, None, ()
            self._rejoin()
        if self._pending is not None and self.match >= self.trust:
            self._learn(*self._pending)

    def _follow(self, token: int) -> bool:
        """Whether ``token`` is what the alignment expects; if so, step past it."""
        cur, draft = self.cursor, self.draft
        if cur is None:
            return False
        if self._inside:
            if token != self._inside[0]:
                return False
            self._inside = self._inside[1:]
            if not self._inside:
                self.cursor = self._after
            return True
        if cur >= len(draft):
            return False
        sub = self._substitution_at(cur) if self.substitutions else None
        if sub is not None:
            after = cur + len(sub.old)
            if not sub.new and after < len(draft) and draft[after] == token:  # a deletion
                self.cursor = after + 1
                return True
            if sub.new and sub.new[0] == token:
                if len(sub.new) == 1:
                    self.cursor = after
                else:
                    self._inside, self._after = sub.new[1:], after
                    self._entered = len(self._out) - 1
                return True
        if draft[cur] == token:
            self.cursor = cur + 1
            return True
        return False

    def _rejoin(self) -> None:
        """Look the output's last tokens up in the draft (rule 2)."""
        out, draft = self._out, self.draft
        for n in range(min(self.max_n, len(out)), self.min_n - 1, -1):
            positions = self._index.get(tuple(out[-n:]))
            if not positions:
                continue
            i = bisect.bisect_left(positions, self._anchor - n)  # continuation >= anchor
            if n == 1:
                # One token is weak evidence (a "(", an indent): only just after the
                # anchor, where an edit that replaced a few tokens rejoins.
                if i == len(positions) or positions[i] + 1 > self._anchor + self.max_edit:
                    continue
                p = positions[i]
            else:
                p = positions[i] if i < len(positions) else positions[-1]
            self.cursor = p + n
            self.match = n + _equal_before(draft, p, out, len(out) - n, 32)
            # Where the agreed run starts, in the draft and in the output: the edit's ends.
            self._pending = (self.cursor - self.match, len(out) - self.match)
            return

    def _learn(self, draft_end: int, out_end: int) -> None:
        """The output wrote ``out[left_at:out_end]`` where the draft held
        ``draft[anchor:draft_end]``: expect that wherever ``old`` comes again."""
        self._pending = None
        old = tuple(self.draft[self._anchor : draft_end])
        new = tuple(self._out[self._left_at : out_end])
        if not self.learn or not old or old == new or max(len(old), len(new)) > self.max_edit:
            return
        rest = [s for s in self.substitutions if s.old != old]
        self.substitutions[:] = [Substitution(old, new), *rest]


def _equal_before(a: Sequence[int], i: int, b: Sequence[int], j: int, limit: int) -> int:
    """How many tokens just before ``a[i]`` and ``b[j]`` are equal (at most ``limit``)."""
    m = 0
    while m < limit and i - m > 0 and j - m > 0 and a[i - m - 1] == b[j - m - 1]:
        m += 1
    return m


def expected_run(first: float, rest: float, k: int) -> float:
    """Mean tokens one batch of ``1 + k`` rows yields: the target's own next token, plus
    the accepted prefix of a ``k``-token draft whose first token is accepted with
    probability ``first`` and each later one (the ones before accepted) with ``rest``.

    Example:
        >>> expected_run(0.5, 1.0, 4)  # 1 + 0.5 * 4
        3.0
        >>> expected_run(0.5, 0.5, 2) == expected_tokens(0.5, 2)  # 1 + 0.5 + 0.25
        True
    """
    if k <= 0:
        return 1.0
    return 1.0 + first * expected_tokens(rest, k - 1)


def batch_len(
    curve: CostCurve, first: float, rest: float, limit: int, min_gain: float = 1.0
) -> int:
    """The draft length ``k`` (0 <= k <= limit) that maximises the expected tokens per
    unit of time, ``expected_run(first, rest, k) / curve.cost(k + 1)``; 0 (one plain
    step) unless that beats plain decoding by ``min_gain``.

    Example, on ``EDIT_CURVE_MS`` (16 rows cost 6.2 steps, 32 rows 10.7):
        >>> curve = CostCurve(EDIT_CURVE_MS)
        >>> batch_len(curve, 0.95, 0.95, 100)  # one miss in 20: 16 rows, 1.8x
        15
        >>> batch_len(curve, 0.99, 0.99, 100)  # one in 100: 32 rows, 2.6x
        31
        >>> batch_len(curve, 0.99, 0.99, 10)  # the draft ends: verify what is left
        10
        >>> batch_len(curve, 0.3, 0.97, 100)  # an alignment that is a guess: plain
        0
    """
    best_k, best = 0, 1.0
    for k in range(1, max(0, limit) + 1):
        speed = expected_run(first, rest, k) / curve.cost(k + 1)
        if speed > best:
            best_k, best = k, speed
    return best_k if best >= min_gain else 0


class EditSizer:
    """``batch_len`` for a copy draft, with the acceptance estimated as it goes.

    Two estimates, both learned from every batch (``AcceptanceStats``, no decay):

    - ``first(match)``: the chance that the first proposed token is right, i.e. that the
      alignment is. It depends on its evidence, the ``match`` tokens just agreed: a
      rejoin on one common token (a ``(``, an indent) is often wrong, one on a whole line
      rarely. One estimate per ``match`` below ``SURE``, from the prior
      ``1 - 0.5 ** (match + 1)`` (0.5 on no evidence, 0.75 on one token, 0.94 on three);
      from ``SURE`` on, the alignment has held and ``rest`` applies. Never above ``rest``.
    - ``rest``: the chance that the output goes on following the draft, one token more
      (a rewrite's copied runs end where its edits are), from ``prior``.

    Example:
        >>> s = EditSizer(CostCurve(EDIT_CURVE_MS))
        >>> run = Proposal(tuple(range(40)), 0, match=12)
        >>> s.size(run)  # the prior: one miss in 50 tokens
        22
        >>> s.size(run, limit=6)  # 6 tokens left: 4 rows (2.4 steps) beat 7 (4.5)
        3
        >>> for _ in range(5):
        ...     s.observe(12, drafted=16, accepted=3)  # the output keeps leaving the draft
        >>> s.size(run)
        2
        >>> guess = Proposal(tuple(range(40)), 0, match=1)
        >>> s.size(guess), [s.observe(1, drafted=2, accepted=0) for _ in range(3)], s.size(guess)
        (2, [None, None, None], 0)
    """

    SURE = 4

    def __init__(
        self,
        curve: CostCurve,
        *,
        max_batch: int = 64,
        prior: float = 0.98,
        prior_weight: float = 16.0,
        first_weight: float = 2.0,
        min_gain: float = 1.0,
    ) -> None:
        self.curve, self.max_batch, self.min_gain = curve, max_batch, min_gain
        self.rest = AcceptanceStats(prior, prior_weight, decay=1.0)
        self._first = [
            AcceptanceStats(1.0 - 0.5 ** (m + 1), first_weight, decay=1.0) for m in range(self.SURE)
        ]

    def first(self, match: int) -> float:
        rest = self.rest.estimate
        return rest if match >= self.SURE else min(self._first[match].estimate, rest)

    def size(self, proposal: Proposal, limit: int | None = None) -> int:
        """How many of ``proposal``'s tokens to verify next (at most ``limit``)."""
        k = min(len(proposal.tokens), self.max_batch - 1)
        if limit is not None:
            k = min(k, limit)
        rest = min(self.rest.estimate, 0.999)
        return batch_len(self.curve, self.first(proposal.match), rest, k, self.min_gain)

    def observe(self, match: int, drafted: int, accepted: int) -> None:
        """A batch verified ``drafted`` tokens of a proposal made on ``match`` agreed
        tokens and accepted the first ``accepted``."""
        if drafted <= 0:
            return
        if match < self.SURE:  # the first token judged the alignment, the others the run
            self._first[match].observe(1, min(accepted, 1))
            if accepted > 0:
                self.rest.observe(drafted - 1, accepted - 1)
        else:
            self.rest.observe(drafted, accepted)
