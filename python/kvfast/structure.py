"""The structure of a state: caches, streams and layers, as plain data read at open."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvfast import _kvfast


@dataclass(frozen=True)
class Layer:
    """One layer of a stream: its K record and (unless the model has none) its V record."""

    index: int
    model_layer: int | None
    k_type: str
    v_type: str | None
    n_embd_k: int
    n_embd_v: int | None
    k_offset: int
    v_offset: int | None
    k_nbytes: int
    v_nbytes: int | None
    k_row_bytes: int
    v_row_bytes: int | None


@dataclass(frozen=True)
class Stream:
    """One stream of a cache: its occupied cells and one K and V record per layer."""

    index: int
    offset: int
    cell_count: int
    pos: npt.NDArray[np.int32]
    seq_ids: list[list[int]]
    ext: npt.NDArray[np.int32] | None
    v_trans: bool
    layers: list[Layer] = field(repr=False)

    def __repr__(self) -> str:
        # short whatever the cell count: the arrays are summarized, not printed
        seqs = sorted({q for ids in self.seq_ids for q in ids})
        shown = ", ".join(map(str, seqs[:8])) + (f", ... ({len(seqs)})" if len(seqs) > 8 else "")
        pos = f"{self.pos.min()}..{self.pos.max()}" if self.cell_count else "-"
        ext = "" if self.ext is None else ", ext"
        return (
            f"Stream(index={self.index}, cells={self.cell_count}, pos={pos}, seq_ids=[{shown}],"
            f" layers={len(self.layers)}, v_trans={self.v_trans}{ext})"
        )


@dataclass(frozen=True)
class Cache:
    """One KV cache (an iSWA model writes two: full-attention layers, then sliding-window ones)."""

    index: int
    offset: int
    streams: list[Stream]

    @property
    def n_layer(self) -> int:
        return max((len(s.layers) for s in self.streams), default=0)

    def __repr__(self) -> str:
        shown = ", ".join(map(repr, self.streams[:4]))
        more = f", ... {len(self.streams) - 4} more" if len(self.streams) > 4 else ""
        return f"Cache(index={self.index}, offset={self.offset}, n_layer={self.n_layer}, streams=[{shown}{more}])"


def _i32(buf: _kvfast.Buf) -> npt.NDArray[np.int32]:
    return np.frombuffer(memoryview(buf), dtype="<i4").astype(np.int32)


def _build_caches(raw: list[dict[str, Any]]) -> list[Cache]:
    caches = []
    for ci, c in enumerate(raw):
        streams = []
        for s in c["streams"]:
            starts = _i32(s["seq_start"])
            ids = _i32(s["seq_ids"]).tolist()
            seq_ids = [ids[starts[i] : starts[i + 1]] for i in range(len(starts) - 1)]
            ext = None
            if s["ext"] is not None:
                ext = _i32(s["ext"]).reshape(-1, s["ext_width"])
            layers = [Layer(index=li, **ld) for li, ld in enumerate(s["layers"])]
            streams.append(
                Stream(
                    index=s["index"],
                    offset=s["offset"],
                    cell_count=s["cell_count"],
                    pos=_i32(s["pos"]),
                    seq_ids=seq_ids,
                    ext=ext,
                    v_trans=s["v_trans"],
                    layers=layers,
                )
            )
        caches.append(Cache(index=ci, offset=c["offset"], streams=streams))
    return caches


_LAYER_KEYS = tuple(Layer.__dataclass_fields__)
