"""Statistics, comparisons and quantization losses against NumPy float64 on the same values."""

from pathlib import Path

import gguf
import numpy as np
import polars as pl
import pytest
from conftest import DATA, GEMMA_270M, proc_status_kb

import kvfast
from kvfast import _kvfast, synth

TOL = {"rtol": 1e-9, "atol": 1e-9}  # float64 sums in a different order
FIXTURES = [
    DATA / "gemma3-270m-f16-fa/state.ggsn",
    DATA / "qwen3tiny-q4_0-q4_1-fa/seq-0.ggsq",
    DATA / "qwen3tiny-f16-nofa/state.bin",
    DATA / "qwen3tiny-3seq-shared/state.bin",
]


def rows64(d: kvfast.State, cache: int, layer: int, kind: str) -> np.ndarray:
    return d.values(layer, kind, cache=cache, dtype="float32").astype(np.float64)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.parent.name)
def test_cell_stats_equal_numpy(path: Path) -> None:
    with kvfast.open(path, head_dim=32 if "qwen3" in str(path) else None) as d:
        df = d.stats(by="cell")
        hd = d.head_dim_k or d.caches[0].streams[0].layers[0].n_embd_k
        expected_rows = sum(
            len(ids) * c.n_layer * 2 * (s.layers[0].n_embd_k // hd)
            for c in d.caches
            for s in c.streams
            for ids in s.seq_ids
        )
        assert df.height == expected_rows
        for c in d.caches:
            for layer in range(c.n_layer):
                for kind in "kv":
                    x = rows64(d, c.index, layer, kind)
                    x = x.reshape(x.shape[0], -1, hd)
                    got = (
                        df.filter(cache=c.index, layer=layer, kind=kind)
                        .unique(["cell", "head"])
                        .sort("cell", "head")
                    )
                    n = x.shape[0] * x.shape[1]
                    np.testing.assert_allclose(got["l2"], np.linalg.norm(x, axis=2).ravel(), **TOL)
                    np.testing.assert_allclose(got["mean"], x.mean(axis=2).ravel(), **TOL)
                    np.testing.assert_allclose(got["std"], x.std(axis=2).ravel(), **TOL)
                    np.testing.assert_array_equal(got["min"], x.min(axis=2).ravel())
                    np.testing.assert_array_equal(got["max"], x.max(axis=2).ravel())
                    np.testing.assert_array_equal(got["absmax"], np.abs(x).max(axis=2).ravel())
                    np.testing.assert_array_equal(got["argmax"], np.abs(x).argmax(axis=2).ravel())
                    assert got.height == n


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.parent.name)
def test_channel_head_layer_stats_equal_numpy(path: Path) -> None:
    with kvfast.open(path, head_dim=32 if "qwen3" in str(path) else None) as d:
        ch, hd_df, ly = d.stats(by="channel"), d.stats(by="head"), d.stats(by="layer")
        hd = d.head_dim_k or d.caches[0].streams[0].layers[0].n_embd_k
        for c in d.caches:
            for layer in range(c.n_layer):
                for kind in "kv":
                    x = rows64(d, c.index, layer, kind)  # every cell once, shared or not
                    got = ch.filter(cache=c.index, layer=layer, kind=kind).sort("head", "channel")
                    np.testing.assert_allclose(got["mean"], x.mean(axis=0), **TOL)
                    np.testing.assert_allclose(got["std"], x.std(axis=0), **TOL)
                    np.testing.assert_array_equal(got["absmax"], np.abs(x).max(axis=0))
                    absmax = np.abs(x).max(axis=0).reshape(-1, hd)
                    ratio = (absmax / np.median(absmax, axis=1, keepdims=True)).ravel()
                    np.testing.assert_allclose(got["outlier_ratio"], ratio, **TOL)
                    heads = x.reshape(x.shape[0], -1, hd)
                    gh = hd_df.filter(cache=c.index, layer=layer, kind=kind).sort("head")
                    np.testing.assert_allclose(gh["mean"], heads.mean(axis=(0, 2)), **TOL)
                    np.testing.assert_allclose(gh["std"], heads.std(axis=(0, 2)), **TOL)
                    np.testing.assert_allclose(
                        gh["l2_mean"], np.linalg.norm(heads, axis=2).mean(axis=0), **TOL
                    )
                    gl = ly.filter(cache=c.index, layer=layer, kind=kind)
                    assert gl["count"][0] == x.size
                    np.testing.assert_allclose(gl["mean"][0], x.mean(), **TOL)
                    np.testing.assert_allclose(gl["std"][0], x.std(), **TOL)
                    assert gl["min"][0] == x.min() and gl["max"][0] == x.max()


def test_skip_first_and_selection() -> None:
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin") as d:
        df = d.stats(by="cell", layers=[1], kinds="k", skip_first=2)
        assert df["pos"].to_list() == [2, 3, 4, 5, 6] and set(df["layer"]) == {1}
        x = rows64(d, 0, 1, "k")[2:]
        lay = d.stats(by="layer", layers=[1], kinds=["k"], skip_first=2)
        assert lay.height == 1 and lay["count"][0] == x.size
        np.testing.assert_allclose(lay["mean"][0], x.mean(), **TOL)


def test_stats_of_shared_cells_follow_the_table() -> None:
    with kvfast.open(DATA / "qwen3tiny-3seq-shared/state.bin") as d:
        df = d.stats(by="cell", kinds="k")
        for q, n in enumerate((9, 12, 15)):
            assert df.filter(seq_id=q, layer=0)["pos"].sort().to_list() == list(range(n))


@pytest.mark.parametrize("ty", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "bf16", "f16"])
def test_quantizers_equal_gguf_byte_for_byte(ty: str) -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [
            rng.standard_normal(32 * 64).astype(np.float32) * 3,
            np.zeros(32, np.float32),
            np.full(32, -2.5, np.float32),
            np.linspace(-1, 1, 32, dtype=np.float32),
        ]
    )
    got = _kvfast.quantize(ty, x.tolist())
    want = gguf.quants.quantize(x.reshape(1, -1), getattr(gguf.GGMLQuantizationType, ty.upper()))
    assert got == want.tobytes()


def test_iq4_nl_quantizer_round_trips() -> None:
    # gguf has no iq4_nl quantizer: check the reference algorithm's own properties instead
    rng = np.random.default_rng(4)
    x = rng.standard_normal(32 * 16).astype(np.float32)
    q = np.frombuffer(_kvfast.quantize("iq4_nl", x.tolist()), np.uint8).reshape(-1, 18)
    from quants import decode

    y = decode("iq4_nl", q.tobytes()).reshape(-1, 32)
    xb = x.reshape(-1, 32)
    # each block's scale is the weighted least-squares one for its indices (sum w q x / sum w q^2)
    rel = np.linalg.norm(xb - y, axis=1) / np.linalg.norm(xb, axis=1)
    assert (rel < 0.2).all()
    # the largest magnitude maps to an end of the table
    idx = np.concatenate([q[:, 2:] & 15, q[:, 2:] >> 4], axis=1)
    ends = idx[np.arange(len(idx)), np.abs(xb).argmax(axis=1)]
    assert set(ends.tolist()) <= {0, 15}


def test_quant_error_equals_numpy_round_trip() -> None:
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin", head_dim=32) as d:
        df = d.quant_error("q4_0")
        assert df.height == 2 * 2 * 2
        for layer in range(2):
            for kind in "kv":
                x = d.values(layer, kind, dtype="float32")
                q = _kvfast.quantize("q4_0", x.ravel().tolist())
                qq = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0)
                assert q == qq.tobytes()
                y = gguf.quants.dequantize(qq, gguf.GGMLQuantizationType.Q4_0).astype(np.float64)
                xs, ys = x.astype(np.float64).reshape(7, 2, 32), y.reshape(7, 2, 32)
                got = df.filter(layer=layer, kind=kind).sort("head")
                np.testing.assert_allclose(got["mse"], ((xs - ys) ** 2).mean(axis=(0, 2)), **TOL)
                np.testing.assert_allclose(got["max_abs"], np.abs(xs - ys).max(axis=(0, 2)), **TOL)
                rel = np.sqrt(((xs - ys) ** 2).sum(axis=(0, 2)) / (xs**2).sum(axis=(0, 2)))
                np.testing.assert_allclose(got["rel"], rel, **TOL)
        by_layer = d.quant_error("q8_0", by="layer")
        assert by_layer.height == 4 and (by_layer["cosine"] > 0.999).all()
        assert (d.quant_error("q4_0", by="layer")["rel"] > by_layer["rel"]).all()


def test_quant_error_of_f16_to_f16_is_zero() -> None:
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin") as d:
        assert (d.quant_error("f16")["mse"] == 0).all()
    with pytest.raises(ValueError, match="type must be a cache type .*not .q3_k."):
        kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin").quant_error("q3_k")


def test_compare_q8_0_against_f16_within_its_bound() -> None:
    a = kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin")
    b = kvfast.open(DATA / "qwen3tiny-q8_0-fa/state.ggsn")  # other container, matched by (seq, pos)
    df = kvfast.compare(a, b)
    assert df.height == 2 * 2 * 7
    for layer in range(2):
        for kind in "kv":
            x = a.values(layer, kind).astype(np.float64)
            y = b.values(layer, kind).astype(np.float64)
            got = df.filter(layer=layer, kind=kind).sort("cell")
            np.testing.assert_allclose(got["mse"], ((x - y) ** 2).mean(axis=1), **TOL)
            np.testing.assert_allclose(got["max_abs"], np.abs(x - y).max(axis=1), **TOL)
            # q8_0 rounds to half a step of amax / 127 per block; later layers drift a little
            amax = np.abs(x).reshape(7, -1, 32).max(axis=2).max(axis=1)
            assert (got["max_abs"].to_numpy() <= amax / 254 * (1.05 if layer == 0 else 4) + 1e-3).all()
    summary = kvfast.compare(a, b, by="layer")
    assert summary.height == 4 and (summary["cosine_min"] > 0.9999).all()


def test_compare_and_quant_error_share_their_error_columns(tmp_path: Path) -> None:
    """compare(by="layer") and quant_error give the same columns with the same meaning: a state
    kvfast wrote as q4_0 / q8_0 from an f16 one compares to it exactly as quant_error predicts, and
    both carry the pooled rel / cosine next to the per-cell means (which NumPy recomputes)."""
    from kvfast.analysis import LOSS_COLUMNS

    # kvfast-core names them (stats/loss.rs); the public names, pinned
    assert LOSS_COLUMNS == (
        *("rows", "count", "nan", "mse", "max_abs", "rel", "cosine"),
        *("rel_mean", "rel_max", "cosine_mean", "cosine_min"),
    )
    gemma = GEMMA_270M
    f16 = kvfast.open(DATA / "gemma3-270m-server/gemma3-270m-server-f16-slot0.bin", model=gemma)
    kvfast.write(f16, tmp_path / "q.bin", cache_type_k="q4_0", cache_type_v="q8_0")
    q = kvfast.open(tmp_path / "q.bin", model=gemma)
    got = kvfast.compare(f16, q, by="layer")
    want = pl.concat(
        [f16.quant_error("q4_0", by="layer", kinds="k"), f16.quant_error("q8_0", by="layer", kinds="v")]
    ).sort("cache", "layer", "kind")
    keys = ["cache", "layer", "model_layer", "kind"]
    assert got.columns == [*keys, *LOSS_COLUMNS]
    assert want.columns == [*keys, "rotation", *LOSS_COLUMNS]
    assert got.select(keys).equals(want.select(keys)) and got.height == 36
    for col in LOSS_COLUMNS:
        np.testing.assert_allclose(got[col].to_numpy(), want[col].to_numpy(), rtol=1e-9, err_msg=col)
    # what the columns mean, from the values
    heads = f16.quant_error("q4_0", kinds="k")
    assert {*LOSS_COLUMNS} <= set(heads.columns)
    for cache, layer in ((0, 1), (1, 7)):
        x, y = rows64(f16, cache, layer, "k"), rows64(q, cache, layer, "k")
        row = got.filter(cache=cache, layer=layer, kind="k")
        cell_rel = np.linalg.norm(y - x, axis=1) / np.linalg.norm(x, axis=1)
        cell_cos = (x * y).sum(axis=1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
        np.testing.assert_allclose(row["rel"], np.linalg.norm(y - x) / np.linalg.norm(x), **TOL)
        np.testing.assert_allclose(
            row["cosine"], (x * y).sum() / np.linalg.norm(x) / np.linalg.norm(y), **TOL
        )
        np.testing.assert_allclose(row["rel_mean"], cell_rel.mean(), **TOL)
        np.testing.assert_allclose(row["rel_max"], cell_rel.max(), **TOL)
        np.testing.assert_allclose(row["cosine_mean"], cell_cos.mean(), **TOL)
        np.testing.assert_allclose(row["cosine_min"], cell_cos.min(), **TOL)
        assert row["rows"].item() == len(x) and row["count"].item() == x.size
        one = heads.filter(cache=cache, layer=layer)  # one KV head: the head row is the layer's
        np.testing.assert_allclose(one["rel_mean"], cell_rel.mean(), **TOL)


def test_compare_matches_by_position_not_order() -> None:
    whole = kvfast.open(DATA / "qwen3tiny-3seq-shared/state.bin")
    seq2 = kvfast.open(DATA / "qwen3tiny-3seq-shared/seq-2.bin")
    df = kvfast.compare(seq2, whole)
    assert df.height == 2 * 2 * 15 and (df["mse"] == 0).all()
    with pytest.raises(kvfast.MatchError, match="have no cell in B"):
        kvfast.compare(whole, seq2)


def test_compare_geometry_errors() -> None:
    with pytest.raises(kvfast.MatchError, match="KV caches"):
        kvfast.compare(
            kvfast.open(DATA / "gemma3-270m-f16-fa/seq-0.bin"),
            kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin"),
        )
    with pytest.raises(kvfast.MatchError, match="values per K/V row"):
        kvfast.compare(
            kvfast.open(DATA / "qwen2vltiny-f16-fa/seq-0.bin"),
            kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin"),
        )


def test_stats_memory_is_bounded(tmp_path: Path) -> None:
    # one big state on disk at a time: 1.1 GB of q8_0, then 2 GiB of f16
    for cells, n_layer, k_type in ((16384, 32, "q8_0"), (32768, 16, "f16")):
        path = tmp_path / "big.bin"
        size = synth.write_state(path, cells=cells, n_layer=n_layer, n_embd_k=1024, k_type=k_type)
        with kvfast.open(path) as d:
            before = proc_status_kb("RssAnon")
            results = [d.stats(by=by) for by in ("cell", "channel", "layer")] + [d.quant_error("q4_0")]
            grown = proc_status_kb("RssAnon") - before
            assert results[0].height == d.caches[0].streams[0].cell_count * 2 * len(
                d.caches[0].streams[0].layers
            )
            assert grown < 256 * 1024, f"RssAnon grew {grown} KiB over a {size >> 20} MiB state"
            del results
        path.unlink()
