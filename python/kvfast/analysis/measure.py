"""Statistics, comparisons and quantization losses over states, computed in Rust.

Each pass streams over the memory map a chunk of cells at a time, in parallel, with the GIL
released: memory stays bounded whatever the size of the state (plus the result table).
Standard deviations are population ones (ddof = 0); sums are accumulated in float64.
"""

from __future__ import annotations

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
from kvfast.errors import MatchError, RotationWarning, TokenMismatchWarning, warn
from kvfast.read import select as checks
from kvfast.read.opened import OpenState

By = Literal["cell", "channel", "head", "layer"]
LOSS_COLUMNS = tuple(_kvfast.LOSS_COLUMNS)
"""The error columns :func:`quant_error` and ``compare(by="layer")`` share, per group of (cell,
head) rows (a head of one layer, or a layer): ``rows`` rows of ``count`` values in all, and ``nan``
values left out (NaN in A, or in A or B for ``compare``: each error is over the other values, NaN
where none is left); ``mse`` and ``max_abs`` over the values; pooled over every value of the
group, ``rel`` = ||B - A|| / ||A|| (the norms of all its rows together) and ``cosine`` (of A and B
as one vector each); per row, ``rel_mean`` and ``rel_max`` of the rows' relative errors and
``cosine_mean`` and ``cosine_min`` of their cosines, over the rows where they are defined (an
all-zero row of A has no relative error, a zero row on either side no cosine; NaN where no row has
one). Pooled values weigh rows by their norm: a layer of a few large rows reads small in ``rel``
where ``rel_mean`` shows its many small rows' errors."""


def select(
    dump: OpenState,
    layers: Sequence[int] | None,
    kinds: Sequence[str] | str | None,
    caches: Sequence[int] | None = None,
    skip_first: int = 0,
) -> dict[str, Any]:
    """The selection for Rust, checked (kvfast.SelectionError for anything out of range)."""
    skip(skip_first)
    sel = checks.selection(dump.caches, layers=layers, kinds=kinds, caches=caches, recurrent=dump.recurrent)
    return {
        "caches": sel.caches,
        "layers": sel.layers,
        "kinds": sel.kinds,
    }


def parts(
    dump: OpenState,
    layers: Sequence[int] | None,
    caches: Sequence[int] | None,
    model_layers: Sequence[int] | None,
) -> list[tuple[Sequence[int] | None, Sequence[int] | None]]:
    """The (caches, layers) selections a pass runs over: the one given, or one per cache holding
    the ``model_layers`` asked for (their results concatenated are the model layers' own)."""
    if model_layers is None:
        return [(caches, layers)]
    return list(checks.by_model_layer(dump.caches, model_layers, layers, caches))


def skip(skip_first: object) -> int:
    """``skip_first``: positions are int32 (llama_pos)."""
    return checks.non_negative("skip_first", skip_first, hi=checks.INT32_MAX)


def stats(
    dump: OpenState,
    by: By = "cell",
    layers: Sequence[int] | None = None,
    kinds: Sequence[str] | str | None = None,
    skip_first: int = 0,
    caches: Sequence[int] | None = None,
    model_layers: Sequence[int] | None = None,
) -> pl.DataFrame:
    skip_first = skip(skip_first)
    if model_layers is not None:
        frames = [
            stats(dump, by, ls, kinds, skip_first, cs) for cs, ls in parts(dump, layers, caches, model_layers)
        ]
        return pl.concat(frames)
    sel = select(dump, layers, kinds, caches, skip_first=skip_first)
    state = dump._reading(sel["caches"], sel["kinds"])
    if by == "cell":
        return pl.DataFrame(_kvfast.cell_stats(state, sel, skip_first))
    if by not in ("channel", "head", "layer"):
        raise ValueError(f"by must be 'cell', 'channel', 'head' or 'layer', not {by!r}")
    channel, head, layer = _kvfast.aggregate_stats(state, sel, skip_first)
    if by == "channel":
        # the median over the channels that hold a value (a channel of NaNs only has none)
        median = pl.col("absmax").fill_nan(None).median().over(["cache", "layer", "kind", "head"])
        return pl.DataFrame(channel).with_columns(
            outlier_ratio=(pl.col("absmax") / median).fill_null(float("nan"))
        )
    return pl.DataFrame(head if by == "head" else layer)


def quant_error(
    dump: OpenState,
    type: str,
    by: Literal["head", "layer"] = "head",
    layers: Sequence[int] | None = None,
    kinds: Sequence[str] | str | None = None,
    skip_first: int = 0,
    rotate: bool = True,
    caches: Sequence[int] | None = None,
    model_layers: Sequence[int] | None = None,
) -> pl.DataFrame:
    """What a cache of ``type`` would lose, per (cache, layer, kind, head) or per layer: the
    columns of :data:`LOSS_COLUMNS` (B = each row quantized and dequantized), ``rotation`` (the
    group llama.cpp rotates in, 0 = none) and, by head, the sums behind them (``sum_sq_err``,
    ``sum_sq``, ``sum_sq_quant``, ``sum_prod``)."""
    type = checks.cache_type("type", type)
    skip_first = skip(skip_first)
    if model_layers is not None:
        return pl.concat(
            [
                quant_error(dump, type, by, ls, kinds, skip_first, rotate, cs)
                for cs, ls in parts(dump, layers, caches, model_layers)
            ]
        )
    sel = select(dump, layers, kinds, caches, skip_first=skip_first)
    if by not in ("head", "layer"):
        raise ValueError(f"by must be 'head' or 'layer', not {by!r}")
    # llama.cpp rotates attention caches only: the recurrent part (kinds r, s) is never rotated
    attention = sel["kinds"] is None or any(k in checks.KINDS for k in sel["kinds"])
    asked = range(len(dump.caches)) if caches is None else caches
    # a memory's parts of their own head sizes (Gemma 4's two caches, a DSA indexer) rotate in
    # groups of their own: each cache simulated in its own
    if (
        rotate
        and attention
        and len(asked) > 1
        and len({simulated_rotation(dump, type, c) for c in asked}) > 1
    ):
        return pl.concat([quant_error(dump, type, by, layers, kinds, skip_first, rotate, [c]) for c in asked])
    groups = simulated_rotation(dump, type, asked[0] if len(asked) else 0) if rotate and attention else (0, 0)
    state = dump._reading(sel["caches"], sel["kinds"])
    heads, per_layer = _kvfast.quant_error(state, type, sel, skip_first, groups)
    df = pl.DataFrame(heads if by == "head" else per_layer)
    rotation = (
        pl.when(pl.col("kind") == "k")
        .then(groups[0])
        .when(pl.col("kind") == "v")
        .then(groups[1])
        .otherwise(0)
        .cast(pl.Int32)
    )
    if by == "head":
        return df.with_columns(rotation=rotation)
    at = df.columns.index("kind") + 1
    order = [*df.columns[:at], "rotation", *df.columns[at:]]
    return df.with_columns(rotation=rotation).select(order).sort("cache", "layer", "kind")


def simulated_rotation(dump: OpenState, type: str, cache: int = 0) -> tuple[int, int]:
    """The (K, V) groups llama.cpp would rotate ``cache`` (an attention cache) in at ``type``, for
    this state's model: from the head sizes where known, else from the rotation found in the state
    itself; (0 = none)."""
    out = []
    for kind in ("k", "v"):
        # llama.cpp's rule for that cache (what loss_table simulates)
        ruled = next(
            (dump._live().rule_group(c.index, kind, type) for c in dump.caches[cache : cache + 1]), 0
        )
        if ruled is not None:
            out.append(ruled)
            continue
        found = [r.group for r in dump.rotation if r.kind == kind and r.group]
        if found:
            # a state rotated in group g has a head size g divides (and, for K, 2g does not)
            out.append(found[0])
        else:
            warn(
                f"the {kind.upper()} head size is unknown, so quant_error cannot apply llama.cpp's"
                " rotation of quantized caches: the loss shown is without it. Pass model= or head_dim="
                " to kvfast.open.",
                RotationWarning,
                about=dump.path,
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
    caches: Sequence[int] | None = None,
    model_layers: Sequence[int] | None = None,
) -> pl.DataFrame:
    """Errors of B against A: one row per (cache, layer, kind, cell, sequence, head) of A with
    ``mse``, ``max_abs``, ``cosine`` and ``rel`` (||b - a|| / ||a||) of that row, over its pairs of
    values but those left out (NaN on either side), counted in ``nan``; cells matched by
    (sequence, position), not by order (``match='sequence'``), by position alone (``'position'``)
    or by position over the common token prefix (``'tokens'``), see
    :mod:`kvfast.analysis.compare_modes`. ``by='layer'``: one row per (cache, layer, kind) with the
    columns of :data:`LOSS_COLUMNS`, as :func:`quant_error`'s (``rows`` counts a cell once per
    sequence it is compared in). Raises MatchError when the states cannot be matched (geometry,
    layers, positions, tokens); warns (TokenMismatchWarning) where both states' tokens are known
    and differ at compared positions."""
    if match not in MATCHES:
        raise ValueError(f"match must be 'sequence', 'position' or 'tokens', not {match!r}")
    if by not in ("cell", "layer"):
        raise ValueError(f"by must be 'cell' or 'layer', not {by!r}")
    if model_layers is not None:
        frames = [
            compare(a, b, by, ls, kinds, match, cs) for cs, ls in parts(a, layers, caches, model_layers)
        ]
        return pl.concat(frames)
    ta, tb = position_tokens(a), position_tokens(b)
    sel = select(a, layers, kinds, caches)
    # kvfast-core's matching raises MatchError (the binding's), a selection it lacks SelectionError
    sa, sb = a._reading(sel["caches"], sel["kinds"]), b._reading(sel["caches"], sel["kinds"])
    if match == "sequence":
        cells, per_layer = _kvfast.compare(sa, sb, sel)
    elif match == "position":
        cells, per_layer = _kvfast.compare_positions(sa, sb, sel)
    else:
        if not ta or not tb:
            raise MatchError(tokens_unknown(a, b, ta, tb))
        below = common_prefix(ta, tb)
        cells, per_layer = _kvfast.compare_positions(sa, sb, sel, below)
    df = pl.DataFrame(cells)
    bad = differing(ta, tb) if match != "tokens" else []
    if bad and df.filter(pl.col("pos").is_in(bad)).height:
        warn(
            f"{a.path} and {b.path} hold different tokens at {len(bad)} positions (first: {bad[0]}):"
            " the errors compare different inputs there. match='tokens' compares the common prefix only.",
            TokenMismatchWarning,
        )
    if by == "cell":
        return df
    return pl.DataFrame(per_layer).sort("cache", "layer", "kind")
