"""Export many states to partitioned Parquet: streaming, parallel, resumable, atomic per state.

Layout: one folder per state (named by its id, :func:`kvfast.dataset.dump_id`), then the partitions::

    OUT/<state>-<hash>/layer-3.parquet      one file per partition of the state
    OUT/<state>-<hash>/_kvfast.json         its marker: source size, mtime, options, value types
    OUT/<state>-<hash>/_recurrent/kind-s.parq   a recurrent part's values (export_recurrent)

Every file holds every column, the partition keys (``layer``, ``cache``, ``kind``) included, with
the types of :data:`kvfast.dataset.INDEX_SCHEMA`, so any engine reads the same table from a glob
(``OUT/**/*.parquet``) with no hive partitioning to infer; ``hive=True`` names the partitions
``layer=3/`` folders instead (the columns stay in the files too). A state's folder is written in
full out of sight and published in one rename (see :mod:`kvfast.dataset.export_commit`), which is why the
state comes before the partitions: a partition folder holds many states and cannot appear in one
step. So a reader sees every state whole, with its marker, or not at all, even after a SIGKILL;
leftovers of a killed run are removed by the next run into OUT.

Each partition is written one record group at a time, so memory stays bounded by one partition of
one state per worker, whatever the number and size of the states. A state whose marker matches its
source and the options is skipped on the next run; any other is exported again and replaces the
earlier export whole (no file of an earlier layer count stays); a state that fails takes its earlier
export away. Inputs are deduplicated by real path; several processes may export into one OUT at once.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from kvfast.dataset import export_parquet, export_recurrent
from kvfast.dataset.export_commit import MARKER, Commit
from kvfast.dataset.export_progress import Progress
from kvfast.dataset.export_types import one_type
from kvfast.dataset.states import (
    INDEX_SCHEMA,
    Paths,
    dump_id,
    expand,
    records,
    stats_frame,
)
from kvfast.errors import ExportError, KvfastWarning, PreRopeError, holding, say
from kvfast.model.geometry import ModelGeometry
from kvfast.model.rotation import Mode
from kvfast.read import remote
from kvfast.read.opening import Models, Opening
from kvfast.read.state import State


@dataclass(frozen=True)
class _Options:
    out: Path
    what: str
    by: str
    partition_by: tuple[str, ...]
    #: How each state is opened (on the workers too: it is picklable).
    opening: Opening
    #: The models' geometries by the model each state opens with, read once: what the markers
    #: record of the model.
    geometries: dict[str, ModelGeometry | None]
    dtype: str | None
    hive: bool = False

    def signature(self, real: str) -> dict[str, Any]:
        """The options the state at `real` is exported with (its model's, where states have several)."""
        geometry = self.geometries.get(repr(self.opening.model_for(real)))
        return {
            "what": self.what,
            "by": self.by,
            "partition_by": list(self.partition_by),
            "head_dim": self.opening.head_dim,
            "model": None if geometry is None else repr(geometry),
            "dtype": self.dtype,
            "rotation": self.opening.rotation,
            "layout": "hive" if self.hive else "files",
            **({"pre_rope": True} if self.opening.pre_rope else {}),
            # the value table's columns: a state exported before a column was added is stale
            **({"columns": list(INDEX_SCHEMA)} if self.what == "values" else {}),
        }

    def dest(self, staged: Path, key: str, part: dict[str, Any]) -> Path:
        """Where a partition's file goes in the state's staged folder: ``layer-3.parquet``
        (``cache-0.layer-3.kind-k.parquet``, ``all.parquet`` unpartitioned), or with ``hive``
        ``layer=3/<key>.parquet``."""
        if self.hive:
            return staged.joinpath(*[f"{k}={v}" for k, v in part.items()]) / f"{key}.parquet"
        name = ".".join(f"{k}-{v}" for k, v in part.items()) or "all"
        return staged / f"{name}.parquet"


def _unique(files: list[str]) -> dict[str, str]:
    """Each state once, as given first, keyed to its real path (a directory and files in it, a
    symbolic link and its target, the same path twice: one state)."""
    seen: dict[str, str] = {}
    for f in files:
        seen.setdefault(remote.real(f), f)
    return {f: real for real, f in seen.items()}


def _check_layout(out: Path) -> None:
    """Refuse a folder holding Parquet or partition folders at its top (another tool's dataset, or
    kvfast's layout before states had their own folder): exporting into it would mix layouts."""
    if not out.is_dir():
        return
    foreign = sorted(p.name for p in out.iterdir() if "=" in p.name or p.suffix == ".parquet")
    if foreign:
        raise ExportError(
            f"{out} holds {', '.join(foreign[:3])} at its top, not kvfast's layout (a folder per state):"
            " export to a new folder (or delete it)",
            _report([]),
        )


def _key(real: str) -> str:
    """The state's directory name: its id (the ``dump`` column)."""
    return dump_id(real)


def _source_id(real: str, storage_options: remote.StorageOptions) -> dict[str, Any]:
    if remote.is_url(real):
        return {"path": real, **remote.info(real, storage_options)}
    st = os.stat(real)
    return {"path": real, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _done(commit: Commit, key: str, source: dict[str, Any], signature: dict[str, Any]) -> bool:
    try:
        saved = json.loads((commit.published(key) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    # a state exported before its recurrent values left the value table's globs: done again
    old = (commit.published(key) / export_recurrent.OLD_FOLDER).exists()
    return bool(saved.get("source") == source and saved.get("options") == signature) and not old


def _write(frames: Iterator[pl.DataFrame], dest: Path) -> tuple[int, str | None]:
    """Write the frames, one row group (or more) each, to `dest` (in a staging directory); only one
    frame is in memory at a time. Returns the rows written and the type of the values' numbers
    (None for statistics); no file when there is no frame."""
    rows = 0
    values: str | None = None
    import pyarrow.parquet as pq  # here, not at import: `import kvfast` leaves Parquet out

    writer: pq.ParquetWriter | None = None
    try:
        for df in frames:
            table: pa.Table = df.to_arrow()
            if writer is None:
                # dictionary-encode the index columns only: trying it on the values is slow and useless
                dictionary = [c for c in table.column_names if c in INDEX_SCHEMA]
                dest.parent.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(
                    dest, table.schema, compression="zstd", compression_level=1, use_dictionary=dictionary
                )
                inner = getattr(df.schema.get("values"), "inner", None)
                if inner is not None:
                    values = "float16" if inner == pl.Float16 else "float32"
            writer.write_table(table)
            rows += df.height
    finally:
        if writer is not None:
            writer.close()
    return rows, values


def _partitions(opts: _Options, d: State) -> list[tuple[dict[str, Any], pl.DataFrame]]:
    """The record groups of one state, keyed by partition values (``cache``/``layer``/``kind``);
    statistics of the recurrent part too (its values have files of their own: export_recurrent)."""
    recs = records(d)
    if opts.what != "values" and d.recurrent is not None:
        recs = pl.concat([recs, export_recurrent.records(d)])
    keys = list(opts.partition_by)
    if keys == ["auto"]:
        keys = auto_partition(recs)
    if not keys:
        return [({}, recs)]
    return [
        (dict(zip(keys, vals, strict=True)), group)
        for vals, group in recs.group_by(keys, maintain_order=True)
    ]


def auto_partition(recs: pl.DataFrame) -> list[str]:
    """The default partition of a state's records: a file per layer; for a state of several
    attention caches (iSWA: each numbers its layers from 0, so ``layer-0`` would mix model layers 0
    and 5), a file per model layer where the model's map is known, else per cache and layer; where a
    model layer is in two caches (a DSA or MSA indexer cache beside the main one, of other head
    sizes), a file per cache, layer and kind."""
    attention = recs.filter(pl.col("kind").is_in(["k", "v"]))
    if attention["cache"].n_unique() <= 1:
        return ["layer"]
    if attention["model_layer"].null_count() > 0:
        return ["cache", "layer"]
    shared = attention.group_by("model_layer").agg(pl.col("cache").n_unique()).filter(pl.col("cache") > 1)
    return ["cache", "layer", "kind"] if shared.height else ["model_layer"]


def _stats_frames(
    opts: _Options, d: State, part: dict[str, Any], recs: pl.DataFrame
) -> Iterator[pl.DataFrame]:
    """The statistics of one partition of one state, with every column (the partition keys too:
    readers need not parse folder names); values go through :mod:`kvfast.dataset.export_parquet`."""
    layers = sorted(set(recs["layer"].to_list()))
    kinds = sorted(set(recs["kind"].to_list()))
    df = stats_frame(d, opts.by, layers, kinds)
    for k, v in part.items():
        df = df.filter(pl.col(k) == v)
    yield df


def export_one(opts: _Options, commit: Commit, progress: Progress, path: str, real: str) -> dict[str, Any]:
    """Stage the state's files and marker, then publish them in one step; on failure, take any
    earlier export of the state away too (a failed state leaves nothing behind)."""
    key = _key(real)
    row: dict[str, Any] = {
        "path": path,
        "dump": key,
        "status": "skipped",
        "rows": 0,
        "files": 0,
        "error": None,
    }
    staged: Path | None = None
    size = 0
    read = 0

    def advance(n: int) -> None:
        nonlocal read
        n = min(n, size - read)
        read += n
        progress.advance(n)

    try:
        # the source as it was before reading: a change during the export makes the marker stale
        source = _source_id(real, opts.opening.storage_options)
        size = source["size"]
        signature = opts.signature(path)
        if _done(commit, key, source, signature):
            return row
        staged = commit.stage(key)
        types: set[str] = set()
        with opts.opening.open(path) as d:
            plan = d._live().value_plan()
            width = None if plan is None or len(plan[1]) != 1 else plan[1][0]  # the values' width
            parts = [(opts.dest(staged, key, part), part, recs) for part, recs in _partitions(opts, d)]
            if opts.what == "values":  # in Rust, the partitions in parallel (kvfast.dataset.export_parquet)
                written = export_parquet.write_values(d, [(p[0], p[2]) for p in parts], opts.dtype, advance)
            else:
                written = [_write(_stats_frames(opts, d, part, recs), dest) for dest, part, recs in parts]
            for (dest, _, _), (n, values) in zip(parts, written, strict=True):
                row["files"] += dest.exists()
                row["rows"] += n
                types |= {values} if values else set()
            if opts.what == "values":
                n, files = export_recurrent.write_values(d, staged, opts.dtype, advance)
                row["rows"] += n
                row["files"] += files
        marker = {
            "source": source,
            "options": signature,
            "rows": row["rows"],
            "files": row["files"],
            "values": sorted(types),
            "head_dim": width,
        }
        (staged / MARKER).write_text(json.dumps(marker))
        commit.publish(staged, key)
        row["status"] = "written"
    except Exception as e:  # noqa: BLE001 - every failure is reported; nothing partial stays
        row.update(status="failed", rows=0, files=0, error=f"{type(e).__name__}: {e}")
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
        try:
            commit.retire(key)
        except OSError as gone:
            row["error"] += f" (and its earlier export could not be removed: {gone})"
    finally:
        advance(size - read)
        progress.state_done()
    return row


def _report(rows: list[dict[str, Any]]) -> pl.DataFrame:
    schema = {
        "path": pl.String(),
        "dump": pl.String(),
        "status": pl.String(),
        "rows": pl.Int64(),
        "files": pl.Int64(),
    }
    return pl.DataFrame(rows, schema={**schema, "error": pl.String()})


class Outcomes:
    """The report rows of one export as its states finish, in any order; the first state that
    failed under ``on_error="fail"`` stops new states from starting."""

    def __init__(self, files: dict[str, str], on_error: str) -> None:
        self.order = {f: i for i, f in enumerate(files)}
        self.on_error = on_error
        self.rows: list[dict[str, Any]] = []
        self.failed: dict[str, Any] | None = None

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if row["status"] == "failed" and self.on_error == "fail" and self.failed is None:
            self.failed = row

    def report(self) -> pl.DataFrame:
        """The report in the order the states were given; raises :class:`ExportError` carrying it
        when a state failed under ``on_error="fail"``."""
        report = _report(sorted(self.rows, key=lambda r: self.order[r["path"]]))
        if self.failed is not None:
            raise ExportError(f"{self.failed['path']}: {self.failed['error']}", report)
        return report


def source_size(path: str, storage_options: remote.StorageOptions = None) -> int:
    """A state's size in bytes (local or remote), 0 when it cannot be read."""
    try:
        return remote.info(path, storage_options)["size"] if remote.is_url(path) else os.stat(path).st_size
    except OSError:
        return 0


def plan_export(
    paths: Paths,
    out: Path,
    what: str,
    partition_by: Sequence[str],
    head_dim: int | None,
    model: Models,
    on_error: str,
    by: str,
    dtype: str | None,
    rotation: Mode,
    hive: bool,
    pre_rope: bool,
    storage_options: remote.StorageOptions = None,
) -> tuple[dict[str, str], _Options]:
    """An export's arguments checked, its states (given name -> real path, each once) and its
    options, the values' type decided: what :func:`export` and ``kvfast.ray.export`` share."""
    if what not in ("values", "stats"):
        raise ValueError(f"what must be 'values' or 'stats', not {what!r}")
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', not {on_error!r}")
    if dtype not in (None, "float32", "native"):
        raise ValueError(f"dtype must be None, 'float32' or 'native', not {dtype!r}")
    if tuple(partition_by) != ("auto",):
        bad = set(partition_by) - {"cache", "layer", "model_layer", "kind"}
        if bad:
            raise ValueError(
                f"partition_by takes 'auto', or cache, layer, model_layer and kind, not {sorted(bad)}"
            )
    files = _unique(expand(paths, storage_options))
    opening = Opening(head_dim, model, rotation, pre_rope, storage_options)
    models = {repr(opening.model_for(given)): given for given in files}
    geometries = {m: opening.geometry(given) for m, given in models.items()}
    _check_layout(out)
    if pre_rope:
        _refuse_early(opening, next(iter(files)))
        dtype = "float32" if what == "values" and dtype is None else dtype
    if what == "values" and dtype is None:
        dtype = one_type(files, out, opening)
    opts = _Options(out, what, by, tuple(partition_by), opening, geometries, dtype, hive)
    return files, opts


def _refuse_early(opening: Opening, first: str) -> None:
    """Raise the :class:`PreRopeError` of opening the first state, before any state is exported:
    keys before RoPE come from the model's GGUF, the same for every state, so when the first
    cannot have them (no GGUF given, a rope the state does not fit) none can. Any other failure
    is that state's own, reported with it."""
    try:
        opening.open(first).close()
    except PreRopeError:
        raise
    except Exception:  # noqa: BLE001, S110 - the state's export reports it
        pass


def export(
    paths: Paths,
    out_dir: str | os.PathLike[str],
    what: str = "values",
    partition_by: Sequence[str] = ("auto",),
    jobs: int | None = None,
    head_dim: int | None = None,
    model: Models = None,
    on_error: str = "fail",
    by: str = "cell",
    dtype: str | None = None,
    rotation: Mode = "auto",
    hive: bool = False,
    progress: bool | None = None,
    pre_rope: bool = False,
    storage_options: remote.StorageOptions = None,
) -> pl.DataFrame:
    """Write every state's value table (or statistics, ``what="stats"``, ``by=...``) as Parquet
    under ``out_dir``, one folder per state, one file per partition; returns the report: one row
    per state with its path, its id (``dump``, its folder's name), status ('written', 'skipped'
    when already exported and unchanged, 'failed'), rows, files and error.

    Every file holds every column, partition keys included. ``partition_by=("auto",)`` (default):
    a file per layer (``layer-3.parquet``), and for a state of several caches (iSWA) a file per
    model layer where the model's layer map is known (``model_layer-5.parquet``), else per cache
    and layer (``cache-1.layer-0.parquet``);
    or name the keys (cache, layer, model_layer, kind; ``()``: one ``all.parquet``). ``hive=True``
    puts each partition in a ``key=value`` folder (``model_layer=3/``) instead of naming the file
    after it.

    The values' type: ``dtype=None`` (default) one type for the whole of OUT, so that every engine
    reads one schema: float16 (Parquet's FLOAT16) when every state is f16, else float32 (a warning
    says so when OUT already holds float16 states); ``"float32"``: float32 everywhere;
    ``"native"``: each file its own (float16 where all its records are f16, else float32), the
    smallest, read with :func:`kvfast.scan_export` or :func:`kvfast.export_schema`.
    ``progress``: a bar of bytes read on stderr (None: when stderr is a terminal).

    ``on_error="skip"`` reports a failing state and goes on; ``"fail"`` starts no new state once
    one has failed, lets those already started finish, and raises :class:`ExportError` carrying the
    report. Either way a failed state leaves nothing behind, not even an earlier export of it.
    Inputs naming one file twice (by real path) are exported once, reported under the first name.
    Values and statistics are in the basis ``rotation`` chooses (see :func:`kvfast.open`);
    ``pre_rope=True`` (``model`` a GGUF file) writes keys before RoPE, as float32.
    States may be URLs (``s3://bucket/prefix/``: see :mod:`kvfast.read.remote`, ``storage_options``),
    read by ranged requests; ``out_dir`` is a local folder. A remote state's marker records its
    size, ETag and modification time.
    """
    files, opts = plan_export(
        paths,
        Path(out_dir),
        what,
        partition_by,
        head_dim,
        model,
        on_error,
        by,
        dtype,
        rotation,
        hive,
        pre_rope,
        storage_options,
    )
    outcomes = Outcomes(files, on_error)
    sizes = (source_size(real, opts.opening.storage_options) for real in files.values())
    bar = Progress(sum(sizes), len(files), progress)
    n_jobs = max(1, jobs or os.cpu_count() or 1)
    todo = iter(files.items())
    with Commit(opts.out) as commit, ThreadPoolExecutor(max_workers=n_jobs) as pool:
        running: set[Future[tuple[dict[str, Any], list[KvfastWarning]]]] = set()
        while True:
            # no new state is started once one has failed with on_error="fail"
            while (
                outcomes.failed is None and len(running) < n_jobs and (item := next(todo, None)) is not None
            ):
                running.add(pool.submit(holding, export_one, opts, commit, bar, *item))
            if not running:
                break
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                row, kept = fut.result()
                for w in kept:
                    say(w)
                outcomes.add(row)
    bar.close()
    return outcomes.report()
