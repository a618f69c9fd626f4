"""One model layer's attention weights as a dense float32 array ``[head, query, cell]``: what
Hugging Face's ``output_attentions=True`` gives, for a range of the captured queries and of the
cache's cells, computed in Rust (kvfast-core's ``attention::dense``) in the memory of that array
and one layer's keys, never through a table of rows.

>>> with kvfast.open("out/p00000.ggsq") as st:                       # doctest: +SKIP
...     a = kvfast.attn.dense(st, "out/p00000.queries.json", layer=5, rows=(-64, None))
...     a.weights.shape                                               # (heads, 64, cells)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvfast import _kvfast
from kvfast.attn.queries import Queries
from kvfast.attn.weights import Incomplete, QueriesArg, prepare
from kvfast.errors import SelectionError
from kvfast.read.state import State

Range = tuple[int | None, int | None]


@dataclass(frozen=True)
class DenseAttention:
    """A model layer's weights over a cache's cells: ``weights[h, i, j]`` is the weight query head
    ``heads[h]`` of query row ``i`` gives cell ``j`` (NaN where the query does not see the cell: a
    later position, another sequence, outside a sliding window, or a query left out by
    ``incomplete="skip"``; ``np.nan_to_num`` gives Hugging Face's zeros). Each row sums to 1 over
    every cell the query sees (less a learned sink's share), of which ``cells`` chose the columns."""

    weights: npt.NDArray[np.float32]
    #: The query heads, in the order of the first axis.
    heads: npt.NDArray[np.int64]
    #: Per query (second axis): its position, its sequence and its row in the queries.
    query_pos: npt.NDArray[np.int32]
    seq_id: npt.NDArray[np.int32]
    query_row: npt.NDArray[np.int64]
    #: Per column (third axis): the cache's stream, the cell and the cell's position.
    stream: npt.NDArray[np.int64]
    cell: npt.NDArray[np.int64]
    pos: npt.NDArray[np.int32]
    #: The cache holding the layer, its layer index there, and the model layer.
    cache: int
    layer: int
    model_layer: int


def _span(r: Range | None, n: int, what: str) -> tuple[int, int]:
    """A (start, stop) range as Python slices read it (None: an end; negative: from the end)."""
    if r is None:
        return 0, n
    start, stop, _ = slice(*_bounds(r, what)).indices(n)
    return start, max(start, stop)


def dense(
    state: State,
    queries: QueriesArg,
    layer: int,
    *,
    rows: Range | None = None,
    cells: Range | None = None,
    heads: Sequence[int] | None = None,
    model: str | os.PathLike[str] | None = None,
    scale: float | dict[int, float] | None = None,
    sinks: dict[int, Sequence[float]] | None = None,
    incomplete: Incomplete = "skip",
    chunk: int = 16,
) -> DenseAttention:
    """The weights of model layer ``layer`` as a :class:`DenseAttention`: the query rows ``rows``
    (``(start, stop)`` of the captured rows, as a slice: ``(-64, None)`` is the last 64), the cells
    ``cells`` (``(start, stop)`` of the cache's cells in stream then cell order), the query heads
    ``heads`` (None: all). Memory: the array (4 bytes a weight) and the layer's keys. The other
    arguments are :func:`kvfast.attn.attention`'s."""
    q = queries if isinstance(queries, Queries) else Queries.load(queries)
    r0, r1 = _span(rows, len(q.pos), "rows")
    p = prepare(state, q, model, scale, sinks)
    values = np.ascontiguousarray(q.values[r0:r1], dtype=np.float32)
    arr, axes = _kvfast.attention_dense(
        state._live(),
        p.model,
        values,
        q.row_len,
        np.ascontiguousarray(q.pos[r0:r1], dtype=np.int32),
        np.ascontiguousarray(q.seq[r0:r1], dtype=np.int32),
        p.blocks,
        int(layer),
        heads=None if heads is None else [int(h) for h in heads],
        scale=p.scale,
        sinks=p.sinks,
        incomplete=incomplete,
        chunk=chunk,
        cells=None if cells is None else _bounds(cells, "cells"),
    )
    return DenseAttention(
        weights=arr,
        heads=np.asarray(axes["heads"], dtype=np.int64),
        query_pos=np.asarray(q.pos[r0:r1], dtype=np.int32),
        seq_id=np.asarray(q.seq[r0:r1], dtype=np.int32),
        query_row=np.arange(r0, r1, dtype=np.int64),
        stream=np.asarray(axes["stream"], dtype=np.int64),
        cell=np.asarray(axes["cell"], dtype=np.int64),
        pos=np.asarray(axes["pos"], dtype=np.int32),
        cache=int(axes["cache"]),
        layer=int(axes["layer"]),
        model_layer=int(axes["model_layer"]),
    )


def _bounds(r: Range, what: str) -> tuple[int | None, int | None]:
    if not (isinstance(r, tuple) and len(r) == 2 and all(x is None or _whole(x) for x in r)):
        raise SelectionError(f"{what}: expected (start, stop) of whole numbers or None, not {r!r}")
    return r


def _whole(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)
