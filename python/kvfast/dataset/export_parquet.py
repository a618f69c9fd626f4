"""Writing a state's partitions of the value table as Parquet, for :func:`kvfast.export`.

The files are written in Rust (``_kvfast.write_parquet``, arrow-rs's ``parquet`` crate): every
partition of the state at once (rayon), the GIL released, one row group per record, so memory holds
a record per worker whatever the size of the state. The values column is encoded there directly
(PLAIN, zstd level 1, pages of 64 KiB, no statistics), which arrow-rs's own writer does at
tens of MB/s for float16; the files hold the schema Polars would write (the index columns of
:data:`kvfast.dataset.INDEX_SCHEMA`, values a ``fixed_size_list`` of float16, Parquet's FLOAT16, or
float32), read alike by Polars, pyarrow and DuckDB. README's export benchmark gives what each
encoding tried gave.

The columns of :data:`kvfast.dataset.states.ADDED_SCHEMA` are written in the same pass: the
layer's K and V types by Rust from the state's layout, each row's token and piece looked up by
(cache, stream, cell) in the state's :meth:`~kvfast.read.state.State.cell_tokens`, handed over
once as an array of (token, piece key) per stream and a dictionary of the state's pieces.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import polars as pl

from kvfast import _kvfast
from kvfast.dataset.states import INDEX_SCHEMA, dump_id
from kvfast.read import remote

#: How the values column is written (the measured choice: README, "Export").
SETTINGS: dict[str, Any] = {"zstd": 1, "split": False, "page_bytes": 1 << 16, "row_group_bytes": 64 << 20}


class Opened(Protocol):
    """An open state (``kvfast.open``'s): its path and its binding object."""

    @property
    def path(self) -> str: ...

    def _live(self) -> _kvfast.State: ...

    def cell_tokens(self) -> pl.DataFrame: ...

    def _reading(
        self,
        caches: Sequence[int] | None = None,
        kinds: Sequence[str] | None = None,
        stored: bool = False,
    ) -> _kvfast.State: ...


@functools.cache
def _index_schema() -> bytes:
    """The index columns' Arrow schema as Polars hands them to a writer (Arrow IPC): the files hold
    these types, with their metadata, as if Polars had written the frame."""
    return bytes(pl.DataFrame(schema=INDEX_SCHEMA).to_arrow().schema.serialize().to_pybytes())


def tokens_by_cell(d: Opened) -> tuple[list[tuple[int, int, list[int], list[int]]], list[str]]:
    """The state's cells' tokens as the writer takes them: per (cache, stream), each cell's token
    and the index of its piece in the list of the state's distinct pieces (-1: not known), and
    that list (:meth:`State.cell_tokens`'s mapping, not another)."""
    toks = d.cell_tokens()
    pieces = toks["piece"].drop_nulls().unique(maintain_order=True)
    keyed = toks.join(
        pl.DataFrame({"piece": pieces, "key": pl.int_range(pieces.len(), dtype=pl.Int32, eager=True)}),
        on="piece",
        how="left",
        maintain_order="left",
    ).with_columns(pl.col("token", "key").fill_null(-1))
    per_stream = [
        (c, s, group["token"].to_list(), group["key"].to_list())
        for (c, s), group in keyed.sort("cache", "stream", "cell", maintain_order=True).group_by(
            "cache", "stream", maintain_order=True
        )
    ]
    return per_stream, pieces.to_list()


def write_values(
    d: Opened,
    parts: Sequence[tuple[Path, pl.DataFrame]],
    dtype: str | None,
    advance: Callable[[int], None],
    **settings: Any,
) -> list[tuple[int, str | None]]:
    """Write each partition's records (rows of cache, layer, kind) to its file; per partition, the
    rows written and the values' type (``"float16"``/``"float32"``; None when no file was written).
    ``dtype``: None (as stored), ``"float32"``, or ``"native"`` (float16 in a file whose records all
    read as float16, else float32). ``advance(nbytes)`` is called after each record; ``settings``
    override :data:`SETTINGS` (the benchmark's experiments)."""
    todo = [
        (
            os.fspath(dest),
            [(c, ly, str(k)) for c, ly, k in recs.select("cache", "layer", "kind").iter_rows()],
            dtype,
        )
        for dest, recs in parts
    ]
    # the dump and path columns, as dataset.name_columns gives them
    dump, path = dump_id(d.path), remote.real(d.path)
    tokens, pieces = tokens_by_cell(d)
    return _kvfast.write_parquet(
        d._reading(), todo, dump, path, _index_schema(), tokens, pieces, advance, **{**SETTINGS, **settings}
    )
