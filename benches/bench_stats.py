"""Statistics benchmark: kvfast's Rust kernels against a plain copy of the same bytes, against NumPy
computing the same statistics, and `quant_error` against plain decoding, on one f16 state (a
Qwen3-0.6B-shaped cache by default: 28 layers, 8 KV heads x 128, 4,096 tokens: 448 MiB), single-core
(RAYON_NUM_THREADS=1) and on all cores; best of --repeat, page cache warm.

- copy: a plain copy of the state's mapped bytes into a new array (`raw.copy()`, one core: how the
  goal was set, 0.067 s on the machine it was set on), and the strictest copy, `np.copyto` into a
  preallocated buffer whose pages are mapped already (no page faults), on one core and split
  over all cores;
- stats: by="cell" (per (cell, head) l2, mean, std, min, max, absmax, argmax), "channel", "head",
  "layer" (one pass each), and NumPy computing by="cell" and "channel" a record at a time (rows as
  float32, sums in float64), as a careful script would;
- quant_error("q8_0") (llama.cpp's rotation of q8_0 caches simulated: K in groups of 128, V of 64)
  against plain decoding (`values(layer, kind, dtype="float32")` of every record), and NumPy doing
  the same round trip.

Each thread setting runs in its own process (rayon reads RAYON_NUM_THREADS once); NumPy (one core)
runs in the single-core one. Prints a table and writes bench-out/stats.json.

    python benches/bench_stats.py [--dir DIR] [--repeat 3] [--tokens 4096]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from timing import best

import kvfast
from kvfast import synth

HEAD_DIM = 128
N_LAYER, N_EMBD = 28, 1024
BYS = ("cell", "channel", "head", "layer")


def records(d: kvfast.State) -> list[tuple[int, int, int]]:
    s = d.caches[0].streams[0]
    out = []
    for ly in s.layers:
        out.append((ly.k_offset, ly.k_nbytes, s.cell_count))
        out.append((ly.v_offset or 0, ly.v_nbytes or 0, s.cell_count))
    return out


def numpy_cells(mm: mmap.mmap, recs: list[tuple[int, int, int]]) -> int:
    rows = 0
    for off, nb, cells in recs:
        x = (
            np.frombuffer(mm, "<f2", count=nb // 2, offset=off)
            .astype(np.float32)
            .reshape(cells, -1, HEAD_DIM)
        )
        ax = np.abs(x)
        out = (
            np.sqrt(np.einsum("chd,chd->ch", x, x, dtype=np.float64)),
            x.mean(axis=2, dtype=np.float64),
            x.std(axis=2, dtype=np.float64),
            x.min(axis=2),
            x.max(axis=2),
            ax.max(axis=2),
            ax.argmax(axis=2),
        )
        rows += out[0].size
    return rows


def numpy_channels(mm: mmap.mmap, recs: list[tuple[int, int, int]]) -> int:
    rows = 0
    for off, nb, cells in recs:
        x = np.frombuffer(mm, "<f2", count=nb // 2, offset=off).astype(np.float32).reshape(cells, -1)
        absmax = np.abs(x).max(axis=0)
        out = (x.mean(axis=0, dtype=np.float64), x.std(axis=0, dtype=np.float64), absmax)
        heads = absmax.reshape(-1, HEAD_DIM)
        ratio = heads / np.median(heads, axis=1, keepdims=True)
        rows += out[0].size + ratio.size * 0
    return rows


def hadamard(n: int) -> np.ndarray:
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(np.float32(n))).astype(np.float32)


def numpy_quant_error(mm: mmap.mmap, recs: list[tuple[int, int, int]]) -> float:
    """q8_0 round trip of every row with llama.cpp's rotation (K: groups of 128, V: 64), per head
    sums of squared errors in float64 (roundf's halves away from zero: np.round rounds to even)."""
    total = 0.0
    for i, (off, nb, cells) in enumerate(recs):
        g = 128 if i % 2 == 0 else 64
        h = hadamard(g)
        x = np.frombuffer(mm, "<f2", count=nb // 2, offset=off).astype(np.float32).reshape(-1, g)
        r = (x @ h).reshape(-1, 32)
        d = np.abs(r).max(axis=1, keepdims=True) / np.float32(127)
        inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
        p = r * inv
        q = np.trunc(p + np.copysign(np.float32(0.49999997), p))
        y = ((q * d.astype(np.float16).astype(np.float32)).reshape(-1, g) @ h).reshape(cells, -1, HEAD_DIM)
        err = (x.reshape(cells, -1, HEAD_DIM).astype(np.float64) - y) ** 2
        total += float(err.sum(axis=(0, 2)).sum())
    return total


def copy_on_all_cores(buf: np.ndarray, raw: np.ndarray) -> None:
    """`np.copyto` split into one range per core, each on its own thread (NumPy releases the GIL)."""
    k = os.cpu_count() or 1
    n = raw.size
    with ThreadPoolExecutor(k) as pool:
        parts = [(i * n // k, (i + 1) * n // k) for i in range(k)]
        list(pool.map(lambda p: np.copyto(buf[p[0] : p[1]], raw[p[0] : p[1]]), parts))


def measure(path: Path, repeat: int, with_numpy: bool) -> dict[str, float]:
    """Every timing of one thread setting (this process's RAYON_NUM_THREADS)."""
    res: dict[str, float] = {}
    with kvfast.open(path, head_dim=HEAD_DIM) as d, open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        raw = np.frombuffer(mm, np.uint8)
        buf = np.empty_like(raw)
        res["copy_s"] = best(lambda: raw.copy(), max(repeat, 5))
        res["warm_copy_s"] = best(lambda: np.copyto(buf, raw), max(repeat, 5))
        res["warm_copy_all_s"] = best(lambda: copy_on_all_cores(buf, raw), max(repeat, 5))
        for by in BYS:
            d.stats(by=by)  # map the pages once
            res[f"{by}_s"] = best(lambda by=by: d.stats(by=by), repeat)
        layers = range(d.caches[0].n_layer)
        res["decode_s"] = best(
            lambda: [d.values(ly, k, dtype="float32") for ly in layers for k in "kv"], repeat
        )
        res["quant_error_s"] = best(lambda: d.quant_error("q8_0"), repeat)
        if with_numpy:
            recs = records(d)
            res["cell_numpy_s"] = best(lambda: numpy_cells(mm, recs), repeat)
            res["channel_numpy_s"] = best(lambda: numpy_channels(mm, recs), repeat)
            res["quant_error_numpy_s"] = best(lambda: numpy_quant_error(mm, recs), repeat)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--child", choices=("1", "all"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="kvfast-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"f16-{args.tokens}.bin"
    if args.child:
        print(json.dumps(measure(path, args.repeat, with_numpy=args.child == "1")))
        return
    if not path.exists():
        synth.write_state(path, cells=args.tokens, n_layer=N_LAYER, n_embd_k=N_EMBD, k_type="f16")
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    size = path.stat().st_size
    results: dict[str, dict[str, float]] = {}
    for threads in ("1", "all"):
        env = dict(os.environ)
        env.pop("RAYON_NUM_THREADS", None)
        if threads == "1":
            env["RAYON_NUM_THREADS"] = "1"
        cmd = [sys.executable, __file__, "--dir", str(tmp), "--repeat", str(args.repeat)]
        cmd += ["--tokens", str(args.tokens), "--child", threads]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        results[threads] = json.loads(out.strip().splitlines()[-1])
    one, every = results["1"], results["all"]
    print(
        f"state: {size / (1 << 20):.0f} MiB f16 ({args.tokens} tokens x {N_LAYER} layers x {N_EMBD}),"
        f" head_dim {HEAD_DIM}; {os.cpu_count()} cores; best of {args.repeat}"
    )
    print(
        f"plain copy of its bytes into a new array (one core): {one['copy_s']:.3f} s,"
        f" {size / one['copy_s'] / 1e9:.1f} GB/s"
    )
    print(
        f"np.copyto into a mapped buffer: {one['warm_copy_s']:.3f} s one core,"
        f" {every['warm_copy_all_s']:.3f} s split over all cores"
    )
    print(f"plain decoding to float32: {one['decode_s']:.3f} s one core, {every['decode_s']:.3f} s all cores")
    print()
    head = (
        f"{'work':<20}{'1 core s':>9}{'x copy':>8}{'x warm':>8}{'all s':>8}{'x copy':>8}{'x warm':>8}"
        f"{'GB/s':>7}{'NumPy s':>9}{'x faster':>9}"
    )
    print(head)
    for by in BYS:
        t1, ta = one[f"{by}_s"], every[f"{by}_s"]
        t_np = one.get(f"{by}_numpy_s")
        np_cols = f"{t_np:9.2f}{t_np / ta:8.1f}x" if t_np else f"{'':9}{'':9}"
        print(
            f"{'stats ' + by:<20}{t1:9.3f}{t1 / one['copy_s']:7.2f}x{t1 / one['warm_copy_s']:7.2f}x"
            f"{ta:8.3f}{ta / every['copy_s']:7.2f}x{ta / every['warm_copy_all_s']:7.2f}x"
            f"{size / ta / 1e9:7.2f}{np_cols}"
        )
    t1, ta, t_np = one["quant_error_s"], every["quant_error_s"], one["quant_error_numpy_s"]
    print(
        f"{'quant_error q8_0':<20}{t1:9.3f}{t1 / one['decode_s']:6.2f}xd{'':8}{ta:8.3f}{ta / every['decode_s']:6.2f}xd{'':8}"
        f"{size / ta / 1e9:7.2f}{t_np:9.2f}{t_np / ta:8.1f}x"
    )
    print(
        "(x copy: time over the plain copy's into a new array, one core, same process; x warm: over"
        " np.copyto's into a mapped buffer, on as many cores as the column; xd: over plain decoding's)"
    )
    out_dir = Path("bench-out")
    out_dir.mkdir(exist_ok=True)
    (out_dir / "stats.json").write_text(
        json.dumps(
            {"state_bytes": size, "tokens": args.tokens, "one_core": one, "all_cores": every}, indent=1
        )
    )
    if not args.dir:
        path.unlink()


if __name__ == "__main__":
    main()
