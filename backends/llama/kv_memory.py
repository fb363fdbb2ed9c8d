"""The saved-state memory of the llama.cpp runtime: slots' KV sequences copied to host
memory, least recently used first, within a byte budget (``kvMemoryMb``). Pure
bookkeeping; ``runtime.Slot`` saves and restores the bytes."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass


@dataclass(slots=True)
class SavedState:
    """A slot's sequence copied to host memory (``llama_state_seq_get_data``): its KV
    entries and what its ``Slot`` knows of them; it can come back into any slot."""

    tokens: list[int]
    prompt_len: int
    stale_from: int | None
    drift: int
    data: ctypes.Array[ctypes.c_uint8]

    @property
    def nbytes(self) -> int:
        return len(self.data)


class KvMemory:
    """Saved states of slots, least recently used first, within ``budget`` bytes.

    Going back to a document or a place costs a copy of its saved state (tens of ms)
    instead of evaluating its prompt again (seconds on a small CPU). A state whose
    tokens another one extends is dropped: the longer one serves every prompt it served.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.states: list[SavedState] = []
        self.saves = 0
        self.restores = 0
        self.evictions = 0

    @property
    def used(self) -> int:
        return sum(s.nbytes for s in self.states)

    def add(self, state: SavedState) -> None:
        n = len(state.tokens)
        for old in self.states:
            if len(old.tokens) >= n and old.tokens[:n] == state.tokens and old.stale_from is None:
                return  # already held, and more
        exact = n if state.stale_from is None else state.stale_from
        self.states = [
            s
            for s in self.states
            if not (len(s.tokens) <= exact and state.tokens[: len(s.tokens)] == s.tokens)
        ]
        self.states.append(state)
        self.saves += 1
        while self.states and self.used > self.budget:
            self.states.pop(0)
            self.evictions += 1

    def take(self, index: int) -> SavedState:
        self.restores += 1
        return self.states.pop(index)

    def as_dict(self) -> dict[str, int]:
        return {
            "states": len(self.states),
            "bytes": self.used,
            "budgetBytes": self.budget,
            "tokens": sum(len(s.tokens) for s in self.states),
            "saves": self.saves,
            "restores": self.restores,
            "evictions": self.evictions,
        }
