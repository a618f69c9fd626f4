"""Keep masks of the usual pruning rules, as Polars expressions over :func:`kvfast.writing.cells.cells`
for :func:`kvfast.write`'s ``keep=``: drop a share of the cells by a score (the key norm, as
KnormPress does: the keys of largest L2 norm draw the least attention), always keeping the first
``sinks`` positions (attention sinks) and the last ``window`` (StreamingLLM's recent window; at
least the last one, so that llama.cpp goes on from the position the source ended at).
"""

from __future__ import annotations

from typing import Literal

import polars as pl

GROUP = ["cache", "stream"]
TOKEN = ["stream", "pos", "seq_ids"]


def protected(sinks: int = 0, window: int = 1) -> pl.Expr:
    """The cells always kept: positions below ``sinks`` and the last ``window`` positions of each
    cache's stream."""
    last = pl.col("pos").max().over(GROUP)
    return (pl.col("pos") < sinks) | (pl.col("pos") > last - window)


def by_score(
    ratio: float,
    score: str = "k_l2",
    drop: Literal["highest", "lowest"] = "highest",
    sinks: int = 0,
    window: int = 1,
) -> pl.Expr:
    """Keep all but ``ratio`` of the unprotected tokens of each stream, dropping those of the
    ``drop`` scores (``score``: a column of :func:`kvfast.writing.cells.cells`, e.g. ``k_l2``).

    A token's score is the mean of its cells' over the attention caches that hold it (an iSWA
    model keeps a token in both of its caches); the tokens are ranked in the first cache that has
    scores (the full-attention one, which holds every token), and :func:`kvfast.write` drops each
    token from every cache holding it. ``ratio=1`` keeps the sinks and the window alone
    (StreamingLLM)."""
    if not 0 <= ratio <= 1:
        raise ValueError(f"ratio must be in [0, 1], not {ratio}")
    prot = protected(sinks, window)
    decider = pl.col("cache") == pl.col("cache").filter(pl.col(score).is_not_null()).min()
    free = decider & ~prot
    s = pl.when(free).then(pl.col(score).mean().over(TOKEN)).otherwise(None)
    rank = s.rank("ordinal", descending=drop == "highest").over(GROUP)
    n_drop = (s.count().over(GROUP) * ratio).floor()
    return ~free | (rank > n_drop)
