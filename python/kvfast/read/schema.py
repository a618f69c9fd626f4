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

KIND = pl.Enum(["k", "v", "r", "s"])

INDEX: dict[str, pl.DataType] = {
    "dump": pl.String(),
    "path": pl.String(),
    "cache": pl.UInt8(),
    "stream": pl.UInt8(),
    "layer": pl.UInt16(),
    "model_layer": pl.UInt16(),
    "kind": KIND,
    "cell": pl.UInt32(),
    "pos": pl.Int32(),
    "seq_id": pl.UInt8(),
    "head": pl.UInt16(),
    "channel": pl.UInt32(),
}
