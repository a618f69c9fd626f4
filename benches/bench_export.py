"""Export benchmark: `kvfast.export` of 50 generated f16 states (2.1 GiB in all) against plain
scripts writing the same Parquet (the same columns and types, one zstd level 1 file per state and
layer, float16 values), with Polars and with pyarrow, in the same run. Each runs in its own process;
the parent samples the child's anonymous memory (RssAnon: mapped file pages are page cache, not the
process's) every 20 ms for the peak. `--experiments` also times kvfast's writer with other encodings
of the values column (kvfast.dataset.export_parquet.SETTINGS: BYTE_STREAM_SPLIT, no compression, zstd 3,
page sizes) and gives each one's output size. Prints tables and writes bench-out/export.json.

    python benches/bench_export.py [--dir DIR] [--states 50] [--experiments]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import PeakRssAnon

# The frame of one layer (K then V) of a state, built from the bytes with NumPy, typed as kvfast's
# value table (kvfast.dataset.INDEX_SCHEMA, values Array(Float16, 128)).
FRAME = r"""
import sys, os, numpy as np, polars as pl
import kvfast
from kvfast.dataset import INDEX_SCHEMA

def layer_frames(src):
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        d = kvfast.open(path)  # the layout only: offsets and cell metadata
        raw = np.memmap(path, dtype=np.uint8, mode="r")
        s = d.caches[0].streams[0]
        heads = s.layers[0].n_embd_k // 128
        real = os.path.realpath(path)
        toks = d.cell_tokens().filter(cache=0, stream=0)
        for ly in s.layers:
            frames = []
            for kind, off, n in (("k", ly.k_offset, ly.n_embd_k), ("v", ly.v_offset, ly.n_embd_v)):
                vals = np.frombuffer(raw, "<f2", count=s.cell_count * n, offset=off).reshape(-1, 128)
                cells = np.repeat(np.arange(s.cell_count, dtype=np.int32), heads)
                frames.append(pl.DataFrame({
                    "dump": kvfast.dump_id(real), "path": real, "cache": 0, "stream": 0, "layer": ly.index,
                    "model_layer": ly.index, "kind": kind, "cell": cells, "pos": s.pos[cells], "seq_id": 0,
                    "head": np.tile(np.arange(heads, dtype=np.int32), s.cell_count),
                    "k_type": ly.k_type, "v_type": ly.v_type,
                    "token": toks["token"].gather(cells), "piece": toks["piece"].gather(cells),
                    "values": pl.Series(vals).cast(pl.Array(pl.Float16, 128)),
                }).cast(INDEX_SCHEMA).select(*INDEX_SCHEMA, "values"))
            part = os.path.join(out, kvfast.dump_id(real))
            os.makedirs(part, exist_ok=True)
            yield frames, os.path.join(part, f"layer-{ly.index}.parquet")
src, out = sys.argv[1], sys.argv[2]
"""

POLARS = (
    FRAME
    + r"""
for frames, dest in layer_frames(src):
    pl.concat(frames).write_parquet(dest, compression="zstd", compression_level=1)
"""
)

PYARROW = (
    FRAME
    + r"""
import pyarrow.parquet as pq
for frames, dest in layer_frames(src):
    t = pl.concat(frames).to_arrow()
    pq.write_table(t, dest, compression="zstd", compression_level=1, use_dictionary=list(INDEX_SCHEMA))
"""
)

KVFAST = r"""
import json, sys, kvfast
from kvfast.dataset import export_parquet
export_parquet.SETTINGS.update(json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})
report = kvfast.export(sys.argv[1], sys.argv[2], head_dim=128)
assert (report["status"] == "written").all(), report
"""

#: The encodings of the values column tried (kvfast.dataset.export_parquet.SETTINGS; the first is export's).
EXPERIMENTS: list[tuple[str, dict[str, object]]] = [
    ("PLAIN, zstd 1, 64 KiB pages (export's)", {}),
    ("PLAIN, zstd 1, 1 MiB pages", {"page_bytes": 1 << 20}),
    ("PLAIN, zstd 1, 8 MiB pages", {"page_bytes": 8 << 20}),
    ("PLAIN, zstd 3, 64 KiB pages", {"zstd": 3}),
    ("PLAIN, uncompressed, 64 KiB pages", {"zstd": None}),
    ("PLAIN, uncompressed, 1 MiB pages", {"zstd": None, "page_bytes": 1 << 20}),
    ("BYTE_STREAM_SPLIT, zstd 1, 64 KiB pages", {"split": True}),
    ("BYTE_STREAM_SPLIT, uncompressed", {"split": True, "zstd": None}),
]


def run(code: str, src: Path, out: Path, *args: str) -> tuple[float, int, int]:
    """Wall seconds, peak RssAnon and output size (bytes) of `code` run in a fresh interpreter."""
    if out.exists():
        shutil.rmtree(out)
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, str(src), str(out), *args])
    watch = PeakRssAnon(proc, 0.02)
    rc = proc.wait()
    peak = watch.join()
    if rc:
        raise SystemExit(f"benchmark child failed with {rc}")
    elapsed = time.perf_counter() - t
    size = sum(f.stat().st_size for f in out.glob("**/*.parquet"))
    shutil.rmtree(out)
    return elapsed, peak, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--states", type=int, default=50)
    ap.add_argument("--experiments", action="store_true", help="also time other encodings of the values")
    args = ap.parse_args()
    from kvfast import synth

    tmp = Path(args.dir or tempfile.mkdtemp(prefix="kvfast-bench-"))
    src = tmp / "states"
    src.mkdir(parents=True, exist_ok=True)
    total = 0
    for i in range(args.states):
        p = src / f"s{i:03d}.bin"
        if not p.exists():
            synth.write_state(p, cells=1344, n_layer=8, n_embd_k=1024, seed=i)
        total += p.stat().st_size
    for p in src.iterdir():  # warm the page cache
        p.read_bytes()
    runs = {
        "kvfast.export": run(KVFAST, src, tmp / "out"),
        "plain Polars script": run(POLARS, src, tmp / "out"),
        "plain pyarrow script": run(PYARROW, src, tmp / "out"),
    }
    gib = total / (1 << 30)
    print(f"{args.states} states, {gib:.2f} GiB of f16 rows, head_dim 128")
    print(f"{'export':<26}{'seconds':>9}{'GB/s':>8}{'peak RssAnon MiB':>18}{'output MiB':>12}")
    for name, (t, m, size) in runs.items():
        print(f"{name:<26}{t:9.2f}{total / t / 1e9:8.2f}{m / (1 << 20):18.0f}{size / (1 << 20):12.0f}")
    t_kv = runs["kvfast.export"][0]
    t_plain = min(runs["plain Polars script"][0], runs["plain pyarrow script"][0])
    print(f"kvfast: {t_plain / t_kv:.1f}x the throughput of the faster plain script")
    tried = {}
    if args.experiments:
        print(f"\n{'values column':<40}{'seconds':>9}{'GB/s':>8}{'output / input':>16}")
        for name, settings in EXPERIMENTS:
            t, m, size = run(KVFAST, src, tmp / "out", json.dumps(settings))
            tried[name] = {"settings": settings, "s": t, "peak_anon": m, "bytes": size}
            print(f"{name:<40}{t:9.2f}{total / t / 1e9:8.2f}{size / total:16.3f}")
    out = Path("bench-out")
    out.mkdir(exist_ok=True)
    (out / "export.json").write_text(
        json.dumps(
            {
                "states": args.states,
                "bytes": total,
                **{
                    key: {"s": t, "peak_anon": m, "bytes": size}
                    for key, (t, m, size) in zip(("kvfast", "polars", "pyarrow"), runs.values(), strict=True)
                },
                "experiments": tried,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
