"""Pictures of a state, as matplotlib figures (``pip install 'kvfast[plot]'``).

- :func:`layout`: the file drawn to scale as a strip of regions, with the per-token arithmetic;
- :func:`heatmap`: |value| over cells x channels for one layer (one panel per head if asked);
- :func:`stats`: per-layer norms and outlier-channel counts;
- :func:`diff`: the error of one state against another per layer and head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from kvfast.analysis import compare
from kvfast.dump import Dump

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {"meta": "#9e9e9e", "k": "#1f77b4", "v": "#ff7f0e", "outputs": "#2ca02c"}


def _figure(**kw: Any) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("kvfast's pictures need matplotlib: pip install 'kvfast[plot]'") from e
    return Figure(**kw)


def per_token(d: Dump) -> list[str]:
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


def layout(d: Dump) -> Figure:
    """The file as a strip of regions to scale, colored by kind (metadata, K rows, V rows, logits)."""
    lay = d.layout()
    fig = _figure(figsize=(12, 3.2), layout="constrained")
    ax = fig.subplots()
    for role, kind, off, nb in lay.select("role", "kind", "offset", "nbytes").iter_rows():
        color = COLORS["outputs"] if role == "outputs" else COLORS[kind] if role == "rows" else COLORS["meta"]
        ax.broken_barh([(off, max(nb, d.size / 4000))], (0, 1), facecolors=color, edgecolor="none")
    for c in d.caches:
        ax.axvline(c.offset, color="black", lw=0.8)
        ax.text(c.offset, 1.05, f"cache {c.index}", fontsize=8)
    ax.set_xlim(0, d.size)
    ax.set_ylim(0, 1.6)
    ax.set_yticks([])
    ax.set_xlabel("byte offset")
    version = "" if d.version is None else f" v{d.version}"
    ax.set_title(
        f"{d.container}{version}: {d.size:,} bytes = rows {d.row_bytes:,} + outputs {d.output_bytes:,}"
        f" + metadata {d.meta_bytes:,}",
        fontsize=10,
    )
    for i, line in enumerate(per_token(d)):
        ax.text(0, 1.5 - 0.13 * i, line, fontsize=8, va="top")
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(color=COLORS[k], label=lbl)
            for k, lbl in (("meta", "metadata"), ("k", "K rows"), ("v", "V rows"), ("outputs", "logits"))
        ],
        loc="lower right",
        fontsize=8,
        ncols=4,
    )
    return fig


def heatmap(d: Dump, layer: int, kind: str = "k", cache: int = 0, per_head: bool = False) -> Figure:
    """|value| over cells (rows) x channels (columns), the picture the KIVI paper draws."""
    x = np.abs(d.values(layer, kind, cache=cache, dtype="float32"))
    hd = (d.head_dim_k if kind == "k" else d.head_dim_v) or x.shape[1]
    heads = x.shape[1] // hd if per_head else 1
    fig = _figure(figsize=(min(4 + 3 * heads, 24), 4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, heads, squeeze=False)[0])
    vmax = float(x.max()) or 1.0
    im = None
    for h, ax in enumerate(axes):
        part = x[:, h * hd : (h + 1) * hd] if per_head else x
        im = ax.imshow(part, aspect="auto", interpolation="nearest", cmap="magma", vmin=0, vmax=vmax)
        ax.set_xlabel("channel")
        ax.set_title(
            f"head {h}" if per_head else f"cache {cache} layer {layer} {kind.upper()}: |value|", fontsize=9
        )
    axes[0].set_ylabel("cell")
    _token_ticks(axes[0], d, cache, len(x))
    if im is not None:
        fig.colorbar(im, ax=list(axes))
    return fig


def _token_ticks(ax: Any, d: Dump, cache: int, n: int, most: int = 40) -> None:
    """Label the cell axis with each cell's token piece where known (at most `most` labels)."""
    rec = d.caches[cache].streams
    stream = next((s.index for s in rec if s.cell_count), 0)
    toks = d.cell_tokens().filter(cache=cache, stream=stream)
    pieces = toks["piece"].to_list()
    if n == 0 or all(p is None for p in pieces):
        return
    step = max(1, -(-n // most))
    cells = list(range(0, n, step))
    ax.set_yticks(cells)
    ax.set_yticklabels([f"{c} {pieces[c]!r}" if pieces[c] is not None else str(c) for c in cells], fontsize=6)


def stats(d: Dump, outlier: float = 4.0) -> Figure:
    """Per-layer mean L2 norm of (cell, head) rows, and count of outlier channels (absmax over the
    head's median channel absmax above `outlier`), for K and V."""
    lay = d.stats(by="layer")
    ch = d.stats(by="channel")
    counts = (
        ch.group_by("cache", "layer", "kind")
        .agg((pl.col("outlier_ratio") > outlier).sum().alias("outliers"))
        .sort("cache", "layer", "kind")
    )
    fig = _figure(figsize=(10, 6), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    for (cache, kind), g in lay.sort("layer").group_by("cache", "kind", maintain_order=True):
        x = g["model_layer"] if g["model_layer"].null_count() == 0 else g["layer"]
        ax1.plot(
            x,
            g["l2_mean"],
            marker="o",
            label=f"cache {cache} {str(kind).upper()}",
            color=COLORS[str(kind)] if len(d.caches) == 1 else None,
        )
    for (cache, kind), g in counts.group_by("cache", "kind", maintain_order=True):
        ax2.plot(g["layer"], g["outliers"], marker="s", label=f"cache {cache} {str(kind).upper()}")
    ax1.set_ylabel("mean L2 norm per cell and head")
    ax1.legend(fontsize=8)
    ax2.set_ylabel(f"channels with absmax > {outlier:g} x median")
    ax2.set_xlabel("layer")
    ax2.legend(fontsize=8)
    fig.suptitle("per-layer norms and outlier channels", fontsize=10)
    return fig


def diff(a: Dump, b: Dump) -> Figure:
    """Relative error (||a - b|| / ||a||, mean over cells) per layer and head, for K and V."""
    df = compare(a, b).group_by("cache", "layer", "kind", "head").agg(pl.col("rel").mean())
    kinds = sorted(df["kind"].unique().to_list())
    fig = _figure(figsize=(5 * len(kinds) + 1, 4.5), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(kinds), squeeze=False)[0])
    vmax = float(df["rel"].fill_nan(None).max() or 1.0)  # type: ignore[arg-type]
    im = None
    for ax, kind in zip(axes, kinds, strict=True):
        g = df.filter(kind=kind).with_columns(row=pl.col("cache") * 10_000 + pl.col("layer"))
        rows = sorted(g["row"].unique().to_list())
        heads = int(g["head"].max() or 0) + 1  # type: ignore[arg-type]
        grid = np.full((len(rows), heads), np.nan)
        for r, h, v in g.select("row", "head", "rel").iter_rows():
            grid[rows.index(r), h] = v
        im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=vmax)
        ax.set_title(f"{kind.upper()}: relative error", fontsize=9)
        ax.set_xticks(range(heads))
        ax.set_xlabel("head")
        ax.set_ylabel("layer" if len(a.caches) == 1 else "cache x layer")
        ax.set_yticks(
            range(len(rows)),
            [f"{r // 10_000}:{r % 10_000}" if len(a.caches) > 1 else str(r) for r in rows],
            fontsize=7,
        )
    if im is not None:
        fig.colorbar(im, ax=list(axes))
    return fig
