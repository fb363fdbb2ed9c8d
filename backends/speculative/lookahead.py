"""Lookahead decoding: a Jacobi window that mines n-grams, verified in the same batch.

After Fu et al., "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding" (2024), and llama.cpp's ``examples/lookahead``. Each step decodes ONE target
batch with three parts, all hanging off the root (the last accepted token):

- the Jacobi window: ``N - 1`` levels of ``W`` columns of guessed tokens. Level ``j``,
  column ``i`` sits at depth ``i + j``; column 0 of level 0 is the root itself. Column
  ``i`` reads as the path ``root, L0[1..i], L1[i], .., L(N-2)[i]``: a Jacobi trajectory
  whose last-level logits give a fresh guess ``new[i]``. Each column then yields the
  n-gram ``L0[i], L1[i], .., L(N-2)[i], new[i]`` (``root`` for ``L0[0]``), which goes into
  the pool, and the window moves one Jacobi iteration (levels shift up, ``new`` becomes
  the last level).
- verification: n-grams that start with the root (from the pool, and from earlier
  occurrences of the latest tokens in the committed text), merged into a trie
  (``tree.build_tree``) of at most ``max_verify`` branches of ``N - 1`` tokens. Only these
  rows can be accepted, by sample-and-match, so the output is exactly the target's own
  whatever the window and pool hold: lossless.
- the root, on every sequence; its logits give the next token when nothing is accepted.

Abstract sequence ids (the runtime maps them to llama.cpp seq ids) make the attention
right: a row sees the committed prefix plus the rows that share a seq id with it at a
lower depth. Column ``i`` is seq ``i``; verification branch ``b`` is seq ``W + b``. A row
on several sequences lists its own sequence first (llama.cpp masks by the first id).
Example for ``W = 3, N = 3`` with two verification n-grams ``[a, b]`` and ``[c, d]``
(``x`` = level 0, ``y`` = level 1)::

    plan row    0    1    2    3    4    5    6    7    8    9
    token       r    a    b    c    d    x1   x2   y0   y1   y2
    depth       0    1    2    1    2    1    2    1    2    3
    logits      1    1    1    1    1    0    0    1    1    1
    seq 0       0                                  0
    seq 1       1                        1              1
    seq 2       2                        2    2              2
    seq 3       3    3    3                                          verify [r a b]
    seq 4       4              4    4                                verify [r c d]
    role        root  '-- verification --'  '- level 0 -' '-- level 1 --'

    column i's path: root -> x1 .. xi (level 0, shared) -> yi (its own deeper levels)

The root carries every seq id ``0 .. W + max_verify - 1`` (also those of branches this
step does not use), so one recipe keeps the committed prefix on all sequences. KV cache
after a step, with abstract seq ``s`` as the generation's llama.cpp slot's sequence ``s``
(``Slot``: its calls touch no other slot) and the prompt copied to all of them once
(``seq_cp(0, s)``)::

    n_keep = n_past + 1 + len(result.accepted_tokens)
    llama_memory_seq_rm(mem, -1, n_keep, -1)          # all rows past the new tokens
    if result.accepted_tokens:                        # also drops window rows at depth <= A
        llama_memory_seq_keep(mem, result.keep_seq)
        for s in range(max_seqs), s != keep_seq: llama_memory_seq_cp(mem, keep_seq, s, -1, -1)
    n_past, root = n_keep, result.next_token

Batch size: ``W * (N - 1)`` window rows (root included) plus at most
``max_verify * (N - 1)`` verification rows (fewer when n-grams share a prefix), i.e. at
most ``(W + max_verify) * (N - 1)`` rows and ``W + max_verify`` sequences. ``N`` sets how
far one step can jump (up to ``N - 1`` accepted tokens plus the bonus token) and costs
``W + max_verify`` rows per unit; ``W`` sets how many n-grams the window mines per step;
``G`` (``pool_size``) how many n-grams per first token are remembered. On the 2-core CPU
a batch of 8 rows costs about 4 single steps, so use W 2-4, N 3-4, max_verify 1-3: e.g.
W=2, N=3, max_verify=2 decodes at most 8 rows.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from kode.backends.speculative.ngram import NgramDrafter, merge_distinct
from kode.backends.speculative.tree import TokenTree, build_tree, verify


@dataclass(frozen=True, slots=True)
class LookaheadRow:
    """One token of a lookahead batch."""

    token: int
    depth: int  # KV position = n_past + depth (root = depth 0)
    seq_ids: tuple[int, ...]  # abstract ids in [0, n_seqs); the row's own sequence first
    want_logits: bool


@dataclass(frozen=True, slots=True)
class LookaheadPlan:
    """One lookahead step: the rows to decode and what ``update`` needs to read them.

    Plan rows ``0 .. tree.n_rows - 1`` are the verification trie's rows (row 0 the root),
    the window rows follow.
    """

    rows: tuple[LookaheadRow, ...]  # [R] row 0 = root (last accepted token), in every sequence
    n_seqs: int  # W + max_verify: ids 0..n_seqs-1, all on the root; unused branches hold it alone
    step: int  # planner step; update() rejects a plan from another step
    tree: TokenTree  # verification trie; its row t is plan row t
    window: tuple[tuple[int, ...], ...]  # [N-1][W] levels the window rows were built from
    last_level_rows: tuple[int, ...]  # [W] plan row whose logits give column i's new guess

    @property
    def logit_rows(self) -> tuple[int, ...]:
        """Plan rows that need logits (``target_tokens`` is read only at these).

        Example: for the module docstring's plan, ``(0, 1, 2, 3, 4, 7, 8, 9)``.
        """
        return tuple(i for i, row in enumerate(self.rows) if row.want_logits)

    @property
    def n_draft(self) -> int:
        """Draft tokens offered for verification (trie rows after the root)."""
        return self.tree.n_rows - 1


@dataclass(frozen=True, slots=True)
class LookaheadResult:
    """What one lookahead step produced."""

    accepted_tokens: tuple[int, ...]  # [A] verified draft tokens after the root
    next_token: int  # bonus token, the next root
    keep_seq: int  # abstract seq whose rows at depth <= A are kept (root + accepted)
    accepted_rows: tuple[int, ...]  # [A] plan rows of the accepted tokens (depths 1..A)

    @property
    def kept_rows(self) -> tuple[int, ...]:
        """Plan rows whose KV entries stay: the root and the accepted rows."""
        return (0, *self.accepted_rows)


class Lookahead:
    """Lookahead decoding planner: call ``plan`` then ``update`` once per target step.

    Example (a target that always continues 1 2 3 1 2 3 ...):
        >>> la = Lookahead(window=2, ngram=3, pool_size=4, max_verify=1)
        >>> la.reset([1, 2, 3, 1, 2])
        >>> plan = la.plan(3)  # root 3 follows the context
        >>> [r.token for r in plan.rows[: plan.tree.n_rows]]  # "3" was followed by "1 2"
        [3, 1, 2]
        >>> res = la.update(plan, target_tokens=[1, 2, 3] + [0] * (len(plan.rows) - 3))
        >>> res.accepted_tokens, res.next_token, res.keep_seq
        ((1, 2), 3, 2)
    """

    def __init__(
        self,
        window: int,
        ngram: int,
        pool_size: int,
        max_verify: int,
        seed: int = 0,
        history_max_n: int = 3,
    ) -> None:
        """``window`` W >= 1 columns, ``ngram`` N >= 2, ``pool_size`` G >= 1 n-grams kept per
        first token, ``max_verify`` >= 0 n-grams verified per step. ``history_max_n`` > 0
        also looks the latest 1..history_max_n tokens up in the committed text (and in
        ``add_source`` sources) for verification n-grams, ranked before the pool's; 0
        turns that off."""
        if window < 1 or ngram < 2 or pool_size < 1 or max_verify < 0 or history_max_n < 0:
            raise ValueError(
                f"need window >= 1, ngram >= 2, pool_size >= 1, max_verify >= 0, "
                f"history_max_n >= 0; got {window=} {ngram=} {pool_size=} {max_verify=} "
                f"{history_max_n=}"
            )
        self.window = window
        self.ngram = ngram
        self.pool_size = pool_size
        self.max_verify = max_verify
        self._seed = seed
        self._lookup = NgramDrafter(1, history_max_n) if history_max_n > 0 else None
        self._rng = random.Random(seed)
        self._history: list[int] = []  # committed tokens, then the open plan's root
        self._pooled = 0  # history positions whose ending n-gram is in the pool
        self._pool: dict[int, dict[tuple[int, ...], None]] = {}  # first -> tails, oldest first
        self._levels: list[list[int]] = []  # [N-1][W]
        self._step = 0
        self._open = False  # a plan's root is the last history token
        self.reset(())

    @property
    def max_seqs(self) -> int:
        """Most sequence ids a plan uses (the context needs ``n_seq_max`` >= this)."""
        return self.window + self.max_verify

    @property
    def max_rows(self) -> int:
        """Most rows a plan holds: ``(W + max_verify) * (N - 1)``."""
        return (self.window + self.max_verify) * (self.ngram - 1)

    def reset(self, context: Sequence[int]) -> None:
        """Start a new generation after ``context`` (the tokens before the first root).

        The pool and the lookup index are seeded from the context's n-grams and the
        window from random context tokens (deterministic for a given ``seed``).
        """
        self._rng = random.Random(self._seed)
        self._history = list(context)
        self._pool = {}
        self._pooled = 0
        self._pool_history()
        self._levels = [[self._fill() for _ in range(self.window)] for _ in range(self.ngram - 1)]
        if self._lookup is not None:
            self._lookup.reset()
        self._step += 1
        self._open = False

    def add_source(self, tokens: Sequence[int]) -> None:
        """Another text to mine verification n-grams from (the suffix, open documents)."""
        if self._lookup is not None:
            self._lookup.add_source(tokens)
        else:
            self._pool_tokens(tokens)

    def advance(self, tokens: Sequence[int]) -> None:
        """Commit ``tokens`` decoded without a plan (plain or other-drafter steps).

        ``tokens`` are the roots and accepted tokens those steps committed; the next
        ``plan`` root follows them. Any open plan is dropped.

        Example:
            >>> la = Lookahead(window=2, ngram=2, pool_size=2, max_verify=1)
            >>> la.reset([1, 2])
            >>> la.advance([3, 4])  # e.g. two plain decoding steps
            >>> [(r.token, r.seq_ids) for r in la.plan(1).rows[:2]]  # "1" was followed by "2"
            [(1, (0, 1, 2)), (2, (2,))]
        """
        self._close()
        self._history.extend(tokens)
        self._pool_history()
        self._levels = [self._shift(level, len(tokens)) for level in self._levels]

    def plan(self, root: int) -> LookaheadPlan:
        """Rows to decode this step (see the module docstring for the layout).

        Shapes: -> rows [R <= (W + max_verify)(N - 1)], n_seqs = W + max_verify.

        Example:
            >>> la = Lookahead(window=2, ngram=3, pool_size=2, max_verify=0)
            >>> la.reset([]); p = la.plan(7)
            >>> [(r.depth, r.seq_ids, r.want_logits) for r in p.rows]
            [(0, (0, 1), True), (1, (1,), False), (1, (0,), True), (2, (1,), True)]
        """
        self._close()
        self._history.append(root)
        self._open = True
        self._step += 1
        self._pool_history()
        w, last = self.window, self.ngram - 2
        tree = build_tree(root, self._candidates(root), 1 + self.max_verify * (self.ngram - 1))
        # the root goes on every sequence, used or not, so that after a step the committed
        # prefix is on all of them (see "KV cache after a step" in the module docstring)
        rows = [LookaheadRow(root, 0, tuple(range(self.max_seqs)), True)]
        rows.extend(
            LookaheadRow(
                tree.tokens[t], tree.depths[t], tuple(w + b for b in tree.branches[t]), True
            )
            for t in range(1, tree.n_rows)
        )
        last_level_rows = [0] * w  # column 0 of level 0 is the root (row 0)
        for j, level in enumerate(self._levels):
            for i in range(1 if j == 0 else 0, w):
                seq_ids = tuple(range(i, w)) if j == 0 else (i,)
                if j == last:
                    last_level_rows[i] = len(rows)
                rows.append(LookaheadRow(level[i], i + j, seq_ids, j == last))
        return LookaheadPlan(
            rows=tuple(rows),
            n_seqs=self.max_seqs,
            step=self._step,
            tree=tree,
            window=tuple(tuple(level) for level in self._levels),
            last_level_rows=tuple(last_level_rows),
        )

    def update(self, plan: LookaheadPlan, target_tokens: Sequence[int]) -> LookaheadResult:
        """Read the target's choices for ``plan``: accept, mine n-grams, move the window.

        ``target_tokens[i]`` is the target's choice after row i (argmax, or a sample);
        only rows with ``want_logits`` are read, pass anything (e.g. -1) for the others.

        Shapes: target_tokens [len(plan.rows)] -> A accepted tokens, 0 <= A <= N - 1.

        Example: see the class docstring.
        """
        if plan.step != self._step or not self._open:
            raise ValueError("plan is not the current one (plan() or reset() ran since)")
        if len(target_tokens) != len(plan.rows):
            raise ValueError(f"need {len(plan.rows)} target tokens, got {len(target_tokens)}")
        ver = verify(plan.tree, target_tokens[: plan.tree.n_rows])
        accepted = len(ver.accepted_tokens)
        # [N][W]: the window's levels plus the fresh guesses from the last level's logits
        levels = [*plan.window, tuple(target_tokens[r] for r in plan.last_level_rows)]
        root = plan.rows[0].token
        for i in range(self.window):
            first = root if i == 0 else levels[0][i]
            self._pool_add(first, tuple(level[i] for level in levels[1:]))
        # One Jacobi iteration (levels up), then as many columns left as extra tokens were
        # accepted, so that every guess keeps its absolute position.
        self._levels = [self._shift(level, accepted) for level in levels[1:]]
        self._history.extend(ver.accepted_tokens)  # their n-grams are pooled at the next plan
        self._open = False
        return LookaheadResult(
            accepted_tokens=ver.accepted_tokens,
            next_token=ver.next_token,
            keep_seq=self.window + ver.branch if accepted else 0,
            accepted_rows=ver.accepted_rows,
        )

    def _candidates(self, root: int) -> list[list[int]]:
        """Verification n-grams for ``root`` (last history token): lookup, then pool."""
        limit, tail = self.max_verify, self.ngram - 1
        if limit == 0:
            return []
        out = [] if self._lookup is None else self._lookup.propose(self._history, tail, limit)
        for cand in reversed(self._pool.get(root, {})):  # newest first
            if len(out) == limit and all(len(c) == tail for c in out):
                break
            merge_distinct(out, list(cand), limit)
        return out

    def _close(self) -> None:
        """Drop the open plan's root from the history."""
        if self._open:
            self._history.pop()
            self._pooled = min(self._pooled, len(self._history))
            self._open = False

    def _fill(self) -> int:
        """A guess for an empty window cell: a random committed token."""
        return self._rng.choice(self._history) if self._history else 0

    def _shift(self, level: Sequence[int], k: int) -> list[int]:
        """``level`` moved ``k`` columns left, refilled on the right."""
        kept = list(level[k:])
        return kept + [self._fill() for _ in range(len(level) - len(kept))]

    def _pool_add(self, first: int, tail: tuple[int, ...]) -> None:
        """Remember ``first, *tail`` as the newest n-gram for ``first`` (ring of G)."""
        ring = self._pool.setdefault(first, {})
        ring.pop(tail, None)
        ring[tail] = None
        if len(ring) > self.pool_size:
            del ring[next(iter(ring))]

    def _pool_tokens(self, tokens: Sequence[int]) -> None:
        """Add every full n-gram of ``tokens`` to the pool."""
        n = self.ngram
        for p in range(len(tokens) - n + 1):
            self._pool_add(tokens[p], tuple(tokens[p + 1 : p + n]))

    def _pool_history(self) -> None:
        """Add the history's n-grams that end at positions not pooled yet."""
        n, hist = self.ngram, self._history
        for end in range(max(self._pooled, n - 1), len(hist)):
            self._pool_add(hist[end - n + 1], tuple(hist[end - n + 2 : end + 1]))
        self._pooled = len(hist)
