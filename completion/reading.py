"""Reading the active document into the engine's chunk store while the user reads (issue
#29), so that the full window at a place the user jumps to is assembled from chunks read
earlier instead of evaluated (``backends/llama/kv_chunks.py``, ``chunkMemoryMb``).

The rules (``regions`` and ``Reader.next`` decide them, purely):

1. A document is read in regions of about ``READ_LINES`` lines that start and end where
   chunks do (``kv_reuse.chunk_boundary``: the same lines the engine splits a prompt
   at), so every chunk of a region is a chunk of any window that holds its lines.
2. Regions nearest the places the user visited in the document come first (the cursor
   now, then the places before it, most recent first), then the rest outwards.
3. A region is read once per text: an edited region reads again (its chunks changed),
   the others are not read twice.
4. Reading stops when the next region would not fit the store's budget with what it
   holds (reading on would drop the chunks nearest the user first).

Reading is background work (``Preparation``): it waits for a quiet moment, yields to
every keystroke and stops when the cursor moves.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from kode.backends.kv_reuse import CHUNK_EVERY, chunk_boundary

# Lines per read request (about 800 tokens of Python: seconds of prefill on 2 cores; the
# engine stops between two chunks when a keystroke comes).
READ_LINES = 96
# Places remembered per document (rule 2).
VISITED = 8
# Regions remembered as read per document, the latest kept: a 10,000-line document has
# about 100 regions, so ten times that leaves room for a session's edits and undos (an
# undone edit's region is not read again) at ~100 KB a document at most.
READ_MARKS = 1024


def regions(
    lines: Sequence[str], near: Sequence[int], size: int = READ_LINES, every: int = CHUNK_EVERY
) -> list[tuple[int, int]]:
    """The document's ``lines`` as ``[start, end)`` regions of at least ``size`` lines
    (the last may be shorter) whose ends are chunk boundaries, those nearest the lines
    in ``near`` first (earlier entries of ``near`` win ties).

    >>> lines = ["import sys"] + ["x"] * 9 + ["import sys"] + ["x"] * 9
    >>> regions(lines, near=[15], size=4, every=4)
    [(10, 20), (0, 10)]
    >>> regions(["x"] * 5, near=[], size=4, every=4)
    [(0, 5)]
    """
    bounds = [i for i in range(1, len(lines)) if chunk_boundary(lines[i], every)]
    found, start = [], 0
    for b in [*bounds, len(lines)]:
        if b - start >= size or b == len(lines):
            if b > start:
                found.append((start, b))
            start = b
    if not near:
        return found

    def distance(region: tuple[int, int]) -> tuple[int, int]:
        a, b = region
        gaps = [0 if a <= line < b else min(abs(line - a), abs(line - (b - 1))) for line in near]
        best = min(gaps)
        return best, gaps.index(best)

    return sorted(found, key=distance)


def fingerprint(text: str) -> int:
    return zlib.crc32(text.encode())


class Reader:
    """What was read of each document, and the places visited in it (rules 2-3)."""

    def __init__(self) -> None:
        self._read: dict[str, dict[int, None]] = {}  # uri -> marks read, oldest first
        self._visited: dict[str, list[int]] = {}
        self.regions = 0  # regions read
        self.tokens = 0  # tokens the engine evaluated reading them

    def visit(self, uri: str, line: int) -> None:
        places = [p for p in self._visited.get(uri, []) if p != line]
        self._visited[uri] = [line, *places][:VISITED]

    def forget(self, uri: str) -> None:
        self._read.pop(uri, None)
        self._visited.pop(uri, None)

    def next(self, uri: str, text: str) -> tuple[str, int] | None:
        """The next region of ``text`` to read (its text and fingerprint), or None once
        every region was read."""
        lines = text.splitlines(keepends=True)
        done = self._read.get(uri, {})
        for a, b in regions(lines, self._visited.get(uri, [])):
            region = "".join(lines[a:b])
            mark = fingerprint(region)
            if mark not in done and region.strip():
                return region, mark
        return None

    def done(self, uri: str, mark: int, tokens: int) -> None:
        marks = self._read.setdefault(uri, {})
        marks.pop(mark, None)
        marks[mark] = None
        while len(marks) > READ_MARKS:
            del marks[next(iter(marks))]
        self.regions += 1
        self.tokens += tokens


def fits(store: dict[str, int] | None, region_tokens: int) -> bool:
    """Rule 4: whether ``region_tokens`` more fit the store (``ChunkAssembly.chunk_store``)
    beside what it holds, at the bytes per token it holds now.

    >>> fits({"bytes": 900, "budgetBytes": 1000, "tokens": 90}, 10)
    True
    >>> fits({"bytes": 900, "budgetBytes": 1000, "tokens": 90}, 11)
    False
    """
    if not store or not store.get("budgetBytes"):
        return False
    held, tokens = store.get("bytes", 0), store.get("tokens", 0)
    per_token = held / tokens if tokens else 0
    return held + region_tokens * per_token <= store["budgetBytes"]
