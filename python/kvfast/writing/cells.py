"""The cells a written state keeps: one row per cell of every attention cache (:func:`cells`), and
the keep mask :func:`kvfast.write` takes, from a boolean per row or a Polars expression over them.

Columns of :func:`cells`: cache, stream, cell, pos, seq_ids (the cell's sequences), token, piece
(see :meth:`kvfast.State.cell_tokens`) and, computed only when an expression names them, the
cell's statistics of :meth:`kvfast.State.stats` (``by="cell"``) averaged over layers and heads, one
column per kind and statistic: ``k_l2`` (the key norm), ``k_absmax``, ``k_mean``, ``k_std``,
``k_min``, ``k_max``, and the same for ``v_``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from kvfast.errors import WriteError

if TYPE_CHECKING:
    from kvfast.read.state import State

KEYS = ["cache", "stream", "cell"]
STATS = ["l2", "absmax", "mean", "std", "min", "max"]
#: The statistics columns :func:`cells` can carry.
STAT_COLUMNS = [f"{k}_{s}" for k in ("k", "v") for s in STATS]

__all__ = ["STAT_COLUMNS", "WriteError", "cells", "keep_mask", "kept_positions", "prunable"]


def cells(dump: State, stats: Sequence[str] = ()) -> pl.DataFrame:
    """One row per cell of every attention cache, in (cache, stream, cell) order; ``stats`` adds
    statistics columns (names from :data:`STAT_COLUMNS`)."""
    frames = []
    for ci, c in enumerate(dump.caches):
        for s in c.streams:
            n = s.cell_count
            frames.append(
                pl.DataFrame(
                    {
                        "cache": np.full(n, ci, np.int32),
                        "stream": np.full(n, s.index, np.int32),
                        "cell": np.arange(n, dtype=np.int32),
                        "pos": np.asarray(s.pos, np.int32),
                        "seq_ids": pl.Series(s.seq_ids, dtype=pl.List(pl.Int32)),
                    }
                )
            )
    schema = {"cache": pl.Int32, "stream": pl.Int32, "cell": pl.Int32, "pos": pl.Int32}
    out = pl.concat(frames) if frames else pl.DataFrame(schema=schema)
    if out.height:
        toks = dump.cell_tokens().drop("pos")
        out = out.join(toks, on=KEYS, how="left", maintain_order="left")
    for kind in sorted({c[0] for c in stats}):
        want = [c for c in stats if c[0] == kind]
        bad = [c for c in want if c not in STAT_COLUMNS]
        if bad:
            raise WriteError("keep", f"no cell column {bad[0]!r}; statistics: {', '.join(STAT_COLUMNS)}")
        if not any(getattr(l, f"{kind}_type") for c in dump.caches for s in c.streams for l in s.layers):
            out = out.with_columns(pl.lit(None, pl.Float64).alias(c) for c in want)
            continue
        st = dump.stats(by="cell", kinds=[kind])
        agg = st.group_by(KEYS).agg([pl.col(c[2:]).mean().alias(c) for c in want])
        out = out.join(agg, on=KEYS, how="left", maintain_order="left")
    return out


def keep_mask(dump: State, keep: Any, sync: bool) -> list[list[list[bool]]]:
    """Per cache (the recurrent part, if any, last: ``[]``, every cell kept), per stream, per cell:
    whether the cell is kept. ``sync``: a token (stream, position, sequences) dropped from one
    attention cache is dropped from every cache that holds it (both caches of an iSWA pair), and only
    that token (``_synced``)."""
    stats: list[str] = []
    if isinstance(keep, pl.Expr):
        stats = sorted({n for n in keep.meta.root_names() if n in STAT_COLUMNS})
    frame = cells(dump, stats)
    if isinstance(keep, pl.Expr):
        try:
            flags = frame.select(keep.alias("keep"))["keep"]
        except pl.exceptions.PolarsError as e:
            raise WriteError("keep", f"the expression does not evaluate over the cells: {e}") from e
    else:
        flags = pl.Series("keep", np.asarray(keep))
    if flags.len() != frame.height:
        raise WriteError(
            "keep", f"one flag per cell of the attention caches ({frame.height}), not {flags.len()}"
        )
    if flags.dtype != pl.Boolean:
        raise WriteError("keep", f"booleans, not {flags.dtype}")
    if flags.null_count():
        raise WriteError(
            "keep",
            f"the flags of {flags.null_count()} cells are null (a column not known for them, as token"
            " without a model's vocabulary): decide them, e.g. with .fill_null(True)",
        )
    frame = frame.with_columns(keep=flags)
    if sync and len(dump.caches) > 1:
        frame = _synced(dump, frame)
    flags_np = frame["keep"].to_numpy()
    out: list[list[list[bool]]] = []
    at = 0
    for c in dump.caches:
        streams = []
        for s in c.streams:
            streams.append(flags_np[at : at + s.cell_count].tolist())
            at += s.cell_count
        out.append(streams)
    if dump.recurrent is not None:
        out.append([])
    return out


def prunable(dump: State, mask: list[list[list[bool]]]) -> None:
    """Refuse a keep that cannot mean what it asks: on a state with no attention cell (a recurrent
    state, a hybrid's checkpoint of its recurrent part alone, an empty sequence: there is nothing
    to keep or drop, and the state would be written unchanged), or one dropping cells of a partial
    state (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the cache it lacks stays in llama.cpp's context,
    holding every token, so a token dropped here is still attended to there)."""
    flags = [f for cache in mask for stream in cache for f in stream]
    if not flags:
        raise WriteError(
            "keep",
            f"{dump.path} holds no cell of an attention cache (its memory: "
            f"{'a recurrent part' if dump.recurrent is not None else 'empty caches'}): keep selects "
            "attention cells, and there are none to keep or drop",
        )
    partial = dump.partial
    if partial is not None and not all(flags):
        raise WriteError(
            "keep",
            f"{dump.path} is a partial state (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: its {partial.absent} "
            f"of model layers {partial.model_layers} is not in it): restored as llama-server restores a "
            "checkpoint, that cache keeps every token, so a token dropped here is still attended to "
            "there; prune the whole state (written without the flag) instead",
        )


def _synced(dump: State, frame: pl.DataFrame) -> pl.DataFrame:
    """The keep flags with every token dropped from one attention cache dropped from the others.

    A token is a cell's stream, position, sequences and cell extension (x, y) and its rank among
    the cells of its cache alike in those (llama.cpp places a ubatch's cells in the same order in
    both caches of an iSWA pair): so a position one sequence holds twice (M-RoPE image tokens,
    ``llama_memory_seq_div``) is two tokens, and dropping one of its cells drops only that one."""
    xs, ys = [], []
    for c in dump.caches:
        for s in c.streams:
            ext = s.ext
            n = s.cell_count
            xs.append(np.asarray(ext[:, 0], np.int64) if ext is not None else np.zeros(n, np.int64))
            ys.append(np.asarray(ext[:, 1], np.int64) if ext is not None else np.zeros(n, np.int64))
    token = ["stream", "pos", "_seqs", "_x", "_y", "_rank"]
    keyed = frame.select("cache", "stream", "pos", "seq_ids", "keep").with_columns(
        _seqs=pl.col("seq_ids").list.eval(pl.element().cast(pl.String)).list.join(","),
        _x=pl.Series(np.concatenate(xs) if xs else np.zeros(0, np.int64)),
        _y=pl.Series(np.concatenate(ys) if ys else np.zeros(0, np.int64)),
    )
    keyed = keyed.with_columns(
        _rank=pl.int_range(pl.len()).over(["cache", "stream", "pos", "_seqs", "_x", "_y"])
    )
    dropped = keyed.filter(~pl.col("keep")).select(token).unique().with_columns(_gone=pl.lit(True))
    gone = keyed.select(token).join(dropped, on=token, how="left", maintain_order="left")["_gone"]
    return frame.with_columns(keep=pl.col("keep") & gone.is_null())


def kept_positions(dump: State, mask: list[list[list[bool]]]) -> tuple[set[int], set[int]]:
    """Positions of the attention caches' cells: (those with a cell kept in some cache, those with
    none kept in any)."""
    had: set[int] = set()
    kept: set[int] = set()
    for c, mc in zip(dump.caches, mask):
        for s, m in zip(c.streams, mc):
            for p, k in zip(s.pos.tolist(), m):
                had.add(p)
                if k:
                    kept.add(p)
    return kept, had - kept
