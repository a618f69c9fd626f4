"""Statistics benchmark: kvfast's Rust kernels against NumPy computing the same statistics on the
same state (at least 1 GiB, f16, head_dim 128), in the same run; best of --repeat.

- by="cell": per (cell, head) l2, mean, std, min, max, absmax, argmax;
- by="channel": per channel mean, std, absmax (+ outlier ratio against the head's median).
NumPy works a record at a time (rows as float32, sums in float64), as a careful script would.
Prints a table and writes bench-out/stats.json.

    python benches/bench_stats.py [--dir DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import mmap
import tempfile
from pathlib import Path

import numpy as np
from timing import best

import kvfast
from kvfast import synth

HEAD_DIM = 128


def records(d: kvfast.Dump) -> list[tuple[int, int, int]]:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="kvfast-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "f16.bin"
    if not path.exists():
        synth.write_state(path, cells=16384, n_layer=16, n_embd_k=1024, k_type="f16")
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    results: dict[str, float] = {}
    with kvfast.open(path, head_dim=HEAD_DIM) as d, open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        recs = records(d)
        size = d.size
        for by, numpy_fn in (("cell", numpy_cells), ("channel", numpy_channels)):
            t_kv = best(lambda by=by: d.stats(by=by), args.repeat)
            t_np = best(lambda fn=numpy_fn: fn(mm, recs), args.repeat)
            results[f"{by}_kvfast_s"] = t_kv
            results[f"{by}_numpy_s"] = t_np
            results[f"{by}_speedup"] = t_np / t_kv
    print(f"state: {size / (1 << 30):.2f} GiB f16, head_dim {HEAD_DIM}")
    print(f"{'stats':<10}{'kvfast s':>10}{'NumPy s':>10}{'GB/s':>8}{'speedup':>9}")
    for by in ("cell", "channel"):
        t_kv, t_np = results[f"{by}_kvfast_s"], results[f"{by}_numpy_s"]
        print(f"{by:<10}{t_kv:10.3f}{t_np:10.3f}{size / t_kv / 1e9:8.2f}{t_np / t_kv:8.1f}x")
    out = Path("bench-out")
    out.mkdir(exist_ok=True)
    (out / "stats.json").write_text(json.dumps({"state_bytes": size, **results}, indent=1))


if __name__ == "__main__":
    main()
