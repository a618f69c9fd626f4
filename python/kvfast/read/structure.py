"""The structure of a state: caches, streams and layers, as plain data read at open; and the
recurrent part of a recurrent or hybrid model's state (:class:`Recurrent`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from kvfast import _kvfast
from kvfast.errors import SelectionError


@dataclass(frozen=True)
class Layer:
    """One layer of a stream: its K record and (unless the cache is V-less, as an MLA model's is)
    its V record."""

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
    """One stream of a cache: its occupied cells and one K and V record per layer.

    The cells' metadata are NumPy arrays (read-only, built at open in time independent of Python
    objects per cell): ``pos`` (one position per cell) and, in CSR form, the sequences of each cell
    (cell ``i``'s are ``seq_id_values[seq_id_starts[i]:seq_id_starts[i + 1]]``). ``seq_ids``, the
    same as one list per cell, is built when first asked for."""

    index: int
    offset: int
    cell_count: int
    pos: npt.NDArray[np.int32]
    seq_id_starts: npt.NDArray[np.int32] = field(repr=False)
    seq_id_values: npt.NDArray[np.int32] = field(repr=False)
    ext: npt.NDArray[np.int32] | None
    v_trans: bool
    layers: list[Layer] = field(repr=False)

    @cached_property
    def seq_ids(self) -> list[list[int]]:
        """The sequences of each cell, one list per cell (built on first use: O(cells) objects)."""
        ids = self.seq_id_values.tolist()
        starts = self.seq_id_starts.tolist()
        return [ids[starts[i] : starts[i + 1]] for i in range(len(starts) - 1)]

    def cell_seq_ids(self, cell: int) -> list[int]:
        """The sequences of one cell (from the arrays: builds no list per cell)."""
        if (
            isinstance(cell, bool)
            or not isinstance(cell, int | np.integer)
            or not 0 <= cell < self.cell_count
        ):
            raise SelectionError(
                f"cell {cell!r} out of range: stream {self.index} has {self.cell_count} cells"
            )
        lo, hi = int(self.seq_id_starts[cell]), int(self.seq_id_starts[cell + 1])
        return [int(q) for q in self.seq_id_values[lo:hi]]

    @property
    def sequences(self) -> list[int]:
        """The sequences the stream's cells belong to, ascending."""
        return [int(q) for q in np.unique(self.seq_id_values)]

    @property
    def shared_cells(self) -> int:
        """How many cells belong to more than one sequence."""
        return int(np.count_nonzero(np.diff(self.seq_id_starts) > 1))

    def __repr__(self) -> str:
        # short whatever the cell count: the arrays are summarized, not printed
        seqs = self.sequences
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
    def layers(self) -> list[Layer]:
        """The cache's layers: those of its longest stream (every stream of a cache holds the same
        layers; one with no cell lists none)."""
        return max(self.streams, key=lambda s: len(s.layers)).layers if self.streams else []

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        shown = ", ".join(map(repr, self.streams[:4]))
        more = f", ... {len(self.streams) - 4} more" if len(self.streams) > 4 else ""
        return f"Cache(index={self.index}, offset={self.offset}, n_layer={self.n_layer}, streams=[{shown}{more}])"


@dataclass(frozen=True)
class Partial:
    """What a state written with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`` lacks of its model's memory
    (llama-server's context checkpoints of hybrid and sliding-window models): ``absent`` is the
    cache it does not hold, ``"attention cache"`` (a hybrid's: the state is its recurrent part) or
    ``"full-attention cache"`` (an iSWA model's: the state is its sliding-window cache, then a
    hybrid iSWA model's recurrent part); ``model_layers`` are the model layers that cache holds
    (none of them has a record in the state). Only the model tells: see :attr:`kvfast.State.partial`."""

    absent: str
    model_layers: list[int]


@dataclass(frozen=True)
class RecurrentLayer:
    """One layer's records in the recurrent part: R (the conv / token-shift state) and S (the SSM /
    WKV / delta-net state), each one row per cell of ``n_embd_r`` / ``n_embd_s`` values (0 for a
    state the model does not keep, as LFM2's S). ``index`` counts the part's layers;
    ``model_layer`` is the model's (None where only the model tells)."""

    index: int
    model_layer: int | None
    r_type: str
    s_type: str
    n_embd_r: int
    n_embd_s: int
    r_offset: int
    s_offset: int
    r_nbytes: int
    s_nbytes: int
    r_row_bytes: int
    s_row_bytes: int


@dataclass(frozen=True)
class Recurrent:
    """The recurrent part of a state (``llama_memory_recurrent``): the whole memory of a recurrent
    model (Mamba, RWKV), the end of a hybrid one's (Qwen3.5, LFM2, Granite 4, ...), after its
    attention caches. One cell per sequence (not per token), at the sequence's last position; R and
    S records of the layers that have them. ``index`` is its place among the caches: tables,
    :meth:`kvfast.State.layout` and ``values(cache=)`` number it after the attention caches.
    ``n_layer`` is the model's layer count the part records (attention layers included)."""

    index: int
    offset: int
    n_layer: int
    stream: Stream
    layers: list[RecurrentLayer] = field(repr=False)

    @property
    def cell_count(self) -> int:
        return self.stream.cell_count

    def __repr__(self) -> str:
        ly = self.layers[0] if self.layers else None
        rows = "" if ly is None else f", r={ly.r_type} x {ly.n_embd_r}, s={ly.s_type} x {ly.n_embd_s}"
        return (
            f"Recurrent(index={self.index}, cells={self.cell_count}, layers={len(self.layers)}"
            f" of {self.n_layer}{rows})"
        )


def i32(buf: _kvfast.ByteView) -> npt.NDArray[np.int32]:
    # a read-only view of the binding's buffer: no copy, no object per cell
    return np.frombuffer(memoryview(buf), dtype=np.dtype("<i4")).view(np.int32)


def _stream(s: dict[str, Any], layers: list[Layer]) -> Stream:
    ext = None
    if s["ext"] is not None:
        ext = i32(s["ext"]).reshape(-1, s["ext_width"])
    return Stream(
        index=s["index"],
        offset=s["offset"],
        cell_count=s["cell_count"],
        pos=i32(s["pos"]),
        seq_id_starts=i32(s["seq_start"]),
        seq_id_values=i32(s["seq_ids"]),
        ext=ext,
        v_trans=s["v_trans"],
        layers=layers,
    )


def build_caches(raw: list[dict[str, Any]]) -> list[Cache]:
    """The attention caches of the binding's cache dicts (the recurrent part is left out)."""
    caches = []
    for ci, c in enumerate(raw):
        if c.get("memory", "kv") != "kv":
            continue
        streams = [_stream(s, [_layer(ld) for ld in s["layers"]]) for s in c["streams"]]
        caches.append(Cache(index=ci, offset=c["offset"], streams=streams))
    return caches


def build_recurrent(raw: list[dict[str, Any]]) -> Recurrent | None:
    """The recurrent part of the binding's cache dicts, if the state has one."""
    for ci, c in enumerate(raw):
        if c.get("memory") != "recurrent":
            continue
        s = c["streams"][0]
        layers = [RecurrentLayer(**{k: ld[k] for k in _RECURRENT_KEYS}) for ld in s["layers"]]
        return Recurrent(
            index=ci, offset=c["offset"], n_layer=c["n_layer"], stream=_stream(s, []), layers=layers
        )
    return None


_LAYER_KEYS = tuple(Layer.__dataclass_fields__)


def _layer(ld: dict[str, Any]) -> Layer:
    """A Layer of the binding's layer dict. Where the dict holds exactly the fields (as it does),
    the frozen dataclass is filled without its ``__init__``, which sets each field through
    ``object.__setattr__``: ten times slower, and open builds one per layer."""
    if ld.keys() != Layer.__dataclass_fields__.keys():
        return Layer(**{k: ld[k] for k in _LAYER_KEYS})
    layer = object.__new__(Layer)
    layer.__dict__.update(ld)
    return layer


_RECURRENT_KEYS = tuple(RecurrentLayer.__dataclass_fields__)
