"""Statistics, comparisons and quantization losses over states, computed in Rust.

Each pass streams over the memory map a chunk of cells at a time, in parallel, with the GIL
released: memory stays bounded whatever the size of the state (plus the result table).
Standard deviations are population ones (ddof = 0); sums are accumulated in float64.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Literal

import polars as pl

from kvfast import _kvfast
from kvfast.analysis.compare_modes import (
    MATCHES,
    Match,
    common_prefix,
    differing,
    position_tokens,
    tokens_unknown,
)
from kvfast.errors import MatchError, RotationWarning, TokenMismatchWarning
from kvfast.read import select as checks
from kvfast.read.opened import OpenState

By = Literal["cell", "channel", "head", "layer"]
_GROUP = ["cache", "layer", "model_layer", "kind"]


def select(
    dump: OpenState,
    layers: Sequence[int] | None,
    kinds: Sequence[str] | str | None,
    caches: Sequence[int] | None = None,
    skip_first: int = 0,
) -> dict[str, Any]:
    """The selection for Rust, checked (kvfast.SelectionError for anything out of range)."""
    checks.non_negative("skip_first", skip_first)
    sel = checks.selection(dump.caches, layers=layers, kinds=kinds, caches=caches, recurrent=dump.recurrent)
    return {
        "caches": sel.caches,
        "layers": sel.layers,
        "kinds": sel.kinds,
    }


def stats(
    dump: OpenState,
    by: By = "cell",
    layers: Sequence[int] | None = None,
    kinds: Sequence[str] | str | None = None,
    skip_first: int = 0,
) -> pl.DataFrame:
    state = dump._live()
    sel = select(dump, layers, kinds, skip_first=skip_first)
    if by == "cell":
        return pl.DataFrame(_kvfast.cell_stats(state, sel, skip_first))
    if by not in ("channel", "head", "layer"):
        raise ValueError(f"by must be 'cell', 'channel', 'head' or 'layer', not {by!r}")
    channel, head, layer = _kvfast.aggregate_stats(state, sel, skip_first)
    df = pl.DataFrame(channel)
    if by == "channel":
        return _with_cells(df, df).with_columns(
            outlier_ratio=pl.col("absmax")
            / pl.col("absmax").median().over(["cache", "layer", "kind", "head"])
        )
    return _with_cells(pl.DataFrame(head if by == "head" else layer), df)


def _with_cells(df: pl.DataFrame, channel: pl.DataFrame) -> pl.DataFrame:
    """Add ``cells`` after ``count``: the cells the statistics are over (each cell once, whatever
    its sequences). ``count`` is the number of values: cells in by="channel" (one value of the
    channel per cell), cells x head_dim in by="head", cells x values per row in by="layer"."""
    keys = ["cache", "layer", "kind"]
    cells = channel.group_by(keys).agg(cells=pl.col("count").first())
    at = df.columns.index("count") + 1
    order = [*df.columns[:at], "cells", *df.columns[at:]]
    joined = df.join(cells, on=keys, how="left", maintain_order="left")
    return joined.with_columns(pl.col("cells").fill_null(0).cast(pl.UInt64)).select(order)


def quant_error(
    dump: OpenState,
    type: str,
    by: Literal["head", "layer"] = "head",
    layers: Sequence[int] | None = None,
    kinds: Sequence[str] | str | None = None,
    skip_first: int = 0,
    rotate: bool = True,
) -> pl.DataFrame:
    sel = select(dump, layers, kinds, skip_first=skip_first)
    # llama.cpp rotates attention caches only: the recurrent part (kinds r, s) is never rotated
    attention = sel["kinds"] is None or any(k in checks.KINDS for k in sel["kinds"])
    groups = simulated_rotation(dump, type) if rotate and attention else (0, 0)
    df = pl.DataFrame(_kvfast.quant_error(dump._live(), type, sel, skip_first, groups))
    df = df.with_columns(
        rotation=pl.when(pl.col("kind") == "k")
        .then(groups[0])
        .when(pl.col("kind") == "v")
        .then(groups[1])
        .otherwise(0)
        .cast(pl.Int32)
    )
    if by == "head":
        return df
    if by != "layer":
        raise ValueError(f"by must be 'head' or 'layer', not {by!r}")
    return (
        df.group_by(_GROUP, maintain_order=True)
        .agg(
            pl.col("rotation").first(),
            pl.col("count").sum(),
            (pl.col("sum_sq_err").sum() / pl.col("count").sum()).alias("mse"),
            pl.col("max_abs").max(),
            (pl.col("sum_sq_err").sum() / pl.col("sum_sq").sum()).sqrt().alias("rel"),
            (pl.col("sum_prod").sum() / (pl.col("sum_sq").sum() * pl.col("sum_sq_quant").sum()).sqrt()).alias(
                "cosine"
            ),
        )
        .sort("cache", "layer", "kind")
    )


def simulated_rotation(dump: OpenState, type: str) -> tuple[int, int]:
    """The (K, V) groups llama.cpp would rotate a cache of ``type`` in, for this state's model: from
    the head sizes where known, else from the rotation found in the state itself; (0 = none)."""
    out = []
    for kind in ("k", "v"):
        # llama.cpp's rule for this state's first attention cache (what loss_table simulates)
        ruled = next((dump._live().rule_group(c.index, kind, type) for c in dump.caches[:1]), 0)
        if ruled is not None:
            out.append(ruled)
            continue
        found = [r.group for r in dump.rotation if r.kind == kind and r.group]
        if found:
            # a state rotated in group g has a head size g divides (and, for K, 2g does not)
            out.append(found[0])
        else:
            warnings.warn(
                f"{dump.path}: the {kind.upper()} head size is unknown, so quant_error cannot apply"
                " llama.cpp's rotation of quantized caches: the loss shown is without it. Pass model= or"
                " head_dim= to kvfast.open.",
                RotationWarning,
                stacklevel=4,
            )
            out.append(0)
    return out[0], out[1]


def compare(
    a: OpenState,
    b: OpenState,
    by: Literal["cell", "layer"] = "cell",
    layers: Sequence[int] | None = None,
    kinds: Sequence[str] | str | None = None,
    match: Match = "sequence",
) -> pl.DataFrame:
    """Errors of B against A: one row per (cache, layer, kind, cell, sequence, head) of A, cells
    matched by (sequence, position), not by order (``match='sequence'``), by position alone
    (``'position'``) or by position over the common token prefix (``'tokens'``), see
    :mod:`kvfast.analysis.compare_modes`; ``by='layer'`` summarizes per layer and kind. Raises MatchError
    when the states cannot be matched (geometry, layers, positions, tokens); warns
    (TokenMismatchWarning) where both states' tokens are known and differ at compared positions."""
    if match not in MATCHES:
        raise ValueError(f"match must be 'sequence', 'position' or 'tokens', not {match!r}")
    ta, tb = position_tokens(a), position_tokens(b)
    sel = select(a, layers, kinds)
    # kvfast-core's matching raises MatchError (the binding's), a selection it lacks SelectionError
    if match == "sequence":
        df = pl.DataFrame(_kvfast.compare(a._live(), b._live(), sel))
    elif match == "position":
        df = pl.DataFrame(_kvfast.compare_positions(a._live(), b._live(), sel))
    else:
        if not ta or not tb:
            raise MatchError(tokens_unknown(a, b, ta, tb))
        below = common_prefix(ta, tb)
        df = pl.DataFrame(_kvfast.compare_positions(a._live(), b._live(), sel, below))
    bad = differing(ta, tb) if match != "tokens" else []
    if bad and df.filter(pl.col("pos").is_in(bad)).height:
        warnings.warn(
            f"{a.path} and {b.path} hold different tokens at {len(bad)} positions (first: {bad[0]}):"
            " the errors compare different inputs there. match='tokens' compares the common prefix only.",
            TokenMismatchWarning,
            stacklevel=2,
        )
    if by == "cell":
        return df
    if by != "layer":
        raise ValueError(f"by must be 'cell' or 'layer', not {by!r}")
    return summarize(df)


def summarize(df: pl.DataFrame) -> pl.DataFrame:
    """Per-layer summary of a cell-level comparison."""
    return (
        df.group_by(_GROUP, maintain_order=True)
        .agg(
            pl.len().alias("rows"),
            pl.col("mse").mean(),
            pl.col("max_abs").max(),
            pl.col("cosine").mean().alias("cosine_mean"),
            pl.col("cosine").min().alias("cosine_min"),
            pl.col("rel").mean().alias("rel_mean"),
            pl.col("rel").max().alias("rel_max"),
        )
        .sort("cache", "layer", "kind")
    )
