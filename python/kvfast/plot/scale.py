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


def select_cells(
    cells: tuple[int, int] | None, n: int, what: str = "cells", of: str = "the record"
) -> tuple[int, int]:
    """The (start, stop) of a cell range within ``0..n``; all of them for None."""
    if cells is None:
        return 0, n
    try:
        start, stop = (int(c) for c in cells)
    except (TypeError, ValueError):
        raise SelectionError(f"{what} must be (start, stop), not {cells!r}") from None
    if not 0 <= start < stop <= n:
        raise SelectionError(f"{what} {start}:{stop} out of range: {of} has {n} {what} (0:{n})")
    return start, stop


def select_rows(rows: tuple[int | None, int | None] | None, n: int) -> tuple[int, int]:
    """The (start, stop) of a range of the ``n`` captured query rows, read as a slice (None: an
    end; negative: from the end, ``(-64, None)``: the last 64); all of them for None."""
    if rows is None:
        return 0, n
    try:
        a, b = rows
        start, stop, _ = slice(None if a is None else int(a), None if b is None else int(b)).indices(n)
    except (TypeError, ValueError):
        raise SelectionError(f"rows must be (start, stop), not {rows!r}") from None
    if stop <= start:
        raise SelectionError(f"rows {rows[0]}:{rows[1]} select none of the queries' {n} rows")
    return start, stop


CellsArg = tuple[int, int] | str | None
"""Cells of a picture of attention: None (all), ``(start, stop)``, ``"sinks+recent"`` (the first
:data:`SINKS` cells and the last :data:`RECENT`, side by side) or ``"N+M"`` (the first N and the
last M)."""
SINKS = 16
"""``"sinks+recent"``: the first cells shown (attention sinks: ``<bos>`` and the first tokens)."""
RECENT = 64
"""``"sinks+recent"``: the last cells shown (the recent window)."""


def cell_parts(cells: CellsArg, n: int) -> list[tuple[int, int]]:
    """The ranges of cells drawn side by side: one range, or the first and the last cells
    (``"sinks+recent"``, ``"N+M"``; one range of all ``n`` when they meet)."""
    if not isinstance(cells, str):
        return [select_cells(cells, n)]
    first, last = SINKS, RECENT
    if cells != "sinks+recent":
        parts = cells.split("+")
        try:
            if len(parts) != 2:
                raise ValueError
            first, last = int(parts[0]), int(parts[1])
        except ValueError:
            raise SelectionError(
                f"cells {cells!r}: give (start, stop), 'sinks+recent' or 'N+M' (the first N cells and the last M)"
            ) from None
        if first < 0 or last < 0 or first + last == 0:
            raise SelectionError(f"cells {cells!r}: N and M are counts of cells, 0 or more, not both 0")
    if first + last >= n:
        return [(0, n)]
    return [p for p in ((0, first), (n - last, n)) if p[1] > p[0]]


ATTENTION_SCALES = ("log", "row", "linear")
"""The colour scales of attention maps; the first is the default (see :func:`attention_scale`)."""


def attention_scale(
    w: npt.NDArray[np.floating[Any]], scale: str = "log"
) -> tuple[npt.NDArray[np.floating[Any]], Any, str]:
    """The weights ``w[..., row, cell]`` as drawn, a matplotlib norm and the colourbar's label.

    ``"log"`` (the default): the weights on a log scale over four decades below the largest. At
    2k-8k cells a query's weights are mostly of the order of 1/cells (1e-4 at 8k) beside sinks of
    0.3-0.9: a linear scale draws all but the sinks in its bottom colour, a log one shows the recent
    window, the heavy hitters and the sinks at once. ``"row"``: each query row divided by its
    largest weight, linear (what each query reads most, whatever its row's spread). ``"linear"``:
    the weights from 0 to the largest."""
    if scale not in ATTENTION_SCALES:
        raise SelectionError(f"scale must be one of {', '.join(ATTENTION_SCALES)}, not {scale!r}")
    from matplotlib.colors import Normalize

    if scale == "row":
        peak = np.fmax.reduce(w, axis=-1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            shown = w / np.where(peak > 0, peak, 1.0)
        return shown, Normalize(vmin=0, vmax=1), "attention weight / its query row's largest"
    norm, label = colour_scale(w, scale)
    return w, norm, label.replace("|value|", "attention weight", 1)


def parse_cells(text: str) -> tuple[int, int] | str:
    """``A:B`` (cells A to B-1) from the command line; ``:B`` and ``A:`` are not taken (the count
    is not known here); ``sinks+recent`` and ``N+M`` are kept as given (attention pictures)."""
    if text == "sinks+recent" or "+" in text:
        return text
    return parse_range(text)


def parse_range(text: str) -> tuple[int, int]:
    """``A:B`` (A to B-1) from the command line."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        start, stop = int(parts[0]), int(parts[1])
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"{text!r} is not a range START:STOP") from None
    return start, stop


def parse_rows(text: str) -> tuple[int | None, int | None]:
    """``A:B`` of the captured query rows, as a slice: either end may be left out and a negative
    one counts from the end (``-64:``: the last 64)."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        a, b = (int(x) if x.strip() else None for x in parts)
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(
            f"{text!r} is not a range of rows START:STOP (-64: for the last 64)"
        ) from None
    return a, b
