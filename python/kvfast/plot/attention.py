"""Pictures of attention from captured queries (:mod:`kvfast.attn`): matplotlib figures.

- :func:`attention_map`: the weights of one model layer, a panel per query head: query rows
  (their positions) down, the cache's cells across, a cell no query of the row sees left blank;
- :func:`attention_mass`: the attention each cell received, cells along x (the token's pieces as
  labels where the state knows them), a panel per cache: the mean share of a query head's
  attention (``what="share"``: sinks stand out) or the mass accumulated over the queries
  (``what="mass"``: H2O's heavy hitters), both as :func:`kvfast.attn.sinks` computes them.

The drawn numbers are the tables' own: the map's image array (``fig.axes[h].images[0]``) is the
weights of head ``h`` pivoted (rows: the queries, columns: the cells), the bars' heights are the
``share`` / ``mass`` column, in cell order. Every picture is a self-displaying
:class:`~kvfast.plot.display.Picture` with its tick labels at :data:`~kvfast.plot.style.TICK` points.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import polars as pl

from kvfast.attn.scores import sinks
from kvfast.attn.weights import Incomplete, QueriesArg
from kvfast.errors import SelectionError
from kvfast.plot import style
from kvfast.plot.grid import Grid, attention_grid
from kvfast.plot.scale import CellsArg, attention_scale
from kvfast.read.state import State

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["attention_map", "attention_mass"]

KEYS = ["stream", "cell"]


def _labels(pieces: list[str | None], cells: list[int]) -> list[str]:
    return [str(c) if p is None else f"{c} {p!r}" for c, p in zip(cells, pieces, strict=True)]


def _cell_ticks(ax: Axes, pieces: list[str | None], cell_ids: list[int], width: float) -> None:
    """The cell axis's ticks, as many as fit in `width` inches: the tokens' pieces where the state
    has them, else the cells' numbers."""
    named = any(p is not None for p in pieces)
    # pieces stand rotated (a line of type each); numbers lie flat, as wide as their digits
    digits = len(str(max(cell_ids))) if cell_ids else 1
    spacing = 2.2 if named else max(2.2, 0.65 * digits + 1.2)
    at = list(range(0, len(cell_ids), style.stride(len(cell_ids), style.fitting(width, spacing=spacing))))
    ax.set_xticks(at)
    if named:
        ax.set_xticklabels(
            _labels([pieces[i] for i in at], [cell_ids[i] for i in at]), rotation=90, fontsize=style.TICK
        )
    else:
        ax.set_xticklabels([str(cell_ids[i]) for i in at], fontsize=style.TICK)


def _cache_cells(state: State, cache: int) -> pl.DataFrame:
    """Every (stream, cell) of a cache in order, with pos and the token's piece (null: unknown)."""
    t = state.cell_tokens().filter(pl.col("cache") == cache)
    return t.select(pl.col("stream").cast(pl.Int64), pl.col("cell").cast(pl.Int64), "pos", "piece").sort(KEYS)


def _row_ticks(ax: Axes, g: Grid, height: float) -> None:
    """The query axis's ticks, as many as fit in `height` inches: position (sequence where there
    are several) and the token's piece where the state has it."""
    n = len(g.query_pos)
    ys = list(range(0, n, style.stride(n, style.fitting(height))))
    multi_seq = len(set(g.seq_id.tolist())) > 1
    labels = []
    for i in ys:
        text = f"{g.query_pos[i]} ({g.seq_id[i]})" if multi_seq else str(g.query_pos[i])
        piece = g.query_piece[i]
        labels.append(text if piece is None else f"{text} {piece!r}")
    ax.set_yticks(ys)
    ax.set_yticklabels(labels)


def _break_marks(left: Axes, right: Axes) -> None:
    """The broken axis between two parts of the cells: the facing spines hidden, // marks."""
    left.spines["right"].set_visible(False)
    right.spines["left"].set_visible(False)
    right.tick_params(axis="y", left=False, labelleft=False)
    kw: dict[str, Any] = {"marker": [(-1, -1.5), (1, 1.5)], "markersize": 9, "linestyle": "none"}
    kw.update(color="k", mec="k", mew=1, clip_on=False)
    left.plot([1, 1], [0, 1], transform=left.transAxes, **kw)
    right.plot([0, 0], [0, 1], transform=right.transAxes, **kw)


def attention_map(
    state: State,
    queries: QueriesArg,
    layer: int,
    *,
    heads: Sequence[int] | None = None,
    rows: tuple[int | None, int | None] | None = None,
    cells: CellsArg = None,
    scale: str = "log",
    model: str | os.PathLike[str] | None = None,
    incomplete: Incomplete = "skip",
) -> Figure:
    """The attention weights of model layer ``layer``, a panel per query head (``heads``: only
    these): a row per query (``rows=(start, stop)``: only these of the captured rows), a column per
    cell of the cache holding the layer (``cells=(start, stop)``: only those; ``"sinks+recent"``:
    the first 16 cells and the last 64 side by side, a broken axis; ``"N+M"``: the first N and the
    last M), blank where the query does not see the cell (later positions, another sequence,
    outside a sliding window). Both axes carry the tokens' pieces where the state knows them (as
    many as fit).

    ``scale``: ``"log"`` (default: at thousands of cells most weights are near 1/cells beside sinks
    near 1, which only a log scale shows together), ``"row"`` (each query row divided by its
    largest weight) or ``"linear"``. The weights come from ``kvfast.attn.dense``, in memory of
    the order of the drawn array: past 1024 rows or 1024 cells a drawn value is the largest weight
    of its block (the title says so; see :mod:`kvfast.plot.grid`)."""
    g = attention_grid(
        state, queries, layer, rows=rows, cells=cells, heads=heads, model=model, incomplete=incomplete
    )
    shown_w, norm, label = attention_scale(g.stacked(), scale)
    bounds = np.cumsum([0] + [p.weights.shape[2] for p in g.parts])
    n, k = len(g.heads), len(g.parts)
    n_cols = int(bounds[-1])
    zoomed = k > 1
    # a zoomed view labels every cell: as wide as its labels need
    panel_w = min(max(3.4, n_cols * style.TICK * 1.5 / 72), 20.0) if zoomed else 3.4
    ncol = max(1, min(n, 4, int(22 // (panel_w + 0.4))))
    nrow = -(-n // ncol)
    fig = style.figure(
        figsize=(min(3.2 + (panel_w + 0.4) * ncol, 24), 0.8 + 3.2 * nrow), layout="constrained"
    )
    # the panels, and a narrow column at the right for the colourbar they share
    outer = fig.add_gridspec(nrow, ncol + 1, width_ratios=[1.0] * ncol + [0.04 * max(1.0, 3.4 / panel_w)])
    widths = [max(1, p.weights.shape[2]) for p in g.parts]
    im = None
    drawn: list[Axes] = []
    for i, h in enumerate(g.heads):
        sub = outer[i // ncol, i % ncol].subgridspec(1, k, width_ratios=widths, wspace=0.04)
        axes = [fig.add_subplot(sub[0, j]) for j in range(k)]
        for j, (ax, part) in enumerate(zip(axes, g.parts, strict=True)):
            img = shown_w[i, :, bounds[j] : bounds[j + 1]]
            im = ax.imshow(
                np.ma.masked_invalid(img), aspect="auto", interpolation="nearest", cmap="viridis", norm=norm
            )
            ax.set_facecolor("#f2f2f2")
            share = part.weights.shape[2] / max(1, n_cols)
            _cell_ticks(
                ax, part.piece, part.cell.tolist(), width=max(0.6, panel_w * (share if zoomed else 1.0))
            )
            style.tick_sizes(ax)
        axes[0].set_title(
            f"model layer {layer} head {h}", fontsize=style.TITLE, loc="left" if zoomed else "center"
        )
        axes[0].set_ylabel("query position", fontsize=style.LABEL)
        _row_ticks(axes[0], g, height=2.6)
        style.tick_sizes(axes[0])
        for a, b in itertools.pairwise(axes):
            b.sharey(a)
            _break_marks(a, b)
        fig.supxlabel(
            "cell"
            + (
                f" (the first {g.parts[0].stop} and the last {g.n_cells - g.parts[-1].start})"
                if zoomed
                else ""
            ),
            fontsize=style.LABEL,
        )
        drawn += axes
    pooled = f"; each value the largest of {g.row_step} rows x {g.col_step} cells" if g.pooled else ""
    fig.suptitle(
        f"{os.path.basename(state.path)}: attention of {g.n_rows} queries over cache {g.cache}{pooled}",
        fontsize=style.LABEL,
    )
    if im is not None:
        bar = fig.colorbar(im, cax=fig.add_subplot(outer[:, ncol]))
        bar.set_label(label, fontsize=style.LABEL)
        style.tick_sizes(bar.ax)
    return fig


def attention_mass(
    state: State,
    queries: QueriesArg,
    *,
    what: Literal["share", "mass"] = "share",
    layers: Sequence[int] | None = None,
    log: bool = False,
    model: str | os.PathLike[str] | None = None,
    incomplete: Incomplete = "skip",
) -> Figure:
    """The attention each cell received, a bar per cell along x, a panel per cache: ``share``,
    the mean share of a query head's attention (over the layers, ``layers``: only these model
    layers, their heads and the queries that saw the cell), or ``mass``, the attention it
    accumulated (H2O's score); the x axis labelled with the tokens' pieces where the state knows
    them, as many as fit. Cell 0 (``<bos>``, the largest bar as a rule) is drawn clear of the y
    axis (a margin of one bar either side); ``log=True``: a log y axis (the sinks and the rest at
    once)."""
    if what not in ("share", "mass"):
        raise SelectionError(f"what must be 'share' or 'mass', not {what!r}")
    view = sinks(state, queries, model=model, layers=layers, incomplete=incomplete)
    caches = sorted(view["cache"].unique().to_list())
    if not caches:
        raise SelectionError("no query sees a cell of the state")
    fig = style.figure(figsize=(12, 0.9 + 2.6 * len(caches)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(caches), 1, squeeze=False).ravel())
    for ax, cache in zip(axes, caches, strict=True):
        cols = _cache_cells(state, int(cache))
        got = view.filter(pl.col("cache") == cache).select(
            pl.col("stream").cast(pl.Int64), pl.col("cell").cast(pl.Int64), what
        )
        y = cols.join(got, on=KEYS, how="left", maintain_order="left")[what].fill_null(0.0).to_numpy()
        x = np.arange(len(y))
        # a margin either side (1.5% of the cells, at least one bar): the first bar (<bos>, the main
        # sink) stands clear of the y axis's spine however many cells there are; past the pixels
        # of the axis a bar keeps a hairline edge, so that one cell's bar cannot vanish
        n = len(y)
        margin = max(1.0, 0.015 * n)
        ax.bar(
            x,
            y,
            width=0.8 if n <= 64 else 1.0,
            color="#1f77b4",
            edgecolor="#1f77b4" if n > 400 else "none",
            linewidth=0.6 if n > 400 else 0.0,
        )
        ax.set_xlim(-0.5 - margin, n - 0.5 + margin)
        if log and (y > 0).any():
            ax.set_yscale("log")
            ax.set_ylim(bottom=float(y[y > 0].min()) / 2)
        pieces, cell_ids = cols["piece"].to_list(), cols["cell"].to_list()
        _cell_ticks(ax, pieces, cell_ids, width=11.0)
        ax.set_xlabel("cell" if len(caches) == 1 else f"cell of cache {cache}", fontsize=style.LABEL)
        ax.set_ylabel(
            "mean share of a head's attention" if what == "share" else "attention accumulated",
            fontsize=style.LABEL,
        )
        ax.grid(axis="y", alpha=0.3)
        style.tick_sizes(ax)
    which = "" if layers is None else f", model layers {', '.join(str(x) for x in layers)}"
    fig.suptitle(
        f"{os.path.basename(state.path)}: attention received per cell"
        f" ({'sinks: share' if what == 'share' else 'heavy hitters: H2O mass'}{which})",
        fontsize=style.LABEL,
    )
    return fig
