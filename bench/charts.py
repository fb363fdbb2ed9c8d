"""The benchmarks' charts: one way to draw a figure into a PNG, one way to draw bars side
by side. matplotlib is imported when a chart is drawn (``pip install kode[bench]``), so
the benchmarks' pure parts and ``kode`` itself start without it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def figure(path: Path, size: tuple[float, float]) -> Iterator[Any]:
    """The axes of a ``size`` (inches) figure, saved to ``path`` (120 dpi, laid out
    tight) when the block ends without an error; closed either way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    try:
        yield ax
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def grouped_bars(
    ax: Any, groups: Sequence[str], series: Mapping[str, Sequence[float]], **labels: Any
) -> None:
    """One bar per series in every group, side by side and centred on the group's tick
    (``labels``: how the tick labels are drawn, e.g. ``rotation=20``); a legend names the
    series."""
    width = 0.8 / max(len(series), 1)
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, list(values), width=width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(list(groups), **labels)
