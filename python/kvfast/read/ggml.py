"""The ggml types a KV cache can hold: kvfast-core's table (``types.rs``), the only copy."""

from __future__ import annotations

from typing import NamedTuple

from kvfast import _kvfast


class GgmlType(NamedTuple):
    """One type's layout: ``id`` is ggml's ``enum ggml_type``; a row is whole blocks."""

    id: int
    #: Values per block (1 for f32, f16 and bf16).
    block_len: int
    block_bytes: int
    #: Offset in a block of its first quant byte, after the scale, min and high bits (0 for floats).
    quants_at: int


#: name -> layout, in kvfast-core's order (f32, f16, bf16, q8_0, q4_0, ...).
TYPES: dict[str, GgmlType] = {name: GgmlType(*t) for name, t in _kvfast.ggml_types().items()}


def is_float(name: str) -> bool:
    """f32, f16 or bf16: one value a block, never quantized (nor rotated by llama.cpp); False for a
    name that is no type."""
    t = TYPES.get(name)
    return t is not None and t.block_len == 1


def value_byte(name: str, index: int) -> int:
    """Offset within a row of the byte holding value `index`: its element for a float type; for a
    quantized one its quant byte (q8_0: one a value; 4- and 5-bit types: value j and j + 16 of a
    block share byte j, j in the low nibble)."""
    t = TYPES[name]
    i = index % t.block_len
    return index // t.block_len * t.block_bytes + t.quants_at + i % (t.block_bytes - t.quants_at)
