"""Where one value of the cache lives: in the state file, and in llama.cpp's live cache tensor."""

from __future__ import annotations

from dataclasses import dataclass

from kvfast.structure import Layer, Stream

# bytes per block, and where a value's quant byte sits in its block (after d, m, qh)
_QUANT = {
    "q8_0": (34, 2),
    "q4_0": (18, 2),
    "iq4_nl": (18, 2),
    "q4_1": (20, 4),
    "q5_0": (22, 6),
    "q5_1": (24, 8),
}
_FLOAT = {"f32": 4, "f16": 2, "bf16": 2}


@dataclass(frozen=True)
class Where:
    """One value's coordinates, checked against the record that holds it."""

    layer: Layer
    kind: str
    cells: int
    cell: int
    index: int  # value index within the cell's row: head * head_dim + elem
    transposed: bool

    @property
    def type(self) -> str:
        t = self.layer.k_type if self.kind == "k" else self.layer.v_type
        assert t is not None
        return t

    @property
    def row_bytes(self) -> int:
        rb = self.layer.k_row_bytes if self.kind == "k" else self.layer.v_row_bytes
        assert rb is not None
        return rb

    @property
    def n_embd(self) -> int:
        n = self.layer.n_embd_k if self.kind == "k" else self.layer.n_embd_v
        assert n is not None
        return n


def locate(
    stream: Stream, layer: int, cell: int, head: int, elem: int, kind: str, head_dim: int | None
) -> Where:
    if kind not in ("k", "v"):
        raise ValueError(f"kind must be 'k' or 'v', not {kind!r}")
    if not 0 <= layer < len(stream.layers):
        raise ValueError(f"layer {layer} out of range: the stream has {len(stream.layers)} layers")
    ly = stream.layers[layer]
    n_embd = ly.n_embd_k if kind == "k" else ly.n_embd_v
    if n_embd is None:
        raise ValueError(f"layer {layer} has no V record")
    hd = head_dim or n_embd
    if not 0 <= head < n_embd // hd or not 0 <= elem < hd:
        raise ValueError(f"head {head} / elem {elem} out of range: {n_embd // hd} heads of {hd} values")
    if not 0 <= cell < stream.cell_count:
        raise ValueError(f"cell {cell} out of range: the stream has {stream.cell_count} cells")
    return Where(ly, kind, stream.cell_count, cell, head * hd + elem, kind == "v" and stream.v_trans)


def value_byte(type_name: str, index: int) -> int:
    """Offset within a row of the byte holding value `index` (for 4- and 5-bit types: its low bits)."""
    if type_name in _FLOAT:
        return index * _FLOAT[type_name]
    block_bytes, quants = _QUANT[type_name]
    i = index % 32
    return index // 32 * block_bytes + quants + (i if type_name == "q8_0" else i % 16)


def file_offset(w: Where, record_offset: int) -> int:
    if w.transposed:
        return record_offset + (w.index * w.cells + w.cell) * _FLOAT[w.type]
    return record_offset + w.cell * w.row_bytes + value_byte(w.type, w.index)


def tensor_offset(w: Where, n_ctx: int, n_stream: int, stream: int) -> int:
    """Offset from the start of the layer's K (or V) tensor of shape [n_embd, n_ctx / n_stream, n_stream],
    assuming the i-th written cell is cell i of the live cache (as after one decode into a fresh context)."""
    kv_size = n_ctx // n_stream
    if not 0 <= w.cell < kv_size or not 0 <= stream < n_stream:
        raise ValueError(f"cell {w.cell} / stream {stream} outside a cache of {n_stream} x {kv_size} cells")
    if w.transposed:
        el = _FLOAT[w.type]
        return stream * kv_size * w.n_embd * el + (w.index * kv_size + w.cell) * el
    return stream * kv_size * w.row_bytes + w.cell * w.row_bytes + value_byte(w.type, w.index)
