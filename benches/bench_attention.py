"""Attention benchmark: kvfast's reductions of attention weights (mass per cell, entropy per query,
top-k cells per query) in Rust against a NumPy computation of the same weights, in the same run.

Writes an f16 state (`kvfast.synth`: one sequence of --cells cells, --layers layers of K rows of
8 KV heads x 128) and a header-only qwen3 GGUF saying 16 query heads of 128 over those 8 KV heads
(so every KV head serves two query heads, scale 1 / sqrt(128)), and random queries for the last
--queries positions. Times (best of --repeat):
- kvfast: `attn.mass`, `attn.entropy`, `attn.top_k(k=8)`, each one pass over every layer in Rust
  (f64 logits and softmax, chunks of queries in parallel, the GIL released, no weight kept), and
  `attn.reductions` giving the three from one pass;
- NumPy: per layer, the keys as float64, every head's logits by a batched matrix product (BLAS), the
  causal mask, the softmax, then the same three reductions (float64 throughout; the whole layer's
  weights are held, queries x heads x cells).
Checks the two agree (mass to 1e-9), prints a table and writes bench-out/attention.json.

    python benches/bench_attention.py [--cells 2048] [--layers 2] [--queries 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
from timing import best

import kvfast
from kvfast import attn, synth

N_HEAD, N_HEAD_KV, HEAD = 16, 8, 128


def write_model(path: Path, n_layer: int) -> None:
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_block_count(n_layer)
    w.add_embedding_length(N_HEAD * HEAD)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD)
    w.add_value_length(HEAD)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def numpy_reductions(st: kvfast.State, q: attn.Queries, n_layer: int, k: int) -> dict[str, np.ndarray]:
    """Mass [layer, head, cell], entropy [layer, head, query] and top-k cells [layer, head, query, k]."""
    s = st.caches[0].streams[0]
    pos = s.pos.astype(np.int64)
    scale = 1 / np.sqrt(HEAD)
    mask = pos[None, :] > q.pos.astype(np.int64)[:, None]  # [query, cell]: future cells
    out: dict[str, list[np.ndarray]] = {"mass": [], "entropy": [], "top": []}
    for il in range(n_layer):
        keys = st.values(il, "k").astype(np.float64).reshape(s.cell_count, N_HEAD_KV, HEAD)
        qq = q.layer(il).astype(np.float64)  # [query, head, dim]
        kv = np.repeat(keys, N_HEAD // N_HEAD_KV, axis=1)  # query head h reads KV head h // 2
        lg = scale * (qq.transpose(1, 0, 2) @ kv.transpose(1, 2, 0))  # [head, query, cell]: BLAS
        lg[:, mask] = -np.inf
        lg -= lg.max(axis=-1, keepdims=True)
        w = np.exp(lg)
        w /= w.sum(axis=-1, keepdims=True)
        out["mass"].append(w.sum(axis=1))
        with np.errstate(divide="ignore", invalid="ignore"):
            out["entropy"].append(-np.where(w > 0, w * np.log(w), 0.0).sum(axis=-1))
        out["top"].append(np.argpartition(-w, k, axis=-1)[..., :k])
    return {name: np.stack(v) for name, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        state, model = Path(tmp) / "s.bin", Path(tmp) / "m.gguf"
        synth.write_state(state, cells=a.cells, n_layer=a.layers, n_embd_k=N_HEAD_KV * HEAD, k_type="f16")
        write_model(model, a.layers)
        rng = np.random.default_rng(0)
        pos = np.arange(a.cells - a.queries, a.cells)
        q = attn.Queries.from_arrays(
            {il: rng.standard_normal((a.queries, N_HEAD, HEAD)).astype(np.float32) for il in range(a.layers)},
            pos,
            0,
            str(model),
        )
        with kvfast.open(state, model=model) as st:
            st.values(0, "k")  # the page cache warm
            ref = numpy_reductions(st, q, a.layers, 8)
            got = attn.mass(st, q).sort("layer", "head", "cell")
            want = ref["mass"].reshape(-1)
            np.testing.assert_allclose(got["mass"].to_numpy(), want, rtol=1e-9, atol=1e-12)
            runs = {
                "kvfast mass": lambda: attn.mass(st, q),
                "kvfast entropy": lambda: attn.entropy(st, q),
                "kvfast top_k(8)": lambda: attn.top_k(st, q, 8),
                "kvfast all three, one pass": lambda: attn.reductions(st, q, k=8),
                "NumPy weights + all three": lambda: numpy_reductions(st, q, a.layers, 8),
            }
            times = {name: best(fn, a.repeat) for name, fn in runs.items()}
            cpu = {}
            for name, fn in runs.items():  # CPU seconds of one run (a loaded machine stretches the wall)
                t = time.process_time()
                fn()
                cpu[name] = time.process_time() - t
    weights = a.layers * N_HEAD * a.queries * (a.cells - a.queries / 2)
    np_t = times["NumPy weights + all three"]
    rust_t = times["kvfast mass"] + times["kvfast entropy"] + times["kvfast top_k(8)"]
    print(
        f"{a.layers} layers x {N_HEAD} heads x {a.queries} queries over {a.cells} cells: {weights / 1e6:.1f} M weights"
    )
    print(f"CPUs: {os.cpu_count()}")
    for name, t in times.items():
        print(
            f"  {name:28s} {t * 1000:9.1f} ms  {weights / t / 1e6:8.1f} M weights/s  ({cpu[name] * 1000:.0f} ms CPU)"
        )
    print(f"  kvfast, the three passes: {rust_t * 1000:.1f} ms = {np_t / rust_t:.2f}x NumPy's one pass")
    one = times["kvfast all three, one pass"]
    print(f"  kvfast, the three in one pass: {one * 1000:.1f} ms = {np_t / one:.2f}x NumPy's one pass")
    print(f"  kvfast mass alone: {np_t / times['kvfast mass']:.2f}x NumPy")
    held = N_HEAD * a.queries * a.cells * 8  # float64 logits, then weights, of one layer
    print(f"  NumPy holds {held >> 20} MiB of weights a layer (and its temporaries); kvfast none")
    out = Path(__file__).parent / "bench-out"
    out.mkdir(exist_ok=True)
    (out / "attention.json").write_text(
        json.dumps(
            {
                "args": vars(a),
                "weights": weights,
                "cpus": os.cpu_count(),
                "seconds": times,
                "cpu_seconds": cpu,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
