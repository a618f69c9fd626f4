"""Writing a state's partitions of the value table as Parquet, for :func:`kvfast.export`.

The files are written in Rust (``_kvfast.write_parquet``, arrow-rs's ``parquet`` crate): every
partition of the state at once (rayon), the GIL released, one row group per record, so memory holds
a record per worker whatever the size of the state. The values column is encoded there directly
(PLAIN, zstd level 1, pages of 64 KiB, no statistics), which arrow-rs's own writer does at
tens of MB/s for float16; the files hold the schema Polars would write (the index columns of
:data:`kvfast.dataset.INDEX_SCHEMA`, values a ``fixed_size_list`` of float16, Parquet's FLOAT16, or
float32), read alike by Polars, pyarrow and DuckDB. README's export benchmark gives what each
encoding tried gave.
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
    return _kvfast.write_parquet(
        d._reading(), todo, dump, path, _index_schema(), advance, **{**SETTINGS, **settings}
    )
