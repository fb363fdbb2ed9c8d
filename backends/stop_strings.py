"""Stop strings in generated text, in one place: where the earliest one begins, and how
much of the text's end must be held back because it could still begin one. The team
server streams with both; the editor's stop rules (``completion/stops.py``) cut with the
first."""

from __future__ import annotations

from collections.abc import Sequence


def find_stop(text: str, stops: Sequence[str], start: int) -> tuple[int, str] | None:
    """The earliest stop string in ``text`` that ends at or after ``start``."""
    best: tuple[int, str] | None = None
    for stop in stops:
        at = text.find(stop, max(0, start - len(stop) + 1))
        if at >= 0 and (best is None or at < best[0]):
            best = (at, stop)
    return best


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of ``text`` could still begin a stop string."""
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return hold
