"""The types of kvfast's index columns, the same in every table it hands out (values, statistics,
comparisons, tokens, layouts, exports), so frames of different states and tables concat and join.

Each is as narrow as llama.cpp's own bounds allow, a third to a half of int32's bytes: ``cache``
(< 8) and ``stream`` (< 256, LLAMA_MAX_SEQ) UInt8, ``layer`` and ``model_layer`` (< 4096) UInt16,
``kind`` an Enum of k, v, r, s (one byte), ``cell`` UInt32, ``pos`` Int32 (llama.cpp's
llama_pos), ``seq_id`` UInt8 (llama.cpp refuses ids of LLAMA_MAX_SEQ = 256 or more), ``head``
UInt16, ``channel`` UInt32. 18 bytes a row in all, against 37 as int32 and text. Cast to wider
types where another frame needs them (``pl.col("layer").cast(pl.Int64)``).
"""

import polars as pl

from kvfast import _kvfast

#: kvfast-core's record kinds (k, v, r, s), one byte each.
KIND = pl.Enum(_kvfast.KINDS)

#: The ggml types a KV cache can hold, in kvfast-core's order (f32, f16, bf16, q8_0, q4_0, ...):
#: the ``k_type`` and ``v_type`` columns of scans and exports, one byte each.
GGML_TYPE = pl.Enum(list(_kvfast.ggml_types()))

_POLARS: dict[str, pl.DataType] = {
    "string": pl.String(),
    "uint8": pl.UInt8(),
    "uint16": pl.UInt16(),
    "uint32": pl.UInt32(),
    "int32": pl.Int32(),
    "kind": KIND,
}

#: Every index column's type, as kvfast-core defines it (``kvfast_core::plan::columns::INDEX``).
INDEX: dict[str, pl.DataType] = {name: _POLARS[ty] for name, ty in _kvfast.INDEX_COLUMNS.items()}
