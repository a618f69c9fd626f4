"""Many states as one dataset: lazy Polars scans with pushdown, and a metadata manifest.

`scan` registers a Polars IO source. Polars hands it the projection, the predicate, the row limit
and a batch size, and does not re-apply the predicate nor the limit: this source applies both
exactly. The predicate is pushed down as far as its columns allow:
- only dump / path / cache / layer / model_layer / kind / k_type / v_type: records that fail it are
  never read;
- index columns too (stream, cell, pos, seq_id, head, token, piece): each record's index is built
  and filtered first (no value bytes), and a record with no row left is never read;
- values: every record of the dumps left is read, then filtered.
A projection without `values` reads no value bytes at all.
"""

from __future__ import annotations

import hashlib
import os
import re
import weakref
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from kvfast.dataset import walk
from kvfast.model.geometry import ModelGeometry
from kvfast.model.rotation import Mode
from kvfast.read import remote, schema
from kvfast.read.opening import Models, Opening
from kvfast.read.state import State, open
from kvfast.read.tokens import cell_tokens

STATE_SUFFIXES = (".bin", ".ggsq", ".ggsn", ".state", ".session", ".slot")
#: The columns scans and exports add to a state's value table (besides dump and path): the ggml
#: types of the row's layer's K and V records, one value a record (null where the layer has none:
#: an MLA cache's V; both for the recurrent part, whose R and S are no K or V cache), and the token
#: its cell holds and the text it stands for, as :meth:`State.cell_tokens` maps them (null where
#: not known; ``piece`` from ``model=``'s GGUF vocabulary or a probe manifest's recorded pieces).
ADDED_SCHEMA: dict[str, pl.DataType] = {
    "k_type": schema.GGML_TYPE,
    "v_type": schema.GGML_TYPE,
    "token": pl.Int32(),
    "piece": pl.String(),
}
RECORD_COLS = frozenset({"dump", "path", "cache", "layer", "model_layer", "kind", "k_type", "v_type"})
INDEX_COLS = RECORD_COLS | {"stream", "cell", "pos", "seq_id", "head", "token", "piece"}
#: The index columns of scans and exports, in order (values follow).
INDEX_SCHEMA: dict[str, pl.DataType] = {
    **{k: v for k, v in schema.INDEX.items() if k != "channel"},
    **ADDED_SCHEMA,
}

#: Records and value bytes read by scans in this process (to see pushdown at work).
READS: Counter[str] = Counter()

Paths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def expand(paths: Paths, storage_options: remote.StorageOptions = None) -> list[str]:
    """Paths, glob patterns and directories, as a list of state files in order.

    - A directory: the state files (:data:`STATE_SUFFIXES`) in it and in every folder below it
      (hidden files and folders, and kvfast's own ``_kvfast`` folders, left out), sorted by path.
    - A glob (``runs/**/*``, recursive ``**``): the files it matches, in order; directories, hidden
      files and files that are plainly no state (:data:`NOT_STATES`: manifests, Parquet, models,
      pictures) are skipped.
    - A path: itself, whatever its name.
    - URLs (``s3://bucket/prefix/``, ``s3://bucket/runs/*.ggsq``) as the objects they name, listed
      with ``storage_options`` (see :mod:`kvfast.read.remote`): open them with the same ones (an
      :class:`~kvfast.read.opening.Opening`'s).
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    found: list[str] = []
    for item in items:
        p = os.fspath(item)
        if remote.is_url(p):
            found += remote.expand(p, set(STATE_SUFFIXES), storage_options)
            continue
        p = remote.local_path(p)
        if os.path.isdir(p):
            found += _states_below(Path(p))
        elif any(c in p for c in "*?[") and not os.path.exists(p):
            found += [f for f in walk.glob(p) if _may_be_state(Path(f))]
        else:
            found.append(p)
    if not found:
        raise FileNotFoundError(f"no state files in {paths!r}")
    return found


#: Files a glob matches that are plainly no state: skipped (a path given by name is always read).
NOT_STATES = frozenset(
    {".json", ".jsonl", ".parquet", ".gguf", ".png", ".svg", ".pdf", ".txt", ".md", ".csv"}
)


def _may_be_state(f: Path) -> bool:
    return f.is_file() and not f.name.startswith(".") and f.suffix.lower() not in NOT_STATES


def _states_below(root: Path) -> list[str]:
    """The state files in `root` and every folder below it, sorted by path (symbolic links to
    folders are not followed: no cycles); a folder that cannot be listed is an error naming it,
    never skipped."""
    out: list[str] = []
    for here, dirs, files in os.walk(root, onerror=walk.refuse):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        out += [
            os.path.join(here, f) for f in files if not f.startswith(".") and Path(f).suffix in STATE_SUFFIXES
        ]
    return sorted(out)


def dump_id(path: str | os.PathLike[str]) -> str:
    """A state's stable id, the ``dump`` column of scans and exports: its file's stem (made safe for
    folder names and hive readers: no ``=``, no leading ``.`` or ``_``) and the first 10 hex digits
    of the SHA-1 of its real path. The same whatever the working directory or the spelling of the
    path (``./a.bin``, a symbolic link); it is also the state's folder in an export. A file moved
    elsewhere gets another id. A URL's id is its object's stem and the SHA-1 of the URL."""
    if remote.is_url(path):
        return remote.dump_id_of_url(os.fspath(path))
    real = os.path.realpath(remote.local_path(path))
    stem = re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(real).stem).lstrip("._") or "state"
    return f"{stem}-{hashlib.sha1(real.encode()).hexdigest()[:10]}"


def name_columns(d: State) -> dict[str, str]:
    """The dump and path columns of a state: its stable id and its real path."""
    return {"dump": dump_id(d.path), "path": remote.real(d.path)}


def model_geometry(model: str | os.PathLike[str] | ModelGeometry | None) -> ModelGeometry | None:
    """The geometry a ``model=`` argument names: None, a geometry as given, or a GGUF's (read once
    for every state of a scan or export)."""
    if model is None or isinstance(model, ModelGeometry):
        return model
    return ModelGeometry.from_gguf(model)


def records(d: State, kinds: Sequence[str] = ("k", "v")) -> pl.DataFrame:
    """The state's records of ``kinds`` as kvfast-core lists them, one row per (cache, layer, kind)
    with every stream's bytes summed: the record columns (dump, path, cache, layer, model_layer,
    kind, k_type, v_type: the types of the layer's K and V records), then ``type`` (the record's
    own), ``n_embd`` (values per cell) and ``nbytes``."""
    recs = pl.DataFrame(d._live().records())
    for kind in ("k", "v"):  # the layer's K and V types on each of its records
        types = recs.filter(pl.col("kind") == kind).select(
            "cache", "layer", pl.col("type").alias(f"{kind}_type")
        )
        recs = recs.join(types, on=["cache", "layer"], how="left", maintain_order="left")
    recs = recs.filter(pl.col("kind").is_in(list(kinds)))
    names = [pl.lit(v, pl.String()).alias(k) for k, v in name_columns(d).items()]
    cols = [
        pl.col(k).cast(INDEX_SCHEMA[k]) for k in ("cache", "layer", "model_layer", "kind", "k_type", "v_type")
    ]
    return recs.select(*names, *cols, "type", "n_embd", "nbytes")


def _records(d: State) -> pl.DataFrame:
    """One row per (cache, layer, kind) of the attention caches (K and V)."""
    return records(d)


def record_bytes(d: State, cache: int, layer: int, kind: str) -> int:
    """Row bytes of one record over every stream (0: the state has no such record)."""
    recs = records(d, (kind,)).filter((pl.col("cache") == cache) & (pl.col("layer") == layer))
    return int(recs["nbytes"].sum())


class _Added:
    """What a state's records add to their rows (:data:`ADDED_SCHEMA`): the types of each (cache,
    layer) and the cells' tokens, made once per open state (a scan reads many records of it)."""

    def __init__(self, d: State) -> None:
        recs = records(d, ("k", "v", "r", "s"))
        self.types = {
            (c, ly): (k, v) for c, ly, k, v in recs.select("cache", "layer", "k_type", "v_type").iter_rows()
        }
        self.tokens = cell_tokens(d).drop("pos")


_ADDED: weakref.WeakKeyDictionary[State, _Added] = weakref.WeakKeyDictionary()


def _added(d: State) -> _Added:
    found = _ADDED.get(d)
    if found is None:
        found = _ADDED[d] = _Added(d)
    return found


def added_columns(d: State, cache: int, layer: int, df: pl.DataFrame) -> pl.DataFrame:
    """`df`, rows of one (cache, layer) of `d` with cache, stream and cell columns, with the
    columns of :data:`ADDED_SCHEMA` (the same as :meth:`State.to_polars` with ``tokens=True``
    gives token and piece)."""
    added = _added(d)
    k_type, v_type = added.types.get((cache, layer), (None, None))
    toks = added.tokens.filter(pl.col("cache") == cache)
    return df.with_columns(
        k_type=pl.lit(k_type, schema.GGML_TYPE), v_type=pl.lit(v_type, schema.GGML_TYPE)
    ).join(toks, on=["cache", "stream", "cell"], how="left", maintain_order="left")


def record_frame(
    d: State, cache: int, layer: int, kind: str, dtype: str | None, values: bool
) -> pl.DataFrame:
    """One record's value table (``values``: with the values column, counted in :data:`READS`) with
    the dump and path columns and those of :data:`ADDED_SCHEMA`, in :data:`INDEX_SCHEMA`'s column
    order."""
    stream = (d._reading([cache], [kind]) if values else d._live()).table(
        caches=[cache],
        layers=[layer],
        kinds=[kind],
        dtype=dtype,
        with_values=values,
    )
    if values:
        READS["records"] += 1
        READS["bytes"] += record_bytes(d, cache, layer, kind)
    df = pl.DataFrame(stream).with_columns(**{k: pl.lit(v, pl.String()) for k, v in name_columns(d).items()})
    return added_columns(d, cache, layer, df).select([*INDEX_SCHEMA, *(["values"] if values else [])])


def batches(
    frames: Iterator[pl.DataFrame], n_rows: int | None, batch_size: int | None
) -> Iterator[pl.DataFrame]:
    """The frames cut to ``n_rows`` rows in all and to ``batch_size`` rows each (empty ones left
    out): what a Polars IO source's ``n_rows`` and ``batch_size`` ask."""
    left = n_rows
    for df in frames:
        if left is not None:
            if left <= 0:
                return
            df = df.head(left)
            left -= df.height
        if batch_size and df.height > batch_size:
            for start in range(0, df.height, batch_size):
                yield df.slice(start, batch_size)
        elif df.height:
            yield df


def open_all(paths: list[str], opening: Opening) -> list[tuple[str, State]]:
    """Open every state with ``opening``'s options."""
    return [(p, opening.open(p)) for p in paths]


def value_types(dumps: list[State]) -> tuple[bool, set[int]]:
    """Whether every record of the dumps reads as float16 (as stored: keys before RoPE are f32),
    and the values' widths (head sizes) they have; each state's part is the core's table plan."""
    plans = [p for p in (d._live().value_plan() for d in dumps) if p is not None]
    return all(name == "float16" for name, _ in plans), {hd for _, hds in plans for hd in hds}


def values_schema(dumps: list[State]) -> tuple[pl.DataType, str | None]:
    """The values column's type over every dump: Float16 when every record is f16, else Float32,
    of the one width the dumps' values have."""
    all_f16, dims = value_types(dumps)
    if not dims:
        dims.add(1)  # no K or V at all (recurrent models): an empty value table
    if len(dims) != 1:
        raise ValueError(
            f"the states' values have different widths (head sizes) {sorted(dims)}, and a scan is one"
            " table of one width: scan each model's states apart, or export them all (kvfast.export"
            " keeps each state's width; kvfast.scan_export(OUT, head_dim=...) reads one). Where a head"
            " size is unknown, give head_dim or model."
        )
    inner = pl.Float16() if all_f16 else pl.Float32()
    return pl.Array(inner, dims.pop()), None if all_f16 else "float32"


def scan(
    paths: Paths,
    head_dim: int | None = None,
    model: Models = None,
    rotation: Mode = "auto",
    pre_rope: bool = False,
    storage_options: remote.StorageOptions = None,
) -> pl.LazyFrame:
    """The value table of every state as one lazy frame, with ``dump`` (the state's stable id,
    :func:`dump_id`) and ``path`` (its real path) columns, and those of :data:`ADDED_SCHEMA`: the
    layer's ``k_type`` and ``v_type``, the cell's ``token`` and ``piece``.

    Opening reads metadata only; rows are read when the query runs, and only those the projection
    and the predicate need (see the module's doc). Values are in the basis ``rotation`` chooses
    (see :func:`kvfast.open`); ``pre_rope=True`` (``model`` a GGUF file) gives keys before RoPE.
    URLs (``s3://...``) are read by ranged requests, only the records a query reads
    (``storage_options``: see :mod:`kvfast.read.remote`).
    """
    files = expand(paths, storage_options)
    how = Opening(head_dim, model, rotation, pre_rope, storage_options)
    dumps = [d for _, d in open_all(files, how)]
    values_type, dtype = values_schema(dumps)
    schema = {**INDEX_SCHEMA, "values": values_type}

    def source(
        with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None, batch_size: int | None
    ) -> Iterator[pl.DataFrame]:
        wanted = list(schema) if with_columns is None else with_columns
        roots, record_level = _pushdown(predicate)
        need_values = "values" in wanted or "values" in roots
        index_level = predicate is not None and not record_level and roots <= INDEX_COLS

        def frames() -> Iterator[pl.DataFrame]:
            for d in dumps:
                recs = _chosen_records(d, predicate, record_level)
                for cache, layer, kind in recs.select("cache", "layer", "kind").iter_rows():
                    if index_level:
                        assert predicate is not None
                        index = record_frame(d, cache, layer, kind, dtype, values=False).filter(predicate)
                        if index.is_empty():
                            continue
                        if not need_values:
                            yield index.select(wanted)
                            continue
                    df = record_frame(d, cache, layer, kind, dtype, values=need_values)
                    if predicate is not None and not record_level:
                        df = df.filter(predicate)
                    yield df.select(wanted)

        yield from batches(frames(), n_rows, batch_size)

    return register_source(source, schema, f"kvfast.scan of {len(files)} states")


def _pushdown(predicate: pl.Expr | None) -> tuple[set[str], bool]:
    """The predicate's columns, and whether it can choose whole records on its own."""
    roots = set(predicate.meta.root_names()) if predicate is not None else set()
    return roots, predicate is not None and roots <= RECORD_COLS


def _chosen_records(d: State, predicate: pl.Expr | None, record_level: bool) -> pl.DataFrame:
    """The dump's records, filtered by a record-level predicate."""
    recs = _records(d)
    if record_level and predicate is not None:
        recs = recs.filter(predicate)
    return recs


def register_source(source: Any, schema: dict[str, pl.DataType], detail: str) -> pl.LazyFrame:
    """A lazy frame over a Polars IO source generator of ``schema`` (``detail`` shown by explain)."""
    from polars.io.plugins import register_io_source

    return register_io_source(io_source=source, schema=schema, explain_name="kvfast", explain_detail=detail)


STATS_SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "cell": {
        **{
            k: INDEX_SCHEMA[k]
            for k in ("cache", "stream", "layer", "model_layer", "kind", "cell", "pos", "seq_id", "head")
        },
        "l2": pl.Float64(),
        "mean": pl.Float64(),
        "std": pl.Float64(),
        "min": pl.Float32(),
        "max": pl.Float32(),
        "absmax": pl.Float32(),
        "argmax": pl.UInt32(),
        "nan": pl.UInt32(),
    },
    "channel": {
        **{k: INDEX_SCHEMA[k] for k in ("cache", "layer", "model_layer", "kind", "head")},
        "channel": schema.INDEX["channel"],
        "count": pl.UInt64(),
        "cells": pl.UInt64(),
        "nan": pl.UInt64(),
        **{k: pl.Float64() for k in ("mean", "std", "min", "max", "absmax", "outlier_ratio")},
    },
    "head": {
        **{k: INDEX_SCHEMA[k] for k in ("cache", "layer", "model_layer", "kind", "head")},
        "count": pl.UInt64(),
        "cells": pl.UInt64(),
        "nan": pl.UInt64(),
        **{k: pl.Float64() for k in ("mean", "std", "min", "max", "absmax", "l2_mean", "l2_max")},
    },
    "layer": {
        **{k: INDEX_SCHEMA[k] for k in ("cache", "layer", "model_layer", "kind")},
        "count": pl.UInt64(),
        "cells": pl.UInt64(),
        "nan": pl.UInt64(),
        **{k: pl.Float64() for k in ("mean", "std", "min", "max", "absmax", "l2_mean", "l2_max")},
    },
}


def stats_frame(
    d: State, by: str, layers: list[int] | None = None, kinds: list[str] | None = None
) -> pl.DataFrame:
    """`State.stats` with leading ``dump`` and ``path`` columns, in the schema `scan_stats` declares."""
    df = d.stats(by=by, layers=layers, kinds=kinds)  # type: ignore[arg-type]
    schema = STATS_SCHEMAS[by]
    names = name_columns(d)
    return df.with_columns(**{k: pl.lit(v, pl.String()) for k, v in names.items()}).select(
        *names, *[pl.col(c).cast(t) for c, t in schema.items()]
    )


def scan_stats(
    paths: Paths,
    by: str = "cell",
    head_dim: int | None = None,
    model: Models = None,
    rotation: Mode = "auto",
    pre_rope: bool = False,
    storage_options: remote.StorageOptions = None,
) -> pl.LazyFrame:
    """`State.stats(by=...)` of every state as one lazy frame, with ``dump`` and ``path`` columns. A
    predicate on dump / path / cache / layer / model_layer / kind decides which records are read."""
    if by not in STATS_SCHEMAS:
        raise ValueError(f"by must be one of {sorted(STATS_SCHEMAS)}, not {by!r}")
    files = expand(paths, storage_options)
    how = Opening(head_dim, model, rotation, pre_rope, storage_options)
    dumps = [d for _, d in open_all(files, how)]
    schema = {"dump": pl.String(), "path": pl.String(), **STATS_SCHEMAS[by]}

    def source(
        with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None, batch_size: int | None
    ) -> Iterator[pl.DataFrame]:
        wanted = list(schema) if with_columns is None else with_columns
        _, record_level = _pushdown(predicate)

        def frames() -> Iterator[pl.DataFrame]:
            for d in dumps:
                recs = _chosen_records(d, predicate, record_level)
                if recs.is_empty():
                    continue
                layers = sorted(set(recs["layer"].to_list()))
                kinds = sorted(set(recs["kind"].to_list()))
                df = stats_frame(d, by, layers, kinds)
                if predicate is not None:
                    df = df.filter(predicate)
                yield df.select(wanted)

        yield from batches(frames(), n_rows, batch_size)

    return register_source(source, schema, f"kvfast.scan_stats of {len(files)} states")


def manifest(paths: Paths) -> pl.DataFrame:
    """One row per state, from metadata only: path (its real path), dump (its id, :func:`dump_id`),
    size, container, version, arch, caches, layers, cells, K/V types, token count; a state that
    fails to open has its error and nulls."""
    rows = []
    for p in expand(paths):
        row: dict[str, Any] = {"path": remote.real(p), "dump": dump_id(p), "error": None}
        try:
            with open(p) as d:
                layers = [ly for c in d.caches for ly in c.layers]
                tokens = d.tokens
                row.update(
                    size=d.size,
                    container=d.container,
                    version=d.version,
                    arch=d.arch,
                    caches=len(d.caches),
                    layers=len(layers),
                    cells=max((sum(s.cell_count for s in c.streams) for c in d.caches), default=0),
                    k_types=",".join(sorted({ly.k_type for ly in layers})),
                    v_types=",".join(sorted({ly.v_type for ly in layers if ly.v_type})),
                    n_tokens=None if tokens is None else len(tokens),
                    row_bytes=d.row_bytes,
                )
        except Exception as e:  # noqa: BLE001 - the manifest reports every state, good or not
            row.update(
                size=os.path.getsize(p) if os.path.isfile(p) else None, error=f"{type(e).__name__}: {e}"
            )
        rows.append(row)
    schema = {
        "path": pl.String(),
        "dump": pl.String(),
        "size": pl.UInt64(),
        "container": pl.String(),
        "version": pl.Int32(),
        "arch": pl.String(),
        "caches": pl.Int32(),
        "layers": pl.Int32(),
        "cells": pl.Int64(),
        "k_types": pl.String(),
        "v_types": pl.String(),
        "n_tokens": pl.Int64(),
        "row_bytes": pl.UInt64(),
        "error": pl.String(),
    }
    return pl.DataFrame(rows, schema=schema)
