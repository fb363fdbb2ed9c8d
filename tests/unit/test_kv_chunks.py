"""The chunk store keeps evaluated chunks by their tokens within its budget, least
recently used dropped first (no model: the entries are opaque bytes)."""

from __future__ import annotations

import ctypes

from kode.backends.llama.kv_chunks import Chunk, ChunkStore


def chunk(tokens: tuple[int, ...], nbytes: int) -> Chunk:
    return Chunk(tokens, (ctypes.c_uint8 * nbytes)())


def test_the_least_recently_used_chunk_goes_first_within_the_budget() -> None:
    store = ChunkStore(300)
    store.add(chunk((1,), 100))
    store.add(chunk((2,), 100))
    store.add(chunk((3,), 100))
    assert store.get([1]) is not None  # 1 is now the most recent
    store.add(chunk((4,), 100))
    assert (2,) not in store and [1] in store and (3,) in store and (4,) in store
    assert store.used == 300 and store.evictions == 1
    assert store.get((2,)) is None
    assert store.as_dict() == {
        "chunks": 3,
        "bytes": 300,
        "budgetBytes": 300,
        "tokens": 3,
        "hits": 1,
        "misses": 1,
        "evictions": 1,
    }


def test_a_chunk_over_the_budget_is_not_kept_and_a_new_copy_replaces_the_old() -> None:
    store = ChunkStore(150)
    store.add(chunk((1, 2), 200))
    assert len(store) == 0 and store.used == 0
    store.add(chunk((1, 2), 100))
    store.add(chunk((1, 2), 120))
    assert len(store) == 1 and store.used == 120
