"""Attention benchmark: kvfast's attention mass per cell (`attn.mass`) against what a user writes in
NumPy float32, and against the arithmetic floor of the pass, in one run, at three shapes:

- the benchmark shape: 2 layers, 256 queries over 2,048 cells;
- 1 layer, 512 queries over 16,384 cells, and over 32,768 cells (the long contexts).

Each writes an f16 state (`kvfast.synth`: one sequence, K rows of 8 KV heads x 128) and a
header-only qwen3 GGUF saying 16 query heads of 128 over those 8 KV heads (every KV head serves two
query heads, scale 1 / sqrt(128)), and random queries for the last --queries positions. Times (the
best of --repeat rounds, each round timing the three in turn), per shape:

- kvfast: `attn.mass`, one pass in Rust (f32 tiles of queries against each KV head's keys, the
  online softmax, the GIL released, no weight kept);
- NumPy float32, the whole pass: per layer the keys decoded to f32 (`st.values`), the logits of
  every query head by one batched matrix product (the two query heads of a KV head stacked, so the
  keys are not repeated), the scale, the causal mask, the softmax, the sum over queries;
- the f32 matrix product alone: the same batched product of the same logits, keys already decoded
  (NumPy's BLAS): the floor of the pass's arithmetic.

Checks kvfast's mass against NumPy's (float32: 1e-3 relative), and measures kvfast's memory: the
growth of RssAnon over one pass in a fresh interpreter (sampled every 5 ms; `timing.PeakRssAnon`).
Prints a table and writes bench-out/attention.json. On a machine shared with other work the times
stretch; the ratios, measured in the same run, are what to read.

    python benches/bench_attention.py [--shapes 2048x256x2,16384x512x1,32768x512x1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np
from timing import PeakRssAnon, best

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


def setup(tmp: Path, cells: int, layers: int, queries: int) -> tuple[Path, Path, attn.Queries]:
    """The state, the model and the queries of a shape."""
    state, model = tmp / f"s{cells}.bin", tmp / f"m{layers}.gguf"
    synth.write_state(state, cells=cells, n_layer=layers, n_embd_k=N_HEAD_KV * HEAD, k_type="f16")
    write_model(model, layers)
    rng = np.random.default_rng(0)
    q = attn.Queries.from_arrays(
        {il: rng.standard_normal((queries, N_HEAD, HEAD)).astype(np.float32) for il in range(layers)},
        np.arange(cells - queries, cells),
        0,
        str(model),
    )
    return state, model, q


def grouped(q: attn.Queries, il: int) -> np.ndarray:
    """A layer's queries as [KV head, its query heads x queries, dim] (query head h reads KV head h // 2)."""
    qq = q.layer(il).transpose(1, 0, 2)  # [head, query, dim]
    return np.ascontiguousarray(qq.reshape(N_HEAD_KV, (N_HEAD // N_HEAD_KV) * qq.shape[1], HEAD))


def numpy_mass(st: kvfast.State, q: attn.Queries, layers: int) -> np.ndarray:
    """What a user writes in NumPy float32: mass [layer, head, cell]."""
    s = st.caches[0].streams[0]
    future = s.pos[None, :].astype(np.int64) > q.pos.astype(np.int64)[:, None]  # [query, cell]
    out = []
    for il in range(layers):
        keys = st.values(il, "k").astype(np.float32).reshape(s.cell_count, N_HEAD_KV, HEAD)
        lg = np.matmul(grouped(q, il), keys.transpose(1, 2, 0))  # [KV head, 2 x query, cell]
        lg *= np.float32(1 / np.sqrt(HEAD))
        lg = lg.reshape(N_HEAD, len(q.pos), s.cell_count)
        lg[:, future] = -np.inf
        lg -= lg.max(axis=-1, keepdims=True)
        np.exp(lg, out=lg)
        lg /= lg.sum(axis=-1, keepdims=True)
        out.append(lg.sum(axis=1))
    return np.stack(out)


def matmul_alone(keys: list[np.ndarray], q: attn.Queries) -> None:
    """The f32 batched matrix product of the logits alone, keys decoded beforehand."""
    for il, k in enumerate(keys):
        np.matmul(grouped(q, il), k)


def child(state: str, model: str, cells: int, layers: int, queries: int) -> None:
    """One pass of attn.mass in this interpreter: prints RssAnon (bytes) just before it."""
    rng = np.random.default_rng(0)
    q = attn.Queries.from_arrays(
        {il: rng.standard_normal((queries, N_HEAD, HEAD)).astype(np.float32) for il in range(layers)},
        np.arange(cells - queries, cells),
        0,
        model,
    )
    with kvfast.open(state, model=model) as st:
        rss = next(
            ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("RssAnon:")
        )
        print(int(rss.split()[1]) * 1024, flush=True)
        attn.mass(st, q)


def rss_growth(state: Path, model: Path, cells: int, layers: int, queries: int) -> int:
    """The growth of RssAnon over one pass of attn.mass in a fresh interpreter, in bytes."""
    args = [
        sys.executable,
        __file__,
        "--child",
        str(state),
        str(model),
        str(cells),
        str(layers),
        str(queries),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    watch = PeakRssAnon(proc, 0.005)
    out, _ = proc.communicate()
    peak = watch.join()
    return peak - int(out.split()[0])


def shape(tmp: Path, cells: int, queries: int, layers: int, repeat: int) -> dict[str, object]:
    state, model, q = setup(tmp, cells, layers, queries)
    with kvfast.open(state, model=model) as st:
        keys = [
            np.ascontiguousarray(
                st.values(il, "k").astype(np.float32).reshape(cells, N_HEAD_KV, HEAD).transpose(1, 2, 0)
            )
            for il in range(layers)
        ]
        got = attn.mass(st, q).sort("layer", "head", "cell")["mass"].to_numpy()
        want = numpy_mass(st, q, layers).reshape(-1)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6)
        runs = {
            "kvfast attn.mass": lambda: attn.mass(st, q),
            "NumPy float32 pass": lambda: numpy_mass(st, q, layers),
            "f32 matrix product alone": lambda: matmul_alone(keys, q),
        }
        # the three in turn, `repeat` rounds, the best of each: a burst of other work on a shared
        # machine then stretches one round of all three rather than one of them
        rounds = [{name: best(fn, 1) for name, fn in runs.items()} for _ in range(repeat)]
        times = {name: min(r[name] for r in rounds) for name in runs}
    keys.clear()
    rss = rss_growth(state, model, cells, layers, queries)
    state.unlink()
    return {"cells": cells, "queries": queries, "layers": layers, "seconds": times, "rss_growth": rss}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        c = sys.argv[2:]
        child(c[0], c[1], int(c[2]), int(c[3]), int(c[4]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--shapes", default="2048x256x2,16384x512x1,32768x512x1", help="cells x queries x layers, ..."
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    results = []
    print(f"CPUs: {os.cpu_count()}; {N_HEAD} query heads over {N_HEAD_KV} KV heads x {HEAD}, f16 keys")
    print(
        f"{'shape':<34}{'kvfast mass':>12}{'NumPy f32':>11}{'matmul':>9}{'x NumPy':>9}{'x matmul':>10}"
        f"{'M weights/s':>13}{'RssAnon +':>11}"
    )
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        for spec in a.shapes.split(","):
            cells, queries, layers = (int(x) for x in spec.split("x"))
            r = shape(Path(tmp), cells, queries, layers, a.repeat)
            results.append(r)
            t = r["seconds"]
            assert isinstance(t, dict)
            kv, np_t, mm = t["kvfast attn.mass"], t["NumPy float32 pass"], t["f32 matrix product alone"]
            weights = layers * N_HEAD * queries * (cells - queries / 2)
            rss = r["rss_growth"]
            assert isinstance(rss, int)
            print(
                f"{f'{layers} x {queries} queries x {cells} cells':<34}{kv * 1e3:9.0f} ms{np_t * 1e3:8.0f} ms"
                f"{mm * 1e3:6.0f} ms{np_t / kv:8.2f}x{kv / mm:9.2f}x{weights / kv / 1e6:13.0f}"
                f"{rss / 2**20:8.1f} MiB",
                flush=True,
            )
    print("x NumPy: NumPy's time over kvfast's (above 1: kvfast faster); x matmul: kvfast's over the floor's")
    out = Path(__file__).parent / "bench-out"
    out.mkdir(exist_ok=True)
    (out / "attention.json").write_text(
        json.dumps({"cpus": os.cpu_count(), "shapes": results}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
