"""Query vectors beside a state: the file format the probe runner writes, and :class:`Queries`.

A capture of one sequence is two files beside its state (``OUT/<id>.ggsq``):

- ``<id>.queries.npy``: float32, C order, ``[rows, row_len]`` (NumPy's ``.npy``, version 1): a row
  per captured token; a row is the concatenation of the attention layers' blocks, each block
  ``n_head`` query heads of ``head_dim`` values, head-major;
- ``<id>.queries.json``: the sidecar (``format: "kvfast-queries"``, ``version: 1``): ``values`` (the
  .npy's name), ``shape``, ``basis`` (what the vectors are), ``model`` (the GGUF), ``state``,
  ``prompt_id``, ``rows`` (per row: ``pos``, ``seq``, ``token``, ``generated``) and ``layers`` (per
  attention layer: ``model_layer``, ``offset`` in the row, ``n_head``, ``head_dim``, the window,
  and what llama.cpp's graph showed: ``llama_scale``, **the** scale of q . k that llama.cpp applied
  to these vectors (the one to use: ``kvfast.attention`` does), and its two factors as the graph
  holds them, ``op_scale`` (the scale argument of the ``kq`` soft-max op alone: 1.0 for a model that
  scales its queries in the graph, as Gemma does) and ``q_prescale`` (that query scaling, divided
  out of the vectors); ``softcap``, ``rotation`` (the Hadamard group undone, 0: none), ``sinks``
  (learned sink logits per head, or null), ``flash_attn``, ``positions_checked``). Sidecars written
  before ``op_scale`` had the name call it ``kq_scale``: :meth:`Queries.load` reads it as
  ``op_scale``, so that no field named like the attention scale holds a factor of it.

The probe manifest's ``queries`` column names each state's sidecar. :meth:`Queries.load` maps the
values (nothing is read until used); :meth:`Queries.from_arrays` makes queries of one's own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from kvfast.attn.sidecar import Sidecar
from kvfast.read.regular import Stamp

FORMAT = "kvfast-queries"
VERSION = 1
#: What the captured vectors are.
BASIS = (
    "the query operand of llama.cpp's attention op in each layer, after RoPE, in the model's basis "
    "(a quantized cache's Hadamard rotation undone with the graph's own matrix) and before the "
    "attention scale (a query scaling the model does in its graph divided out): the keys kvfast "
    "gives (RoPE applied, rotation undone) pair with it as scale * q . k"
)


def values_name(prompt_id: str) -> str:
    return f"{prompt_id}.queries.npy"


def sidecar_name(values: Path) -> str:
    return values.name.removesuffix(".npy") + ".json"


def _renamed(layer: dict[str, Any]) -> dict[str, Any]:
    """A sidecar's layer entry with an older name read as the format names it now: ``kq_scale``
    (the soft-max op's scale argument, not the attention scale) as ``op_scale``."""
    if "kq_scale" not in layer:
        return layer
    out = {k: v for k, v in layer.items() if k != "kq_scale"}
    out.setdefault("op_scale", layer["kq_scale"])
    return out


@dataclass(frozen=True)
class QueryLayer:
    """Where one attention layer's query heads lie in a row, and what llama.cpp applied."""

    model_layer: int
    offset: int
    n_head: int
    head_dim: int
    #: The scale llama.cpp applied to q . k for these vectors (None: not recorded).
    llama_scale: float | None = None
    #: Learned sink logits per head, as llama.cpp's softmax added them (None: none).
    sinks: list[float] | None = None
    info: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class Queries:
    """Query vectors of some tokens: ``values[row, layer.offset:...]`` is the layer's heads."""

    values: npt.NDArray[np.float32]
    pos: npt.NDArray[np.int32]
    seq: npt.NDArray[np.int32]
    layers: list[QueryLayer]
    #: The GGUF model they were captured with (None: not known).
    model: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    #: Per row, the token llama.cpp decoded there (None: not known, as for queries of one's own):
    #: what :mod:`kvfast.attn.belongs` checks against the state's tokens.
    token: npt.NDArray[np.int32] | None = None
    #: The sidecar they were loaded from (None: made in memory).
    source: str | None = None
    #: The ``.npy`` file the values map, as it was at load (None: values in memory).
    stamp: Stamp | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.pos)
        if self.values.ndim != 2 or self.values.shape[0] != n or len(self.seq) != n:
            raise ValueError(
                f"queries: values of shape {self.values.shape} for {n} positions and {len(self.seq)} sequences"
            )
        if self.token is not None and len(self.token) != n:
            raise ValueError(f"queries: {len(self.token)} tokens for {n} rows")
        for lay in self.layers:
            if lay.offset < 0 or lay.offset + lay.n_head * lay.head_dim > self.values.shape[1]:
                raise ValueError(
                    f"queries: model layer {lay.model_layer} lies outside rows of {self.values.shape[1]}"
                )

    @property
    def row_len(self) -> int:
        return int(self.values.shape[1])

    def layer(self, model_layer: int) -> npt.NDArray[np.float32]:
        """One layer's queries, ``[rows, n_head, head_dim]`` (a view)."""
        lay = next((x for x in self.layers if x.model_layer == model_layer), None)
        if lay is None:
            raise KeyError(f"no queries of model layer {model_layer}")
        block = self.values[:, lay.offset : lay.offset + lay.n_head * lay.head_dim]
        return block.reshape(len(self.pos), lay.n_head, lay.head_dim)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Queries:
        """Queries from a sidecar (``<id>.queries.json``); the values are memory-mapped."""
        s = Sidecar(Path(path), FORMAT, VERSION)
        layers = [
            QueryLayer(
                x["model_layer"],
                x["offset"],
                x["n_head"],
                x["head_dim"],
                x.get("llama_scale"),
                x.get("sinks"),
                info=_renamed(x),
            )
            for x in s.layers
        ]
        return cls(s.values, s.pos, s.seq, layers, s.model, s.side, s.token, os.fspath(path), s.stamp)

    def check_unchanged(self) -> None:
        """:class:`kvfast.FileChangedError` when the ``.npy`` file the values map changed since
        :meth:`Queries.load` (truncated, the next read of a vector would kill the process with SIGBUS):
        every pass checks first, as a mapped state does."""
        if self.stamp is not None:
            self.stamp.check()

    def rows(self, keep: npt.NDArray[np.bool_]) -> Queries:
        """The rows where `keep` is true (a copy), with their positions, sequences and tokens."""
        token = None if self.token is None else self.token[keep]
        return Queries(
            np.ascontiguousarray(self.values[keep]),
            self.pos[keep],
            self.seq[keep],
            self.layers,
            self.model,
            self.meta,
            token,
            self.source,
        )

    @classmethod
    def from_arrays(
        cls,
        layers: dict[int, npt.ArrayLike],
        pos: npt.ArrayLike,
        seq: npt.ArrayLike | int = 0,
        model: str | None = None,
    ) -> Queries:
        """Queries of one's own: per model layer an array ``[rows, n_head, head_dim]`` (after RoPE,
        in the model's basis, before the scale), the rows' positions and sequences."""
        p = np.asarray(pos, dtype=np.int32).reshape(-1)
        s = np.broadcast_to(np.asarray(seq, dtype=np.int32), p.shape).copy()
        blocks, parts, off = [], [], 0
        for il in sorted(layers):
            a = np.asarray(layers[il], dtype=np.float32)
            if a.ndim != 3 or a.shape[0] != len(p):
                raise ValueError(
                    f"model layer {il}: expected [rows={len(p)}, n_head, head_dim], got {a.shape}"
                )
            blocks.append(QueryLayer(il, off, a.shape[1], a.shape[2]))
            parts.append(a.reshape(len(p), -1))
            off += a.shape[1] * a.shape[2]
        values = (
            np.ascontiguousarray(np.concatenate(parts, axis=1))
            if parts
            else np.zeros((len(p), 0), np.float32)
        )
        return cls(values, p, s, blocks, model)

    def to_polars(self) -> pl.DataFrame:
        """One row per (model layer, head, query row): model_layer, head, pos, seq_id, q (float32
        array of head_dim)."""
        frames = []
        for lay in self.layers:
            q = self.layer(lay.model_layer)
            n, h, d = q.shape
            frames.append(
                pl.DataFrame(
                    {
                        "model_layer": np.full(n * h, lay.model_layer, np.uint16),
                        "head": np.tile(np.arange(h, dtype=np.uint16), n),
                        "pos": np.repeat(self.pos, h),
                        "seq_id": np.repeat(self.seq, h).astype(np.uint8),
                        "q": np.ascontiguousarray(q.reshape(n * h, d)),
                    }
                )
            )
        return pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()
