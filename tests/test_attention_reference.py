"""The attention pass's reductions against a float64 reference on a realistic shape: 16 query heads
over 8 KV heads x 128 (every KV head serving two), f16 keys, 1,100 cells (several blocks of the
kernel's key columns, the last one partial), queries at scattered positions (short and long rows,
several tiles), with and without a sink logit. The kernel computes in f32 as llama.cpp does; every
reduction stays within 1e-4 relative of float64."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import kvfast
from kvfast import attn, synth

N_HEAD, N_HEAD_KV, HEAD, CELLS = 16, 8, 128, 1100
POS = np.array([0, 1, 7, 255, 256, 257, 300, 511, 512, 700, 900, 1023, 1024, 1090, 1098, 1099])


@pytest.fixture(scope="module")
def shape(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, attn.Queries]:
    tmp = tmp_path_factory.mktemp("ref")
    state, model = tmp / "s.bin", tmp / "m.gguf"
    synth.write_state(state, cells=CELLS, n_layer=1, n_embd_k=N_HEAD_KV * HEAD, k_type="f16", seed=3)
    w = gguf.GGUFWriter(str(model), "qwen3")
    w.add_block_count(1)
    w.add_embedding_length(N_HEAD * HEAD)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD)
    w.add_value_length(HEAD)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    rng = np.random.default_rng(5)
    values = (3 * rng.standard_normal((len(POS), N_HEAD, HEAD))).astype(np.float32)  # peaked and flat rows
    return state, model, attn.Queries.from_arrays({0: values}, POS, 0, str(model))


def reference(st: kvfast.State, q: attn.Queries, sinks: list[float] | None) -> np.ndarray:
    """Float64 weights [head, query, cell] (0 where unseen)."""
    keys = st.values(0, "k").astype(np.float64).reshape(CELLS, N_HEAD_KV, HEAD)
    qq = q.layer(0).astype(np.float64)
    lg = np.einsum("qhd,chd->hqc", qq, np.repeat(keys, 2, axis=1)) / np.sqrt(HEAD)
    lg[:, np.arange(CELLS)[None, :] > POS[:, None]] = -np.inf
    m = lg.max(axis=-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, np.array(sinks)[:, None, None])
    e = np.exp(lg - m)
    den = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        den += np.exp(np.array(sinks)[:, None, None] - m)
    out: np.ndarray = e / den
    return out


@pytest.mark.parametrize("sink", [False, True])
def test_every_reduction_equals_float64_within_1e4(
    shape: tuple[Path, Path, attn.Queries], sink: bool
) -> None:
    state, model, q = shape
    sinks = [float(s) for s in np.linspace(-2, 6, N_HEAD)] if sink else None
    kw = {"sinks": {0: sinks}} if sinks is not None else {}
    with kvfast.open(state, model=model) as st:
        ref = reference(st, q, sinks)
        red = attn.reductions(st, q, k=8, chunk=5, **kw)  # type: ignore[arg-type]
        mass = red["mass"].sort("head", "cell")
        want = ref.sum(axis=1)
        np.testing.assert_allclose(mass["mass"].to_numpy(), want.reshape(-1), rtol=1e-4, atol=1e-12)
        assert (
            mass["queries"].to_list()
            == np.tile((POS[:, None] >= np.arange(CELLS)).sum(axis=0), N_HEAD).tolist()
        )
        ent = red["entropy"].sort("head", "query_pos")
        with np.errstate(divide="ignore", invalid="ignore"):
            h = -np.where(ref > 0, ref * np.log(ref), 0.0).sum(axis=-1)
        np.testing.assert_allclose(ent["entropy"].to_numpy(), h.reshape(-1), rtol=1e-4, atol=1e-12)
        top = red["top_k"].sort("head", "query_pos", "rank")
        heads, rows = top["head"].to_numpy(), np.searchsorted(POS, top["query_pos"].to_numpy())
        by_rank = -np.sort(-ref, axis=-1)[:, :, :8]  # the reference's 8 largest (fewer where fewer cells)
        np.testing.assert_allclose(
            top["weight"].to_numpy(), ref[heads, rows, top["cell"].to_numpy()], rtol=1e-4
        )
        np.testing.assert_allclose(
            top["weight"].to_numpy(), by_rank[heads, rows, top["rank"].to_numpy()], rtol=1e-4, atol=1e-12
        )
        w = attn.attention(st, q, heads=[5], chunk=3, **kw)  # type: ignore[arg-type]
        rows = np.searchsorted(POS, w["query_pos"].to_numpy())
        np.testing.assert_allclose(
            w["weight"].to_numpy(), ref[5, rows, w["cell"].to_numpy()], rtol=1e-4, atol=1e-12
        )
        assert len(w) == (POS + 1).sum()
        d = attn.dense(st, q, 0, **kw).weights  # type: ignore[arg-type]
        seen = np.arange(CELLS)[None, None, :] <= POS[None, :, None]
        assert (np.isnan(d) == ~np.broadcast_to(seen, d.shape)).all()
        np.testing.assert_allclose(np.nan_to_num(d), ref, rtol=1e-4, atol=1e-12)
