"""Which cached prompt tokens a new prompt can reuse (pure; no model).

In the PSM fill-in-the-middle order a keystroke edits the end of the prefix, and the
suffix after it only *moves*: ``<|fim_prefix|>…typed<|fim_suffix|>…<|fim_middle|>``.
Reusing the longest common prefix alone re-evaluates the whole suffix on every
keystroke (64 tokens: about 0.7 s on the 2-core dev machine). ``plan_moved_tail``
finds the tail that only moved, so a runtime can keep its KV entries, shift their
positions (``llama_memory_seq_add``) and evaluate just the inserted tokens, the first
``refresh`` tokens of the tail (``<|fim_suffix|>`` and what follows the cursor) and the
prompt's last token. The moved entries were computed before the edit (they did not see
the typed text): an approximation, bounded by ``max_drift`` tokens of change since
they were last evaluated exactly and judged by the quality benchmark
(``kode bench quality --modes engine,moved``).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

# A moved tail's first tokens are evaluated again: in PSM they are <|fim_suffix|> and the
# text right after the cursor, which carry what the model knows of the cursor's
# surroundings. Measured with `kode bench quality --modes moved` (1.5B, 20+20 tasks, 12
# characters typed): re-evaluating 0 tokens ignored the typed text; 1 or 4 tokens lost one
# multi-line task (9/20 -> 8/20); 8 tokens lost none (single 16/20, multi 10/20 vs 9/20).
MOVED_REFRESH = 8

# Chunks of assembled windows (``backends/llama/kv_chunks.py``) start where a line's text
# says so, not at a count of lines from a window's top: the same text then splits the
# same way in every window that holds it, wherever the window starts, and an edit moves
# only the boundaries next to it. One line in ``CHUNK_EVERY`` (non-blank) on average: the
# benchmark's 32-line chunks with 32-token seams kept the exact first lines of the whole
# window (``docs/benchmarks.md``, "Assembled windows").
CHUNK_EVERY = 32
# The first tokens of each chunk are evaluated again inside the window (EPIC's seams).
CHUNK_SEAM = 32


def chunk_boundary(line: str, every: int = CHUNK_EVERY) -> bool:
    """Whether a chunk starts at a line with this text (white space around it ignored):
    a non-blank line whose text hashes to a multiple of ``every``.

    >>> [chunk_boundary(t, 4) for t in ("", "   ", "import os", "import sys", " pass ")]
    [False, False, False, True, True]
    """
    text = line.strip()
    return bool(text) and zlib.crc32(text.encode()) % every == 0


@dataclass(frozen=True, slots=True)
class MovedTail:
    """A reuse plan: ``old[:keep]`` stays in place, ``old[old_tail:old_tail + length]``
    moves to ``new_tail`` (same tokens), ``new[keep:new_tail]`` and ``new[-1]`` are
    evaluated.

    Shapes: positions are token indices; ``delta = new_tail - old_tail`` is the shift.
    """

    keep: int
    old_tail: int
    new_tail: int
    length: int
    refreshed: int = 0  # of the evaluated tokens: unchanged ones re-evaluated (refresh)

    @property
    def delta(self) -> int:
        return self.new_tail - self.old_tail

    @property
    def inserted(self) -> int:
        """Tokens evaluated before the tail (the edit)."""
        return self.new_tail - self.keep

    @property
    def removed(self) -> int:
        """Cached tokens dropped before the tail."""
        return self.old_tail - self.keep

    @property
    def drift(self) -> int:
        """Tokens of change (the edit itself) the moved entries did not see."""
        return self.inserted + self.removed - 2 * self.refreshed


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix, by bisection over C-level slice compares
    (a 4,000-token prompt compares in microseconds, not a Python loop per token).

    Example:
        >>> common_prefix([1, 2, 3, 4], [1, 2, 9])
        2
        >>> common_prefix((1, 2), [1, 2, 3])
        2
    """
    x = a if isinstance(a, list) else list(a)
    y = b if isinstance(b, list) else list(b)
    lo, hi = 0, min(len(x), len(y))
    if x[:hi] == y[:hi]:
        return hi
    while hi - lo > 1:  # x[:lo] == y[:lo] and x[:hi] != y[:hi]
        mid = (lo + hi) // 2
        if x[:mid] == y[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def plan_moved_tail(
    old: Sequence[int],
    new: Sequence[int],
    *,
    min_tail: int = 8,
    max_insert: int = 32,
    refresh: int = 0,
) -> MovedTail | None:
    """How to reuse ``old`` (the cached prompt) for ``new`` by moving its tail, or None
    when plain prefix reuse is as good (nothing moved, too little to move, too much new).

    Both prompts end with a token that is always evaluated again (its logits start the
    generation), so tails are compared without it. The tail is the longest common
    suffix of ``old[keep:-1]`` and ``new[keep:-1]``, where ``keep`` is their common prefix,
    less its first ``refresh`` tokens (those are evaluated again, as part of the edit).

    Example: a character typed at the end of the prefix (``9`` inserted before the
    suffix ``5 6 7``; ``0`` is ``<|fim_middle|>``):
        >>> p = plan_moved_tail([1, 2, 5, 6, 7, 0], [1, 2, 9, 5, 6, 7, 0], min_tail=2)
        >>> p
        MovedTail(keep=2, old_tail=2, new_tail=3, length=3, refreshed=0)
        >>> p.delta, p.inserted, p.removed
        (1, 1, 0)

        A backspace moves the tail left; an unchanged prompt needs no move:
        >>> plan_moved_tail([1, 2, 9, 5, 6, 7, 0], [1, 2, 5, 6, 7, 0], min_tail=2).delta
        -1
        >>> plan_moved_tail([1, 2, 5, 6, 7, 0], [1, 2, 5, 6, 7, 0], min_tail=2) is None
        True
    """
    if min_tail < 1 or max_insert < 0:
        raise ValueError(f"need min_tail >= 1 and max_insert >= 0: {min_tail=} {max_insert=}")
    if len(old) < 2 or len(new) < 2:
        return None
    old_body, new_body = old[:-1], new[:-1]
    keep = common_prefix(old_body, new_body)
    if keep == len(old_body) or keep == len(new_body):
        return None  # one is a prefix of the other: prefix reuse already covers it
    room = min(len(old_body), len(new_body)) - keep
    length = 0
    while length < room and old_body[-1 - length] == new_body[-1 - length]:
        length += 1
    refreshed = min(refresh, length)  # the tail's first tokens are evaluated again
    length -= refreshed
    if length < min_tail:
        return None
    plan = MovedTail(keep, len(old_body) - length, len(new_body) - length, length, refreshed)
    if plan.delta == 0 and plan.inserted == 0:
        return None
    if plan.inserted > max_insert:
        return None
    return plan


@dataclass(frozen=True, slots=True)
class Candidate:
    """A KV state that could serve a new prompt: ``index`` in the caller's list, and how
    many leading prompt tokens its entries hold exactly."""

    index: int
    common: int


def prefix_reach(cached: Sequence[int], prompt: Sequence[int], stale_from: int | None) -> int:
    """How many leading tokens of ``prompt`` a state holding ``cached`` serves exactly
    (entries from ``stale_from`` on were moved after an edit and are not exact)."""
    n = common_prefix(cached, prompt)
    return n if stale_from is None else min(n, stale_from)


def choose_state(current: int, saved: Sequence[int], *, min_gain: int = 32) -> Candidate | None:
    """Which saved state to bring back before evaluating a prompt, or None to keep the
    current one. ``current`` and ``saved[i]`` are how many leading prompt tokens each
    serves exactly (``prefix_reach``); a restore costs a copy of the state, so it must
    save at least ``min_gain`` tokens of evaluation.

        >>> choose_state(10, [5, 400, 380])
        Candidate(index=1, common=400)
        >>> choose_state(390, [5, 400]) is None   # only 10 tokens better: keep
        True
    """
    best: Candidate | None = None
    for i, common in enumerate(saved):
        if common >= current + min_gain and (best is None or common > best.common):
            best = Candidate(i, common)
    return best


def worth_saving(current_len: int, reach: int, prompt_len: int, *, min_tokens: int = 64) -> bool:
    """Whether the state in a sequence (``current_len`` tokens, ``prompt_len`` of them the
    last prompt) should be kept before a prompt that reuses only ``reach`` of them: when
    at least ``min_tokens`` would be lost and the new prompt keeps less than half of the
    old one (a switch of place or document, not a keystroke, whose suffix only moves).

        >>> worth_saving(1200, 40, 1150)    # another document
        True
        >>> worth_saving(1200, 900, 1150)   # a keystroke near the cursor
        False
    """
    return current_len - reach >= min_tokens and reach * 2 < prompt_len


@dataclass(frozen=True, slots=True)
class Held:
    """What one free sequence holds, seen from a new prompt: ``reach`` leading prompt
    tokens served exactly (``prefix_reach``), ``length`` tokens in all (``prompt_len`` of
    them its last prompt), last used at ``used`` (any increasing count)."""

    reach: int
    length: int
    prompt_len: int
    used: int


@dataclass(frozen=True, slots=True)
class SlotChoice:
    """Where a new prompt goes: free sequence ``slot``, after saving what it holds
    (``save``) and then restoring saved state ``state`` into it (None: none)."""

    slot: int
    state: int | None = None
    save: bool = False


def choose_slot(free: Sequence[Held], saved: Sequence[int], *, min_gain: int = 32) -> SlotChoice:
    """Which free sequence of a context evaluates a new prompt (the others keep what
    they hold for their own documents), and whether a saved state comes back first.
    ``saved[i]``: how many leading prompt tokens saved state i serves exactly.

    The sequences that serve within ``min_gain`` tokens of the most are equals; of
    them the prompt takes one that loses nothing (empty, or holding only a prefix of
    the prompt), else the least recently used. If a saved state serves ``min_gain``
    more than it (``choose_state``), the state is restored into it, its tokens saved
    first when there are at least 64; otherwise its tokens are saved when the prompt
    throws most of them away (``worth_saving``). With one sequence this is the
    single-sequence rule.

        >>> a, c = Held(900, 1000, 990, used=5), Held(10, 800, 790, used=7)
        >>> choose_slot([a, c], [])                     # a keystroke in a's document
        SlotChoice(slot=0, state=None, save=False)
        >>> choose_slot([Held(10, 1000, 990, used=5), c], [])   # another document
        SlotChoice(slot=0, state=None, save=True)
        >>> choose_slot([Held(16, 1000, 990, used=7), Held(0, 0, 0, used=0)], [])
        SlotChoice(slot=1, state=None, save=False)
        >>> choose_slot([Held(10, 1000, 990, used=5), c], [700])  # back to a saved place
        SlotChoice(slot=0, state=0, save=True)
    """
    if not free:
        raise ValueError("no free sequence")
    top = max(held.reach for held in free)
    near = [i for i, held in enumerate(free) if held.reach >= top - min_gain]
    best = min(near, key=lambda i: (free[i].length > free[i].reach, free[i].used))
    held = free[best]
    pick = choose_state(held.reach, saved, min_gain=min_gain)
    if pick is not None:
        return SlotChoice(best, pick.index, held.length >= 64)
    return SlotChoice(best, None, worth_saving(held.length, held.reach, held.prompt_len))
