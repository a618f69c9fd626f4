"""Pictures of a state, as matplotlib figures (``pip install 'kvfast[plot]'``).

- :func:`layout`: the file drawn to scale as a strip of regions, with the per-token arithmetic;
- :func:`heatmap`: |value| over cells x channels for one layer (one panel per head if asked);
- :func:`stats`: per-layer norms and outlier-channel counts;
- :func:`diff`: the error of one state against another per layer and head (:mod:`.comparison`).

Every picture is a :class:`~kvfast.plot.display.Picture` (a matplotlib Figure that shows itself as
the last expression of a notebook cell, pyplot imported or not) with its tick labels at one size
(:data:`~kvfast.plot.style.TICK` points).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from kvfast.plot import style
from kvfast.plot.comparison import diff
from kvfast.plot.scale import colour_scale, select_cells
from kvfast.read.address import record_ref
from kvfast.read.state import State

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["COLORS", "diff", "heatmap", "layout", "per_token", "stats"]

COLORS = {
    "meta": "#9e9e9e",
    "k": "#1f77b4",
    "v": "#ff7f0e",
    "r": "#9467bd",
    "s": "#8c564b",
    "outputs": "#2ca02c",
}
_LEGEND = {
    "meta": "metadata",
    "k": "K rows",
    "v": "V rows",
    "r": "R rows (recurrent)",
    "s": "S rows (recurrent)",
    "outputs": "logits",
}


def _layers(n: int) -> str:
    return "1 layer" if n == 1 else f"{n} layers"


def _role(d: State, cache: int) -> str:
    """`` (indexer, model layers [0, 1])``: the cache's part of its model's memory ('' unknown)."""
    parts = d.parts
    p = parts[cache] if cache < len(parts) else None
    return "" if p is None else f" ({p.role}, model layers {p.model_layers})"


def per_token(d: State) -> list[str]:
    """Bytes per token per layer, per cache, for K and V; per sequence for the recurrent part's R
    and S (one cell per sequence)."""
    lines = []
    for c in d.caches:
        if not c.layers:
            lines.append(f"cache {c.index}{_role(d, c.index)}: no layers")
            continue
        ly = c.layers[0]
        k, v = ly.k_row_bytes, ly.v_row_bytes or 0
        total = sum(x.k_row_bytes + (x.v_row_bytes or 0) for x in c.layers)
        lines.append(
            f"cache {c.index}{_role(d, c.index)}: {_layers(len(c.layers))}; per token per layer K {k:,} B"
            f" ({ly.k_type}, {ly.n_embd_k} values)"
            f" + V {v:,} B ({ly.v_type}, {ly.n_embd_v} values); per token {total:,} B"
        )
    rec = d.recurrent
    if rec is not None and rec.layers:
        r = rec.layers[0]
        total = sum(x.r_row_bytes + x.s_row_bytes for x in rec.layers)
        lines.append(
            f"recurrent part (cache {rec.index}): {_layers(len(rec.layers))}; per sequence per layer"
            f" R {r.r_row_bytes:,} B ({r.r_type}, {r.n_embd_r} values) + S {r.s_row_bytes:,} B ({r.s_type},"
            f" {r.n_embd_s} values); per sequence {total:,} B"
        )
    return lines


def _shade(color: str, layer: int | None) -> Any:
    """`color`, lighter on odd layers: consecutive layers of one kind stay apart in the strip."""
    from matplotlib.colors import to_rgb

    rgb = np.array(to_rgb(color))
    return tuple(rgb + (1 - rgb) * 0.35) if layer is not None and layer % 2 else tuple(rgb)


def layout(d: State) -> Figure:
    """The file as a strip of regions to scale, colored by kind (metadata, K / V rows, the recurrent
    part's R / S rows, logits), consecutive layers in alternating shades; the per-token arithmetic
    in a panel above it. The legend lists the kinds the file holds."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import StrMethodFormatter

    lay = d.layout()
    lines = per_token(d)
    fig = style.figure(figsize=(12, 2.6 + 0.22 * len(lines)), layout="constrained")
    text_ax, ax = fig.subplots(2, 1, height_ratios=[0.35 + 0.22 * len(lines), 2])
    text_ax.axis("off")
    for i, line in enumerate(lines):
        text_ax.text(
            0, 1 - (i + 0.5) / len(lines), line, fontsize=8, va="center", transform=text_ax.transAxes
        )
    present: set[str] = set()
    rows = lay.select("role", "kind", "layer", "offset", "nbytes").iter_rows()
    for role, kind, layer, off, nb in rows:
        if role == "rows":
            key = str(kind)
            color = _shade(COLORS[key], layer)
        else:
            key = "outputs" if role == "outputs" else "meta"
            color = COLORS[key]
        if nb:
            present.add(key)
        ax.broken_barh([(off, max(nb, d.size / 4000))], (0, 1), facecolors=color, edgecolor="none")
    starts = [(c.offset, f" cache {c.index}{_role(d, c.index)}") for c in d.caches]
    if d.recurrent is not None:
        starts.append((d.recurrent.offset, f" recurrent (cache {d.recurrent.index})"))
    for off, name in starts:
        ax.vlines(off, 0, 1.18, color="black", lw=0.8)
        ax.text(off, 1.2, name, fontsize=8, va="bottom")
    ax.set_xlim(0, d.size)
    ax.set_ylim(0, 1.45)
    ax.set_yticks([])
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_xlabel("byte offset", fontsize=style.LABEL)
    style.tick_sizes(ax)
    version = "" if d.version is None else f" v{d.version}"
    fig.suptitle(
        f"{os.path.basename(d.path)}: {d.container}{version}, {d.size:,} bytes = rows {d.row_bytes:,}"
        f" + outputs {d.output_bytes:,} + metadata {d.meta_bytes:,}",
        fontsize=style.LABEL,
    )
    handles = [Patch(color=COLORS[k], label=lbl) for k, lbl in _LEGEND.items() if k in present]
    shaded = next((k for k in ("k", "v", "r", "s") if k in present), None)
    if shaded is not None:
        handles.append(Patch(color=_shade(COLORS[shaded], 1), label="(odd layers lighter)"))
    ax.legend(handles=handles, loc="upper right", fontsize=8, ncols=len(handles), frameon=False)
    return fig


def _record_title(d: State, cache: int, layer: int, kind: str) -> str:
    """``layer 3 (model layer 11) K`` (the cache too when the state has several)."""
    rec = record_ref(d.caches, cache, layer, kind)
    ml = rec.layer.model_layer
    where = f"cache {cache} " if len(d.caches) > 1 else ""
    model = f" (model layer {ml})" if ml is not None and (ml != layer or len(d.caches) > 1) else ""
    return f"{where}layer {layer}{model} {kind.upper()}"


def heatmap(
    d: State,
    layer: int,
    kind: str = "k",
    cache: int = 0,
    per_head: bool = False,
    *,
    scale: str = "linear",
    clip: float | None = None,
    cells: tuple[int, int] | None = None,
) -> Figure:
    """|value| over cells (rows) x channels (columns), the picture the KIVI paper draws.

    ``scale="log"`` colours by log |value| (one outlier channel no longer makes the rest black);
    ``clip=99.5`` caps the colour scale at that percentile of |value| (the colourbar says so);
    ``cells=(start, stop)`` draws only those cells. Panels are titled with the layer, the model
    layer and the kind; the cell axis is labelled with token pieces where known (as many as fit);
    channel ticks fall at powers of two, and where one panel holds several heads, dashed lines
    divide them."""
    from matplotlib.ticker import MaxNLocator

    rec = record_ref(d.caches, cache, layer, kind)
    x = np.abs(d.values(layer, kind, cache=cache, dtype="float32"))
    start, stop = select_cells(cells, len(x))
    x = x[start:stop]
    hd = (d.head_dim_k if kind == "k" else d.head_dim_v) or x.shape[1]
    heads = max(1, x.shape[1] // hd)
    panels = heads if per_head else 1
    pieces = _pieces(d, cache, start, stop)
    # tall enough for a label per cell where the cells have token pieces (up to 8 inches)
    height = 4.4 if pieces is None else min(max(4.4, 1.4 + len(x) * style.TICK * 1.5 / 72), 8.0)
    fig = style.figure(figsize=(min(4 + 3 * panels, 24), height), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, panels, squeeze=False)[0])
    norm, label = colour_scale(x, scale, clip)
    title = _record_title(d, cache, layer, kind)
    im = None
    for h, ax in enumerate(axes):
        part = x[:, h * hd : (h + 1) * hd] if per_head else x
        extent = (-0.5, part.shape[1] - 0.5, stop - 0.5, start - 0.5)
        im = ax.imshow(part, aspect="auto", interpolation="nearest", cmap="magma", norm=norm, extent=extent)
        style.channel_ticks(ax, part.shape[1])
        if per_head or heads == 1:
            ax.set_xlabel("channel", fontsize=style.LABEL)
        else:
            ax.set_xlabel(f"channel ({heads} heads of {hd})", fontsize=style.LABEL)
            for b in range(1, heads):
                ax.axvline(b * hd - 0.5, color="white", lw=0.8, ls="--")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{title} head {h}" if per_head else title, fontsize=style.TITLE)
        style.tick_sizes(ax)
    axes[0].set_ylabel("cell", fontsize=style.LABEL)
    if pieces is not None:
        cells_at = list(
            range(start, stop, style.stride(stop - start, style.fitting(height - 1.4, spacing=1.5)))
        )
        axes[0].set_yticks(cells_at)
        axes[0].set_yticklabels(
            [str(c) if pieces[c - start] is None else f"{c} {pieces[c - start]!r}" for c in cells_at],
            fontsize=style.TICK,
        )
    undone = any(r.undone for r in d.rotation if r.cache == cache and r.kind == kind)
    basis = f"{rec.type}, Hadamard rotation undone" if undone else rec.type
    if kind == "k" and getattr(d, "pre_rope", False):
        basis += ", before RoPE"
    fig.suptitle(f"{os.path.basename(d.path)}: |value| ({basis})", fontsize=style.LABEL)
    if im is not None:
        bar = fig.colorbar(im, ax=list(axes), extend="max" if clip is not None else "neither")
        bar.set_label(label, fontsize=style.LABEL)
        style.tick_sizes(bar.ax)
    return fig


def _pieces(d: State, cache: int, start: int, stop: int) -> list[str | None] | None:
    """The token piece of each of cells ``start .. stop - 1`` of the cache's first stream with cells
    (None for a cell whose piece is not known); None when none is."""
    rec = d.caches[cache].streams
    stream = next((s.index for s in rec if s.cell_count), 0)
    pieces: list[str | None] = d.cell_tokens().filter(cache=cache, stream=stream)["piece"].to_list()
    shown = pieces[start:stop]
    return None if not shown or all(p is None for p in shown) else shown


def _broken(xs: list[int], ys: list[float]) -> tuple[list[float], list[float]]:
    """The points with a gap (NaN) wherever x skips: a line joins consecutive layers only."""
    out_x: list[float] = []
    out_y: list[float] = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if i and x != xs[i - 1] + 1:
            out_x.append(np.nan)
            out_y.append(np.nan)
        out_x.append(x)
        out_y.append(y)
    return out_x, out_y


def stats(d: State, outlier: float = 4.0, skip_first: int = 0) -> Figure:
    """Per-layer mean L2 norm of (cell, head) rows, and count of outlier channels (absmax over the
    head's median channel absmax above `outlier`), for K and V. Both panels share one x axis: the
    model's layer where every layer's is known (with ``model=``, or a one-cache state), else the
    layer within its cache. One line per cache and kind, joining consecutive layers only: an iSWA
    state's sliding-window cache breaks where a global layer comes between, and the global cache's
    layers are points. ``skip_first=N`` leaves out positions < N (attention sinks), as in
    :meth:`State.stats`."""
    from matplotlib.ticker import MaxNLocator

    lay = d.stats(by="layer", skip_first=skip_first)
    ch = d.stats(by="channel", skip_first=skip_first)
    counts = (
        ch.group_by("cache", "layer", "model_layer", "kind")
        .agg((pl.col("outlier_ratio") > outlier).sum().alias("outliers"))
        .sort("cache", "layer", "kind")
    )
    by_model = lay["model_layer"].null_count() == 0
    xcol = "model_layer" if by_model else "layer"
    fig = style.figure(figsize=(10, 6), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    panels = ((ax1, lay, "l2_mean", "o"), (ax2, counts, "outliers", "s"))
    for ax, df, col, marker in panels:
        for (cache, kind), g in df.sort("cache", "kind", xcol).group_by("cache", "kind", maintain_order=True):
            label = f"{str(kind).upper()}" if len(d.caches) == 1 else f"cache {cache} {str(kind).upper()}"
            xs, ys = _broken(g[xcol].to_list(), g[col].cast(pl.Float64).to_list())
            ax.plot(
                xs,
                ys,
                marker=marker if cache == 0 else "^",
                linestyle=("-", "--", ":", "-.")[int(cache) % 4],
                label=label,
                color=COLORS[str(kind)],
            )
        ax.legend(fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        style.tick_sizes(ax)
    ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_ylabel("mean L2 norm per cell and head", fontsize=style.LABEL)
    ax2.set_ylabel(f"channels with absmax > {outlier:g} x median", fontsize=style.LABEL)
    if by_model:
        ax2.set_xlabel("model layer", fontsize=style.LABEL)
    else:
        ax2.set_xlabel("layer within its cache" if len(d.caches) > 1 else "layer", fontsize=style.LABEL)
    skipped = f", positions < {skip_first} left out" if skip_first else ""
    fig.suptitle(
        f"{os.path.basename(d.path)}: per-layer norms and outlier channels{skipped}", fontsize=style.LABEL
    )
    return fig
