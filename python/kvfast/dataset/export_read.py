"""Reading an export back: its files, one schema over them, and a Polars scan that reads any export.

A plain glob (``OUT/**/*.parquet``) reads an export made with the default ``dtype``: every file has
one schema. An export with ``dtype="native"`` mixes float16 and float32 files, which engines read
differently (Polars refuses the second type, pyarrow silently casts every file to the first one's
type, float32 values above 65504 becoming inf). :func:`export_schema` gives the one schema that
holds every file (values float32 where any file has them), and :func:`scan_export` reads with it.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pyarrow as pa

from kvfast.dataset import export_recurrent
from kvfast.dataset.export_commit import MARKER


def _states(out: str | os.PathLike[str]) -> list[Path]:
    """The folders of the states published in `out` (never the staging folder ``_kvfast/`` that an
    export falls back to when OUT is a mount point)."""
    return [
        state
        for state in sorted(Path(out).iterdir())
        if state.is_dir() and not state.name.startswith(("_", ".")) and (state / MARKER).is_file()
    ]


def export_files(out: str | os.PathLike[str]) -> list[str]:
    """The Parquet files of the value table (or statistics) of the states published in `out`: what
    ``OUT/**/*.parquet`` matches, never files being written."""
    files: list[str] = []
    for state in _states(out):
        # the recurrent part's values, of other widths, are elsewhere (export_recurrent)
        files += sorted(
            str(f) for f in state.rglob("*.parquet") if not f.relative_to(state).parts[0].startswith("_")
        )
    return files


def recurrent_files(out: str | os.PathLike[str], kind: str) -> list[str]:
    """The files of the recurrent part's ``kind`` rows ('r' or 's') of the states published in
    `out`, one per state that has them: ``OUT/*/_recurrent/kind-s.parq``."""
    if kind not in ("r", "s"):
        raise ValueError(f"kind must be 'r' or 's', not {kind!r}")
    return [str(f) for state in _states(out) if (f := state / export_recurrent.name(kind)).is_file()]


def _widest(schemas: list[pa.Schema]) -> pa.Schema:
    first = schemas[0]
    fields = []
    for field in first:
        types = {s.field(field.name).type for s in schemas if field.name in s.names}
        if len(types) > 1 and pa.types.is_fixed_size_list(field.type):
            inner = field.type.value_field.with_type(pa.float32())
            field = field.with_type(pa.list_(inner, field.type.list_size))
        fields.append(field)
    return pa.schema(fields)


def export_schema(out: str | os.PathLike[str]) -> pa.Schema:
    """One Arrow schema for every file of the export in `out`: a values column of float32 where
    any file holds float32, float16 where all do. Pass it to pyarrow
    (``pyarrow.dataset.dataset(OUT, format="parquet", schema=...)``, which pandas uses too)."""
    files = export_files(out)
    if not files:
        raise FileNotFoundError(f"{out}: no exported state (no folder with a {MARKER} and Parquet files)")
    import pyarrow.parquet as pq  # here, not at import: `import kvfast` leaves Parquet out

    return _widest([pq.read_schema(f) for f in files])


def scan_export(out: str | os.PathLike[str]) -> pl.LazyFrame:
    """The export in `out` as one Polars lazy frame (the states published when it is called),
    whatever its ``dtype`` and layout: float16 files are read as float32 where others are."""
    schema = pl.Schema(pl.from_arrow(export_schema(out).empty_table()).schema)  # type: ignore[union-attr]
    return pl.scan_parquet(
        export_files(out),
        schema=schema,
        hive_partitioning=False,
        cast_options=pl.ScanCastOptions(float_cast="upcast"),
    )
