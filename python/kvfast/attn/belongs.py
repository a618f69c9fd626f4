"""Whether queries belong to the state and the model they are used with.

A queries sidecar records the prompt, the state and the model it was captured with, and per row the
position, sequence and token. Before any weight is computed (:mod:`kvfast.attn.weights`) the rows
are checked against the state:

- every row's position must be a cell of its sequence in the state (queries of one's own,
  :meth:`~kvfast.attn.queries.Queries.from_arrays`, included);
- every captured row's token must be the state's token at that position, where the state knows its
  tokens (a GGSQ sequence file, a single-sequence GGSN, cells that carry their token): the decisive
  test that the queries were captured from this state's prompt;
- where the state knows none of those tokens, the state's file name must be one the sidecar names
  (``state`` or ``whole_state``), and the state's arch the sidecar's ``arch``;

and a model given (``model=``) must be the sidecar's: the same arch and layer geometry in its GGUF
header (not the same path; each captured layer's heads and head size are the pass's own check).
What does not
belong is a :class:`~kvfast.errors.QueriesError` (or :class:`~kvfast.errors.ModelMismatchError` for
the model) naming both sides and the first difference.
"""

from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt

from kvfast.attn.queries import Queries
from kvfast.errors import ModelMismatchError, QueriesError
from kvfast.model import cached
from kvfast.model.geometry import ModelGeometry
from kvfast.read.state import State

_SHIFT = np.int64(1) << np.int64(32)


def _name(q: Queries) -> str:
    """The queries as a message names them: the sidecar and its prompt."""
    what = q.source or "the queries"
    prompt, state = q.meta.get("prompt_id"), q.meta.get("state")
    if prompt is not None:
        what += f" (prompt {prompt!r}" + (f", state {state}" if state else "") + ")"
    return what


def _held(state: State) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The (seq << 32 | pos) keys of the state's cells that name their sequences, and the positions
    of cells that name none (a sequence file's: they belong to its one sequence)."""
    keyed, free = [], []
    for c in state.caches:
        for s in c.streams:
            pos = s.pos.astype(np.int64)
            starts = s.seq_id_starts.astype(np.int64)
            counts = starts[1:] - starts[:-1]
            free.append(pos[counts == 0])
            seqs = s.seq_id_values.astype(np.int64)
            keyed.append((seqs << np.int64(32)) | np.repeat(pos, counts))
    return _union(keyed), _union(free)


def _union(parts: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def _check_positions(state: State, q: Queries) -> None:
    keyed, free = _held(state)
    pos, seq = q.pos.astype(np.int64), q.seq.astype(np.int64)
    held = np.isin((seq << np.int64(32)) | pos, keyed) | np.isin(pos, free)
    if held.all():
        return
    i = int(np.flatnonzero(~held)[0])
    raise QueriesError(
        f"{_name(q)}: row {i} is a query at position {pos[i]} of sequence {seq[i]}, where "
        f"{state.path} holds no cell ({int((~held).sum())} of {len(pos)} rows): the queries are "
        "not of this state",
        "rows.pos",
    )


def _state_tokens(state: State) -> npt.NDArray[np.int64]:
    """The state's token at each position (-1: not known)."""
    t = state.cell_tokens().drop_nulls("token")
    if not t.height:
        return np.zeros(0, np.int64)
    pos = t["pos"].to_numpy().astype(np.int64)
    out = np.full(int(pos.max()) + 1, -1, np.int64)
    out[pos] = t["token"].to_numpy().astype(np.int64)
    return out


def _check_tokens(state: State, q: Queries) -> None:
    if q.token is None:
        return
    ours = _state_tokens(state)
    pos = q.pos.astype(np.int64)
    inside = (pos >= 0) & (pos < len(ours))
    theirs = np.full(len(pos), -1, np.int64)
    theirs[inside] = ours[pos[inside]]
    known = theirs >= 0
    if known.any():
        differ = known & (theirs != q.token.astype(np.int64))
        if differ.any():
            i = int(np.flatnonzero(differ)[0])
            raise QueriesError(
                f"{_name(q)} does not belong to {state.path}: at position {pos[i]} the queries were "
                f"captured on token {int(q.token[i])}, the state holds token {int(theirs[i])} "
                f"({int(differ.sum())} of {int(known.sum())} positions differ)",
                "rows.token",
            )
        return
    _check_recorded(state, q)


def _check_recorded(state: State, q: Queries) -> None:
    """The state knows none of the rows' tokens: what the sidecar recorded must name it."""
    names = {n for n in (q.meta.get("state"), q.meta.get("whole_state")) if isinstance(n, str)}
    mine = os.path.basename(state.path)
    if names and mine not in names:
        raise QueriesError(
            f"{_name(q)} was captured for {' or '.join(sorted(names))}, not {state.path} (which holds no "
            "tokens to compare)",
            "state",
        )
    arch, theirs = q.meta.get("arch"), state.arch or (state.model.arch if state.model else None)
    if isinstance(arch, str) and theirs is not None and arch != theirs:
        raise QueriesError(f"{_name(q)} was captured with a {arch} model, {state.path} is {theirs}", "arch")


def _geometry(g: ModelGeometry) -> tuple[object, ...]:
    return (g.arch, g.n_layer, g.head_dim_k, g.head_dim_v, g.n_head_kv, g.swa)


def check_model(q: Queries, model: str) -> None:
    """The model attention is computed with is the one the queries were captured with: the same
    arch and geometry in the GGUF headers (a copy elsewhere is the same model). Each layer's heads
    and head size are checked against the model by the pass itself."""
    given = cached.geometry(model)
    recorded = q.meta.get("arch")
    if isinstance(recorded, str) and recorded != given.arch:
        raise ModelMismatchError(
            f"{_name(q)} was captured with a {recorded} model ({q.model}), {model} is {given.arch}"
        )
    if q.model is not None and os.path.exists(q.model) and os.path.abspath(q.model) != os.path.abspath(model):
        theirs = cached.geometry(q.model)
        if _geometry(theirs) != _geometry(given):
            raise ModelMismatchError(
                f"{_name(q)} was captured with {q.model} ({theirs.arch}, {theirs.n_layer} layers), "
                f"{model} is another model ({given.arch}, {given.n_layer} layers)"
            )


def check(state: State, q: Queries, model: str) -> None:
    """Refuse queries that are not of `state` (its positions, its tokens) or not of `model`."""
    check_model(q, model)
    _check_positions(state, q)
    _check_tokens(state, q)
