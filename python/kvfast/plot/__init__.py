"""Pictures of states as matplotlib figures (:mod:`.figures`, re-exported here: ``kvfast.plot.layout``
and the like; :mod:`.comparison` draws one state against another; :mod:`.attention` draws the
attention of captured queries, :mod:`.grid` the weights it draws, :mod:`.html` an interactive page
of them), their colour scales and cell windows (:mod:`.scale`), their type
sizes and ticks (:mod:`.style`) and the figure they are drawn on (:mod:`.display`: it shows itself
in a notebook). matplotlib itself is imported when a figure is drawn."""

from kvfast.plot.attention import attention_map, attention_mass
from kvfast.plot.figures import COLORS, diff, heatmap, layout, per_token, stats
from kvfast.plot.html import HtmlView, attention_html

__all__ = [
    "COLORS",
    "HtmlView",
    "attention_html",
    "attention_map",
    "attention_mass",
    "diff",
    "heatmap",
    "layout",
    "per_token",
    "stats",
]
