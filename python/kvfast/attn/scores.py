"""Attention-based scores of a state's cells, for pruning (:func:`kvfast.analysis.prune.by_score`,
``kvfast prune --score``): each rule reduces the attention mass of some of the queries in Rust
(:func:`kvfast.attn.mass`, no weight kept), summed over the layers and heads of each cache.

- ``"h2o"`` (Heavy-Hitter Oracle, Zhang et al. 2023): the attention a cell accumulated from every
  query;
- ``"snapkv"`` (Li et al. 2024): the votes of the observation window, the last ``observe`` queries,
  smoothed along the positions by an average pool of ``pool`` cells (SnapKV's kernel);
- ``"tova"`` (Oren et al. 2024): the attention of the last query alone (its heads averaged).

A higher score means more attention: prune with ``drop="lowest"``. A cell no scored query saw
(its cache's layers hold none of the queries' model layers) has a null score and is never dropped
by the score.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

import polars as pl

from kvfast.attn.queries import Queries
from kvfast.attn.weights import Incomplete, QueriesArg, mass
from kvfast.read.state import State

Rule = Literal["h2o", "snapkv", "tova"]
RULES: tuple[Rule, ...] = ("h2o", "snapkv", "tova")
KEYS = ["cache", "stream", "cell"]


def scores(
    state: State,
    queries: QueriesArg,
    rule: Rule = "h2o",
    *,
    observe: int = 32,
    pool: int = 7,
    model: str | os.PathLike[str] | None = None,
    incomplete: Incomplete = "skip",
) -> pl.DataFrame:
    """One row per (cache, stream, cell) some query saw: its pos and ``score`` under ``rule``."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, not {rule!r}")
    q = queries if isinstance(queries, Queries) else Queries.load(queries)
    if not len(q.pos):
        raise ValueError("no query to score with")
    if rule == "tova":
        q = q.rows(q.pos == q.pos.max())
    elif rule == "snapkv":
        if observe < 1:
            raise ValueError(f"observe must be positive, not {observe}")
        q = q.rows(q.pos > q.pos.max() - observe)
    m = mass(state, q, model=model, incomplete=incomplete)
    per = m.group_by([*KEYS, "pos"]).agg(pl.col("mass").sum().alias("score")).sort(KEYS)
    if rule == "snapkv" and pool > 1:
        per = per.with_columns(
            pl.col("score")
            .rolling_mean(pool, min_samples=1, center=True)
            .over("cache", "stream", order_by="pos")
        )
    return per.with_columns(pl.col(c).cast(pl.Int32) for c in KEYS)


def by_attention(
    state: State,
    queries: QueriesArg,
    ratio: float,
    rule: Rule = "h2o",
    *,
    sinks: int = 0,
    window: int = 1,
    observe: int = 32,
    pool: int = 7,
    model: str | os.PathLike[str] | None = None,
) -> list[bool]:
    """The keep mask (a boolean per row of :func:`kvfast.writing.cells.cells`, as
    :func:`kvfast.write`'s ``keep=`` takes it) that drops ``ratio`` of the unprotected tokens of
    least attention under ``rule``, keeping the first ``sinks`` positions and the last ``window``
    (see :func:`kvfast.analysis.prune.by_score`)."""
    from kvfast.analysis.prune import by_score
    from kvfast.writing.cells import cells

    s = scores(state, queries, rule, observe=observe, pool=pool, model=model)
    frame = cells(state).join(s.drop("pos"), on=KEYS, how="left", maintain_order="left")
    expr = by_score(ratio, "score", "lowest", sinks, window)
    return [bool(x) for x in frame.select(expr.alias("keep"))["keep"].fill_null(True)]


def sinks(
    state: State,
    queries: QueriesArg,
    *,
    model: str | os.PathLike[str] | None = None,
    layers: Sequence[int] | None = None,
    incomplete: Incomplete = "skip",
) -> pl.DataFrame:
    """Attention sinks and heavy hitters two ways, one row per cell of each cache that some query
    saw (cache, stream, cell, pos, and the token's ``piece`` where the state knows it):

    - ``share``: the mean share of a query head's attention the cell received (its mass over layers
      and heads, divided by the query heads that saw it): StreamingLLM's sinks are the first cells
      by this;
    - ``mass``: the attention it accumulated, summed over the queries, layers and heads (H2O's
      heavy hitters, its score under ``scores(rule="h2o")``): a cell seen by more queries gathers
      more, so early cells lead;
    - ``k_l2``: its key norm (mean over layers and heads: :meth:`kvfast.State.stats`), which
      predicts attention without queries: KnormPress keeps the keys of smallest norm;

    each with its rank within the cache: ``share_rank`` and ``mass_rank`` (1 the largest),
    ``k_l2_rank`` (1 the smallest norm, the cell the key norm rates most attended), the rows
    sorted by ``share_rank``. ``layers``: only these model layers' attention (and norms)."""
    q = queries if isinstance(queries, Queries) else Queries.load(queries)
    m = mass(state, q, model=model, layers=layers, incomplete=incomplete)
    per = m.group_by([*KEYS, "pos"]).agg(
        (pl.col("mass").sum() / pl.col("queries").sum()).alias("share"), pl.col("mass").sum()
    )
    per = per.with_columns(pl.col(c).cast(pl.Int32) for c in KEYS)
    ml = None if layers is None else [int(x) for x in layers]
    norms = (
        state.stats(by="cell", kinds=["k"], model_layers=ml)
        .group_by(KEYS)
        .agg(pl.col("l2").mean().alias("k_l2"))
        .with_columns(pl.col(c).cast(pl.Int32) for c in KEYS)
    )
    pieces = state.cell_tokens().select(*KEYS, "piece").with_columns(pl.col(c).cast(pl.Int32) for c in KEYS)
    out = per.join(pieces, on=KEYS, how="left").join(norms, on=KEYS, how="left")
    return out.select(
        *KEYS,
        "pos",
        "piece",
        "share",
        "mass",
        "k_l2",
        pl.col("share").rank("min", descending=True).over("cache").alias("share_rank"),
        pl.col("mass").rank("min", descending=True).over("cache").alias("mass_rank"),
        pl.col("k_l2").rank("min").over("cache").alias("k_l2_rank"),
    ).sort(["cache", "share_rank", "stream", "cell"])
