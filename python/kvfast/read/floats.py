"""Float16 without its traps.

f16 caches give ``Array(Float16, n)`` values, and Polars computes in the type it is given: a sum of
squares of f16 values overflows to inf past 65504 (a key of absmax 256 already does it), and sums
round to 11 bits. :func:`upcast` casts every Float16 of a frame (inside arrays and lists too) to
Float32 before anything is computed; ``to_polars(dtype="float32")`` decodes to float32 directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import polars as pl

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame)


def _wider(dtype: PolarsDataType, to: PolarsDataType) -> PolarsDataType:
    if dtype == pl.Float16:
        return to
    if isinstance(dtype, pl.Array):
        return pl.Array(_wider(dtype.inner, to), dtype.shape)
    if isinstance(dtype, pl.List):
        return pl.List(_wider(dtype.inner, to))
    if isinstance(dtype, pl.Struct):
        return pl.Struct({f.name: _wider(f.dtype, to) for f in dtype.fields})
    return dtype


def upcast(frame: Frame, to: PolarsDataType = pl.Float32) -> Frame:
    """`frame` (a DataFrame or LazyFrame) with every Float16, also inside Array, List and Struct
    columns, cast to `to` (Float32 by default; Float64 for long sums)."""
    schema = frame.collect_schema() if isinstance(frame, pl.LazyFrame) else frame.schema
    casts = {name: _wider(dtype, to) for name, dtype in schema.items()}
    changed = [pl.col(name).cast(dtype) for name, dtype in casts.items() if dtype != schema[name]]
    return frame.with_columns(changed) if changed else frame
