"""Streams of one cache whose layers disagree are refused at open (issue 11's reproducer).

A cache's streams split one tensor per layer, so they share every layer's type and row width. A
crafted file of two streams with rows of 8 and 64 values once opened, and then quant_error read past
a buffer (stream 1's rows went through a round trip sized for stream 0's) and stats(by="channel")
silently cut stream 1's rows to stream 0's width.
"""

import struct
from pathlib import Path

import numpy as np
import pytest

import kvfast
from kvfast._kvfast import State

IO_MAGIC = 0xAF143CD8
F16, Q8_0 = 1, 8


def _stream(
    cells: int, k: tuple[int, int], v: tuple[int, int], v_trans: bool = False, seed: int = 0
) -> bytes:
    """One stream of one layer: cell meta (sequence 0), then K and V records of (type id, row bytes)."""
    rng = np.random.default_rng(seed)
    out = struct.pack("<I", cells)
    for p in range(cells):
        out += struct.pack("<iIi", p, 1, 0)
    out += struct.pack("<II", int(v_trans), 1)
    for i, (ty, rb) in enumerate((k, v)):
        if i == 1 and v_trans:
            out += struct.pack("<iII", ty, 2, rb // 2)
        else:
            out += struct.pack("<iQ", ty, rb)
        # f16 values in [-4, 4]; for q8_0 the bytes are only ever walked, not decoded
        out += rng.uniform(-4, 4, rb * cells // 2).astype("<f2").tobytes()
    return out


def _state(*streams: bytes) -> bytes:
    return struct.pack("<IiI", IO_MAGIC, 0, len(streams)) + b"".join(streams)


def two_widths() -> bytes:
    """The reproducer: layer 0 rows of 8 f16 values in stream 0, of 64 in stream 1."""
    return _state(_stream(2, (F16, 16), (F16, 16)), _stream(2, (F16, 128), (F16, 128), seed=1))


def test_the_reproducer_is_about_half_a_kilobyte() -> None:
    assert 500 <= len(two_widths()) < 800


def test_streams_of_different_widths_raise_at_open(tmp_path: Path) -> None:
    raw = two_widths()
    with pytest.raises(kvfast.FormatError) as e:
        State.from_bytes(raw)
    err = e.value
    assert err.field == "cache 0 stream 1 layer 0 k row_bytes"
    assert err.kind == "format"
    assert isinstance(err.offset, int)
    assert struct.unpack_from("<Q", raw, err.offset) == (128,)
    assert f"byte {err.offset}" in str(err) and "16 as in stream 0" in str(err)
    path = tmp_path / "two-widths.bin"
    path.write_bytes(raw)
    with pytest.raises(kvfast.KvfastError):
        kvfast.open(path)


@pytest.mark.parametrize(
    ("second", "field"),
    [
        (_stream(1, (F16, 16), (F16, 32)), "cache 0 stream 1 layer 0 v row_bytes"),
        (_stream(1, (Q8_0, 68), (F16, 16)), "cache 0 stream 1 layer 0 k type"),
        (_stream(1, (F16, 16), (F16, 16), v_trans=True), "cache 0 stream 1 v_trans"),
    ],
    ids=["v-width", "k-type", "v-trans"],
)
def test_every_disagreement_is_named(second: bytes, field: str) -> None:
    first = _stream(1, (F16, 68) if "k type" in field else (F16, 16), (F16, 16))
    with pytest.raises(kvfast.FormatError) as e:
        State.from_bytes(_state(first, second))
    assert e.value.field == field


def test_agreeing_streams_give_their_own_values(tmp_path: Path) -> None:
    s0, s1 = _stream(2, (F16, 128), (F16, 128)), _stream(3, (F16, 128), (F16, 128), seed=1)
    path = tmp_path / "two-streams.bin"
    path.write_bytes(_state(s0, s1))
    want = np.frombuffer(s1[4 + 3 * 12 + 8 + 12 :][: 3 * 128], dtype="<f2").astype(np.float32)
    with kvfast.open(path, head_dim=64) as d:
        got = d.values(0, "k", stream=1, dtype="float32")
        assert got.shape == (3, 64)
        np.testing.assert_array_equal(got.ravel(), want)
        chan = d.stats(by="channel", kinds="k")
        assert len(chan) == 64
        both = np.concatenate([d.values(0, "k", stream=0, dtype="float32"), got])
        np.testing.assert_allclose(chan["absmax"].to_numpy(), np.abs(both).max(axis=0))
        q = d.quant_error("q8_0", kinds="k")
        assert q["count"].to_list() == [5 * 64]
        assert np.isfinite(q["mse"].to_numpy()).all()
