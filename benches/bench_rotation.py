"""Rotation benchmark: undoing llama.cpp's Hadamard rotation, fused into decoding, in the same run as
plain decoding and as the plain NumPy way (decode, then a matrix product per group).

Writes a q8_0 state (`kvfast.synth`, raw sequence bytes of 2026; K rows of 1,024 values = 8 heads of
128, so K is undone in groups of 128 and V in groups of 64), warms the page cache, then times (best
of --repeat) decoding every record to float32:
- as stored (`rotation="none"`): ggml's dequantization alone;
- in the model's basis (`rotation="hadamard"`): dequantization plus a fast Walsh-Hadamard transform
  per group, in Rust, in parallel;
- NumPy: the same dequantization vectorized, then `rows.reshape(-1, n) @ H_n`;
and the same for `stats(by="channel")`. The goal: the undo costs at most 1.5x plain decoding.
Prints a table and writes bench-out/rotation.json.

    python benches/bench_rotation.py [--dir DIR] [--repeat 3] [--cells 8192]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
from timing import best

import kvfast
from kvfast import synth

GiB = 1 << 30


def sylvester(n: int) -> np.ndarray:
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.float32(np.sqrt(n))


def numpy_undo(mm: mmap.mmap, d: kvfast.State) -> int:
    """Decode every q8_0 record with NumPy, then multiply every group by the Hadamard matrix."""
    n = 0
    mats = {64: sylvester(64), 128: sylvester(128)}
    s = d.caches[0].streams[0]
    for ly in s.layers:
        for off, nb, group in ((ly.k_offset, ly.k_nbytes, 128), (ly.v_offset or 0, ly.v_nbytes or 0, 64)):
            b = np.frombuffer(mm, np.uint8, count=nb, offset=off).reshape(-1, 34)
            scale = b[:, :2].copy().view("<f2").astype(np.float32)
            x = (b[:, 2:].view(np.int8).astype(np.float32) * scale).reshape(-1, group) @ mats[group]
            n += x.nbytes
            del x
    return n


def kvfast_all(d: kvfast.State) -> int:
    n = 0
    for ly in d.caches[0].streams[0].layers:
        for kind in "kv":
            a = d.values(ly.index, kind, dtype="float32")
            n += a.nbytes
            del a
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="where to write the state (default: a temporary folder)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cells", type=int, default=8192)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory() if args.dir is None else None
    root = Path(args.dir or tmp.name)  # type: ignore[union-attr]
    root.mkdir(parents=True, exist_ok=True)
    path = root / "q8_0.bin"
    synth.write_state(path, cells=args.cells, n_layer=16, n_embd_k=1024, k_type="q8_0")
    size = os.path.getsize(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stored = kvfast.open(path, rotation="none")
        model = kvfast.open(path, rotation="hadamard", head_dim=128)
    assert [(r.kind, r.group) for r in model.rotation] == [("k", 128), ("v", 64)]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        kvfast_all(stored)  # warm the page cache
        rows = [
            ("values as stored (kvfast)", best(lambda: kvfast_all(stored), args.repeat)),
            ("values in the model's basis (kvfast)", best(lambda: kvfast_all(model), args.repeat)),
            ("values in the model's basis (NumPy)", best(lambda: numpy_undo(mm, stored), args.repeat)),
            ("stats by channel, as stored (kvfast)", best(lambda: stored.stats(by="channel"), args.repeat)),
            (
                "stats by channel, model's basis (kvfast)",
                best(lambda: model.stats(by="channel"), args.repeat),
            ),
        ]
    t = dict(rows)
    ratios = {
        "undo / plain decoding": t["values in the model's basis (kvfast)"] / t["values as stored (kvfast)"],
        "NumPy undo / kvfast undo": t["values in the model's basis (NumPy)"]
        / t["values in the model's basis (kvfast)"],
        "stats undo / stats plain": t["stats by channel, model's basis (kvfast)"]
        / t["stats by channel, as stored (kvfast)"],
    }
    print(f"q8_0 state of {size / GiB:.2f} GiB, {os.cpu_count()} cores, best of {args.repeat}")
    print(f"{'work':<44}{'seconds':>10}{'state GB/s':>12}")
    for name, s in rows:
        print(f"{name:<44}{s:10.4f}{size / s / 1e9:12.2f}")
    for name, r in ratios.items():
        print(f"{name:<44}{r:10.2f}x")
    out = Path("bench-out")
    out.mkdir(exist_ok=True)
    (out / "rotation.json").write_text(json.dumps({"bytes": size, "seconds": t, "ratios": ratios}, indent=1))
    stored.close()
    model.close()
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
