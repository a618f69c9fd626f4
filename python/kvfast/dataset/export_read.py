"""Reading an export back: its files, one schema over them, and a Polars scan that reads any export.

A plain glob (``OUT/**/*.parquet``) reads an export made with the default ``dtype``: every file has
one schema. An export with ``dtype="native"`` mixes float16 and float32 files, which engines read
differently (Polars refuses the second type, pyarrow silently casts every file to the first one's
type, float32 values above 65504 becoming inf). :func:`export_schema` gives the one schema that
holds every file (values float32 where any file has them), and :func:`scan_export` reads with it.

An export of states of several models holds each state's values at its own width (its head size,
recorded in the state's marker): such an export is one table per width, read with ``head_dim=``
(:func:`scan_export`, :func:`export_schema`, and :func:`export_files` for any other engine); a plain
glob reads it only where one width is all it holds.
"""

from __future__ import annotations

import json
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


def _width(marker: Path) -> int | None:
    try:
        width = json.loads(marker.read_text()).get("head_dim")
    except (OSError, ValueError):
        return None
    return width if isinstance(width, int) else None


def widths(out: str | os.PathLike[str]) -> list[int]:
    """The values' widths (head sizes) of the states published in `out`: an export of states of
    several models holds each state's values at its own width."""
    return sorted({w for w in (_width(state / MARKER) for state in _states(out)) if w is not None})


def export_files(out: str | os.PathLike[str], head_dim: int | None = None) -> list[str]:
    """The Parquet files of the value table (or statistics) of the states published in `out`: what
    ``OUT/**/*.parquet`` matches, never files being written; ``head_dim``: of the states whose
    values have that width only (see :func:`widths`), the list to hand any engine
    (``pl.scan_parquet(files)``, ``duckdb.read_parquet(files)``, ``pyarrow.dataset.dataset(files)``,
    ``datasets.load_dataset("parquet", data_files=files)``)."""
    files: list[str] = []
    for state in _states(out):
        if head_dim is not None and _width(state / MARKER) != head_dim:
            continue
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
    """Every column of any of the schemas (the first's order, a column only later files have before
    the values: states exported before a column was added lack it), values float32 where any file
    has them so."""
    names = list(schemas[0].names)
    for s in schemas[1:]:
        for name in s.names:
            if name not in names:
                names.insert(names.index("values") if "values" in names else len(names), name)
    fields = []
    for name in names:
        field = next(s.field(name) for s in schemas if name in s.names)
        types = {s.field(name).type for s in schemas if name in s.names}
        if len(types) > 1 and pa.types.is_fixed_size_list(field.type):
            inner = field.type.value_field.with_type(pa.float32())
            field = field.with_type(pa.list_(inner, field.type.list_size))
        fields.append(field)
    return pa.schema(fields)


def _one_width(out: str | os.PathLike[str], head_dim: int | None) -> list[str]:
    """The files of the one width read: `head_dim`, or the only one there is."""
    if head_dim is None:
        several = widths(out)
        if len(several) > 1:
            raise ValueError(
                f"{out} holds values of widths (head sizes) {several}, one table each: give head_dim="
            )
    return export_files(out, head_dim)


def export_schema(out: str | os.PathLike[str], head_dim: int | None = None) -> pa.Schema:
    """One Arrow schema for every file of the export in `out` (of values of width ``head_dim``
    where it holds several): every column any file has (the index columns of
    :data:`kvfast.dataset.INDEX_SCHEMA`, ``k_type``, ``v_type``, ``token`` and ``piece`` included;
    a file written before one was added reads it as null), and a values column of float32 where
    any file holds float32, float16 where all do. Pass it to pyarrow
    (``pyarrow.dataset.dataset(OUT, format="parquet", schema=...)``, which pandas uses too)."""
    files = _one_width(out, head_dim)
    if not files:
        raise FileNotFoundError(f"{out}: no exported state (no folder with a {MARKER} and Parquet files)")
    import pyarrow.parquet as pq  # here, not at import: `import kvfast` leaves Parquet out

    return _widest([pq.read_schema(f) for f in files])


def scan_export(out: str | os.PathLike[str], head_dim: int | None = None) -> pl.LazyFrame:
    """The export in `out` as one Polars lazy frame (the states published when it is called),
    whatever its ``dtype`` and layout: float16 files are read as float32 where others are. An
    export of states of several head sizes is one table per width: give ``head_dim``."""
    schema = pl.Schema(pl.from_arrow(export_schema(out, head_dim).empty_table()).schema)  # type: ignore[union-attr]
    return pl.scan_parquet(
        export_files(out, head_dim),
        schema=schema,
        hive_partitioning=False,
        cast_options=pl.ScanCastOptions(float_cast="upcast"),
        missing_columns="insert",  # null in a file written before the column was added
    )
