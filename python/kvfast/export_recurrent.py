"""The recurrent part of a state in an export: its statistics join the state's files (they have no
values column), its values go to files of their own, ``recurrent/kind-r.parquet`` and
``recurrent/kind-s.parquet`` in the state's folder, since their rows are of other widths than K
and V (and R than S): a glob of the value table (``OUT/**/*.parquet`` without ``recurrent/``, what
:func:`kvfast.export_files` lists) keeps one schema. Read them with
``pl.read_parquet("OUT/*/recurrent/kind-s.parquet")``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl

from kvfast import dataset
from kvfast.dataset import _frame
from kvfast.state import State

#: The folder of a state's recurrent values in an export.
FOLDER = "recurrent"


def records(d: State) -> pl.DataFrame:
    """One row per (cache, layer, kind) of the recurrent part, as ``dataset.records`` gives K and V."""
    return dataset.records(d, ("r", "s"))


def _frames(d: State, kind: str, dtype: str | None, advance: Callable[[int], None]) -> Iterator[pl.DataFrame]:
    recs = dataset.records(d, (kind,))
    for cache, layer, n_embd, nbytes in recs.select("cache", "layer", "n_embd", "nbytes").iter_rows():
        if n_embd == 0:
            continue  # rows of no value (LFM2 keeps no S)
        yield _frame(d, cache, layer, kind, dtype, values=True)
        advance(nbytes)


def write_values(
    d: State,
    staged: Path,
    dtype: str | None,
    advance: Callable[[int], None],
    write: Callable[[Iterator[pl.DataFrame], Path], tuple[int, str | None]],
) -> tuple[int, int]:
    """Write the recurrent part's values, one file per kind; (rows, files) written."""
    if d.recurrent is None:
        return 0, 0
    rows = files = 0
    for kind in ("r", "s"):
        dest = staged / FOLDER / f"kind-{kind}.parquet"
        n, _ = write(_frames(d, kind, None if dtype == "native" else dtype, advance), dest)
        rows += n
        files += dest.exists()
    return rows, files
