"""kvfast on a Ray cluster (``pip install 'kvfast[ray]'``): the long table, statistics and export of
many states, with the work on the workers, where the bytes are.

- :func:`read_states`: a ``ray.data.Dataset`` of :func:`kvfast.scan`'s table (same columns and
  types, f16 kept as Arrow ``halffloat``), read by tasks of (state, group of records).
- :func:`stats`: a Dataset of :func:`kvfast.scan_stats`'s rows, computed by the Rust kernels on the
  workers; :func:`to_polars` collects any of them.
- :func:`export`: :func:`kvfast.export`, one Ray task per state.

Every path must be readable by every worker (a shared file system, or what ``kvfast.open`` reads).
Rows come in no set order across tasks: sort them for a stable one.
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa
import ray
import ray.data

from kvfast.dataset import states as dataset
from kvfast.model.rotation import Mode
from kvfast.ray import plan
from kvfast.ray.exporting import export
from kvfast.ray.source import StatesSource, Work
from kvfast.read.opening import Models, Opening
from kvfast.read.state import State

__all__ = ["export", "read_states", "stats", "to_polars"]


def _open(paths: dataset.Paths, how: Opening) -> list[tuple[str, State]]:
    return dataset.open_all([plan.where(p) for p in dataset.expand(paths, how.storage_options)], how)


def read_states(
    paths: dataset.Paths,
    head_dim: int | None = None,
    model: Models = None,
    columns: list[str] | None = None,
    filter: pl.Expr | None = None,
    *,
    dump: Any = None,
    cache: Any = None,
    layer: Any = None,
    model_layer: Any = None,
    kind: Any = None,
    head: Any = None,
    seq_id: Any = None,
    rotation: Mode = "auto",
    pre_rope: bool = False,
    task_bytes: int = plan.TASK_BYTES,
    **read_args: Any,
) -> ray.data.Dataset:
    """:func:`kvfast.scan`'s table of every state as a Ray Dataset.

    ``filter`` is a Polars expression over its columns, as in ``scan``; each keyword selection
    (``layer=1``, ``kind="k"``, ``head=[0, 1]``, ``seq_id``, ``dump``...) keeps rows whose column
    is one of the values. Both are pushed down as ``scan`` pushes its predicate: on dump / cache /
    layer / model_layer / kind / k_type / v_type no task is planned for another record (one layer of a thousand
    states reads that layer's bytes only); on the index columns a record's index is filtered before
    its values are read. ``columns`` chooses the columns (``Dataset.select_columns`` is pushed down
    too). A task takes at least ``task_bytes`` of values (64 MiB; a whole state when it holds
    fewer), more when Ray asks for fewer tasks. ``read_args`` go to ``ray.data.read_datasource``
    (``override_num_blocks``, ``concurrency``, ``ray_remote_args``...).
    """
    how = Opening(head_dim, model, rotation, pre_rope)
    sel = plan.selection(filter, _chosen(locals()))
    states = _open(paths, how)
    values_type, dtype = dataset.values_schema([d for _, d in states])
    schema = {**dataset.INDEX_SCHEMA, "values": values_type}
    _check_columns(columns, schema)
    planned = plan.plan(states, sel, False, task_bytes)
    _close(states)
    source = StatesSource(
        planned,
        Work(how, sel, "values", dtype),
        schema,
        columns,
        f"kvfast({len(states)} states)",
    )
    return _read(source, planned, read_args)


def stats(
    paths: dataset.Paths,
    by: str = "cell",
    head_dim: int | None = None,
    model: Models = None,
    filter: pl.Expr | None = None,
    *,
    dump: Any = None,
    cache: Any = None,
    layer: Any = None,
    model_layer: Any = None,
    kind: Any = None,
    head: Any = None,
    seq_id: Any = None,
    rotation: Mode = "auto",
    pre_rope: bool = False,
    task_bytes: int = plan.TASK_BYTES,
    **read_args: Any,
) -> ray.data.Dataset:
    """:func:`kvfast.scan_stats`'s rows (``State.stats(by=...)`` of every state, with ``dump`` and
    ``path``) as a Ray Dataset, computed on the workers by tasks of (state, group of layers);
    ``to_polars(stats(...))`` is ``scan_stats(...).collect()`` up to row order. ``filter`` and the
    keyword selections as in :func:`read_states` (``head`` and ``seq_id`` only where ``by`` has
    those columns)."""
    if by not in dataset.STATS_SCHEMAS:
        raise ValueError(f"by must be one of {sorted(dataset.STATS_SCHEMAS)}, not {by!r}")
    how = Opening(head_dim, model, rotation, pre_rope)
    sel = plan.selection(filter, _chosen(locals()))
    states = _open(paths, how)
    schema = {"dump": pl.String(), "path": pl.String(), **dataset.STATS_SCHEMAS[by]}
    planned = plan.plan(states, sel, True, task_bytes)
    _close(states)
    source = StatesSource(
        planned,
        Work(how, sel, by, None),
        schema,
        None,
        f"kvfast_stats({len(states)} states)",
    )
    return _read(source, planned, read_args)


def to_polars(ds: ray.data.Dataset) -> pl.DataFrame:
    """Every block of the Dataset, gathered on the driver as one Polars frame (Arrow types kept)."""
    tables = ray.get(ds.to_arrow_refs())
    return pl.DataFrame(pa.concat_tables(tables) if tables else None)


def _read(source: StatesSource, planned: plan.Plan, read_args: dict[str, Any]) -> ray.data.Dataset:
    """The Dataset of the source. Unless told otherwise, as many blocks as the plan has tasks of
    ``task_bytes``: Ray's default (200 blocks or more) splits their blocks and schedules a task
    per piece, whose cost passes the work's on small states."""
    read_args.setdefault("override_num_blocks", max(1, len(planned.tasks(1 << 40))))
    ds: ray.data.Dataset = ray.data.read_datasource(source, **read_args)
    return ds


def _close(states: list[tuple[str, State]]) -> None:
    for _, d in states:
        d.close()


def _chosen(args: dict[str, Any]) -> dict[str, Any]:
    return {k: args[k] for k in plan.SELECTIONS}


def _check_columns(columns: list[str] | None, schema: dict[str, pl.DataType]) -> None:
    unknown = sorted(set(columns or []) - set(schema))
    if unknown:
        raise ValueError(f"no columns {unknown}: the table has {list(schema)}")
