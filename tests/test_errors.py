"""Malformed input always raises a KvfastError naming a byte offset: never a crash or a hang."""

import struct
from pathlib import Path

import pytest
from conftest import DATA, STATE_FILES

import kvfast
from kvfast._kvfast import State

SMALL = [f for f in STATE_FILES if f.stat().st_size < 20_000]


def _check(err: kvfast.KvfastError, size: int) -> None:
    assert isinstance(err.offset, int) and 0 <= err.offset <= size
    assert isinstance(err.field, str) and err.field
    assert f"byte {err.offset}" in str(err)
    assert err.kind in ("truncated", "format", "ambiguous", "unsupported_version")


@pytest.mark.parametrize("path", SMALL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_truncated_at_every_byte(path: Path) -> None:
    raw = path.read_bytes()
    for n in range(len(raw)):
        with pytest.raises(kvfast.KvfastError) as e:
            State.from_bytes(raw[:n])
        _check(e.value, n)


def test_truncated_gemma_at_many_offsets() -> None:
    raw = (DATA / "gemma3-270m-f16-fa/state.ggsn").read_bytes()
    for n in list(range(800)) + list(range(800, len(raw), 997)) + [len(raw) - 1]:
        with pytest.raises(kvfast.KvfastError) as e:
            State.from_bytes(raw[:n])
        _check(e.value, n)


@pytest.mark.parametrize("path", SMALL, ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize("value", [0x00, 0xFF, 0x7F, 0x80])
def test_corrupted_bytes(path: Path, value: int) -> None:
    raw = path.read_bytes()
    # every metadata byte, then a sample of the rows (a corrupted row value is still a valid state)
    with kvfast.open(path) as d:
        meta = d.layout().filter(role="meta")
    offsets = sorted({o + i for o, n in zip(meta["offset"], meta["nbytes"]) for i in range(n)})
    offsets += list(range(0, len(raw), 61))
    for off in offsets:
        bad = bytearray(raw)
        bad[off] = value
        try:
            State.from_bytes(bytes(bad))
        except kvfast.KvfastError as e:
            _check(e, len(raw))


def test_corrupted_counts_do_not_allocate() -> None:
    raw = bytearray((DATA / "qwen3tiny-f16-fa/seq-0.bin").read_bytes())
    raw[12:16] = struct.pack("<I", 0xFFFFFFFF)  # cell_count
    with pytest.raises(kvfast.TruncatedError) as e:
        State.from_bytes(bytes(raw))
    assert e.value.offset == 16 and "cell_count" not in e.value.field or "cell" in e.value.field
    raw = bytearray((DATA / "qwen3tiny-f16-fa/seq-0.ggsq").read_bytes())
    raw[8:12] = struct.pack("<I", 0xFFFFFFF0)  # n_token
    with pytest.raises(kvfast.TruncatedError) as e:
        State.from_bytes(bytes(raw))
    assert e.value.offset == 12 and "tokens" in e.value.field


def test_bad_type_names_field_and_offset() -> None:
    raw = bytearray((DATA / "qwen3tiny-f16-fa/seq-0.ggsq").read_bytes())
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.ggsq") as d:
        hdr = d.caches[0].streams[0].layers[1].k_offset - 12
    raw[hdr : hdr + 4] = struct.pack("<i", 99)
    with pytest.raises(kvfast.FormatError) as e:
        State.from_bytes(bytes(raw))
    assert e.value.offset == hdr and "layer 1 k type" in e.value.field
    assert "expected a cache type id" in str(e.value)


def test_row_bytes_that_are_not_whole_blocks() -> None:
    raw = bytearray((DATA / "qwen3tiny-q8_0-fa/seq-0.bin").read_bytes())
    raw[112:120] = struct.pack("<Q", 35)
    with pytest.raises(kvfast.FormatError) as e:
        State.from_bytes(bytes(raw))
    assert e.value.offset == 112 and "row_bytes" in e.value.field


def test_unsupported_versions() -> None:
    for name, version in (("seq-0.ggsq", 7), ("state.ggsn", 11), ("state.ggsn", 8)):
        raw = bytearray((DATA / "qwen3tiny-f16-fa" / name).read_bytes())
        raw[4:8] = struct.pack("<I", version)
        with pytest.raises(kvfast.UnsupportedVersionError) as e:
            State.from_bytes(bytes(raw))
        assert e.value.offset == 4 and str(version) in str(e.value)


def test_not_a_state(tmp_path: Path) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(kvfast.TruncatedError) as e:
        kvfast.open(empty)
    assert e.value.offset == 0
    text = tmp_path / "t.txt"
    text.write_text("hello, this is not a KV cache\n" * 50)
    with pytest.raises(kvfast.KvfastError):
        kvfast.open(text)
    with pytest.raises(kvfast.FormatError, match="GGUF"):
        kvfast.open(DATA / "models/tiny-qwen3.gguf")
    trailing = tmp_path / "trailing.bin"
    trailing.write_bytes((DATA / "qwen3tiny-f16-fa/seq-0.bin").read_bytes() + b"\x01\x02\x03\x04\x05")
    with pytest.raises(kvfast.KvfastError):
        kvfast.open(trailing)


def test_os_errors_stay_os_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        kvfast.open(tmp_path / "missing.bin")
    with pytest.raises(IsADirectoryError):
        kvfast.open(tmp_path)


def test_error_hierarchy() -> None:
    assert issubclass(kvfast.TruncatedError, kvfast.FormatError)
    assert issubclass(kvfast.FormatError, kvfast.KvfastError)
    assert issubclass(kvfast.UnsupportedVersionError, kvfast.KvfastError)
    assert issubclass(kvfast.ClosedError, kvfast.KvfastError)
