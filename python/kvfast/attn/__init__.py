"""Attention from llama.cpp: query vectors captured while it decodes (:mod:`.capture`, written by
the probe runner's ``queries=`` option in the format of :mod:`.queries`), and the attention of
queries over a state's cache computed in Rust (:mod:`.weights`): the weights (as a table, or one
layer's as a dense ``[head, query, cell]`` array: :func:`.dense`), the mass each cell received, each query's entropy, its top cells, or several of them in one pass (:func:`.reductions`);
and what they are for (:mod:`.scores`): attention sinks by mass next to sinks by key norm, and the
attention-based pruning scores (H2O, SnapKV, TOVA).

>>> q = kvfast.attn.Queries.load("out/p00000.queries.json")        # doctest: +SKIP
>>> with kvfast.open("out/p00000.ggsq") as st:                     # doctest: +SKIP
...     w = kvfast.attention(st, q)
...     sinks = kvfast.attn.mass(st, q).group_by("pos").agg(pl.col("mass").sum())

The capture module is imported when used (it needs llama-cpp-python), not with the package.
"""

from kvfast.attn.arrays import DenseAttention, dense
from kvfast.attn.queries import Queries, QueryLayer
from kvfast.attn.scores import by_attention, scores, sinks
from kvfast.attn.weights import attention, entropy, mass, reductions, top_k

__all__ = [
    "DenseAttention",
    "Queries",
    "QueryLayer",
    "attention",
    "by_attention",
    "dense",
    "entropy",
    "mass",
    "reductions",
    "scores",
    "sinks",
    "top_k",
]
