"""The figure kvfast's pictures are drawn on (imported with matplotlib, when a picture is drawn).

A :class:`Picture` is a matplotlib ``Figure`` that displays itself: as the last expression of a
notebook cell it shows as a PNG (``_repr_png_``) whether or not pyplot was imported (a plain
``Figure`` made without pyplot shows as ``<Figure size 700x440 with 2 Axes>``). Where pyplot's
inline backend is active, IPython's own formatter for figures draws it as any other. It is not
registered with pyplot: ``plt.show()`` does not show it twice, and it is freed with its last
reference. Saved, pickled and drawn like any figure.
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure


class Picture(Figure):
    """A matplotlib Figure that shows itself in a notebook (see the module's docstring)."""

    def _repr_png_(self) -> bytes:
        """The figure as PNG bytes: what IPython shows for the last expression of a cell."""
        buf = io.BytesIO()
        self.savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()
