"""Planning a read over many states on the driver, without Ray: which records of which state each
read task takes, and which predicate each task applies to its rows.

The selections and the predicate are those of :func:`kvfast.scan`: keyword selections (one value or
a list per column) and ``filter=``, a Polars expression. What can choose whole records (dump, path,
cache, layer, model_layer, kind, k_type, v_type) is applied here, so a task is never planned for a
record no row of which is wanted; the rest (stream, cell, pos, seq_id, head, token, piece, values)
is applied by the task, to each record's index before its values are read where it can (as
``scan`` does).
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import Any

import polars as pl

from kvfast.dataset import states as dataset
from kvfast.errors import SelectionError
from kvfast.read.state import State

#: The keyword selections: the columns ``scan`` pushes down.
SELECTIONS = ("dump", "cache", "layer", "model_layer", "kind", "head", "seq_id")

Record = tuple[int, int, str]

#: The fewest value bytes a read task takes by default (a state's records, when it has fewer):
#: Ray's default parallelism (200 tasks or more) cuts small states into tasks whose scheduling
#: costs more than their work.
TASK_BYTES = 64 << 20


def where(path: str) -> str:
    """A path as the workers must be given it: absolute (their working directory is not the
    driver's); a URL as it is."""
    return path if "://" in path else os.path.abspath(path)


@dataclass(frozen=True)
class Selection:
    """The predicate of a read, split by where it is applied."""

    #: Chooses whole records (only record columns): applied when planning.
    records: pl.Expr | None = None
    #: Applied to the rows of each record a task reads (index columns, values, or a mix).
    rows: pl.Expr | None = None
    #: Whether `rows` needs no value column (each record's index is filtered before its values).
    index_only: bool = False

    def narrowed(self, expr: pl.Expr) -> Selection:
        """This selection and `expr` (a predicate pushed later: Ray's filter)."""
        if set(expr.meta.root_names()) <= dataset.RECORD_COLS:
            return replace(self, records=_all([e for e in (self.records, expr) if e is not None]))
        rows = _all([e for e in (self.rows, expr) if e is not None])
        assert rows is not None
        return replace(self, rows=rows, index_only=set(rows.meta.root_names()) <= dataset.INDEX_COLS)

    @property
    def whole(self) -> pl.Expr | None:
        """Both parts as one predicate."""
        return _all([p for p in (self.records, self.rows) if p is not None])


def _values(name: str, value: Any) -> list[Any]:
    items = list(value) if isinstance(value, Iterable) and not isinstance(value, str) else [value]
    text = name in ("dump", "kind")
    for v in items:
        if not (isinstance(v, str) if text else isinstance(v, numbers.Integral) and not isinstance(v, bool)):
            raise SelectionError(f"{name}= takes {'str' if text else 'int'} values, not {v!r}")
    return [v if text else int(v) for v in items]


def selection(filter: pl.Expr | None, chosen: dict[str, Any]) -> Selection:
    """The keyword selections (None: all) and `filter` as one :class:`Selection`."""
    record: list[pl.Expr] = []
    rows: list[pl.Expr] = []
    for name, value in chosen.items():
        if value is None:
            continue
        expr = pl.col(name).is_in(_values(name, value))
        (record if name in dataset.RECORD_COLS else rows).append(expr)
    if filter is not None:
        roots = set(filter.meta.root_names())
        (record if roots <= dataset.RECORD_COLS else rows).append(filter)
    row_expr = _all(rows)
    index_only = row_expr is not None and set(row_expr.meta.root_names()) <= dataset.INDEX_COLS
    return Selection(_all(record), row_expr, index_only)


def _all(exprs: list[pl.Expr]) -> pl.Expr | None:
    """The conjunction of `exprs` (None: no condition)."""
    return reduce(lambda a, b: a & b, exprs) if exprs else None


@dataclass
class Task:
    """One read task: some records of one state (all of them of one layer group for statistics)."""

    path: str
    records: list[Record]
    nbytes: int
    layers: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)


#: The columns of a plan's records.
_RECORD_KEYS = ("dump", "path", "cache", "layer", "model_layer", "kind", "k_type", "v_type")


def _record_table(at: str, d: State) -> pl.DataFrame:
    """The state's records (K and V) with their value bytes, and ``_at``, the path its tasks open."""
    recs = dataset.records(d)
    if "nbytes" not in recs.columns:
        keys = recs.select("cache", "layer", "kind").iter_rows()
        recs = recs.with_columns(nbytes=pl.Series([dataset.record_bytes(d, *k) for k in keys]))
    return recs.select(*_RECORD_KEYS, pl.col("nbytes").cast(pl.Int64), _at=pl.lit(at, pl.String()))


def _chunks(items: Sequence[tuple[Any, int]], target: int) -> list[list[tuple[Any, int]]]:
    """Consecutive runs of `items` of about `target` bytes each (at least one item each)."""
    out: list[list[tuple[Any, int]]] = []
    run: list[tuple[Any, int]] = []
    size = 0
    for item in items:
        run.append(item)
        size += item[1]
        if size >= target:
            out.append(run)
            run, size = [], 0
    if run:
        out.append(run)
    return out


@dataclass(frozen=True)
class Plan:
    """The records a read wants, of every state, with their bytes: a table, no open state (it
    pickles and holds no map), narrowed by record predicates pushed later (Ray's filters)."""

    records: pl.DataFrame
    stats: bool
    #: The fewest value bytes a task takes (a state's records, when it has fewer).
    task_bytes: int = TASK_BYTES

    def narrowed(self, expr: pl.Expr) -> Plan:
        return replace(self, records=self.records.filter(expr))

    def tasks(self, parallelism: int) -> list[Task]:
        """Tasks of about equal bytes (the selected bytes over `parallelism`, at least
        `task_bytes`), never across states: groups of records, or for statistics groups of layers
        with every selected kind of the state (``State.stats`` takes layers x kinds; the task
        filters its rows by the whole predicate)."""
        total = int(self.records["nbytes"].sum())
        target = max(1, self.task_bytes, total // max(1, parallelism))
        out = []
        for (at,), group in self.records.group_by("_at", maintain_order=True):
            if self.stats:
                kinds = sorted(set(group["kind"].to_list()))
                layers = group.group_by("layer").agg(pl.col("nbytes").sum()).sort("layer")
                for run in _chunks(list(layers.iter_rows()), target):
                    nbytes = sum(n for _, n in run)
                    out.append(Task(str(at), [], nbytes, layers=[ly for ly, _ in run], kinds=kinds))
            else:
                cols = group.select("cache", "layer", "kind", "nbytes").iter_rows()
                for run in _chunks([((c, ly, k), n) for c, ly, k, n in cols], target):
                    out.append(Task(str(at), [r for r, _ in run], sum(n for _, n in run)))
        return out


def plan(states: list[tuple[str, State]], sel: Selection, stats: bool, task_bytes: int = TASK_BYTES) -> Plan:
    """The plan of a read of values (``stats`` False) or statistics over `states`."""
    recs = pl.concat([_record_table(at, d) for at, d in states])
    if sel.records is not None:
        recs = recs.filter(sel.records)
    return Plan(recs, stats, task_bytes)
