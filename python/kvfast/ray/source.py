"""The Ray Data source of kvfast: read tasks of (state, group of records), run on the workers.

The driver opens every state once (metadata only) to plan: the values' type and head size over all
states (as :func:`kvfast.scan` decides them), the records the selection wants, and tasks of about
equal bytes, none across two states. Each task opens its state where it runs and yields one Arrow
block per record (values f16 as Arrow ``halffloat`` when every state is f16, as in ``scan``), or
for statistics one block of ``State.stats`` over its layers, computed by the Rust kernels there.
Column pruning (``Dataset.select_columns``) is pushed into the tasks: without ``values`` no value
byte is read; so are Ray's filters (``Dataset.filter(expr=...)``) that Polars can say
(:mod:`kvfast.ray.ray_expr`), as ``filter=`` is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import polars as pl
import pyarrow as pa
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from kvfast.dataset import states as dataset
from kvfast.ray.plan import Plan, Selection, Task
from kvfast.ray.ray_expr import to_polars
from kvfast.read.opening import Opening


def arrow_schema(schema: dict[str, pl.DataType]) -> pa.Schema:
    """The Arrow schema of the blocks of a Polars schema (as ``DataFrame.to_arrow`` gives it)."""
    return pl.DataFrame(schema=schema).to_arrow().schema


@dataclass(frozen=True)
class Work:
    """What every task of one read does with its records (sent to the workers)."""

    how: Opening
    sel: Selection
    #: "values", or the statistics' ``by``.
    what: str
    #: The decoding of values (None: f16 kept; "float32") over every state.
    dtype: str | None

    def run(self, task: Task, wanted: list[str]) -> Iterator[pa.Table]:
        # no column wanted (Ray's count): blocks of the dump column alone, so that the rows count
        # (Arrow's tables of no column lose their rows when concatenated)
        cols = wanted or ["dump"]
        with self.how.open(task.path) as d:  # blocks already made stay valid after close
            frames = self._values(d, task, cols) if self.what == "values" else self._stats(d, task, cols)
            for df in frames:
                if df.height:
                    yield df.to_arrow()

    def _values(self, d: Any, task: Task, wanted: list[str]) -> Iterator[pl.DataFrame]:
        """As ``scan`` reads a record: its index filtered first where the predicate allows it."""
        rows = self.sel.rows
        need_values = "values" in wanted or (rows is not None and "values" in rows.meta.root_names())
        for cache, layer, kind in task.records:
            if rows is not None and self.sel.index_only:
                index = dataset.record_frame(d, cache, layer, kind, self.dtype, values=False).filter(rows)
                if index.is_empty():
                    continue
                if not need_values:
                    yield index.select(wanted)
                    continue
            df = dataset.record_frame(d, cache, layer, kind, self.dtype, values=need_values)
            yield (df if rows is None else df.filter(rows)).select(wanted)

    def _stats(self, d: Any, task: Task, wanted: list[str]) -> Iterator[pl.DataFrame]:
        df = dataset.stats_frame(d, self.what, task.layers, task.kinds)
        whole = self.sel.whole
        yield (df if whole is None else df.filter(whole)).select(wanted)


class StatesSource(Datasource):
    """A Ray Data source over a plan (:mod:`kvfast.ray.plan`); picklable (it holds no open state)."""

    def __init__(
        self,
        plan: Plan,
        work: Work,
        schema: dict[str, pl.DataType],
        columns: list[str] | None,
        name: str,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.plan_export = plan
        self._work = work
        self._schema = schema
        self._columns = list(schema) if columns is None else columns
        self._projection_map: dict[str, str] | None = None
        self._name = name
        self._tasks: dict[int, list[Task]] = {}

    def get_name(self) -> str:
        return self._name

    def supports_projection_pushdown(self) -> bool:
        return True

    def supports_predicate_pushdown(self) -> bool:
        return True

    def apply_predicate(self, predicate_expr: Any) -> StatesSource:
        """Ray's filter (``ds.filter(expr=...)``) pushed into the read, applied as ``filter=``;
        where it cannot be said in Polars, unchanged (Ray then filters the rows itself)."""
        expr = to_polars(predicate_expr)
        if expr is None or not set(expr.meta.root_names()) <= set(self._schema):
            return self
        clone = super().apply_predicate(predicate_expr)  # a copy, Ray's record of it kept
        assert isinstance(clone, StatesSource)
        sel = self._work.sel.narrowed(expr)
        clone._work = replace(self._work, sel=sel)
        if sel.records is not None:
            clone.plan_export = self.plan_export.narrowed(sel.records)
        clone._tasks = {}
        return clone

    def wanted(self) -> list[str]:
        """The columns the blocks hold: those asked for, less those Ray's projection prunes."""
        projected = getattr(self, "_projection_map", None)
        return [c for c in self._columns if projected is None or c in projected]

    def tasks(self, parallelism: int) -> list[Task]:
        if parallelism not in self._tasks:
            self._tasks[parallelism] = self.plan_export.tasks(parallelism)
        return self._tasks[parallelism]

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(t.nbytes for t in self.tasks(1))

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        wanted = self.wanted()
        schema = arrow_schema({c: self._schema[c] for c in wanted})
        work = self._work
        out = []
        # one task at least, so that an empty selection still has its schema
        for task in self.tasks(parallelism) or [Task("", [], 0)]:
            meta = BlockMetadata(
                num_rows=None, size_bytes=task.nbytes, exec_stats=None, input_files=(task.path,)
            )
            read = _Read(work, task, wanted, schema)
            try:
                out.append(ReadTask(read, meta, schema=schema, per_task_row_limit=per_task_row_limit))
            except TypeError:  # Ray before per_task_row_limit / schema
                out.append(ReadTask(read, meta))
        return out


@dataclass(frozen=True)
class _Read:
    """A read task's function (a picklable object: its task and columns are there to see)."""

    work: Work
    task: Task
    wanted: list[str]
    schema: pa.Schema

    def __call__(self) -> Iterator[pa.Table]:
        """The task's blocks; one empty block of the schema when no row is left."""
        empty = True
        if self.task.records or self.task.layers:
            for block in self.work.run(self.task, self.wanted):
                empty = False
                yield block
        if empty:
            yield self.schema.empty_table()
