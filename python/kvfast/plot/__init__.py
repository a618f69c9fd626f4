"""Pictures of states as matplotlib figures (:mod:`.figures`, re-exported here: ``kvfast.plot.layout``
and the like) and their colour scales and cell windows (:mod:`.scale`, no matplotlib needed).
matplotlib itself is imported when a figure is drawn."""

from kvfast.plot.figures import COLORS, diff, heatmap, layout, per_token, stats

__all__ = ["COLORS", "diff", "heatmap", "layout", "per_token", "stats"]
