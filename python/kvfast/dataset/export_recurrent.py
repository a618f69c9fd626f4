"""The recurrent part of a state in an export: its statistics join the state's files (they have no
values column), its values go to files of their own, ``recurrent/kind-r.parquet`` and
``recurrent/kind-s.parquet`` in the state's folder, since their rows are of other widths than K
and V (and R than S): a glob of the value table (``OUT/**/*.parquet`` without ``recurrent/``, what
:func:`kvfast.export_files` lists) keeps one schema. Read them with
``pl.read_parquet("OUT/*/recurrent/kind-s.parquet")``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl

from kvfast.dataset import export_parquet
from kvfast.dataset import states as dataset
from kvfast.read.state import State

#: The folder of a state's recurrent values in an export.
FOLDER = "recurrent"


def records(d: State) -> pl.DataFrame:
    """One row per (cache, layer, kind) of the recurrent part, as ``dataset.records`` gives K and V."""
    return dataset.records(d, ("r", "s"))


def write_values(
    d: State, staged: Path, dtype: str | None, advance: Callable[[int], None]
) -> tuple[int, int]:
    """Write the recurrent part's values, one file per kind (as export writes K and V:
    :mod:`kvfast.dataset.export_parquet`); (rows, files) written."""
    if d.recurrent is None:
        return 0, 0
    recs = dataset.records(d, ("r", "s")).filter(pl.col("n_embd") > 0)  # LFM2 keeps no S: no file
    parts = [
        (staged / FOLDER / f"kind-{kind}.parquet", recs.filter(pl.col("kind") == kind)) for kind in ("r", "s")
    ]
    written = export_parquet.write_values(d, parts, None if dtype == "native" else dtype, advance)
    return sum(n for n, _ in written), sum(t is not None for _, t in written)
