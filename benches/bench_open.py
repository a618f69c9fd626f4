"""Open benchmark: `kvfast.open()` (walk the state, build its structure, `.caches`) against reading
the file once, on large synthetic states (`kvfast.synth`); best of --repeat (of 100 at least for
open), page cache warm.

- the ratio state: cells of a Llama-3-8B-sized row (32 layers, K and V of 1,024 f16 values: 128 KiB
  per cell), 8,192 cells (1 GiB) by default: open should take at most 1/1000 of one read;
- the long state: 32,768 cells of Qwen3-8B's shape (36 layers, K and V of 1,024 f16 values: 4.8 GB),
  the long context of `bench_long.py`: open should take at most 1/1000 of one read here too;
- the cells state: 131,072 cells of tiny rows, where the cells' metadata (position, sequences) is
  all there is to open: its open time is the per-cell cost, which no Python object per cell adds to.
Open is a fixed cost (the model's layers, the rotation plan: well under a millisecond) plus the
per-cell one; reading grows with the bytes. So the ratio grows with the cells toward its limit, the
read time of one 128 KiB cell over the open time of one cell, which is printed too (a 128k-token
state of that model: 16 GiB, whose ratio is near that limit).
Prints a table and writes bench-out/open.json.

    python benches/bench_open.py [--dir DIR] [--repeat 5] [--cells 8192]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from timing import best

import kvfast
from kvfast import synth

CHUNK = 64 << 20


def read_once(path: Path) -> int:
    buf = bytearray(CHUNK)
    n = 0
    with open(path, "rb", buffering=0) as f:
        while got := f.readinto(buf):
            n += got
    return n


def open_state(path: Path) -> None:
    with kvfast.open(path, rotation="none") as d:
        assert d.caches[0].streams[0].cell_count > 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the states (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cells", type=int, default=8192, help="cells of the ratio state")
    ap.add_argument(
        "--long-cells", type=int, default=32768, help="cells of the long state (Qwen3-8B's shape; 0: none)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        results = {}
        for name, cells, n_layer, n_embd in (
            ("ratio", args.cells, 32, 1024),
            ("long", args.long_cells, 36, 1024),
            ("cells", 131072, 1, 64),
        ):
            if cells == 0:
                continue
            path = Path(tmp) / f"{name}.bin"
            size = synth.write_state(path, cells=cells, n_layer=n_layer, n_embd_k=n_embd, k_type="f16")
            read_once(path)  # warm the page cache
            t_read = best(lambda p=path: read_once(p), args.repeat)
            # open takes a millisecond: its best of a few runs is mostly noise, so more runs of it
            t_open = best(lambda p=path: open_state(p), max(args.repeat, 100))
            results[name] = {
                "cells": cells,
                "bytes": size,
                "read_s": t_read,
                "open_s": t_open,
                "open_ns_per_cell": t_open / cells * 1e9,
                "ratio": t_read / t_open,
            }
            path.unlink()
    print(
        f"{'state':<6} {'cells':>8} {'GiB':>6} {'read once':>10} {'open':>10} {'ns/cell':>8} {'read/open':>10}"
    )
    for name, r in results.items():
        print(
            f"{name:<6} {r['cells']:>8} {r['bytes'] / (1 << 30):>6.2f} {r['read_s'] * 1e3:>8.1f}ms"
            f" {r['open_s'] * 1e3:>8.2f}ms {r['open_ns_per_cell']:>8.1f} {r['ratio']:>9.0f}x"
        )
    limit = (
        results["ratio"]["read_s"] / results["ratio"]["cells"] * 1e9 / results["cells"]["open_ns_per_cell"]
    )
    results["per_cell_limit"] = {"ratio": limit}
    print(f"read/open per cell (the ratio of a large state of the ratio state's rows): {limit:.0f}x")
    out = Path("bench-out")
    out.mkdir(exist_ok=True)
    (out / "open.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
