"""Long prompts, end to end: llama.cpp decodes a prompt longer than one micro-batch (n_ubatch 512)
as several graphs, and every attention feature must see all of them.

Thousands of tokens of the tiny random models cost seconds on the CPU, so the regression that
broke query capture past 512 tokens (the positions of the second micro-batch checked against the
first one's) is caught here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import DATA
from test_attention_llama import Softmax

import kvfast
from kvfast import _kvfast, attn

if not os.environ.get("KVFAST_REQUIRE_PROBE"):
    pytest.importorskip("llama_cpp")
from kvfast.attn.capture import Capture, decode_group, write_sidecar
from kvfast.probe import Prompt, Runner

MODELS = DATA / "models"
N = 1500  # three micro-batches of 512, 512 and 476 tokens


def tokens(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1, 250, n)]


def test_probe_captures_every_micro_batch_of_a_long_prompt(tmp_path: Path) -> None:
    """`kvfast probe --queries all` over a prompt of three micro-batches (iSWA model, both caches):
    a query row per token, each layer's positions checked, and the attention mass of every head
    over the whole state equal to the number of queries."""
    from kvfast import probe

    model = MODELS / "tiny-gemma3-attn.gguf"
    prompts = [{"id": "long", "tokens": tokens(N)}]
    man = probe.run(
        model, prompts, tmp_path, n_ctx=2048, queries="all", whole_state=True, generate=1, progress=False
    )
    r = man.row(0, named=True)
    assert r["status"] == "ok"
    q = attn.Queries.load(tmp_path / r["queries"])
    assert q.pos.tolist() == list(range(N + 1))
    assert all(lay["positions_checked"] for lay in q.meta["layers"])
    # the sidecar names the soft-max op's own factor op_scale, never like the attention scale
    raw = json.loads((tmp_path / r["queries"]).read_text())["layers"]
    assert all("kq_scale" not in lay and lay["llama_scale"] > 0 for lay in raw)
    with kvfast.open(tmp_path / r["whole_state"], model=model) as st:
        sums = attn.mass(st, q).group_by("cache", "layer", "head").agg(pl.col("mass").sum())["mass"]
        assert len(sums) == sum(lay.n_head for lay in q.layers)  # every layer and head
        np.testing.assert_allclose(sums.to_numpy(), N + 1, rtol=1e-9)


def test_dense_weights_of_the_last_micro_batch_equal_llamas_softmax(tmp_path: Path) -> None:
    """One layer's dense [head, query, cell] array over a 1,500-token prompt equals llama.cpp's own
    kq_soft_max of the last micro-batch (flash attention off), and the table's weights."""
    model = MODELS / "tiny-qwen3.gguf"
    cap = Capture(_kvfast.attention_layers(model))
    soft = Softmax(cap)
    cap.extra = soft
    r = Runner(str(model), ctk="f16", ctv="f16", fa=False, parallel=1, n_ctx=2048, gpu_layers=0, unified=True,
               capture=cap)  # fmt: skip
    ids = tokens(N, 1)
    try:
        p = Prompt("p", tokens=ids, ids=list(ids))
        _, writers, rows = decode_group(r, [p], [], 0, cap, None, tmp_path)
        r.save_seq(tmp_path / "p.ggsq", 0, ids)
        side = write_sidecar(writers[0], cap, {"model": str(model), "state": "p.ggsq"}, rows[0])
    finally:
        r.close()
    q = attn.Queries.load(tmp_path / side)
    first = 1024  # the last micro-batch's first token
    with kvfast.open(tmp_path / "p.ggsq", model=model) as st:
        for il, sm in soft.got.items():
            a = attn.dense(st, q, il, rows=(first, None))
            assert a.weights.dtype == np.float32
            assert a.weights.shape == (4, N - first, N)
            assert a.query_pos.tolist() == list(range(first, N))
            llama = sm[:, :, :N]  # [head, query of the micro-batch, cell]
            seen = ~np.isnan(a.weights)
            # causal: query at position p sees cells 0..=p, nothing else
            assert seen.sum() == 4 * sum(range(first + 1, N + 1))
            assert float(np.abs(np.where(seen, 0.0, llama)).max()) == 0.0
            assert float(np.abs(np.nan_to_num(a.weights) - llama).max()) < 2e-3
            # a range of cells: the same weights (the softmax still over every cell seen)
            b = attn.dense(st, q, il, rows=(-8, None), cells=(-100, None), heads=[2])
            assert b.weights.shape == (1, 8, 100) and b.cell.tolist() == list(range(N - 100, N))
            np.testing.assert_array_equal(b.weights[0], a.weights[2, -8:, -100:])
        # the table of one query row holds the same numbers
        w = attn.attention(st, attn.Queries(q.values[-1:], q.pos[-1:], q.seq[-1:], q.layers, q.model))
        w0 = w.filter(model_layer=0, head=1).sort("cell")["weight"].to_numpy()
        d0 = attn.dense(st, q, 0, rows=(-1, None), heads=[1]).weights[0, 0]
        np.testing.assert_allclose(d0, w0, rtol=1e-5)
