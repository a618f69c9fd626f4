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

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt
import polars as pl

from kvfast.attn.scores import sinks
from kvfast.attn.weights import Incomplete, QueriesArg, attention
from kvfast.errors import SelectionError
from kvfast.plot import style
from kvfast.plot.scale import colour_scale, select_cells
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
    at = list(range(0, len(cell_ids), style.stride(len(cell_ids), style.fitting(width, spacing=2.2))))
    ax.set_xticks(at)
    if any(p is not None for p in pieces):
        ax.set_xticklabels(
            _labels([pieces[i] for i in at], [cell_ids[i] for i in at]), rotation=90, fontsize=style.TICK
        )
    else:
        ax.set_xticklabels([str(cell_ids[i]) for i in at], fontsize=style.TICK)


def _cache_cells(state: State, cache: int) -> pl.DataFrame:
    """Every (stream, cell) of a cache in order, with pos and the token's piece (null: unknown)."""
    t = state.cell_tokens().filter(pl.col("cache") == cache)
    return t.select(pl.col("stream").cast(pl.Int64), pl.col("cell").cast(pl.Int64), "pos", "piece").sort(KEYS)


def _grid(w: pl.DataFrame, rows: pl.DataFrame, cols: pl.DataFrame, head: int) -> npt.NDArray[np.float64]:
    """Head ``head``'s weights as a [rows, cols] array, NaN where the query does not see the cell."""
    h = w.filter(pl.col("head") == head)
    ri = rows.with_row_index("r").join(h, on=["seq_id", "query_pos"])
    at = ri.join(cols.with_row_index("c"), on=KEYS)
    out = np.full((rows.height, cols.height), np.nan)
    out[at["r"].to_numpy(), at["c"].to_numpy()] = at["weight"].to_numpy()
    return out


def attention_map(
    state: State,
    queries: QueriesArg,
    layer: int,
    *,
    heads: Sequence[int] | None = None,
    cells: tuple[int, int] | None = None,
    scale: str = "linear",
    model: str | os.PathLike[str] | None = None,
    incomplete: Incomplete = "skip",
) -> Figure:
    """The attention weights of model layer ``layer``, a panel per query head (``heads``: only
    these): a row per query (sequence, position), a column per cell of the cache holding the layer
    (``cells=(start, stop)``: only those columns), coloured by weight (``scale="log"``: by log
    weight), blank where the query does not see the cell (later positions, another sequence,
    outside a sliding window). The cell axis is labelled with token pieces where the state knows
    them (as many as fit)."""
    w = attention(state, queries, model=model, layers=[layer], heads=heads, incomplete=incomplete)
    if not w.height:
        raise SelectionError(f"no query of model layer {layer} sees a cell of the state")
    cache = int(w["cache"][0])
    w = w.with_columns(pl.col(c).cast(pl.Int64) for c in ("stream", "cell", "seq_id", "query_pos", "head"))
    cols = _cache_cells(state, cache)
    start, stop = select_cells(cells, cols.height)
    cols = cols.slice(start, stop - start)
    rows = w.select("seq_id", "query_pos").unique().sort("seq_id", "query_pos")
    shown = sorted(w["head"].unique().to_list())
    grids = [_grid(w, rows, cols, h) for h in shown]
    norm, label = colour_scale(np.stack(grids), scale)
    label = label.replace("|value|", "attention weight", 1)
    n = len(shown)
    ncol = min(n, 4)
    nrow = -(-n // ncol)
    fig = style.figure(figsize=(min(3.2 + 3.6 * ncol, 22), 0.8 + 3.2 * nrow), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrow, ncol, squeeze=False).ravel())
    pieces = cols["piece"].to_list()
    cell_ids = cols["cell"].to_list()
    multi_seq = rows["seq_id"].n_unique() > 1
    im = None
    for ax, h, g in zip(axes, shown, grids, strict=False):
        masked = np.ma.masked_invalid(g)
        im = ax.imshow(masked, aspect="auto", interpolation="nearest", cmap="viridis", norm=norm)
        ax.set_facecolor("#f2f2f2")
        ax.set_title(f"model layer {layer} head {h}", fontsize=style.TITLE)
        ax.set_xlabel("cell", fontsize=style.LABEL)
        ax.set_ylabel("query position" + (" (sequence)" if multi_seq else ""), fontsize=style.LABEL)
        _cell_ticks(ax, pieces, cell_ids, width=3.4)
        ys = list(range(0, rows.height, style.stride(rows.height, style.fitting(2.6))))
        ax.set_yticks(ys)
        qp, qs = rows["query_pos"].to_list(), rows["seq_id"].to_list()
        ax.set_yticklabels([f"{qp[i]} ({qs[i]})" if multi_seq else str(qp[i]) for i in ys])
        style.tick_sizes(ax)
    for ax in axes[n:]:
        ax.axis("off")
    fig.suptitle(
        f"{os.path.basename(state.path)}: attention of {rows.height} queries over cache {cache}",
        fontsize=style.LABEL,
    )
    if im is not None:
        bar = fig.colorbar(im, ax=list(axes[:n]))
        bar.set_label(label, fontsize=style.LABEL)
        style.tick_sizes(bar.ax)
    return fig


def attention_mass(
    state: State,
    queries: QueriesArg,
    *,
    what: Literal["share", "mass"] = "share",
    layers: Sequence[int] | None = None,
    model: str | os.PathLike[str] | None = None,
    incomplete: Incomplete = "skip",
) -> Figure:
    """The attention each cell received, a bar per cell along x, a panel per cache: ``share``,
    the mean share of a query head's attention (over the layers, ``layers``: only these model
    layers, their heads and the queries that saw the cell), or ``mass``, the attention it
    accumulated (H2O's score); the x axis labelled with the tokens' pieces where the state knows
    them, as many as fit."""
    if what not in ("share", "mass"):
        raise ValueError(f"what must be 'share' or 'mass', not {what!r}")
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
        ax.bar(x, y, width=1.0, color="#1f77b4", edgecolor="none")
        ax.set_xlim(-0.5, len(y) - 0.5)
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
