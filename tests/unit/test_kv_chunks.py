"""The chunk store keeps evaluated chunks by their tokens within its budget, least
recently used dropped first (no model: the entries are opaque bytes)."""

from __future__ import annotations

import ctypes

from kode.backends.llama.kv_chunks import Chunk, ChunkStore, Plan, cost


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


def test_a_chunk_is_found_by_its_end_and_forgotten_with_it() -> None:
    store = ChunkStore(1000)
    store.add(chunk((1, 2, 3, 4, 5, 6), 10))
    # The whole chunk, then a window's first chunk that starts inside it (its first two
    # tokens are evaluated again: only the rest must be the chunk's end).
    assert store.find((1, 2, 3, 4, 5, 6), 2) is not None
    hit = store.find((9, 9, 3, 4, 5, 6), 2)
    assert hit is not None and hit[1] == 2  # (3, 4, 5, 6) starts at index 2 of the chunk
    assert store.find((9, 9, 9, 9, 4, 5, 6), 4) is None  # too short to restore
    assert store.find((9, 9, 3, 4, 5, 7), 2) is None  # another end
    assert store.find((9, 9), 2) is None  # nothing after the seam
    assert (store.hits, store.misses) == (2, 2)
    assert store.find((9, 9, 3, 4, 5, 6), 2, count=False) is not None
    assert (store.hits, store.misses) == (2, 2)
    store.add(chunk((7, 8, 9, 10, 11), 995))  # drops the first
    assert store.find((9, 9, 3, 4, 5, 6), 2) is None


def test_assembly_evaluates_the_head_the_seams_and_every_chunk_not_stored() -> None:
    store = ChunkStore(1000)
    tokens = list(range(100, 140))
    store.add(chunk(tuple(tokens[10:20]), 10))
    store.add(chunk((1, 2, *tokens[23:30]), 10))  # ends like the window's third chunk
    found = Plan(header=4, chunks=((4, 10), (10, 20), (20, 30)), tail=30)
    # Head 4, (4, 10) not stored: 6, (10, 20): seam 3, (20, 30): seam 3.
    assert cost(tokens, found, store, 3) == (4 + 6 + 3 + 3, 2)
    # A slot holding the first 12 tokens exactly keeps the head and the first chunk.
    assert cost(tokens, found, store, 3, held=12) == (3 + 3, 2)
    assert cost(tokens, found, ChunkStore(1000), 3) == (30, 0)


def test_a_window_chunk_that_ends_inside_a_stored_one_is_its_head() -> None:
    # The last chunk of a window ends at the cursor's line: the first tokens of a stored
    # chunk (their entries are those of these tokens alone).
    store = ChunkStore(1000)
    store.add(chunk((1, 2, 3, 4, 5, 6, 7, 8), 10))
    hit = store.find((1, 2, 3, 4, 5, 6), 2)
    assert hit is not None and hit[1] == 2
    assert store.find((1, 2, 3, 9, 5, 6), 2) is None
    store.add(chunk((7, 8, 9, 10, 11), 995))  # drops the first, and its index entries
    assert store.find((1, 2, 3, 4, 5, 6), 2) is None
