"""Attention weights of queries over a state's cache, computed in Rust (kvfast-core's
``attention``): f32 tiles of queries against each KV head's keys as llama.cpp computes them, the online
softmax, every core, the GIL released.

Every function takes an open :class:`kvfast.State` and :class:`~kvfast.attn.queries.Queries` (or
the path of a queries sidecar, ``<id>.queries.json``), and the model (its GGUF) whose header says
how each layer attends: by default the queries' model, else the state's. The weights are llama.cpp's
(``kq_soft_max`` with flash attention off; see tests/test_attention_llama.py): ``scale * q . k``
over the cells of the query's sequence at or before its position (and inside the window of a
sliding-window layer), soft-capped where the model caps, a query head reading the KV head of its
group, learned sink logits in the denominator where the layer has them.

``scale``: None for the model's (kvfast-core's rule from the header; where llama.cpp recorded the
scale it applied at capture and the two differ, :class:`kvfast.ModelMismatchError`), a number for
every layer, or a dict per model layer. ``incomplete``: a query whose cache lacks cells it saw in
llama.cpp (a sequence save of a sliding-window cache keeps only its last window) is left out
(``"skip"``, the default of every function of :mod:`kvfast.attn` and :mod:`kvfast.plot`) or raises
:class:`kvfast.SelectionError` (``"error"``). One default for all, and ``"skip"``: the views
(sinks, scores, the dense array, the pictures) must work on the states llama.cpp saves, where a
sliding-window layer lacks the early cells by design; a query left out is absent from a table (NaN
in the dense array), never computed over fewer cells. Pass ``"error"`` to insist on whole queries.

Queries that are not of the state (another prompt's: its tokens differ, or positions it does not
hold) or not of the model are refused before anything is computed (:mod:`kvfast.attn.belongs`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import polars as pl

from kvfast import _kvfast
from kvfast.attn import belongs
from kvfast.attn.queries import Queries
from kvfast.errors import ModelMismatchError, RotationError, SelectionError
from kvfast.model import cached
from kvfast.read.state import State

QueriesArg = Queries | str | os.PathLike[str]
Incomplete = Literal["error", "skip"]
Reduction = Literal["weights", "mass", "entropy", "top_k"]
REDUCTIONS: tuple[Reduction, ...] = ("weights", "mass", "entropy", "top_k")


def _model(state: State, q: Queries, model: str | os.PathLike[str] | None) -> str:
    for m in (model, q.model, state.model_path):
        if m is not None:
            return os.fspath(m)
    raise SelectionError(
        "attention needs the model's GGUF (model=PATH): its header says how each layer attends"
    )


def _softcaps(model_layers: list[dict[str, Any]], q: Queries) -> None:
    """The soft-cap llama.cpp applied at capture (the sidecar's ``softcap``) is the model's: kvfast
    computes the weights with the model's, so another one would give other weights."""
    ours = {int(a["model_layer"]): a["softcap"] for a in model_layers}
    for lay in q.layers:
        cap = lay.info.get("softcap")
        mine = ours.get(lay.model_layer)
        if (
            cap is not None
            and lay.model_layer in ours
            and (mine is None or not math.isclose(cap, mine, rel_tol=1e-5))
        ):
            raise ModelMismatchError(
                f"model layer {lay.model_layer}: llama.cpp soft-capped the logits at {cap} when the queries "
                f"were captured, the model's header gives {mine or 'no soft-cap'}: kvfast computes the "
                "weights with the model's"
            )


def _scales(model: str, q: Queries, scale: float | dict[int, float] | None) -> dict[int, float] | None:
    if isinstance(scale, dict):
        return {int(k): float(v) for k, v in scale.items()}
    if scale is not None:
        return {lay.model_layer: float(scale) for lay in q.layers}
    ours = {int(a["model_layer"]): float(a["scale"]) for a in cached.attention_layers(model)}
    for lay in q.layers:
        s = ours.get(lay.model_layer)
        if (
            lay.llama_scale is not None
            and s is not None
            and not math.isclose(s, lay.llama_scale, rel_tol=1e-5)
        ):
            raise ModelMismatchError(
                f"model layer {lay.model_layer}: llama.cpp scaled q . k by {lay.llama_scale} when the "
                f"queries were captured, kvfast's rule for the model gives {s}: pass scale= to say which"
            )
    return None


@dataclass(frozen=True)
class Prepared:
    """What a pass of queries over a state takes beside the vectors: the model's GGUF, each
    layer's block of a row, and the scales and sinks given in place of the model's."""

    model: str
    blocks: list[tuple[int, int, int, int]]
    scale: dict[int, float] | None
    sinks: dict[int, list[float]] | None


def prepare(
    state: State,
    q: Queries,
    model: str | os.PathLike[str] | None,
    scale: float | dict[int, float] | None,
    sinks: dict[int, Sequence[float]] | None,
) -> Prepared:
    """Check that queries pair with a state's keys, and gather what a pass takes beside them."""
    q.check_unchanged()
    m = _model(state, q, model)
    _softcaps(cached.attention_layers(m), q)
    belongs.check(state, q, m)
    rotated = {int(lay.info.get("rotation") or 0) for lay in q.layers} - {0}
    as_stored = [
        r for r in state.rotation if r.kind == "k" and not r.undone and r.type not in ("f16", "f32", "bf16")
    ]
    if rotated and as_stored:
        raise RotationError(
            f"the queries were captured from a cache llama.cpp stored rotated (Hadamard groups of "
            f"{sorted(rotated)}), the state's keys of cache {as_stored[0].cache} are read as stored "
            f"({as_stored[0].evidence}): open it with rotation='hadamard'"
        )
    given_sinks = (
        {int(k): [float(x) for x in v] for k, v in sinks.items()}
        if sinks is not None
        else {lay.model_layer: [float(x) for x in lay.sinks] for lay in q.layers if lay.sinks is not None}
    )
    blocks = [(lay.model_layer, lay.offset, lay.n_head, lay.head_dim) for lay in q.layers]
    return Prepared(m, blocks, _scales(m, q, scale), given_sinks or None)


def _call(
    state: State,
    queries: QueriesArg,
    what: Sequence[str],
    k: int,
    model: str | os.PathLike[str] | None,
    layers: Sequence[int] | None,
    heads: Sequence[int] | None,
    scale: float | dict[int, float] | None,
    sinks: dict[int, Sequence[float]] | None,
    incomplete: Incomplete,
    chunk: int,
) -> list[pl.DataFrame]:
    q = queries if isinstance(queries, Queries) else Queries.load(queries)
    p = prepare(state, q, model, scale, sinks)
    streams = _kvfast.attention(
        state._live(),
        p.model,
        np.ascontiguousarray(q.values, dtype=np.float32),
        q.row_len,
        np.ascontiguousarray(q.pos, dtype=np.int32),
        np.ascontiguousarray(q.seq, dtype=np.int32),
        p.blocks,
        list(what),
        k=k,
        layers=None if layers is None else [int(x) for x in layers],
        heads=None if heads is None else [int(x) for x in heads],
        scale=p.scale,
        sinks=p.sinks,
        incomplete=incomplete,
        chunk=chunk,
    )
    return [pl.DataFrame(s) for s in streams]


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be positive, not {k}")


def attention(
    state: State,
    queries: QueriesArg,
    *,
    model: str | os.PathLike[str] | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    scale: float | dict[int, float] | None = None,
    sinks: dict[int, Sequence[float]] | None = None,
    incomplete: Incomplete = "skip",
    chunk: int = 64,
) -> pl.DataFrame:
    """The weight of every cell each query sees: one row per (cache, stream, layer, model_layer,
    head, query_pos, seq_id, cell) with the cell's pos and its ``weight`` (float64, each query
    head's weights summing to 1 less any sink's share). ``layers``: model layers; ``heads``: query
    heads."""
    return _call(state, queries, ["weights"], 0, model, layers, heads, scale, sinks, incomplete, chunk)[0]


def mass(
    state: State,
    queries: QueriesArg,
    *,
    model: str | os.PathLike[str] | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    scale: float | dict[int, float] | None = None,
    sinks: dict[int, Sequence[float]] | None = None,
    incomplete: Incomplete = "skip",
    chunk: int = 64,
) -> pl.DataFrame:
    """The attention mass each cell received, summed over the queries (per cache, stream, layer,
    model_layer, head, cell, pos: ``mass`` and ``queries``, how many saw the cell), without keeping
    the weights: H2O's accumulated attention, StreamingLLM's sinks."""
    return _call(state, queries, ["mass"], 0, model, layers, heads, scale, sinks, incomplete, chunk)[0]


def entropy(
    state: State,
    queries: QueriesArg,
    *,
    model: str | os.PathLike[str] | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    scale: float | dict[int, float] | None = None,
    sinks: dict[int, Sequence[float]] | None = None,
    incomplete: Incomplete = "skip",
    chunk: int = 64,
) -> pl.DataFrame:
    """The entropy (nats) of each query head's weights: per cache, layer, model_layer, head,
    query_pos, seq_id, with ``cells``, how many it saw (group by head for a head's mean)."""
    return _call(state, queries, ["entropy"], 0, model, layers, heads, scale, sinks, incomplete, chunk)[0]


def top_k(
    state: State,
    queries: QueriesArg,
    k: int = 8,
    *,
    model: str | os.PathLike[str] | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    scale: float | dict[int, float] | None = None,
    sinks: dict[int, Sequence[float]] | None = None,
    incomplete: Incomplete = "skip",
    chunk: int = 64,
) -> pl.DataFrame:
    """The ``k`` cells of largest weight of each query head, largest first (``rank`` 0): the
    columns of :func:`attention` and ``rank``."""
    _check_k(k)
    return _call(state, queries, ["top_k"], k, model, layers, heads, scale, sinks, incomplete, chunk)[0]


def reductions(
    state: State,
    queries: QueriesArg,
    what: Sequence[Reduction] = ("mass", "entropy", "top_k"),
    k: int = 8,
    *,
    model: str | os.PathLike[str] | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    scale: float | dict[int, float] | None = None,
    sinks: dict[int, Sequence[float]] | None = None,
    incomplete: Incomplete = "skip",
    chunk: int = 64,
) -> dict[str, pl.DataFrame]:
    """Several of :func:`attention` (``"weights"``), :func:`mass`, :func:`entropy` and
    :func:`top_k` (``k`` cells) in one pass: each query head's weights computed once for all of
    them, a table of each by name, as each function gives it."""
    names = list(what)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"what: give each of {', '.join(REDUCTIONS)} at most once, and one at least")
    if "top_k" in names:
        _check_k(k)
    tables = _call(state, queries, names, k, model, layers, heads, scale, sinks, incomplete, chunk)
    return dict(zip(names, tables, strict=True))
