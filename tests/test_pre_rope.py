"""Keys before RoPE (open(model=, pre_rope=True)), checked against llama.cpp's own keys: the fixtures
were written by llama.cpp, and layer 0's K of a token depends on the token alone before RoPE, so the
same token at two positions must give the same pre-RoPE keys (up to f16 rounding)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import kvfast
from kvfast import _kvfast
from kvfast.model.pre_rope import PreRopeError, model_rope

DATA = Path(__file__).parent / "data"
QWEN3 = DATA / "models" / "tiny-qwen3.gguf"
HD128 = DATA / "models" / "tiny-qwen3-hd128.gguf"
# token 14 is at position 6 of sequence 1 and position 14 of sequence 2
SHARED = DATA / "qwen3tiny-3seq-shared" / "state.bin"


def _k(table: pl.DataFrame, seq: int, pos: int) -> np.ndarray:
    rows = table.filter(seq_id=seq, pos=pos)["values"].to_list()
    return np.array(rows, dtype=np.float32)


def test_one_token_at_two_positions_has_one_key_before_rope() -> None:
    assert kvfast.open(SHARED.with_suffix(".ggsn")).tokens is not None
    roped = kvfast.open(SHARED, model=QWEN3).to_polars(layers=[0], kinds="k")
    pre = kvfast.open(SHARED, model=QWEN3, pre_rope=True).to_polars(layers=[0], kinds="k")
    assert np.abs(_k(roped, 1, 6) - _k(roped, 2, 14)).max() > 1.0  # the rope differs
    # f16 rounding of values up to ~3 (2^-10 relative), twice
    assert np.abs(_k(pre, 1, 6) - _k(pre, 2, 14)).max() < 4e-3
    # position 0 is not turned; V is never roped
    assert np.array_equal(_k(roped, 0, 0), _k(pre, 0, 0))
    v = kvfast.open(SHARED, model=QWEN3, pre_rope=True).to_polars(kinds="v")
    assert v.equals(kvfast.open(SHARED, model=QWEN3).to_polars(kinds="v"))


def test_every_pass_reads_keys_before_rope() -> None:
    roped, pre = kvfast.open(SHARED, model=QWEN3), kvfast.open(SHARED, model=QWEN3, pre_rope=True)
    assert pre.pre_rope and not roped.pre_rope
    # values (NumPy): f32, cell 0 (position 0) unchanged, later cells turned
    va, vb = roped.values(layer=0, kind="k"), pre.values(layer=0, kind="k")
    assert vb.dtype == np.float32 and np.array_equal(va[0].astype(np.float32), vb[0])
    assert np.abs(va[5].astype(np.float32) - vb[5]).max() > 0.1
    # the same numbers in the table
    t = pre.to_polars(layers=[0], kinds="k", heads=None).filter(stream=0)
    first = t.filter(pl.col("cell") == 5).sort("head")["values"].to_list()
    assert np.allclose(np.concatenate(first), vb[5])
    # statistics: the norm of a cell is kept (RoPE turns pairs), its channels are not
    sa = roped.stats(layers=[0], kinds="k").sort("cell", "seq_id", "head")
    sb = pre.stats(layers=[0], kinds="k").sort("cell", "seq_id", "head")
    assert np.allclose(sa["l2"], sb["l2"], rtol=1e-3)
    assert not np.allclose(sa["absmax"], sb["absmax"])
    ch = pre.stats(by="channel", layers=[0], kinds="k")
    assert not ch.equals(roped.stats(by="channel", layers=[0], kinds="k"))
    # compare: pre-RoPE against itself is exact, against roped keys not
    assert (
        kvfast.compare(pre, kvfast.open(SHARED, model=QWEN3, pre_rope=True), by="layer")["max_abs"].max() == 0
    )
    assert kvfast.compare(roped, pre, by="layer", kinds="k")["max_abs"].max() > 0.1


def test_rotation_is_undone_before_the_rope() -> None:
    # llama.cpp rotates the roped K of a quantized cache: undone in the other order, the q8_0 keys
    # would not match the f16 ones
    f16 = kvfast.open(DATA / "qwen3hd128-f16-fa" / "state.bin", model=HD128, pre_rope=True)
    q8 = kvfast.open(DATA / "qwen3hd128-q8_0-fa" / "state.bin", model=HD128, pre_rope=True)
    assert q8.rotation and any(r.group for r in q8.rotation)
    df = kvfast.compare(f16, q8, by="layer", kinds="k")
    assert df["rel_max"].max() < 0.05
    assert df["cosine_min"].min() > 0.999


def test_the_models_rope() -> None:
    r = model_rope(QWEN3, 32)
    assert r["global"]["neox"] is True and r["global"]["n_dims"] == 32
    assert r["global"]["freq_scale"] == 1.0 and r["global"]["ext_factor"] == 0.0


def test_without_a_model_or_with_m_rope_it_is_a_clear_error() -> None:
    with pytest.raises(PreRopeError, match="needs the model's GGUF") as e:
        kvfast.open(SHARED, head_dim=32, pre_rope=True)
    assert isinstance(e.value, kvfast.KvfastError) and e.value.field == "model"
    # M-RoPE: the sections from the header, height and width from the cell extension
    vl = kvfast.open(
        DATA / "qwen2vltiny-f16-fa" / "state.bin", model=DATA / "models" / "tiny-qwen2vl.gguf", pre_rope=True
    )
    assert vl.pre_rope and vl.stats(by="layer")["absmax"].is_finite().all()


def test_cli_pre_rope() -> None:
    run = [sys.executable, "-m", "kvfast", "stats", str(SHARED), "--by", "layer", "--json"]
    a = subprocess.run([*run, "--model", str(QWEN3)], check=False, capture_output=True, text=True)
    b = subprocess.run(
        [*run, "--model", str(QWEN3), "--pre-rope"], check=False, capture_output=True, text=True
    )
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    assert a.stdout != b.stdout
    c = subprocess.run([*run, "--pre-rope"], check=False, capture_output=True, text=True)
    assert c.returncode != 0 and "needs the model" in c.stderr


def test_scans_exports_and_compare_scan_read_keys_before_rope(tmp_path: Path) -> None:
    ref = kvfast.open(SHARED, model=QWEN3, pre_rope=True).to_polars(layers=[0], kinds="k")
    ref = ref.sort("cell", "seq_id", "head")
    keys = ["cell", "seq_id", "head"]

    def same(df: pl.DataFrame) -> bool:
        got = df.filter(pl.col("layer") == 0, pl.col("kind") == "k").sort(keys)
        return got.height == ref.height and np.array_equal(
            np.array(got["values"].to_list(), dtype=np.float32),
            np.array(ref["values"].to_list(), dtype=np.float32),
        )

    scanned = kvfast.scan(SHARED, model=QWEN3, pre_rope=True).collect()
    assert scanned.schema["values"] == pl.Array(pl.Float32, 32) and same(scanned)
    assert not same(kvfast.scan(SHARED, model=QWEN3).collect())
    stats = kvfast.scan_stats(SHARED, model=QWEN3, pre_rope=True, by="layer").collect()
    assert stats.drop("dump", "path").equals(
        kvfast.open(SHARED, model=QWEN3, pre_rope=True).stats(by="layer")
    )
    kvfast.export([SHARED], tmp_path / "out", model=QWEN3, pre_rope=True)
    assert same(kvfast.scan_export(tmp_path / "out").collect())
    with pytest.raises(PreRopeError):
        kvfast.export([SHARED], tmp_path / "bad", pre_rope=True)
    pre = kvfast.compare_scan(SHARED, [SHARED], model=QWEN3, pre_rope=True).collect()
    assert pre["max_abs"].max() == 0.0


def test_bad_rope_parameters_are_named(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_block_count(2)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(32)
    w.add_value_length(32)
    w.add_string("qwen3.rope.freq_base", "ten thousand")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(kvfast.PreRopeError) as e:
        kvfast.open(SHARED, model=path, pre_rope=True)
    assert e.value.field == "qwen3.rope.freq_base"
    # kvfast-core checks the rope it is given against the K rows too
    geometry = kvfast.ModelGeometry.from_gguf(QWEN3)
    rope = model_rope(QWEN3, 32)["global"]
    for bad, match in (
        ({"n_dims": 33}, "does not fit"),
        ({"freq_base": float("nan")}, "finite and positive"),
    ):
        given = {**rope, **bad}
        pair = {"global": given, "swa": given}
        with pytest.raises(kvfast.PreRopeError, match=match):
            _kvfast.open(SHARED, model=geometry, pre_rope=True, rope=lambda _hd, pair=pair: pair)
    # a geometry without its GGUF cannot say the rope
    geometry = kvfast.ModelGeometry.from_gguf(QWEN3)
    with pytest.raises(kvfast.PreRopeError, match="needs the model's GGUF"):
        kvfast.open(SHARED, model=geometry, pre_rope=True)


def test_mla_keys_whose_rope_comes_last_are_refused() -> None:
    mla = DATA / "deepseek2mla-f16-fa" / "state.bin"
    with pytest.raises(PreRopeError, match="MLA"):
        kvfast.open(mla, model=DATA / "models" / "tiny-deepseek2-mla.gguf", pre_rope=True)


def test_a_k_pe_arch_with_v_is_refused_too(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "ds2.gguf"
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_block_count(2)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_key_length(192)
    w.add_value_length(128)
    w.add_rope_dimension_count(64)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(PreRopeError, match="ropes the last 64 of 192") as e:
        model_rope(path, 192)
    assert e.value.field == "deepseek2.rope.dimension_count"


def test_pictures_draw_keys_before_rope() -> None:
    pytest.importorskip("matplotlib")
    from kvfast import plot

    pre = kvfast.open(SHARED, model=QWEN3, pre_rope=True)
    fig = plot.heatmap(pre, 0, "k")
    assert "before RoPE" in fig.texts[0].get_text()
    image = next(ax for ax in fig.axes if ax.get_images()).get_images()[0].get_array()
    assert np.allclose(np.asarray(image), np.abs(pre.values(layer=0, kind="k")))
    roped = plot.heatmap(kvfast.open(SHARED, model=QWEN3), 0, "k")
    assert "before RoPE" not in roped.texts[0].get_text()
