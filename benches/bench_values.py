"""Values benchmark: kvfast against plain NumPy doing the same work, in the same run.

Writes two states of at least 1 GiB each (f16 and q8_0; `kvfast.synth`), warms the page cache, then
times (best of --repeat):
- f16 table building: `State.to_arrow()` (zero-copy views of the map) against NumPy reading the same
  rows as float32 (`np.frombuffer(...).astype(np.float32)`), and against a state 8x smaller;
- q8_0 decoding to float32: `State.values(..., dtype="float32")` for every record, against a vectorized
  NumPy q8_0 dequantizer and against the machine's limit for writing that many output bytes into
  fresh memory (`np.ones` of the output's size).
Prints a table and writes bench-out/values.json.

    python benches/bench_values.py [--dir DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from timing import best

import kvfast
from kvfast import synth

GiB = 1 << 30


def records(d: kvfast.State) -> list[tuple[int, str, int, int, int]]:
    """(layer, kind, offset, nbytes, cells) of every record."""
    s = d.caches[0].streams[0]
    out = []
    for ly in s.layers:
        out.append((ly.index, "k", ly.k_offset, ly.k_nbytes, s.cell_count))
        out.append((ly.index, "v", ly.v_offset or 0, ly.v_nbytes or 0, s.cell_count))
    return out


def numpy_f16(mm: mmap.mmap, recs: list[tuple[int, str, int, int, int]]) -> int:
    n = 0
    for _, _, off, nb, _ in recs:
        a = np.frombuffer(mm, "<f2", count=nb // 2, offset=off).astype(np.float32)
        n += a.nbytes
        del a
    return n


def numpy_q8_0(mm: mmap.mmap, recs: list[tuple[int, str, int, int, int]]) -> int:
    n = 0
    for _, _, off, nb, cells in recs:
        b = np.frombuffer(mm, np.uint8, count=nb, offset=off).reshape(-1, 34)
        d = b[:, :2].copy().view("<f2").astype(np.float32)
        q = b[:, 2:].view(np.int8).astype(np.float32)
        out = (q * d).reshape(cells, -1)
        n += out.nbytes
        del out
    return n


def fill(recs: list[tuple[int, str, int, int, int]], values_per_byte: float) -> int:
    n = 0
    for _, _, _, nb, _ in recs:
        a = np.ones(int(nb * values_per_byte), np.float32)
        n += a.nbytes
        del a
    return n


def kvfast_values(d: kvfast.State, recs: list[tuple[int, str, int, int, int]]) -> int:
    n = 0
    for layer, kind, _, _, _ in recs:
        a = d.values(layer, kind, dtype="float32")
        n += a.nbytes
        del a
    return n


def index_bytes(t: pa.Table) -> dict[str, float]:
    """Bytes a row of the table's index columns (validity bitmaps included), as kvfast types them and
    as int32 with ``kind`` as text (the types before kvfast.read.schema)."""
    index = [n for n in t.column_names if n != "values"]
    narrow = sum(t.column(n).nbytes for n in index)
    wide = 0
    for n in index:
        col = t.column(n)
        if n == "kind":
            wide += col.cast(pa.string()).nbytes
        else:
            wide += col.cast(pa.int32()).nbytes
    return {"narrow": narrow / t.num_rows, "int32": wide / t.num_rows}


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="where to write the states (default: a temporary folder)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="kvfast-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {"cpus": os.cpu_count()}

    f16 = tmp / "f16.bin"
    f16_small = tmp / "f16-small.bin"
    q8 = tmp / "q8_0.bin"
    if not f16.exists():
        synth.write_state(f16, cells=16384, n_layer=16, n_embd_k=1024, k_type="f16")
    if not f16_small.exists():
        synth.write_state(f16_small, cells=2048, n_layer=16, n_embd_k=1024, k_type="f16")
    if not q8.exists():
        synth.write_state(q8, cells=16384, n_layer=32, n_embd_k=1024, k_type="q8_0")

    rows = []
    # f16: table building
    for p in (f16, f16_small):
        warm(p)
    with kvfast.open(f16, head_dim=128) as d, open(f16, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        recs = records(d)
        out_f32 = sum(nb for *_, nb, _ in recs) * 2
        t_table = best(lambda: d.to_arrow(), args.repeat)
        t_polars = best(lambda: d.to_polars(), args.repeat)
        t_np = best(lambda: numpy_f16(mm, recs), args.repeat)
        size = d.size
        index = index_bytes(d.to_arrow())
    with kvfast.open(f16_small, head_dim=128) as d:
        t_small = best(lambda: d.to_arrow(), args.repeat)
        size_small = d.size
    rows.append(("f16 to_arrow (zero-copy)", size, t_table, None))
    rows.append(("f16 to_polars (zero-copy)", size, t_polars, None))
    rows.append((f"f16 to_arrow, state {size // size_small}x smaller", size_small, t_small, None))
    rows.append(("NumPy frombuffer().astype(float32)", size, t_np, out_f32 / t_np))
    results["f16"] = {
        "state_bytes": size,
        "to_arrow_s": t_table,
        "to_polars_s": t_polars,
        "to_arrow_small_s": t_small,
        "small_state_bytes": size_small,
        "numpy_astype_s": t_np,
        "numpy_over_kvfast": t_np / t_table,
        "index_bytes_per_row": index,
    }

    # q8_0: decoding to float32
    warm(q8)
    with kvfast.open(q8) as d, open(q8, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        recs = records(d)
        out_bytes = sum(nb for *_, nb, _ in recs) * 32 // 34 * 4
        t_kv = best(lambda: kvfast_values(d, recs), args.repeat)
        t_npq = best(lambda: numpy_q8_0(mm, recs), args.repeat)
        t_fill = best(lambda: fill(recs, 32 / 34), args.repeat)
        size = d.size
    rows.append(("q8_0 decode, kvfast (Rust, rayon)", size, t_kv, out_bytes / t_kv))
    rows.append(("q8_0 decode, vectorized NumPy", size, t_npq, out_bytes / t_npq))
    rows.append(("np.ones of the output's size (limit)", size, t_fill, out_bytes / t_fill))
    results["q8_0"] = {
        "state_bytes": size,
        "output_bytes": out_bytes,
        "kvfast_s": t_kv,
        "numpy_s": t_npq,
        "fill_s": t_fill,
        "speedup_vs_numpy": t_npq / t_kv,
        "kvfast_over_fill": t_kv / t_fill,
    }

    print(f"{'work':<42}{'state':>10}{'seconds':>10}{'out GB/s':>10}")
    for name, sz, t, bw in rows:
        gbs = f"{bw / 1e9:10.2f}" if bw else f"{'-':>10}"
        print(f"{name:<42}{sz / GiB:9.2f}G{t:10.4f}{gbs}")
    f, q = results["f16"], results["q8_0"]
    assert isinstance(f, dict) and isinstance(q, dict)
    print(
        f"\nf16 table: {f['numpy_over_kvfast']:.0f}x faster than NumPy's astype;"
        f" {f['to_arrow_s'] / f['to_arrow_small_s']:.2f}x the time of a state"
        f" {f['state_bytes'] / f['small_state_bytes']:.0f}x smaller"
    )
    idx = f["index_bytes_per_row"]
    assert isinstance(idx, dict)
    print(
        f"index columns: {idx['narrow']:.1f} bytes a row (kvfast.read.schema's types) against {idx['int32']:.1f}"
        f" as int32 and text ({idx['narrow'] / idx['int32']:.2f}x)"
    )
    print(
        f"q8_0 decode: {q['speedup_vs_numpy']:.1f}x NumPy's throughput;"
        f" {q['kvfast_over_fill']:.2f}x the time of filling the same output memory"
    )
    out = Path("bench-out")
    out.mkdir(exist_ok=True)
    (out / "values.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
