"""Token trees: several draft continuations verified by the target in one batch.

Candidates that share a prefix share rows, so a batch of R rows can check more guesses
than R tokens of separate chains. Each root-to-leaf path is a *branch*; a runtime gives
each branch its own KV sequence id (rows on several branches carry several ids), so that
every row attends to exactly its ancestors plus the committed prefix::

    candidates [[5, 6, 7], [5, 8], [9]] under root 4       rows  token parent depth branches
                                                            0     4     -1     0     (0, 1, 2)
               4 (row 0)                                    1     5      0     1     (0, 1)
              / \\                                           2     6      1     2     (0,)
       (1) 5     9 (5)                                      3     7      2     3     (0,)
          / \\                                               4     8      1     2     (1,)
     (2) 6   8 (4)                                          5     9      0     1     (2,)
         |
     (3) 7

Verification is sample-and-match: the target's choice after each row (its argmax, or a
sample from its distribution there) is compared with the children of the current row;
this is exact for any sampler, greedy included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import overload


@dataclass(frozen=True, slots=True)
class TokenTree:
    """A trie of draft tokens under a root, rows in topological order.

    Row 0 is the root: the last accepted token, not yet in the KV cache. The KV position of
    row i is ``n_past + depths[i]``.
    """

    tokens: tuple[int, ...]  # [R]
    parents: tuple[int, ...]  # [R] parent row, -1 for the root
    depths: tuple[int, ...]  # [R] root 0
    branches: tuple[tuple[int, ...], ...]  # [R] ids of the root-to-leaf paths through row i
    n_branches: int

    @property
    def n_rows(self) -> int:
        """Number of rows R, root included."""
        return len(self.tokens)

    def children(self, row: int) -> list[int]:
        """Rows whose parent is ``row``, in row order.

        Example:
            >>> build_tree(4, [[5, 6], [5, 8], [9]], 8).children(1)
            [2, 3]
        """
        return [r for r, p in enumerate(self.parents) if p == row]

    def branch_rows(self, branch: int) -> list[int]:
        """Rows from the root to the leaf of ``branch``.

        Example:
            >>> build_tree(4, [[5, 6], [5, 8], [9]], 8).branch_rows(1)
            [0, 1, 3]
        """
        if not 0 <= branch < self.n_branches:
            raise ValueError(f"branch {branch} not in [0, {self.n_branches})")
        return [r for r, b in enumerate(self.branches) if branch in b]


def build_tree(root: int, candidates: Sequence[Sequence[int]], max_rows: int) -> TokenTree:
    """Merge candidate continuations into a trie under ``root``.

    Shared prefixes share rows. Candidates are merged in order and rows are created while
    fewer than ``max_rows`` exist (root included), so the later candidates are truncated
    first. With no candidates the tree is just the root (1 row, 1 branch). Rows are in
    topological order; branch ids follow the row order of the leaves.

    Shapes: candidates [C][<=K] -> R <= min(max_rows, 1 + sum of lengths) rows.

    Example:
        >>> t = build_tree(4, [[5, 6, 7], [5, 8], [9]], max_rows=5)
        >>> t.tokens, t.parents, t.depths
        ((4, 5, 6, 7, 8), (-1, 0, 1, 2, 1), (0, 1, 2, 3, 2))
        >>> t.branches, t.n_branches  # [9] did not fit
        (((0, 1), (0, 1), (0,), (0,), (1,)), 2)
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    tokens = [root]
    parents = [-1]
    depths = [0]
    child_of: dict[tuple[int, int], int] = {}  # (parent row, token) -> row
    for cand in candidates:
        row = 0
        for tok in cand:
            nxt = child_of.get((row, tok))
            if nxt is None:
                if len(tokens) >= max_rows:
                    break
                nxt = len(tokens)
                child_of[(row, tok)] = nxt
                tokens.append(tok)
                parents.append(row)
                depths.append(depths[row] + 1)
            row = nxt
    n_rows = len(tokens)
    has_child = [False] * n_rows
    for p in parents[1:]:
        has_child[p] = True
    leaves = [r for r in range(n_rows) if not has_child[r]]
    branch_sets: list[list[int]] = [[] for _ in range(n_rows)]
    for b, leaf in enumerate(leaves):
        r = leaf
        while r >= 0:
            branch_sets[r].append(b)  # b grows, so each list stays sorted
            r = parents[r]
    return TokenTree(
        tokens=tuple(tokens),
        parents=tuple(parents),
        depths=tuple(depths),
        branches=tuple(tuple(s) for s in branch_sets),
        n_branches=len(leaves),
    )


@dataclass(frozen=True, slots=True)
class Verification:
    """What the target confirmed of a tree."""

    accepted_rows: tuple[int, ...]  # [A] rows along the accepted path after the root
    accepted_tokens: tuple[int, ...]  # [A] their tokens (draft tokens the target confirmed)
    next_token: int  # target's token after the last accepted row (bonus token, next root)
    branch: int  # lowest branch id containing the whole accepted path


def verify(tree: TokenTree, target_tokens: Sequence[int]) -> Verification:
    """Accept the longest path whose every token is the target's choice after its parent.

    ``target_tokens[i]`` is the token the target chooses after row i (its argmax for
    greedy decoding, or a sample from its distribution at row i: sample-and-match, exact
    for any sampler). Walk from the root: while some child of the current row has
    ``token == target_tokens[current]``, move to it.

    Shapes: tree [R], target_tokens [R] -> A accepted rows, 0 <= A < R.

    Example:
        >>> t = build_tree(4, [[5, 6, 7], [5, 8], [9]], max_rows=8)
        >>> # rows:           4  5  6  7  8  9
        >>> verify(t, target_tokens=[5, 8, 0, 0, 3, 0])
        Verification(accepted_rows=(1, 4), accepted_tokens=(5, 8), next_token=3, branch=1)
    """
    if len(target_tokens) != tree.n_rows:
        raise ValueError(f"need {tree.n_rows} target tokens, got {len(target_tokens)}")
    child_of = {
        (p, tok): r for r, (p, tok) in enumerate(zip(tree.parents, tree.tokens, strict=True))
    }
    rows: list[int] = []
    cur = 0
    while (nxt := child_of.get((cur, target_tokens[cur]))) is not None:
        rows.append(nxt)
        cur = nxt
    return Verification(
        accepted_rows=tuple(rows),
        accepted_tokens=tuple(tree.tokens[r] for r in rows),
        next_token=target_tokens[cur],
        branch=tree.branches[cur][0],
    )


def accept_greedy(draft: Sequence[int], target_tokens: Sequence[int]) -> tuple[int, int]:
    """Verify a chain draft ``[d1..dk]`` fed to the target as ``[root, d1..dk]``.

    ``target_tokens[i]`` is the target's choice after the i-th fed token. Returns
    ``(accepted, next_token)``: the number of leading draft tokens confirmed and the
    target's token after them.

    Shapes: draft [k], target_tokens [k + 1].

    Example:
        >>> accept_greedy([5, 6, 7], [5, 6, 9, 1])
        (2, 9)
    """
    if len(target_tokens) != len(draft) + 1:
        raise ValueError(f"need {len(draft) + 1} target tokens, got {len(target_tokens)}")
    a = 0
    while a < len(draft) and draft[a] == target_tokens[a]:
        a += 1
    return a, target_tokens[a]


class LazyPicks(Sequence[int]):
    """``picks[i]`` is the target's token after row ``i``, computed by ``pick(i)`` on first
    use. ``verify`` reads only the rows on the accepted path, so argmax runs (or a sample
    is drawn) only where needed, and a sampler's rng sees exactly plain decoding's draws.

    Example:
        >>> calls = []
        >>> picks = LazyPicks(3, lambda i: calls.append(i) or 10 + i)
        >>> picks[2], picks[2], calls
        (12, 12, [2])
    """

    def __init__(self, n: int, pick: Callable[[int], int]) -> None:
        self._cache: list[int | None] = [None] * n
        self._pick = pick

    def __len__(self) -> int:
        return len(self._cache)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        value = self._cache[i]
        if value is None:
            value = self._cache[i] = self._pick(i)
        return value
