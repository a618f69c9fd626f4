"""What the pictures share: the figure they are drawn on (:func:`figure`, a self-displaying
:class:`~kvfast.plot.display.Picture`), the type sizes, and where ticks go: channels at powers of
two (on head boundaries), and as many row labels as fit at the tick size (no overlapping labels
however many rows). matplotlib is imported when a figure is made, not with this module."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TICK = 9
"""Points: every tick label of every picture (both axes, colourbars, token pieces)."""
LABEL = 10
"""Points: axis labels and the figure's title."""
TITLE = 9
"""Points: a panel's title."""


def figure(**kw: Any) -> Figure:
    """A :class:`~kvfast.plot.display.Picture` (a matplotlib Figure that shows itself in notebooks)."""
    try:
        from kvfast.plot.display import Picture
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("kvfast's pictures need matplotlib: pip install 'kvfast[plot]'") from e
    return Picture(**kw)


def tick_sizes(ax: Any, size: float = TICK) -> None:
    """Both axes' tick labels of `ax` at `size` points."""
    ax.tick_params(axis="both", which="both", labelsize=size)


def channel_step(width: int, most: int = 10) -> int:
    """The spacing of channel ticks over `width` channels: the smallest power of two that leaves
    at most `most` ticks (256 channels read 0, 32, 64, ..., not 0, 40, 80, ...): with heads of a
    power-of-two size, every head starts on a tick."""
    step = 1
    while width > step * most:
        step *= 2
    return step


def channel_ticks(ax: Any, width: int) -> list[int]:
    """Ticks on `ax`'s x axis at multiples of :func:`channel_step`, within ``0 .. width - 1``."""
    step = channel_step(width)
    locs = list(range(0, width, step))
    ax.set_xticks(locs)
    return locs


def fitting(height_in: float, size: float = TICK, spacing: float = 1.6) -> int:
    """How many labels of `size` points fit along `height_in` inches, each given `spacing` times
    its size (at least one)."""
    return max(1, int(height_in * 72 / (size * spacing)))


def stride(n: int, most: int) -> int:
    """Label every k-th of `n` rows so that at most `most` are labelled."""
    return max(1, math.ceil(n / max(1, most)))
