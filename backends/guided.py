"""The names monitor applied where a target picks its tokens.

A target (``steppers.Target``) picks after a batch row; which text that row ends depends
on the row: the generation's tokens already in the cache, then the path through the
token tree from its root to the row. ``Guide`` keeps those paths (``tree``, ``rows``) and
masks a row's logits (``logits``) with what ``backends/monitor.py`` allows after that
text, and weighs them where an attribute is being made (``monitor.Prior``), so every
decoding method picks under the same rule at the same text: a draft token is accepted
only if it equals the masked pick (sample-and-match), or by the p/q rule against the
masked distribution, which is what plain constrained decoding samples from. Speculation
stays lossless against constrained decoding. A row it has no path for (lookahead's
window rows, which only guess) is picked unmasked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from kode.backends.base import GenerationStats
from kode.backends.monitor import Monitor
from kode.backends.speculative import TokenTree

log = logging.getLogger("kode.backends.monitor")

Logits = npt.NDArray[np.float32]


class Guide:
    """One generation's monitor and the text of each row of its last batch."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self._paths: dict[int, tuple[int, ...]] = {-1: ()}  # batch row -> tokens to it
        self._generated: list[int] = []  # the generation's tokens in the cache, in order
        self._text = b""  # what they spell
        self.ms = 0.0  # time spent judging rows and masking

    def prompt(self) -> None:
        """The prompt was evaluated: its last row (-1) ends the text before generation."""
        self._paths = {-1: ()}

    def tree(self, tree: TokenTree, first_row: int = 0) -> None:
        """A batch holds ``tree`` from row ``first_row`` (root first)."""
        paths: dict[int, tuple[int, ...]] = {}
        for r, token in enumerate(tree.tokens):
            parent = tree.parents[r]
            paths[first_row + r] = (*paths.get(first_row + parent, ()), token)
        self._paths = paths

    def rows(self, paths: dict[int, tuple[int, ...]]) -> None:
        """A batch's rows and the tokens from the root to each (a batched plain step)."""
        self._paths = paths

    def commit(self, tokens: Sequence[int]) -> None:
        """``tokens`` (the root and what was accepted) joined the cache."""
        pieces = self.monitor.index.pieces
        self._generated.extend(tokens)
        self._text += b"".join(pieces[t] for t in tokens)

    def _written(self, row: int) -> bytes | None:
        """What the generation has written up to row ``row`` of the last batch."""
        path = self._paths.get(row)
        if path is None:
            return None
        pieces = self.monitor.index.pieces
        return self._text + b"".join(pieces[t] for t in path)

    def mask(self, row: int) -> npt.NDArray[np.bool_] | None:
        """What may follow row ``row`` of the last batch; None: anything."""
        generated = self._written(row)
        return None if generated is None else self._judge(generated)

    def _judge(self, generated: bytes) -> npt.NDArray[np.bool_] | None:
        start = time.perf_counter()
        before = self.monitor.fired.dereferences
        mask = self.monitor.allowed(generated)
        fired = self.monitor.fired
        if fired.dereferences > before:
            log.debug("names monitor fired: %d names allowed", fired.names[-1])
        self.ms += (time.perf_counter() - start) * 1000.0
        return mask

    def logits(self, row: int, logits: Logits) -> Logits:
        """Row ``row``'s logits, masked where the monitor constrains and weighed by the
        names likely made where an attribute is made (a copy then; ``logits`` is never
        changed)."""
        generated = self._written(row)
        if generated is None:
            return logits
        mask = self._judge(generated)
        start = time.perf_counter()
        prior = self.monitor.prior(generated)
        if mask is None and prior is None:
            self.ms += (time.perf_counter() - start) * 1000.0
            return logits
        if mask is None:
            out = np.array(logits, dtype=np.float32, copy=True)
        else:
            out = np.where(mask, logits, np.float32(-np.inf)).astype(np.float32, copy=False)
        if prior is not None:
            prior.mix(out)
            if self.monitor.fired.weighed == 1:  # sizes only, never the names
                log.debug("names monitor weighed %d names likely made", len(prior.shares))
        self.ms += (time.perf_counter() - start) * 1000.0
        return out

    def record(self, stats: GenerationStats) -> None:
        fired = self.monitor.fired
        stats.monitor_fired = fired.dereferences
        stats.monitor_picks = fired.steps
        stats.monitor_ms = self.ms
