"""Pictures of a state, as matplotlib figures (``pip install 'kvfast[plot]'``).

- :func:`layout`: the file drawn to scale as a strip of regions, with the per-token arithmetic;
- :func:`heatmap`: |value| over cells x channels for one layer (one panel per head if asked);
- :func:`stats`: per-layer norms and outlier-channel counts;
- :func:`diff`: the error of one state against another per layer and head.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from kvfast.analysis.measure import compare
from kvfast.plot.scale import colour_scale, select_cells
from kvfast.read.address import record_ref
from kvfast.read.state import State

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {"meta": "#9e9e9e", "k": "#1f77b4", "v": "#ff7f0e", "outputs": "#2ca02c"}


def _figure(**kw: Any) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("kvfast's pictures need matplotlib: pip install 'kvfast[plot]'") from e
    return Figure(**kw)


def per_token(d: State) -> list[str]:
    """Bytes per token per layer, per cache, for K and V."""
    lines = []
    for c in d.caches:
        s = max(c.streams, key=lambda s: len(s.layers))
        ly = s.layers[0]
        k, v = ly.k_row_bytes, ly.v_row_bytes or 0
        total = sum(x.k_row_bytes + (x.v_row_bytes or 0) for x in s.layers)
        lines.append(
            f"cache {c.index}: {len(s.layers)} layers; per token per layer K {k:,} B ({ly.k_type}, {ly.n_embd_k} values)"
            f" + V {v:,} B ({ly.v_type}, {ly.n_embd_v} values); per token {total:,} B"
        )
    return lines


def _shade(color: str, layer: int | None) -> Any:
    """`color`, lighter on odd layers: consecutive layers of one kind stay apart in the strip."""
    from matplotlib.colors import to_rgb

    rgb = np.array(to_rgb(color))
    return tuple(rgb + (1 - rgb) * 0.35) if layer is not None and layer % 2 else tuple(rgb)


def layout(d: State) -> Figure:
    """The file as a strip of regions to scale, colored by kind (metadata, K rows, V rows, logits),
    consecutive layers in alternating shades; the per-token arithmetic in a panel above it."""
    lay = d.layout()
    lines = per_token(d)
    fig = _figure(figsize=(12, 2.6 + 0.22 * len(lines)), layout="constrained")
    text_ax, ax = fig.subplots(2, 1, height_ratios=[0.35 + 0.22 * len(lines), 2])
    text_ax.axis("off")
    for i, line in enumerate(lines):
        text_ax.text(
            0, 1 - (i + 0.5) / len(lines), line, fontsize=8, va="center", transform=text_ax.transAxes
        )
    rows = lay.select("role", "kind", "layer", "offset", "nbytes").iter_rows()
    for role, kind, layer, off, nb in rows:
        if role == "rows":
            color = _shade(COLORS[kind], layer)
        else:
            color = COLORS["outputs"] if role == "outputs" else COLORS["meta"]
        ax.broken_barh([(off, max(nb, d.size / 4000))], (0, 1), facecolors=color, edgecolor="none")
    for c in d.caches:
        ax.vlines(c.offset, 0, 1.18, color="black", lw=0.8)
        ax.text(c.offset, 1.2, f" cache {c.index}", fontsize=8, va="bottom")
    ax.set_xlim(0, d.size)
    ax.set_ylim(0, 1.45)
    ax.set_yticks([])
    ax.set_xlabel("byte offset")
    version = "" if d.version is None else f" v{d.version}"
    fig.suptitle(
        f"{os.path.basename(d.path)}: {d.container}{version}, {d.size:,} bytes = rows {d.row_bytes:,}"
        f" + outputs {d.output_bytes:,} + metadata {d.meta_bytes:,}",
        fontsize=10,
    )
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(color=COLORS[k], label=lbl)
            for k, lbl in (("meta", "metadata"), ("k", "K rows"), ("v", "V rows"), ("outputs", "logits"))
        ]
        + [Patch(color=_shade(COLORS["k"], 1), label="(odd layers lighter)")],
        loc="upper right",
        fontsize=8,
        ncols=5,
        frameon=False,
    )
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
    layer and the kind; the cell axis is labelled with token pieces where known."""
    from matplotlib.ticker import MaxNLocator

    rec = record_ref(d.caches, cache, layer, kind)
    x = np.abs(d.values(layer, kind, cache=cache, dtype="float32"))
    start, stop = select_cells(cells, len(x))
    x = x[start:stop]
    hd = (d.head_dim_k if kind == "k" else d.head_dim_v) or x.shape[1]
    heads = x.shape[1] // hd if per_head else 1
    fig = _figure(figsize=(min(4 + 3 * heads, 24), 4.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, heads, squeeze=False)[0])
    norm, label = colour_scale(x, scale, clip)
    title = _record_title(d, cache, layer, kind)
    im = None
    for h, ax in enumerate(axes):
        part = x[:, h * hd : (h + 1) * hd] if per_head else x
        extent = (-0.5, part.shape[1] - 0.5, stop - 0.5, start - 0.5)
        im = ax.imshow(part, aspect="auto", interpolation="nearest", cmap="magma", norm=norm, extent=extent)
        ax.set_xlabel("channel")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 4, 8, 10]))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{title} head {h}" if per_head else title, fontsize=9)
    axes[0].set_ylabel("cell")
    _token_ticks(axes[0], d, cache, start, stop)
    undone = any(r.undone for r in d.rotation if r.cache == cache and r.kind == kind)
    basis = f"{rec.type}, Hadamard rotation undone" if undone else rec.type
    if kind == "k" and getattr(d, "pre_rope", False):
        basis += ", before RoPE"
    fig.suptitle(f"{os.path.basename(d.path)}: |value| ({basis})", fontsize=10)
    if im is not None:
        bar = fig.colorbar(im, ax=list(axes), extend="max" if clip is not None else "neither")
        bar.set_label(label)
    return fig


def _token_ticks(ax: Any, d: State, cache: int, start: int, stop: int, most: int = 40) -> None:
    """Label the cell axis with each cell's token piece where known (at most `most` labels)."""
    rec = d.caches[cache].streams
    stream = next((s.index for s in rec if s.cell_count), 0)
    toks = d.cell_tokens().filter(cache=cache, stream=stream)
    pieces = toks["piece"].to_list()
    n = stop - start
    if n <= 0 or all(p is None for p in pieces[start:stop]):
        return
    step = max(1, -(-n // most))
    cells = list(range(start, stop, step))
    ax.set_yticks(cells)
    ax.set_yticklabels([f"{c} {pieces[c]!r}" if pieces[c] is not None else str(c) for c in cells], fontsize=6)


def stats(d: State, outlier: float = 4.0, skip_first: int = 0) -> Figure:
    """Per-layer mean L2 norm of (cell, head) rows, and count of outlier channels (absmax over the
    head's median channel absmax above `outlier`), for K and V. Both panels share one x axis: the
    model's layer where every layer's is known (with ``model=``, or a one-cache state), else the
    layer within its cache. ``skip_first=N`` leaves out positions < N (attention sinks), as in
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
    fig = _figure(figsize=(10, 6), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    panels = ((ax1, lay, "l2_mean", "o"), (ax2, counts, "outliers", "s"))
    for ax, df, col, marker in panels:
        for (cache, kind), g in df.sort("cache", "kind", xcol).group_by("cache", "kind", maintain_order=True):
            label = f"{str(kind).upper()}" if len(d.caches) == 1 else f"cache {cache} {str(kind).upper()}"
            ax.plot(
                g[xcol],
                g[col],
                marker=marker if cache == 0 else "^",
                linestyle=("-", "--", ":", "-.")[int(cache) % 4],
                label=label,
                color=COLORS[str(kind)],
            )
        ax.legend(fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_ylabel("mean L2 norm per cell and head")
    ax2.set_ylabel(f"channels with absmax > {outlier:g} x median")
    if by_model:
        ax2.set_xlabel("model layer")
    else:
        ax2.set_xlabel("layer within its cache" if len(d.caches) > 1 else "layer")
    skipped = f", positions < {skip_first} left out" if skip_first else ""
    fig.suptitle(f"{os.path.basename(d.path)}: per-layer norms and outlier channels{skipped}", fontsize=10)
    return fig


def diff(a: State, b: State, *, scale: str = "linear") -> Figure:
    """Relative error (||b - a|| / ||a||, mean over cells) per layer and head, for K and V; rows are
    the model's layers where every layer's is known, else cache:layer. ``scale="log"`` for errors
    that span decades (q8_0 next to q4_0 layers)."""
    df = compare(a, b).group_by("cache", "layer", "model_layer", "kind", "head").agg(pl.col("rel").mean())
    by_model = df["model_layer"].null_count() == 0
    df = df.with_columns(
        row=pl.col("model_layer") if by_model else pl.col("cache") * 10_000 + pl.col("layer")
    )
    kinds = sorted(df["kind"].unique().to_list())
    fig = _figure(figsize=(5 * len(kinds) + 1, 4.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(kinds), squeeze=False)[0])
    rel = df["rel"].fill_nan(None).drop_nulls().to_numpy()
    norm, _ = colour_scale(rel, scale)
    im = None
    for ax, kind in zip(axes, kinds, strict=True):
        g = df.filter(kind=kind)
        rows = sorted(g["row"].unique().to_list())
        heads = int(g["head"].max() or 0) + 1  # type: ignore[arg-type]
        grid = np.full((len(rows), heads), np.nan)
        for r, h, v in g.select("row", "head", "rel").iter_rows():
            grid[rows.index(r), h] = v
        im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis", norm=norm)
        ax.set_title(f"{kind.upper()}: relative error", fontsize=9)
        ax.set_xticks(range(heads))
        ax.set_xlabel("head")
        if by_model:
            ax.set_ylabel("model layer")
            labels = [str(r) for r in rows]
        else:
            ax.set_ylabel("layer" if len(a.caches) == 1 else "cache:layer")
            labels = [f"{r // 10_000}:{r % 10_000}" if len(a.caches) > 1 else str(r) for r in rows]
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
    fig.suptitle(f"{os.path.basename(b.path)} against {os.path.basename(a.path)}", fontsize=10)
    if im is not None:
        label = "||b - a|| / ||a||, mean over cells" + (" (log scale)" if scale == "log" else "")
        fig.colorbar(im, ax=list(axes)).set_label(label)
    return fig
