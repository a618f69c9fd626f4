"""The weights a picture of attention draws (:func:`attention_grid`): one model layer's weights as
a dense ``[head, query, cell]`` array from ``kvfast.attn.dense``, for a range of query rows and
the cells asked for (a range, or the first cells and the last ones side by side: ``"sinks+recent"``),
with the tokens' text on both axes.

Its memory is bounded whatever the context: where the rows x cells of a part exceed
:data:`MAX_ROWS` x :data:`MAX_COLS`, the weights are read in chunks of rows and each drawn value is
the largest weight of a block of ``row_step`` x ``col_step`` (a sink or a heavy hitter stays
visible), so a picture of an 8k-token layer holds an array of the order of its pixels, not the
layer's gigabytes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from kvfast.attn.queries import Queries
from kvfast.attn.weights import Incomplete, QueriesArg
from kvfast.errors import SelectionError
from kvfast.plot.scale import CellsArg, cell_parts, select_rows
from kvfast.read.state import State

MAX_ROWS = 1024
"""Query rows drawn at most: more are shown as the maximum over blocks of rows."""
MAX_COLS = 1024
"""Cells drawn at most per part: more are shown as the maximum over blocks of cells."""
CHUNK_VALUES = 1 << 24
"""Weights read from ``kvfast.attn.dense`` at once when pooling (64 MiB of float32: each read
also reads the model's header, 0.1 s for Gemma 3's vocabulary)."""


@dataclass(frozen=True)
class Part:
    """One contiguous range of the cache's cells, as drawn: ``weights[head, row, col]`` (NaN where
    no query of the block sees a cell of it), ``start:stop`` the cells' indices in the cache's order
    (stream, cell), and per drawn column the first cell's number, position and token piece."""

    start: int
    stop: int
    weights: npt.NDArray[np.float32]
    cell: npt.NDArray[np.int64]
    pos: npt.NDArray[np.int64]
    piece: list[str | None]


@dataclass(frozen=True)
class Grid:
    """A layer's attention, ready to draw: ``parts`` side by side along the cells (one for a
    range; the sinks and the recent window for ``"sinks+recent"``), the query rows down (their
    positions, sequences and token pieces), ``row_step`` x ``col_step`` weights per drawn value
    (1 x 1: the weights themselves; more: the largest of the block)."""

    model_layer: int
    cache: int
    heads: list[int]
    n_cells: int
    #: The query rows drawn (before pooling).
    n_rows: int
    query_pos: npt.NDArray[np.int64]
    seq_id: npt.NDArray[np.int64]
    query_piece: list[str | None]
    parts: list[Part]
    row_step: int
    col_step: int

    @property
    def pooled(self) -> bool:
        return self.row_step > 1 or self.col_step > 1

    def stacked(self) -> npt.NDArray[np.float32]:
        """All parts' weights side by side: ``[head, row, col]``."""
        return np.concatenate([p.weights for p in self.parts], axis=2)


def _columns(state: State, cache: int, d: Any) -> pl.DataFrame:
    """The columns of a dense array of every cell (``d``): stream, cell, pos and the token's piece
    (null: unknown)."""
    cols = pl.DataFrame(
        {
            "stream": np.asarray(d.stream, dtype=np.int64),
            "cell": np.asarray(d.cell, dtype=np.int64),
            "pos": np.asarray(d.pos, dtype=np.int64),
        }
    )
    t = state.cell_tokens().filter(pl.col("cache") == cache)
    t = t.select(pl.col("stream").cast(pl.Int64), pl.col("cell").cast(pl.Int64), "piece")
    return cols.join(t, on=["stream", "cell"], how="left", maintain_order="left")


def _pieces_by_pos(state: State) -> dict[int, str]:
    """The token piece at each position any cache holds (a query's own token)."""
    t = state.cell_tokens().filter(pl.col("piece").is_not_null()).unique("pos", keep="first")
    return dict(zip(t["pos"].to_list(), t["piece"].to_list(), strict=True))


def _pool(x: npt.NDArray[np.float32], rs: int, cs: int) -> npt.NDArray[np.float32]:
    """The largest value of each ``rs`` x ``cs`` block of ``x[head, row, col]`` (NaN: none seen)."""
    if rs == 1 and cs == 1:
        return x
    h, r, c = x.shape
    pr, pc = -(-r // rs) * rs, -(-c // cs) * cs
    padded = np.full((h, pr, pc), np.nan, np.float32)
    padded[:, :r, :c] = x
    blocks = padded.reshape(h, pr // rs, rs, pc // cs, cs)
    out: npt.NDArray[np.float32] = np.fmax.reduce(np.fmax.reduce(blocks, axis=4), axis=2)
    return out


def attention_grid(
    state: State,
    queries: QueriesArg,
    layer: int,
    *,
    rows: tuple[int | None, int | None] | None = None,
    cells: CellsArg = None,
    heads: Sequence[int] | None = None,
    model: str | os.PathLike[str] | None = None,
    incomplete: Incomplete = "skip",
    max_rows: int = MAX_ROWS,
    max_cols: int = MAX_COLS,
) -> Grid:
    """Model layer ``layer``'s attention for ``rows=(start, stop)`` of the captured query rows
        (None: all) over ``cells``: None (all), ``(start, stop)``, ``"sinks+recent"`` or ``"N+M"``
        (the first N cells and the last M); ``rows`` as a slice reads them (``(-64, None)``: the last
    64); at most ``max_rows`` x ``max_cols`` values per part (more:
        the largest of each block)."""
    from kvfast.attn import dense

    q = queries if isinstance(queries, Queries) else Queries.load(queries)
    lay = next((x for x in q.layers if x.model_layer == layer), None)
    if lay is None:
        have = ", ".join(str(x.model_layer) for x in q.layers) or "none"
        raise SelectionError(f"the queries have no model layer {layer} (they have {have})")
    r0, r1 = select_rows(rows, len(q.pos))
    n_heads = lay.n_head if heads is None else len(heads)
    kw: dict[str, Any] = {"heads": heads, "model": model, "incomplete": incomplete}
    # the first query row over every cell: which cache holds the layer, and its cells
    probe = dense(state, q, layer, rows=(r0, r0 + 1), **kw)
    cache = int(probe.cache)
    table = _columns(state, cache, probe)
    spans = cell_parts(cells, table.height)
    n_rows = r1 - r0
    row_step = max(1, -(-n_rows // max_rows))
    widest = max(b - a for a, b in spans)
    col_step = max(1, -(-widest // max_cols))
    parts_w: list[list[npt.NDArray[np.float32]]] = [[] for _ in spans]
    qpos: list[npt.NDArray[np.int64]] = []
    qseq: list[npt.NDArray[np.int64]] = []
    shown_heads: list[int] | None = None
    # rows per read: a multiple of row_step, at most CHUNK_VALUES weights over all parts
    width = sum(b - a for a, b in spans)
    chunk = max(row_step, (CHUNK_VALUES // max(1, n_heads * width)) // row_step * row_step)
    for c0 in range(r0, r1, chunk):
        c1 = min(r1, c0 + chunk)
        for i, (a, b) in enumerate(spans):
            d = dense(state, q, layer, rows=(c0, c1), cells=(a, b), **kw)
            parts_w[i].append(_pool(np.asarray(d.weights, dtype=np.float32), row_step, col_step))
            if i == 0:
                qpos.append(np.asarray(d.query_pos, dtype=np.int64)[::row_step])
                qseq.append(np.asarray(d.seq_id, dtype=np.int64)[::row_step])
                shown_heads = [int(h) for h in d.heads]
    query_pos = np.concatenate(qpos) if qpos else np.zeros(0, np.int64)
    seq_id = np.concatenate(qseq) if qseq else np.zeros(0, np.int64)
    if not query_pos.size:
        raise SelectionError(f"no query row of model layer {layer} sees a cell of the state")
    by_pos = _pieces_by_pos(state)
    query_piece = [by_pos.get(int(p)) for p in query_pos]
    parts = []
    for (a, b), ws in zip(spans, parts_w, strict=True):
        t = table.slice(a, b - a).gather_every(col_step)
        parts.append(
            Part(
                a,
                b,
                np.concatenate(ws, axis=1),
                t["cell"].to_numpy().astype(np.int64),
                t["pos"].to_numpy().astype(np.int64),
                t["piece"].to_list(),
            )
        )
    return Grid(
        model_layer=layer,
        cache=cache,
        heads=shown_heads or [],
        n_cells=table.height,
        n_rows=n_rows,
        query_pos=query_pos,
        seq_id=seq_id,
        query_piece=query_piece,
        parts=parts,
        row_step=row_step,
        col_step=col_step,
    )
