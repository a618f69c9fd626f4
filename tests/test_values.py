"""Values: every fixture against an independent NumPy decoding, Arrow/Polars tables, zero-copy, GIL."""

import threading
from pathlib import Path

import gguf
import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from conftest import DATA, STATE_FILES, proc_status_kb
from quants import decode

import kvfast
from kvfast import synth

QUANTS = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]


def expected_rows(path: Path, d: kvfast.State, cache: int, layer: int, kind: str) -> np.ndarray:
    raw = path.read_bytes()
    s = next(x for x in d.caches[cache].streams if x.cell_count)
    ly = s.layers[layer]
    ty, off, nb, n = (
        (ly.k_type, ly.k_offset, ly.k_nbytes, ly.n_embd_k)
        if kind == "k"
        else (ly.v_type, ly.v_offset, ly.v_nbytes, ly.n_embd_v)
    )
    vals = decode(ty, raw[off : off + nb])
    if kind == "v" and s.v_trans:
        return vals.reshape(n, s.cell_count).T
    return vals.reshape(s.cell_count, n)


def test_every_fixture_decodes_like_numpy(state_file: Path) -> None:
    # the stored numbers (rotated ones included: test_rotation.py checks the undoing)
    with kvfast.open(state_file, rotation="none") as d:
        for c in d.caches:
            for layer in range(c.n_layer):
                for kind in "kv":
                    want = expected_rows(state_file, d, c.index, layer, kind)
                    got = d.values(layer, kind, cache=c.index, dtype="float32")
                    np.testing.assert_array_equal(got, want)
                    stored = d.values(layer, kind, cache=c.index)
                    assert stored.dtype == (
                        np.float16 if c.streams[0].layers[layer].k_type == "f16" else np.float32
                    )
                    np.testing.assert_array_equal(stored.astype(np.float32), want)


@pytest.mark.parametrize("ty", QUANTS + ["bf16"])
def test_bit_exact_with_gguf_dequantize(tmp_path: Path, ty: str) -> None:
    path = tmp_path / "s.bin"
    synth.write_state(path, cells=33, n_layer=2, n_embd_k=256, k_type=ty, v_type="f16", seed=7)
    with kvfast.open(path, rotation="none") as d:
        ly = d.caches[0].streams[0].layers[1]
        raw = path.read_bytes()[ly.k_offset : ly.k_offset + ly.k_nbytes]
        qtype = getattr(gguf.GGMLQuantizationType, ty.upper())
        ref = gguf.quants.dequantize(np.frombuffer(raw, np.uint8).reshape(33, -1), qtype)
        got = d.values(1, "k")
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.view(np.uint32), ref.astype(np.float32).view(np.uint32))
        np.testing.assert_array_equal(got.ravel(), decode(ty, raw))


def _block(d: float, quants: bytes, m: float | None = None, qh: int | None = None) -> bytes:
    out = np.float16(d).tobytes() + (b"" if m is None else np.float16(m).tobytes())
    return out + (b"" if qh is None else qh.to_bytes(4, "little")) + quants


def test_hand_built_blocks(tmp_path: Path) -> None:
    nibbles = bytes(range(16))  # low nibble j, high nibble 0
    cases = {
        "q8_0": (_block(0.5, bytes((i - 16) & 0xFF for i in range(32))), [(i - 16) * 0.5 for i in range(32)]),
        "q4_0": (_block(2.0, nibbles), [(j - 8) * 2.0 for j in range(16)] + [-16.0] * 16),
        "q4_1": (_block(1.0, nibbles, m=-3.0), [j - 3.0 for j in range(16)] + [-3.0] * 16),
        "q5_0": (_block(1.0, nibbles, qh=1 << 16), [j - 16.0 for j in range(16)] + [0.0] + [-16.0] * 15),
        "q5_1": (
            _block(0.5, nibbles, m=1.0, qh=0xFFFFFFFF),
            [(j + 16) * 0.5 + 1 for j in range(16)] + [9.0] * 16,
        ),
        "iq4_nl": (_block(1.0, nibbles), [float(x) for x in decode("iq4_nl", _block(1.0, nibbles))]),
    }
    cases["iq4_nl"] = (
        _block(1.0, nibbles),
        [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113] + [-127] * 16,
    )
    for ty, (block, want) in cases.items():
        path = tmp_path / f"{ty}.bin"
        with open(path, "wb") as f:
            f.write(np.array([0xAF143CD8, 0, 1, 1, 0, 1, 0, 0, 1], "<u4").tobytes())
            f.write(np.int32(synth.TYPES[ty][0]).tobytes() + np.uint64(len(block)).tobytes() + block)
            f.write(np.int32(1).tobytes() + np.uint64(64).tobytes() + bytes(64))
        with kvfast.open(path) as d:
            np.testing.assert_array_equal(d.values(0, "k")[0], np.array(want, np.float32), err_msg=ty)


@pytest.mark.parametrize("folder", ["qwen3tiny-q8_0-fa", "qwen3tiny-q4_0-q4_1-fa"])
def test_quantized_caches_agree_with_f16(folder: str) -> None:
    ref = kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin")
    with kvfast.open(DATA / folder / "seq-0.bin") as q:
        for layer in (0, 1):
            # later layers read a quantized cache upstream, so they drift a little more
            slack = 1.05 if layer == 0 else 4.0
            for kind in "kv":
                a = ref.values(layer, kind).astype(np.float32).reshape(-1, 32)
                b = q.values(layer, kind).reshape(-1, 32)
                ty = (
                    q.caches[0].streams[0].layers[layer].k_type
                    if kind == "k"
                    else q.caches[0].streams[0].layers[layer].v_type
                )
                amax, rng = np.abs(a).max(1), a.max(1) - a.min(1)
                bound = {"q8_0": amax / 254, "q4_0": amax / 8, "q4_1": rng / 30}[ty]
                err = np.abs(a - b).max(1)
                assert (err <= bound * slack + 1e-3).all(), (ty, layer, kind, (err / bound).max())


def test_long_table_matches_values() -> None:
    path = DATA / "qwen3tiny-q4_0-q4_1-fa/seq-0.ggsq"
    with kvfast.open(path, head_dim=32) as d:
        df = d.to_polars()
        assert df.columns == [
            "cache",
            "stream",
            "layer",
            "model_layer",
            "kind",
            "cell",
            "pos",
            "seq_id",
            "head",
            "values",
        ]
        assert df.height == 2 * 2 * 7 * 2  # layers x kinds x cells x heads
        assert df.schema["values"] == pl.Array(pl.Float32, 32)
        row = df.filter(layer=1, kind="v", cell=5, head=1)
        np.testing.assert_array_equal(row["values"].to_numpy()[0], d.values(1, "v")[5, 32:64])
        assert row["pos"][0] == 5 and row["seq_id"][0] == 0
        one = d.to_polars(layers=[1], kinds=["k"], heads=[0])
        assert one.height == 7 and set(one["head"]) == {0}


def test_f16_stays_f16_and_dtype_float32_decodes() -> None:
    with kvfast.open(DATA / "qwen3tiny-f16-nofa/seq-0.bin", head_dim=32) as d:
        df = d.to_polars()
        assert df.schema["values"] == pl.Array(pl.Float16, 32)
        f32 = d.to_polars(dtype="float32")
        assert f32.schema["values"] == pl.Array(pl.Float32, 32)
        v = df.filter(kind="v", layer=0, head=1).sort("cell")["values"].to_numpy()
        np.testing.assert_array_equal(v, d.values(0, "v")[:, 32:])


def test_shared_cells_appear_once_per_sequence() -> None:
    with kvfast.open(DATA / "qwen3tiny-3seq-shared/state.bin") as whole:
        df = whole.to_polars(kinds=["k"])
        assert df.height == 2 * (9 + 12 + 15)
        for q in range(3):
            with kvfast.open(DATA / f"qwen3tiny-3seq-shared/seq-{q}.bin") as seq:
                mine = df.filter(pl.col("seq_id") == q).sort("layer", "pos")
                for layer in range(2):
                    rows = mine.filter(layer=layer)
                    assert rows["pos"].to_list() == list(range(len(seq.caches[0].streams[0].pos)))
                    np.testing.assert_array_equal(rows["values"].to_numpy(), seq.values(layer, "k"))


def test_arrow_capsule_consumers() -> None:
    with kvfast.open(DATA / "gemma3-270m-f16-fa/state.ggsn") as d:
        t = pa.table(d)
        assert t.num_rows == 2 * 18 * 8
        assert pl.DataFrame(d).height == t.num_rows
        vt = t.schema.field("values").type
        assert (vt.value_type, vt.list_size) == (pa.float16(), 256)
        assert d.to_arrow().equals(t)


def _inside(addr: int, d: kvfast.State) -> bool:
    base = d._live().map_address
    return base <= addr < base + d.size


def test_zero_copy_views_of_the_map() -> None:
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin") as d:  # offsets even: views
        v = d.values(1, "k")
        assert _inside(v.ctypes.data, d) and not v.flags.writeable
        t = d.to_arrow(layers=[1], kinds=["k"])
        assert _inside(t.column("values").chunk(0).values.buffers()[1].address, d)
    with kvfast.open(DATA / "qwen3tiny-f16-fa/state.bin") as d:  # arch "qwen3": odd offsets, copies
        assert d.caches[0].streams[0].layers[0].k_offset % 2 == 1
        v = d.values(0, "k")
        assert not _inside(v.ctypes.data, d)
        np.testing.assert_array_equal(v, expected_rows(DATA / "qwen3tiny-f16-fa/state.bin", d, 0, 0, "k"))


def test_large_f16_table_does_not_copy(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    size = synth.write_state(path, cells=4096, n_layer=16, n_embd_k=1024)  # 512 MiB
    before = proc_status_kb("RssAnon")
    with kvfast.open(path, head_dim=128) as d:
        t = d.to_arrow()
        df = d.to_polars()
        grown = proc_status_kb("RssAnon") - before
        assert t.num_rows == df.height == 4096 * 16 * 2 * 8
    assert grown < 96 * 1024, f"RssAnon grew {grown} KiB building tables of a {size >> 20} MiB state"


def test_decoding_releases_the_gil(tmp_path: Path) -> None:
    path = tmp_path / "q8.bin"
    synth.write_state(path, cells=8192, n_layer=4, n_embd_k=4096, k_type="q8_0")
    d = kvfast.open(path)
    done = threading.Event()
    ticks = 0

    def work() -> None:
        for _ in range(3):
            for layer in range(4):
                d.values(layer, "k")
        done.set()

    t = threading.Thread(target=work)
    t.start()
    while not done.is_set():
        ticks += 1
    t.join()
    assert ticks > 10_000, f"the main thread ran {ticks} times while Rust decoded"


def test_head_dim_must_divide_rows() -> None:
    with pytest.raises(ValueError, match="head_dim 48 does not divide the 64"):
        kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin", head_dim=48).to_polars()


@pytest.mark.parametrize("path", [p for p in STATE_FILES if p.parent.name.startswith("qwen3tiny")], ids=str)
def test_model_gives_heads(path: Path) -> None:
    with kvfast.open(path, model=DATA / "models/tiny-qwen3.gguf") as d:
        df = d.to_polars()
        stored = pl.Float16 if d.caches[0].streams[0].layers[0].k_type == "f16" else pl.Float32
        assert df.schema["values"] == pl.Array(stored, 32)
        assert sorted(df["head"].unique()) == [0, 1]
        assert d.caches[0].streams[0].layers[1].model_layer == 1


def test_model_mismatch_names_both_numbers() -> None:
    # a state of the same arch (another arch's is refused by its name first: test_faults_35)
    with pytest.raises(kvfast.ModelMismatchError, match="2 KV heads x 32 = 64 .* the state has 256"):
        kvfast.open(DATA / "qwen3hd128-f16-fa/state.ggsn", model=DATA / "models/tiny-qwen3.gguf")


def _gemma3_gguf(path: Path) -> None:
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(18)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_key_length(256)
    w.add_value_length(256)
    w.add_embedding_length(640)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_iswa_model_layers(tmp_path: Path) -> None:
    model = tmp_path / "gemma3.gguf"
    _gemma3_gguf(model)
    with kvfast.open(DATA / "gemma3-270m-f16-fa/seq-0.ggsq", model=model) as d:
        assert [ly.model_layer for ly in d.caches[0].streams[0].layers] == [5, 11, 17]
        assert [ly.model_layer for ly in d.caches[1].streams[0].layers] == [
            i for i in range(18) if i % 6 != 5
        ]
        df = d.to_polars(kinds=["k"])
        assert sorted(df["model_layer"].unique()) == list(range(18))
        assert df.filter(cache=0, layer=2)["model_layer"].unique().to_list() == [17]
    with kvfast.open(DATA / "gemma3-270m-f16-fa/seq-0.ggsq") as d:
        assert d.caches[0].streams[0].layers[0].model_layer is None


def test_addresses(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    synth.write_state(path, cells=40, n_layer=28, n_embd_k=1024)
    raw = path.read_bytes()
    with kvfast.open(path, head_dim=128) as d:
        assert d.tensor_address(layer=5, cell=37, head=3, elem=10, n_ctx=4096) == 76_564
        a = d.address(layer=5, cell=37, head=3, elem=10)
        assert np.frombuffer(raw, "<f2", count=1, offset=a)[0] == d.values(5, "k")[37, 3 * 128 + 10]
        # a non-unified cache of 4 streams: [1024, 1024, 4]
        assert d.tensor_address(layer=0, cell=1, n_ctx=4096, n_stream=4) == 2048
    nofa = DATA / "qwen3tiny-f16-nofa/seq-0.bin"
    with kvfast.open(nofa, head_dim=32) as d:
        raw = nofa.read_bytes()
        a = d.address(layer=1, cell=4, head=1, elem=3, kind="v")
        assert np.frombuffer(raw, "<f2", count=1, offset=a)[0] == d.values(1, "v")[4, 35]
        assert d.tensor_address(layer=1, cell=4, head=1, elem=3, kind="v", n_ctx=256) == (35 * 256 + 4) * 2
    q8 = DATA / "qwen3tiny-q8_0-fa/seq-0.bin"
    with kvfast.open(q8) as d:
        raw = q8.read_bytes()
        a = d.address(layer=0, cell=2, elem=40)
        block = d.caches[0].streams[0].layers[0].k_offset + 2 * 68 + 34
        scale = np.frombuffer(raw, "<f2", count=1, offset=block)[0].astype(np.float32)
        assert a == block + 2 + 8
        assert np.frombuffer(raw, np.int8, count=1, offset=a)[0] * scale == d.values(0, "k")[2, 40]
