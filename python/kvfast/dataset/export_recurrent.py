"""The recurrent part of a state in an export: its statistics join the state's files (they have no
values column), its values go to files of their own, since their rows are of other widths than K
and V (and R than S)::

    OUT/<state>-<hash>/_recurrent/kind-r.parq     the R rows (conv / token-shift states)
    OUT/<state>-<hash>/_recurrent/kind-s.parq     the S rows (SSM / WKV states)

Parquet files, named so that no documented read of the value table meets them: a glob of
``*.parquet`` (Polars, DuckDB) does not match ``.parq``, and pyarrow (``pyarrow.dataset``,
``pandas.read_parquet``) skips a folder whose name starts with ``_``. They are published with the
state's folder, in the same rename. Read them with ``pl.read_parquet("OUT/*/_recurrent/kind-s.parq")``
(or :func:`kvfast.dataset.export_read.recurrent_files`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl

from kvfast.dataset import export_parquet
from kvfast.dataset import states as dataset
from kvfast.read.state import State

#: The folder of a state's recurrent values in an export.
FOLDER = "_recurrent"
#: Their files' suffix: Parquet, outside the ``*.parquet`` globs of the value table.
SUFFIX = ".parq"
#: Where kvfast before this layout wrote them (inside the globs): an export holding it is redone.
OLD_FOLDER = "recurrent"


def name(kind: str) -> str:
    """The file of one kind's rows in a state's folder: ``_recurrent/kind-s.parq``."""
    return f"{FOLDER}/kind-{kind}{SUFFIX}"


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
    parts = [(staged / name(kind), recs.filter(pl.col("kind") == kind)) for kind in ("r", "s")]
    written = export_parquet.write_values(d, parts, None if dtype == "native" else dtype, advance)
    return sum(n for n, _ in written), sum(t is not None for _, t in written)
