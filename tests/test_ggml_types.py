"""The one ggml type table (kvfast-core's, exported) against gguf-py's, and what is built on it."""

from __future__ import annotations

import gguf
import pytest

from kvfast import _kvfast, synth
from kvfast.read import ggml
from kvfast.read.address import value_byte


@pytest.mark.parametrize("name", list(ggml.TYPES))
def test_the_table_matches_gguf_py(name: str) -> None:
    t = ggml.TYPES[name]
    q = gguf.GGMLQuantizationType[name.upper()]
    assert t.id == q.value
    assert (t.block_len, t.block_bytes) == gguf.GGML_QUANT_SIZES[q]


def test_every_user_of_the_table_sees_the_same_table() -> None:
    assert list(ggml.TYPES) == ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]
    assert synth.TYPES is ggml.TYPES
    assert {n: tuple(t) for n, t in ggml.TYPES.items()} == _kvfast.ggml_types()


def test_where_a_value_sits_in_its_row() -> None:
    # floats: element by element
    assert value_byte("f16", 5) == 10 and value_byte("f32", 5) == 20 and value_byte("bf16", 3) == 6
    # q8_0: after the f16 scale of each 34-byte block, a byte a value
    assert value_byte("q8_0", 0) == 2 and value_byte("q8_0", 33) == 34 + 2 + 1
    # q4_1: d, m, then value j and j + 16 share byte j
    assert value_byte("q4_1", 3) == 4 + 3 and value_byte("q4_1", 19) == 4 + 3
    # q5_0: d, 4 bytes of high bits, then the nibbles; second block
    assert value_byte("q5_0", 32 + 17) == 22 + 6 + 1
    assert value_byte("q5_1", 31) == 8 + 15 and value_byte("iq4_nl", 16) == 2


def test_float_types() -> None:
    assert [n for n in ggml.TYPES if ggml.is_float(n)] == ["f32", "f16", "bf16"]
    assert not ggml.is_float("q3_k")
