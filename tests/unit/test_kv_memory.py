"""The saved-state memory of the llama.cpp runtime (``KvMemory``), without a model: what
it keeps, what a longer state replaces, and what the byte budget evicts."""

from __future__ import annotations

import ctypes

from kode.backends.llama.kv_memory import KvMemory, SavedState


def state(tokens: list[int], nbytes: int, stale_from: int | None = None) -> SavedState:
    return SavedState(tokens, len(tokens), stale_from, 0, (ctypes.c_uint8 * nbytes)())


def test_a_longer_state_replaces_the_states_it_extends() -> None:
    memory = KvMemory(budget=1000)
    memory.add(state([1, 2, 3], 100))
    memory.add(state([7, 8], 100))
    memory.add(state([1, 2, 3, 4, 5], 100))  # serves every prompt [1, 2, 3] served
    assert [s.tokens for s in memory.states] == [[7, 8], [1, 2, 3, 4, 5]]
    memory.add(state([1, 2], 100))  # already held, and more
    assert len(memory.states) == 2
    assert memory.saves == 3


def test_the_least_recently_saved_go_first_past_the_budget() -> None:
    memory = KvMemory(budget=250)
    for first in range(4):
        memory.add(state([first, 0, 0], 100))
    assert [s.tokens[0] for s in memory.states] == [2, 3]
    assert memory.used == 200 and memory.evictions == 2


def test_take_hands_a_state_back_and_counts_it() -> None:
    memory = KvMemory(budget=1000)
    memory.add(state([1], 10))
    memory.add(state([2], 10))
    taken = memory.take(0)
    assert taken.tokens == [1]
    assert [s.tokens for s in memory.states] == [[2]]
    report = memory.as_dict()
    assert report["restores"] == 1 and report["states"] == 1 and report["bytes"] == 10
