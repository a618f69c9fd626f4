"""NaN in statistics (issue 24, item 18), one rule: a NaN value is left out of every statistic and
counted in the table's ``nan`` column; a group with no other value has NaN statistics (argmax
null), never an infinity or 0. Infinities are values. Checked against NumPy's nan-aware functions on
states holding NaN and infinities (f16 rows read as stored, q8_0 rows decoded, V transposed)."""

import ctypes
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import polars as pl
import pytest
from conftest import DATA

import kvfast
from kvfast import _kvfast

HD = 32
SOURCES = {
    "f16": DATA / "qwen3tiny-f16-fa/seq-0.bin",
    "q8_0": DATA / "qwen3tiny-q8_0-fa/seq-0.bin",
    "f16-vtrans": DATA / "qwen3tiny-f16-nofa/seq-0.ggsq",
}


def poisoned(src: Path, out: Path, kind: str) -> kvfast.State:
    """`src` with layer 1's `kind` rows given NaN: cell 0's head 0 NaN only, one NaN in cell 1's
    head 1, channel 5 NaN in every cell, an infinity in cell 2's head 1."""
    with kvfast.open(src, head_dim=HD, rotation="none") as d:
        x = d.values(1, kind).astype(np.float32).copy()
        x[0, :HD] = np.nan
        x[1, HD + 8] = np.nan
        x[:, 5] = np.nan
        x[2, HD + 1] = np.inf
        kvfast.write(d, out, values={(1, kind): x})
    return kvfast.open(out, head_dim=HD, rotation="none")


def poisoned_q8(src: Path, out: Path) -> kvfast.State:
    """A q8_0 state holds NaN only as blocks whose f16 scale is NaN (or inf: its values inf or NaN):
    layer 1's K scales set in the bytes, cell 0's block 0 and every cell's block 1 NaN, cell 2's
    block 0 inf (the expected values are read back)."""
    b = bytearray(src.read_bytes())
    with kvfast.open(src, head_dim=HD, rotation="none") as d:
        ly = d.caches[0].streams[0].layers[1]
        cells = d.caches[0].streams[0].cell_count
        assert ly.k_type == "q8_0" and ly.k_row_bytes == 2 * 34
        at = ly.k_offset + ly.k_nbytes - cells * ly.k_row_bytes  # the rows follow the record's header
    nan, inf = b"\x00\x7e", b"\x00\x7c"
    for c, block, scale in [(0, 0, nan), (2, 0, inf), *[(c, 1, nan) for c in range(cells)]]:
        o = at + c * ly.k_row_bytes + block * 34
        b[o : o + 2] = scale
    out.write_bytes(bytes(b))
    e = kvfast.open(out, head_dim=HD, rotation="none")
    v = e.values(1, "k")
    assert np.isnan(v[0, :HD]).all() and np.isnan(v[:, HD:]).all() and not np.isfinite(v[2, :HD]).all()
    return e


@pytest.fixture(params=sorted(SOURCES))
def state(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[kvfast.State, str]:
    if request.param == "q8_0":
        return poisoned_q8(SOURCES["q8_0"], tmp_path / "nan.bin"), "k"
    kind = "v" if request.param == "f16-vtrans" else "k"
    return poisoned(SOURCES[request.param], tmp_path / "nan.bin", kind), kind


def heads(x: np.ndarray) -> np.ndarray:
    """[cells, values] as [cells, heads, head_dim], float64."""
    return x.astype(np.float64).reshape(x.shape[0], -1, HD)


def test_cell_statistics_leave_nan_out(state: tuple[kvfast.State, str]) -> None:
    d, kind = state
    x = heads(d.values(1, kind))
    assert np.isnan(x).any()
    df = d.stats(by="cell", layers=[1], kinds=kind).sort("cell", "head")
    assert df.schema["argmax"] == pl.UInt32 and df.schema["nan"] == pl.UInt32
    flat = x.reshape(-1, HD)
    nan = np.isnan(flat).sum(axis=1)
    assert df["nan"].to_list() == nan.tolist()
    empty = nan == HD
    assert empty.any() and (~empty).any()
    for col in ("l2", "mean", "std", "min", "max", "absmax"):
        assert df[col].is_nan().to_numpy()[empty].all(), col  # never inf or 0
    assert df["argmax"].is_null().to_numpy().tolist() == empty.tolist()
    with np.errstate(invalid="ignore"):
        want = {
            "l2": np.sqrt(np.nansum(flat**2, axis=1)),
            "mean": np.nanmean(flat[~empty], axis=1),
            "min": np.nanmin(flat[~empty], axis=1),
            "max": np.nanmax(flat[~empty], axis=1),
            "absmax": np.nanmax(np.abs(flat[~empty]), axis=1),
        }
        std = np.nanstd(flat[~empty], axis=1)
    ok = df.filter(~pl.Series(empty))
    np.testing.assert_allclose(ok["l2"].to_numpy(), want["l2"][~empty], rtol=1e-12)
    for col in ("mean", "min", "max", "absmax"):
        np.testing.assert_allclose(ok[col].to_numpy(), want[col], rtol=1e-6, equal_nan=True, err_msg=col)
    finite = np.isfinite(flat[~empty]).sum(axis=1) == (HD - nan[~empty])
    np.testing.assert_allclose(ok["std"].to_numpy()[finite], std[finite], rtol=1e-6, atol=1e-9)
    assert ok["std"].is_nan().to_numpy()[~finite].all()  # inf - inf: no deviation
    # argmax: a channel holding the absmax
    rows = flat[~empty]
    picked = np.abs(rows[np.arange(len(rows)), ok["argmax"].to_numpy()])
    np.testing.assert_array_equal(picked, want["absmax"])


def test_aggregates_leave_nan_out_and_count_it(state: tuple[kvfast.State, str]) -> None:
    d, kind = state
    x = heads(d.values(1, kind))
    cells = x.shape[0]
    ch = d.stats(by="channel", layers=[1], kinds=kind).sort("head", "channel")
    cols = x.reshape(cells, -1).T  # [channel, cells]
    nan = np.isnan(cols).sum(axis=1)
    assert ch["nan"].to_list() == nan.tolist()
    assert (ch["count"] + ch["nan"] == ch["cells"]).all() and (ch["cells"] == cells).all()
    empty = nan == cells
    assert empty.any() and not empty.all()  # channel 5 (q8_0: head 1) NaN in every cell
    for col in ("mean", "std", "min", "max", "absmax", "outlier_ratio"):
        assert ch[col].is_nan().to_numpy()[empty].all(), col
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(ch["mean"].to_numpy()[~empty], np.nanmean(cols[~empty], axis=1), rtol=1e-9)
        np.testing.assert_allclose(ch["min"].to_numpy()[~empty], np.nanmin(cols[~empty], axis=1))
    assert ch["outlier_ratio"].drop_nans().is_finite().all() or ch["absmax"].is_infinite().any()
    for by in ("head", "layer"):
        df = d.stats(by=by, layers=[1], kinds=kind).sort("head" if by == "head" else "layer")
        groups = [x[:, h, :] for h in range(x.shape[1])] if by == "head" else [x]
        for row, g in zip(df.iter_rows(named=True), groups, strict=True):
            v = g.reshape(-1)
            assert (row["nan"], row["count"]) == (int(np.isnan(v).sum()), int((~np.isnan(v)).sum()))
            assert row["cells"] == cells
            if row["count"] == 0:  # q8_0's head 1: NaN only
                assert all(
                    np.isnan(row[c]) for c in ("mean", "std", "min", "max", "absmax", "l2_mean", "l2_max")
                )
                continue
            assert row["min"] == np.nanmin(v) and row["max"] == np.nanmax(v)
            norms = np.sqrt(np.nansum(g.reshape(cells, -1, HD) ** 2, axis=2))
            has = (~np.isnan(g.reshape(cells, -1, HD))).any(axis=2)
            assert row["l2_max"] == pytest.approx(norms[has].max())
            if np.isfinite(norms[has]).all():
                assert row["l2_mean"] == pytest.approx(norms[has].mean())
                assert row["mean"] == pytest.approx(np.nanmean(v))


def test_a_group_of_nan_only_gives_nan_statistics(tmp_path: Path) -> None:
    with kvfast.open(SOURCES["f16"], head_dim=HD) as d:
        x = np.full(d.values(0, "v").shape, np.nan, np.float32)
        kvfast.write(d, tmp_path / "all-nan.bin", values={(0, "v"): x})
    e = kvfast.open(tmp_path / "all-nan.bin", head_dim=HD)
    for by in ("channel", "head", "layer"):
        df = e.stats(by=by, layers=[0], kinds="v")
        assert (df["count"] == 0).all() and (
            df["nan"] == df["cells"] * (HD if by == "head" else 64 if by == "layer" else 1)
        ).all()
        stat_cols = [
            c for c in ("mean", "std", "min", "max", "absmax", "l2_mean", "l2_max") if c in df.columns
        ]
        for col in stat_cols:
            assert df[col].is_nan().all(), (by, col)  # before: absmax 0.0, min +inf, max -inf
    cell = e.stats(by="cell", layers=[0], kinds="v")
    assert cell["argmax"].is_null().all() and (cell["nan"] == HD).all()
    assert cell["absmax"].is_nan().all() and cell["min"].is_nan().all()


def test_quant_error_and_compare_leave_the_states_nan_out(tmp_path: Path) -> None:
    e = poisoned(SOURCES["f16"], tmp_path / "nan.bin", "k")
    x = heads(e.values(1, "k"))
    q = e.quant_error("f16", layers=[1], kinds="k").sort("head")  # f16 round trip: exact
    nan = np.isnan(x).sum(axis=(0, 2))
    assert q["nan"].to_list() == nan.tolist()
    assert (q["count"] + q["nan"] == x.shape[0] * HD).all()
    assert (q.filter(pl.col("head") == 0)["mse"] == 0).all()  # head 0: NaN left out, the rest exact
    layer = e.quant_error("f16", layers=[1], kinds="k", by="layer")
    assert layer["nan"].item() == int(nan.sum())
    with kvfast.open(SOURCES["f16"], head_dim=HD) as d:
        c = kvfast.compare(d, e, layers=[1], kinds="k").sort("cell", "head")
        assert c["nan"].to_list() == np.isnan(x).sum(axis=2).reshape(-1).tolist()
        none = c.filter(pl.col("nan") == HD)
        assert none.height == 1 and all(
            none[col].is_nan().all() for col in ("mse", "max_abs", "cosine", "rel")
        )
        rest = c.filter((pl.col("nan") < HD) & (pl.col("cell") != 2))
        assert (rest["mse"] == 0).all()  # a NaN on either side is left out, not poisoning the head
        summary = kvfast.compare(d, e, layers=[1], kinds="k", by="layer")
        assert summary["nan"].item() == c["nan"].sum()
        assert not np.isnan(summary["mse"].item())


def ggml_q8_0() -> tuple[Callable[[np.ndarray], bytes], Callable[[bytes], np.ndarray]]:
    """llama.cpp's own quantize_row_q8_0_ref and dequantize_row_q8_0 (libggml-base, as
    llama-cpp-python ships it), on whole blocks."""
    llama_cpp = pytest.importorskip("llama_cpp")
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    ptr, n = ctypes.c_void_p, ctypes.c_int64

    def quantize(x: np.ndarray) -> bytes:
        x = np.ascontiguousarray(x, np.float32)
        out = np.zeros(34 * (x.size // 32), np.uint8)
        lib.quantize_row_q8_0_ref(x.ctypes.data_as(ptr), out.ctypes.data_as(ptr), n(x.size))
        return out.tobytes()

    def dequantize(q: bytes) -> np.ndarray:
        b = np.frombuffer(q, np.uint8).copy()
        y = np.zeros(b.size // 34 * 32, np.float32)
        lib.dequantize_row_q8_0(b.ctypes.data_as(ptr), y.ctypes.data_as(ptr), n(y.size))
        return y

    return quantize, dequantize


def test_q8_0_blocks_holding_nan_quantize_as_ggml() -> None:
    # before: the absmax folded with f32::max dropped every NaN (a block of NaNs: scale 0, values
    # 0); ggml's MAX(a, b) = a > b ? a : b makes it NaN, and the next value replaces it
    quantize, _ = ggml_q8_0()
    base = (np.arange(32, dtype=np.float32) - 10) / 3
    blocks = [np.full(32, np.nan, np.float32)]
    for at in (0, 5, 10, 31):
        b = base.copy()
        b[2] = 40.0  # the largest, before a NaN at 5 or 10: forgotten, and 40 / d wraps
        b[at] = np.nan
        blocks.append(b)
    blocks.append(np.where(np.arange(32) % 7 == 3, np.nan, base).astype(np.float32))
    blocks.append(base)
    x = np.concatenate(blocks)
    assert _kvfast.quantize("q8_0", x.tolist()) == quantize(x)
    q = np.frombuffer(quantize(x), np.uint8).reshape(-1, 34)
    scales = q[:, :2].copy().view("<f2")[:, 0]
    assert np.isnan(scales[0]) and np.isnan(scales[4])  # all NaN, the last NaN: a NaN scale
    # gguf's NumPy mirror (max propagates NaN) agrees where ggml's scale is NaN too
    for b in (blocks[0], blocks[4]):
        with np.errstate(invalid="ignore"):  # its NaN quants cast to int8
            want = gguf.quants.quantize(b.reshape(1, -1), gguf.GGMLQuantizationType.Q8_0)
        assert _kvfast.quantize("q8_0", b.tolist()) == want.tobytes()


def test_quant_error_of_nan_is_ggmls_round_trip(tmp_path: Path) -> None:
    # what a q8_0 cache of llama.cpp would hold: its blocks quantized with NaN as ggml does
    quantize, dequantize = ggml_q8_0()
    with kvfast.open(SOURCES["f16"], head_dim=HD, rotation="none") as d:
        x = d.values(1, "k").astype(np.float32).copy()
        x[0, :HD] = np.nan  # a block of NaNs: left out
        x[:, 5] = np.nan  # the absmax of the values after it
        x[3, 1] = 1000.0  # ... which forget this one: it wraps
        x[4, HD + 31] = np.nan  # the last value: a NaN scale, the block's other values NaN
        kvfast.write(d, tmp_path / "nan.bin", values={(1, "k"): x})
    e = kvfast.open(tmp_path / "nan.bin", head_dim=HD, rotation="none")
    x = e.values(1, "k").astype(np.float32)
    y = dequantize(quantize(x.reshape(-1))).reshape(x.shape)
    q = e.quant_error("q8_0", layers=[1], kinds="k", rotate=False).sort("head")
    xh, yh = heads(x), heads(y)
    kept = ~np.isnan(xh)
    assert q["nan"].to_list() == (~kept).sum(axis=(0, 2)).tolist()
    assert q["count"].to_list() == kept.sum(axis=(0, 2)).tolist()
    with np.errstate(invalid="ignore"):
        se = np.where(kept, (xh - yh) ** 2, 0).sum(axis=(0, 2))
    assert np.isfinite(se[0]) and np.isnan(se[1])
    np.testing.assert_allclose(q["sum_sq_err"].to_numpy(), se, rtol=1e-12, equal_nan=True)
    assert np.isnan(q["mse"][1]) and q["rows"].to_list() == [x.shape[0]] * 2
    layer = e.quant_error("q8_0", layers=[1], kinds="k", rotate=False, by="layer")
    assert (layer["nan"].item(), layer["count"].item()) == (int((~kept).sum()), int(kept.sum()))
