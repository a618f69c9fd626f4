"""The picture of one state against another (:func:`diff`) and the names it gives them.

Two states of one prompt often share a file name (``f16/long.ggsq`` and ``q8_0/long.ggsq``): each
is named by the shortest end of its path that tells the two apart, with its cache types.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from kvfast.analysis.compare_modes import MATCHES, Match
from kvfast.analysis.measure import compare
from kvfast.plot import style
from kvfast.plot.scale import colour_scale
from kvfast.read import remote
from kvfast.read.state import State

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEAD_IN = 0.5
"""Inches: the width of a head's column in :func:`diff`."""


def _parts(path: str) -> list[str]:
    p = path if remote.is_url(path) else os.path.abspath(remote.local_path(path))
    return [x for x in p.replace(os.sep, "/").split("/") if x]


def distinct_names(a: str, b: str) -> tuple[str, str]:
    """The shortest ends of paths `a` and `b` (whole folder names) that differ: ``f16/long.ggsq``
    and ``q8_0/long.ggsq``; the file names where those differ, or where the paths are one."""
    pa, pb = _parts(a), _parts(b)
    if pa == pb:
        return pa[-1], pb[-1]
    n = 1
    while n < max(len(pa), len(pb)) and pa[-n:] == pb[-n:]:
        n += 1
    return "/".join(pa[-n:]), "/".join(pb[-n:])


def cache_types(d: State) -> str:
    """The state's K and V cache types: ``f16``, ``K q4_0, V q4_1``, ``K q8_0`` (no V records)."""
    layers = [ly for c in d.caches for s in c.streams for ly in s.layers]
    k = sorted({ly.k_type for ly in layers})
    v = sorted({ly.v_type for ly in layers if ly.v_type})
    if k == v and len(k) == 1:
        return k[0]
    out = f"K {'/'.join(k)}" if k else ""
    return f"{out}, V {'/'.join(v)}" if v else out


def title(a: State, b: State, match: str = "sequence") -> str:
    """``relative error of q8_0/long.ggsq (q8_0) against f16/long.ggsq (f16)``, and the match when
    it is not by sequence."""
    na, nb = distinct_names(a.path, b.path)
    how = "" if match == "sequence" else f", cells matched by {match}"
    return f"relative error of {nb} ({cache_types(b)}) against {na} ({cache_types(a)}){how}"


def diff(a: State, b: State, *, scale: str = "linear", match: Match = "sequence") -> Figure:
    """Relative error (||b - a|| / ||a||, mean over cells: ``rel_mean``) per layer and head, for K and
    V; rows are the model's layers where every layer's is known, else cache:layer. ``scale="log"``
    for errors that span decades (q8_0 next to q4_0 layers); ``match`` pairs the cells as in
    :func:`kvfast.compare` (``"sequence"``, ``"position"`` or ``"tokens"``). Each head is a column of
    the same width whatever the number of heads (one KV head is a narrow column, not the panel),
    with a line between heads; the title names both states by the end of their paths that differs,
    with their cache types."""
    if match not in MATCHES:
        raise ValueError(f"match must be 'sequence', 'position' or 'tokens', not {match!r}")
    df = (
        compare(a, b, match=match)
        .group_by("cache", "layer", "model_layer", "kind", "head")
        .agg(pl.col("rel").fill_nan(None).mean())
    )
    by_model = df["model_layer"].null_count() == 0
    df = df.with_columns(
        row=pl.col("model_layer") if by_model else pl.col("cache").cast(pl.Int64) * 10_000 + pl.col("layer")
    )
    kinds = sorted(df["kind"].unique().to_list())
    heads = {k: int(df.filter(kind=k)["head"].max() or 0) + 1 for k in kinds}  # type: ignore[arg-type]
    rows = sorted(df["row"].unique().to_list())
    # a head is a column HEAD_IN inches wide whatever the number of heads: a model of one KV head
    # gets narrow panels, not one head stretched across the figure
    height = min(max(1.6 + 0.2 * len(rows), 3.4), 12.0)
    widths = [min(max(HEAD_IN * heads[k], 0.6), 8.0) for k in kinds]
    width = sum(widths) + 0.3 * len(kinds) + 2.4
    fig = style.figure(figsize=(width, height), layout="constrained")
    grid_kw = {"width_ratios": widths} if widths else {}
    axes = np.atleast_1d(fig.subplots(1, len(kinds), squeeze=False, sharey=True, gridspec_kw=grid_kw)[0])
    rel = df["rel"].drop_nulls().to_numpy()
    norm, _ = colour_scale(rel, scale)
    im = None
    every = style.stride(len(rows), style.fitting(height - 1.4))
    for i, (ax, kind) in enumerate(zip(axes, kinds, strict=True)):
        g = df.filter(kind=kind)
        grid = np.full((len(rows), heads[kind]), np.nan)
        for r, h, v in g.select("row", "head", "rel").iter_rows():
            grid[rows.index(r), h] = np.nan if v is None else v
        im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis", norm=norm)
        for h in range(1, heads[kind]):
            ax.axvline(h - 0.5, color="white", lw=1.0)
        ax.set_title(kind.upper(), fontsize=style.TITLE)
        ax.set_xticks(range(heads[kind]))
        ax.set_xlabel("KV head", fontsize=style.LABEL)
        style.tick_sizes(ax)
        if i:
            ax.tick_params(axis="y", labelleft=False)  # the rows are the first panel's
    if by_model:
        axes[0].set_ylabel("model layer", fontsize=style.LABEL)
        labels = [str(r) for r in rows]
    else:
        axes[0].set_ylabel("layer" if len(a.caches) == 1 else "cache:layer", fontsize=style.LABEL)
        labels = [f"{r // 10_000}:{r % 10_000}" if len(a.caches) > 1 else str(r) for r in rows]
    shown = list(range(0, len(rows), every))
    axes[0].set_yticks(shown, [labels[i] for i in shown])
    _suptitle(fig, title(a, b, match), width)
    if im is not None:
        label = "||b - a|| / ||a||\nmean over cells" + (" (log scale)" if scale == "log" else "")
        bar = fig.colorbar(im, ax=list(axes))
        bar.set_label(label, fontsize=style.LABEL)
        style.tick_sizes(bar.ax)
    return fig


def _suptitle(fig: Any, text: str, width_in: float) -> None:
    """The figure's title, in lines that fit `width_in` inches, broken before "against" first."""
    import textwrap

    chars = max(20, int(width_in * 72 / (style.LABEL * 0.55)))
    if len(text) > chars and " against " in text:  # B on one line, "against A" on the next
        head, tail = text.split(" against ", 1)
        lines = [*textwrap.wrap(head, chars), *textwrap.wrap("against " + tail, chars)]
    else:
        lines = textwrap.wrap(text, chars)
    fig.suptitle("\n".join(lines), fontsize=style.LABEL)
