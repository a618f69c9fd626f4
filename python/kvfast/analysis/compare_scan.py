"""One state against many: :func:`kvfast.compare` of a reference state with every state of a scan,
as one lazy Polars frame (an IO source, as :func:`kvfast.scan`).

Each state is opened (metadata only) when the scan is made; the comparisons run when the query
does, one state at a time, and only for the states a predicate on ``dump`` / ``path`` keeps.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import polars as pl

from kvfast.analysis.compare_modes import Match
from kvfast.analysis.measure import LOSS_COLUMNS, compare
from kvfast.dataset.states import Paths, batches, dump_id, expand, model_geometry, register_source
from kvfast.errors import MatchError, warn
from kvfast.model.geometry import ModelGeometry
from kvfast.model.rotation import Mode
from kvfast.read import remote
from kvfast.read.schema import INDEX
from kvfast.read.state import State, open

_KEYS: dict[str, pl.DataType] = {
    k: INDEX[k] for k in ("dump", "path", "cache", "layer", "model_layer", "kind")
}
SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "cell": {
        **_KEYS,
        **{k: INDEX[k] for k in ("cell", "pos", "seq_id", "head")},
        **{k: pl.Float64() for k in ("mse", "max_abs", "cosine", "rel")},
        "nan": pl.UInt32(),
    },
    "layer": {
        **_KEYS,
        **{k: pl.UInt64() for k in LOSS_COLUMNS[:3]},
        **{k: pl.Float64() for k in LOSS_COLUMNS[3:]},
    },
}


def compare_scan(
    reference: str | os.PathLike[str] | State,
    paths: Paths,
    by: Literal["cell", "layer"] = "layer",
    match: Match = "sequence",
    layers: Sequence[int] | None = None,
    kinds: Sequence[str] | str | None = None,
    head_dim: int | None = None,
    model: str | os.PathLike[str] | ModelGeometry | None = None,
    rotation: Mode = "auto",
    on_error: Literal["raise", "skip"] = "raise",
    pre_rope: bool = False,
) -> pl.LazyFrame:
    """Errors of every state of ``paths`` (paths, globs, folders, as :func:`kvfast.scan`) against
    ``reference``: the rows of ``compare(reference, state, by=, match=)`` for each state, with its
    ``dump`` (stable id) and ``path`` (real path) first. ``on_error='skip'`` leaves out states
    that cannot be matched (a MatchError) with a warning instead of raising when the query runs.
    ``pre_rope=True`` (``model`` a GGUF file) compares keys before RoPE."""
    if by not in SCHEMAS:
        raise ValueError(f"by must be 'cell' or 'layer', not {by!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    given = model if pre_rope else model_geometry(model)  # keys before RoPE need the GGUF itself

    def opened(p: str | os.PathLike[str]) -> State:
        return open(p, head_dim=head_dim, model=given, rotation=rotation, pre_rope=pre_rope)

    ref = reference if isinstance(reference, State) else opened(reference)
    files = expand(paths)
    states = [opened(p) for p in files]
    schema = SCHEMAS[by]

    def source(
        with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None, batch_size: int | None
    ) -> Iterator[pl.DataFrame]:
        wanted = list(schema) if with_columns is None else with_columns
        roots = set(predicate.meta.root_names()) if predicate is not None else set()

        def frames() -> Iterator[pl.DataFrame]:
            for d in states:
                names = {"dump": dump_id(d.path), "path": remote.real(d.path)}
                if predicate is not None and roots <= names.keys():
                    left = pl.DataFrame({k: [v] for k, v in names.items()}).filter(predicate)
                    if left.is_empty():
                        continue
                try:
                    df = compare(ref, d, by=by, layers=layers, kinds=kinds, match=match)
                except MatchError as e:
                    if on_error == "raise":
                        raise
                    warn(f"left out: {e}", about=d.path)
                    continue
                df = df.with_columns(**{k: pl.lit(v, pl.String()) for k, v in names.items()})
                df = df.select(list(schema)).cast(pl.Schema(schema))
                if predicate is not None:
                    df = df.filter(predicate)
                yield df.select(wanted)

        yield from batches(frames(), n_rows, batch_size)

    detail: Any = f"kvfast.compare_scan of {len(files)} states against {ref.path}"
    return register_source(source, schema, detail)
