"""Export benchmark: `kvfast.export` of 50 generated f16 states (2.1 GiB in all) against a plain
Polars/NumPy script doing the same export (the same columns, one zstd Parquet file per state and
layer), in the same run. Each runs in its own process; the parent samples the child's anonymous
memory (RssAnon: mapped file pages are page cache, not the process's) every 20 ms for the peak.
Prints a table and writes bench-out/export.json.

    python benches/bench_export.py [--dir DIR] [--states 50]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PLAIN = r"""
import sys, os, numpy as np, polars as pl
import kvfast
src, out = sys.argv[1], sys.argv[2]
for name in sorted(os.listdir(src)):
    path = os.path.join(src, name)
    d = kvfast.open(path)  # the layout only: offsets and cell metadata
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    s = d.caches[0].streams[0]
    heads = s.layers[0].n_embd_k // 128
    for ly in s.layers:
        frames = []
        for kind, off, n in (("k", ly.k_offset, ly.n_embd_k), ("v", ly.v_offset, ly.n_embd_v)):
            vals = np.frombuffer(raw, "<f2", count=s.cell_count * n, offset=off).reshape(-1, 128)
            cells = np.repeat(np.arange(s.cell_count, dtype=np.int32), heads)
            frames.append(pl.DataFrame({
                "dump": name, "path": os.path.realpath(path), "cache": np.zeros(len(cells), np.int32),
                "stream": np.zeros(len(cells), np.int32), "layer": np.full(len(cells), ly.index, np.int32),
                "model_layer": np.full(len(cells), ly.index, np.int32), "kind": kind, "cell": cells,
                "pos": s.pos[cells], "seq_id": np.zeros(len(cells), np.int32),
                "head": np.tile(np.arange(heads, dtype=np.int32), s.cell_count),
                "values": pl.Series(vals).cast(pl.Array(pl.Float16, 128)),
            }))
        part = os.path.join(out, name)
        os.makedirs(part, exist_ok=True)
        pl.concat(frames).write_parquet(os.path.join(part, f"layer-{ly.index}.parquet"), compression="zstd")
"""

KVFAST = r"""
import sys, kvfast
report = kvfast.export(sys.argv[1], sys.argv[2], head_dim=128)
assert (report["status"] == "written").all(), report
"""


def run(code: str, src: Path, out: Path) -> tuple[float, int]:
    """Wall seconds and peak RssAnon (bytes) of `code` run in a fresh interpreter."""
    if out.exists():
        shutil.rmtree(out)
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, str(src), str(out)])
    peak = 0

    def sample() -> None:
        nonlocal peak
        status = Path(f"/proc/{proc.pid}/status")
        while proc.poll() is None:
            try:
                for line in status.read_text().splitlines():
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
            except OSError:
                pass
            time.sleep(0.02)

    th = threading.Thread(target=sample)
    th.start()
    rc = proc.wait()
    th.join()
    if rc:
        raise SystemExit(f"benchmark child failed with {rc}")
    return time.perf_counter() - t, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--states", type=int, default=50)
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
    t_kv, m_kv = run(KVFAST, src, tmp / "out-kvfast")
    t_pl, m_pl = run(PLAIN, src, tmp / "out-plain")
    gib = total / (1 << 30)
    print(f"{args.states} states, {gib:.2f} GiB of f16 rows, head_dim 128")
    print(f"{'export':<26}{'seconds':>9}{'GB/s':>8}{'peak RssAnon MiB':>18}")
    for name, t, m in (("kvfast.export", t_kv, m_kv), ("plain Polars/NumPy script", t_pl, m_pl)):
        print(f"{name:<26}{t:9.2f}{total / t / 1e9:8.2f}{m / (1 << 20):18.0f}")
    print(
        f"kvfast: {t_pl / t_kv:.1f}x the throughput; peak RssAnon {m_kv >> 20} MiB against {m_pl >> 20} MiB"
    )
    out = Path("bench-out")
    out.mkdir(exist_ok=True)
    (out / "export.json").write_text(
        json.dumps(
            {
                "states": args.states,
                "bytes": total,
                "kvfast_s": t_kv,
                "kvfast_peak_anon": m_kv,
                "plain_s": t_pl,
                "plain_peak_anon": m_pl,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
