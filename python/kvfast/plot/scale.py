"""Colour scales and cell ranges of the pictures: linear, log, or linear clipped at a percentile.

One planted 20x outlier channel makes a linear |value| heatmap black everywhere else; a log scale
shows the rest, and clipping at a percentile (values above saturate, the colourbar extends) keeps it
linear. The colourbar's label says which was drawn.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from kvfast.errors import SelectionError

SCALES = ("linear", "log")


def colour_scale(
    x: npt.NDArray[np.floating[Any]], scale: str = "linear", clip: float | None = None
) -> tuple[Any, str]:
    """A matplotlib norm for |values| `x`, and the colourbar's label."""
    from matplotlib.colors import LogNorm, Normalize

    if scale not in SCALES:
        raise ValueError(f"scale must be 'linear' or 'log', not {scale!r}")
    finite = x[np.isfinite(x)]
    label = "|value|"
    if clip is not None:
        if not 0 < clip <= 100:
            raise ValueError(f"clip is a percentile, above 0 and at most 100, not {clip!r}")
        vmax = float(np.percentile(finite, clip)) if finite.size else 1.0
        label += f", clipped at its {clip:g}th percentile ({vmax:.3g})"
    else:
        vmax = float(finite.max()) if finite.size else 1.0
    vmax = vmax or 1.0
    if scale == "log":
        positive = finite[finite > 0]
        # the smallest value shown: the 1st percentile of the non-zero values, at most 1e4 below vmax
        low = float(np.percentile(positive, 1)) if positive.size else vmax / 1e4
        vmin = min(max(low, vmax / 1e4), vmax / 10)
        return LogNorm(vmin=vmin, vmax=vmax, clip=True), label + " (log scale; zeros at the bottom)"
    return Normalize(vmin=0, vmax=vmax), label


def select_cells(cells: tuple[int, int] | None, n: int) -> tuple[int, int]:
    """The (start, stop) of a cell range within ``0..n``; all of them for None."""
    if cells is None:
        return 0, n
    try:
        start, stop = (int(c) for c in cells)
    except (TypeError, ValueError):
        raise SelectionError(f"cells must be (start, stop), not {cells!r}") from None
    if not 0 <= start < stop <= n:
        raise SelectionError(f"cells {start}:{stop} out of range: the record has {n} cells (0:{n})")
    return start, stop


def parse_cells(text: str) -> tuple[int, int]:
    """``A:B`` (cells A to B-1) from the command line; ``:B`` and ``A:`` are not taken (the count
    is not known here)."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        start, stop = int(parts[0]), int(parts[1])
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"{text!r} is not a cell range START:STOP") from None
    return start, stop
