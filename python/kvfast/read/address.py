"""Where one value of the cache lives: in the state file, and in llama.cpp's live cache tensor."""

from __future__ import annotations

from dataclasses import dataclass

from kvfast.errors import SelectionError
from kvfast.read import ggml, select
from kvfast.read.structure import Cache, Layer, Recurrent, RecurrentLayer, Stream

# From the one type table: bytes per value of the float types; bytes per block and where the
# quants start in a block of the quantized ones.
FLOAT_BYTES = {n: t.block_bytes for n, t in ggml.TYPES.items() if t.block_len == 1}
QUANT_BLOCKS = {n: (t.block_bytes, t.quants_at) for n, t in ggml.TYPES.items() if t.block_len > 1}


@dataclass(frozen=True)
class RecordRef:
    """One K, V, R or S record of one stream, with that kind's fields picked out."""

    stream: Stream
    layer: Layer | RecurrentLayer
    kind: str
    type: str
    offset: int  # file offset of the first row
    n_embd: int
    row_bytes: int

    @property
    def transposed(self) -> bool:
        return self.kind == "v" and self.stream.v_trans


def record_ref(
    caches: list[Cache],
    cache: int | None,
    layer: int,
    kind: str,
    stream: int | None = None,
    recurrent: Recurrent | None = None,
) -> RecordRef:
    """The record of (cache, stream, layer, kind); ``stream=None``: the first stream holding cells;
    ``cache=None``: the first attention cache for K and V, the `recurrent` part for R and S.
    Raises :class:`kvfast.SelectionError` for anything out of range or not an integer."""
    kind = select.kind(kind)
    if kind in select.RECURRENT_KINDS:
        return _recurrent_ref(recurrent, cache, layer, kind, stream)
    if recurrent is not None and cache is not None and cache == recurrent.index:
        raise SelectionError(
            f"cache {cache} is the recurrent part: its records are kinds 'r' and 's', not {kind!r}"
        )
    if not caches:
        raise SelectionError(f"the state has no attention cache: no {kind.upper()} records")
    cache = select.index(
        "cache", 0 if cache is None else cache, len(caches), f"the state has {len(caches)} attention caches"
    )
    streams = caches[cache].streams
    if stream is not None:
        stream = select.index("stream", stream, len(streams), f"cache {cache} has {len(streams)} streams")
    s = streams[stream] if stream is not None else next((x for x in streams if x.cell_count), streams[0])
    where = f"cache {cache} has {len(s.layers)} layers{_other_caches(caches, cache, layer)}"
    layer = select.index("layer", layer, len(s.layers), where)
    ly = s.layers[layer]
    if kind == "k":
        return RecordRef(s, ly, kind, ly.k_type, ly.k_offset, ly.n_embd_k, ly.k_row_bytes)
    if ly.v_type is None or ly.v_offset is None or ly.n_embd_v is None or ly.v_row_bytes is None:
        raise SelectionError(
            f"cache {cache} layer {layer} has no V record: the cache is V-less (MLA: its K rows hold the"
            " compressed latent and the RoPE part, from which attention computes V); read kind 'k'"
        )
    return RecordRef(s, ly, kind, ly.v_type, ly.v_offset, ly.n_embd_v, ly.v_row_bytes)


def _recurrent_ref(
    recurrent: Recurrent | None, cache: int | None, layer: int, kind: str, stream: int | None
) -> RecordRef:
    if recurrent is None:
        raise SelectionError(f"kind {kind!r} is the recurrent part's, and the state has none")
    if cache is not None and select.integer("cache", cache) != recurrent.index:
        raise SelectionError(
            f"kind {kind!r} is the recurrent part's, cache {recurrent.index} (cache {cache} is an"
            " attention cache)"
        )
    if stream is not None:
        select.index("stream", stream, 1, "the recurrent part has 1 stream")
    n = len(recurrent.layers)
    layer = select.index(
        "layer", layer, n, f"the recurrent part has {n} layers (of the model's {recurrent.n_layer})"
    )
    ly = recurrent.layers[layer]
    if kind == "r":
        return RecordRef(recurrent.stream, ly, kind, ly.r_type, ly.r_offset, ly.n_embd_r, ly.r_row_bytes)
    return RecordRef(recurrent.stream, ly, kind, ly.s_type, ly.s_offset, ly.n_embd_s, ly.s_row_bytes)


def _other_caches(caches: list[Cache], cache: int, layer: object) -> str:
    """A hint naming a cache that has `layer` (an iSWA state's first cache holds few layers)."""
    if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
        return ""
    have = [c for c in caches if c.index != cache and c.n_layer > layer]
    if not have:
        return ""
    c = have[0]
    return f"; cache {c.index} has {c.n_layer} (--cache {c.index}, or cache={c.index})"


@dataclass(frozen=True)
class Where:
    """One value's coordinates, checked against the record that holds it."""

    rec: RecordRef
    cell: int
    index: int  # value index within the cell's row: head * head_dim + elem


def locate(rec: RecordRef, cell: int, head: int, elem: int, head_dim: int | None) -> Where:
    """`head_dim` was checked at open (a positive integer dividing the row); None: the whole row."""
    hd = rec.n_embd if head_dim is None or rec.kind in select.RECURRENT_KINDS else head_dim
    if rec.n_embd == 0:
        raise SelectionError(
            f"{rec.kind.upper()} rows of 0 values (a state the model does not keep): no value"
        )
    if hd <= 0 or rec.n_embd % hd:
        raise SelectionError(f"head_dim {hd} does not divide the {rec.n_embd} values per row")
    n_heads = rec.n_embd // hd
    head = select.index("head", head, n_heads, f"{n_heads} heads of {hd} values")
    elem = select.index("elem", elem, hd, f"{n_heads} heads of {hd} values")
    cell = select.index("cell", cell, rec.stream.cell_count, f"the stream has {rec.stream.cell_count} cells")
    return Where(rec, cell, head * hd + elem)


def value_byte(type_name: str, index: int) -> int:
    """Offset within a row of the byte holding value `index` (for 4- and 5-bit types: its low bits)."""
    return ggml.value_byte(type_name, index)


def file_offset(w: Where) -> int:
    r = w.rec
    if r.transposed:
        return r.offset + (w.index * r.stream.cell_count + w.cell) * FLOAT_BYTES[r.type]
    return r.offset + w.cell * r.row_bytes + value_byte(r.type, w.index)


def tensor_offset(w: Where, n_ctx: int, n_stream: int) -> int:
    """Offset from the start of the layer's K (or V) tensor of shape [n_embd, n_ctx / n_stream, n_stream],
    assuming the i-th written cell is cell i of the live cache (as after one decode into a fresh context)."""
    r = w.rec
    n_ctx = select.positive("n_ctx", n_ctx)
    n_stream = select.positive("n_stream", n_stream)
    kv_size = n_ctx // n_stream
    stream = r.stream.index
    if not 0 <= w.cell < kv_size or not 0 <= stream < n_stream:
        raise SelectionError(
            f"cell {w.cell} / stream {stream} outside a cache of {n_stream} x {kv_size} cells"
        )
    if r.transposed:
        el = FLOAT_BYTES[r.type]
        return stream * kv_size * r.n_embd * el + (w.index * kv_size + w.cell) * el
    return stream * kv_size * r.row_bytes + w.cell * r.row_bytes + value_byte(r.type, w.index)
