"""Export many states to hive-partitioned Parquet: streaming, parallel, resumable and atomic.

Each state is written as one Parquet file per partition (``OUT/layer=3/<state>-<hash>.parquet``),
one record group at a time, so memory stays bounded by one partition of one state per worker,
whatever the number and size of the states. Files are written under a hidden temporary name and
renamed when complete; a state's marker (``OUT/_kvfast/<state>-<hash>.json``, recording the source's
size and modification time and the export options) is written last, so a state whose marker matches
is skipped on the next run, and one interrupted midway is redone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from kvfast.dataset import INDEX_SCHEMA, Paths, _frame, _records, _values_schema, expand, stats_frame
from kvfast.dump import Dump, open
from kvfast.errors import KvfastError
from kvfast.model import ModelGeometry

MARKERS = "_kvfast"


class ExportError(KvfastError):
    """A state failed and ``on_error='fail'``: ``.report`` holds what was done before the batch stopped."""

    kind = "export"
    offset = None
    field = None

    def __init__(self, message: str, report: pl.DataFrame) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class _Options:
    out: Path
    what: str
    by: str
    partition_by: tuple[str, ...]
    head_dim: int | None
    model: ModelGeometry | None
    dtype: str | None

    def signature(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "by": self.by,
            "partition_by": list(self.partition_by),
            "head_dim": self.head_dim,
            "model": None if self.model is None else repr(self.model),
            "dtype": self.dtype,
        }


def _key(path: str) -> str:
    p = Path(path)
    digest = hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:10]
    return f"{p.stem}-{digest}"


def _source_id(path: str) -> dict[str, Any]:
    st = os.stat(path)
    return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _marker(opts: _Options, key: str) -> Path:
    return opts.out / MARKERS / f"{key}.json"


def _done(opts: _Options, path: str, key: str) -> bool:
    m = _marker(opts, key)
    if not m.exists():
        return False
    try:
        saved = json.loads(m.read_text())
    except (OSError, ValueError):
        return False
    return bool(saved.get("source") == _source_id(path) and saved.get("options") == opts.signature())


def _write_atomic(frames: Iterator[pl.DataFrame], dest: Path) -> int:
    """Write the frames, one row group (or more) each, to a hidden temporary file, then rename it
    to `dest`; only one frame is in memory at a time. Returns the rows written."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    rows = 0
    writer: pq.ParquetWriter | None = None
    try:
        for df in frames:
            table: pa.Table = df.to_arrow()
            if writer is None:
                # dictionary-encode the index columns only: trying it on the values is slow and useless
                dictionary = [c for c in table.column_names if c in INDEX_SCHEMA]
                writer = pq.ParquetWriter(
                    tmp, table.schema, compression="zstd", compression_level=1, use_dictionary=dictionary
                )
            writer.write_table(table)
            rows += df.height
        if writer is None:
            return 0
        writer.close()
        writer = None
        os.replace(tmp, dest)
        return rows
    except BaseException:
        if writer is not None:
            writer.close()
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _partitions(opts: _Options, d: Dump) -> list[tuple[dict[str, Any], pl.DataFrame]]:
    """The record groups of one state, keyed by partition values (``cache``/``layer``/``kind``)."""
    recs = _records(d)
    keys = list(opts.partition_by)
    if not keys:
        return [({}, recs)]
    return [
        (dict(zip(keys, vals, strict=True)), group)
        for vals, group in recs.group_by(keys, maintain_order=True)
    ]


def _part_frames(opts: _Options, d: Dump, part: dict[str, Any], recs: pl.DataFrame) -> Iterator[pl.DataFrame]:
    """The frames of one partition of one state, a record (or one statistics pass) at a time,
    without the partition columns (the directory names carry them)."""
    if opts.what == "values":
        for c, ly, k in recs.select("cache", "layer", "kind").iter_rows():
            yield _frame(d, c, ly, k, opts.dtype, values=True).drop(list(part))
    else:
        layers = sorted(set(recs["layer"].to_list()))
        kinds = sorted(set(recs["kind"].to_list()))
        df = stats_frame(d, opts.by, layers, kinds)
        for k, v in part.items():
            df = df.filter(pl.col(k) == v)
        yield df.drop(list(part))


def _export_one(opts: _Options, path: str) -> dict[str, Any]:
    key = _key(path)
    row: dict[str, Any] = {"path": path, "status": "skipped", "rows": 0, "files": 0, "error": None}
    if _done(opts, path, key):
        return row
    written: list[Path] = []
    try:
        with open(path, head_dim=opts.head_dim, model=opts.model) as d:
            for part, recs in _partitions(opts, d):
                dest = opts.out.joinpath(*[f"{k}={v}" for k, v in part.items()]) / f"{key}.parquet"
                n = _write_atomic(_part_frames(opts, d, part, recs), dest)
                if n:
                    written.append(dest)
                row["rows"] += n
        m = _marker(opts, key)
        m.parent.mkdir(parents=True, exist_ok=True)
        tmp = m.with_name(f".{m.name}.tmp-{os.getpid()}")
        tmp.write_text(
            json.dumps({"source": _source_id(path), "options": opts.signature(), "rows": row["rows"]})
        )
        os.replace(tmp, m)
        row.update(status="written", files=len(written))
    except Exception as e:  # noqa: BLE001 - every failure is reported; nothing partial stays
        for f in written:
            with contextlib.suppress(OSError):
                f.unlink()
        row.update(status="failed", rows=0, files=0, error=f"{type(e).__name__}: {e}")
    return row


def _progress(total: int) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    # disable=None: silent when stderr is not a terminal
    return tqdm(total=total, unit="state", desc="kvfast export", disable=None, file=sys.stderr)


def _try_open(path: str, head_dim: int | None, model: ModelGeometry | None) -> Dump | None:
    """The dump, or None when it fails to open (the export reports it)."""
    try:
        return open(path, head_dim=head_dim, model=model)
    except (KvfastError, OSError, ValueError):
        return None


def export(
    paths: Paths,
    out_dir: str | os.PathLike[str],
    what: str = "values",
    partition_by: Sequence[str] = ("layer",),
    jobs: int | None = None,
    head_dim: int | None = None,
    model: str | os.PathLike[str] | ModelGeometry | None = None,
    on_error: str = "fail",
    by: str = "cell",
    dtype: str | None = None,
) -> pl.DataFrame:
    """Write every state's value table (or statistics, ``what="stats"``, ``by=...``) as
    hive-partitioned Parquet under ``out_dir``; returns the report: one row per state with its
    status ('written', 'skipped' when already exported and unchanged, 'failed'), rows, files and
    error. f16 values stay f16 (Parquet's Float16 logical type) unless ``dtype="float32"``.

    ``on_error="skip"`` reports a failing state and goes on; ``"fail"`` stops the batch and raises
    :class:`ExportError` carrying the report. Either way no partial file of a failed state is left.
    """
    if what not in ("values", "stats"):
        raise ValueError(f"what must be 'values' or 'stats', not {what!r}")
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', not {on_error!r}")
    bad = set(partition_by) - {"cache", "layer", "kind"}
    if bad:
        raise ValueError(f"partition_by takes cache, layer and kind, not {sorted(bad)}")
    files = expand(paths)
    geometry = model if model is None or isinstance(model, ModelGeometry) else ModelGeometry.from_gguf(model)
    if what == "values" and dtype is None:
        # one values type for the whole dataset: f16 when every state is f16
        dumps = [d for d in (_try_open(f, head_dim, geometry) for f in files) if d is not None]
        dtype = _values_schema(dumps)[1] if dumps else None
        for dd in dumps:
            dd.close()
    opts = _Options(Path(out_dir), what, by, tuple(partition_by), head_dim, geometry, dtype)
    opts.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    bar = _progress(len(files))
    failed: dict[str, Any] | None = None
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        pending = {pool.submit(_export_one, opts, f) for f in files}
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for fut in done:
                row = fut.result()
                rows.append(row)
                if bar is not None:
                    bar.update(1)
                if row["status"] == "failed" and on_error == "fail" and failed is None:
                    failed = row
                    for p in pending:
                        p.cancel()
            if failed is not None:
                wait(pending)
                rows.extend(f.result() for f in pending if not f.cancelled())
                break
    if bar is not None:
        bar.close()
    order = {f: i for i, f in enumerate(files)}
    report = pl.DataFrame(
        sorted(rows, key=lambda r: order[r["path"]]),
        schema={
            "path": pl.String(),
            "status": pl.String(),
            "rows": pl.Int64(),
            "files": pl.Int64(),
            "error": pl.String(),
        },
    )
    if failed is not None:
        raise ExportError(f"{failed['path']}: {failed['error']}", report)
    return report
