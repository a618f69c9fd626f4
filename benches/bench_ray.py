"""Ray benchmark: kvfast.ray on a local cluster of 1 and then 2 nodes against the single-machine path,
over generated f16 states (default 16 states of 64 MiB: 1 GiB), in the same run.

Each node has one CPU and ``RAYON_NUM_THREADS=1``, so a node is one core's worth of work: what
1 -> 2 nodes gains is what adding a machine gains, less what Ray costs. The single-machine path runs
in a child process on one core (``RAYON_NUM_THREADS=1``) and on all of them. Work timed (best of
``--repeat``, benches/timing.py):

- stats: per-layer channel statistics, ``kvfast.ray.stats(by="channel")`` gathered into Polars,
  against ``scan_stats(by="channel").collect()``;
- read: ``read_states`` with a per-block row count on the workers (every value read, decoded and
  put into an Arrow block in Ray's object store), against ``scan(...).collect()``;
- export: ``kvfast.ray.export`` into a new folder, against ``kvfast.export(jobs=1)``;
- plan: the driver's ``read_states(...)`` call alone (it opens every state), per state.

Prints a table and writes bench-out/ray.json.

    python benches/bench_ray.py [--dir DIR] [--states 16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import best

SINGLE = r"""
import json, shutil, sys, time
sys.path.insert(0, sys.argv[4])
from timing import best
import kvfast
src, out, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = iter(range(1000))
def export():
    kvfast.export(src, f"{out}/{next(runs)}", head_dim=128, jobs=1, progress=False)
times = {
    "stats": best(lambda: kvfast.scan_stats(src, by="channel", head_dim=128).collect(), repeat),
    "read": best(lambda: kvfast.scan(src, head_dim=128).collect(), repeat),
    "export": best(export, max(1, repeat - 1)),
}
shutil.rmtree(out, ignore_errors=True)
print(json.dumps(times))
"""


def single(src: Path, out: Path, repeat: int, threads: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if threads is not None:
        env["RAYON_NUM_THREADS"] = threads
    here = str(Path(__file__).resolve().parent)
    r = subprocess.run(
        [sys.executable, "-c", SINGLE, str(src), str(out), str(repeat), here],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def on_cluster(src: Path, out: Path, nodes: int, repeat: int) -> dict[str, float]:
    import pyarrow as pa
    import ray

    import kvfast.ray as kray
    from kvfast.ray.local import LocalCluster

    def count(t: pa.Table) -> pa.Table:
        return pa.table({"rows": [t.num_rows]})

    runs = iter(range(1000))

    def read() -> int:
        ds = kray.read_states(str(src), head_dim=128).map_batches(
            count, batch_format="pyarrow", batch_size=None
        )
        return int(kray.to_polars(ds)["rows"].sum())

    def export() -> None:
        kray.export(str(src), out / f"{nodes}-{next(runs)}", head_dim=128)

    with LocalCluster(nodes=nodes, cpus=1, env={"RAYON_NUM_THREADS": "1"}):
        ray.data.DataContext.get_current().enable_progress_bars = False
        read()  # warm: the workers' imports
        n_states = len(list(src.iterdir()))
        times = {
            "stats": best(lambda: kray.to_polars(kray.stats(str(src), by="channel", head_dim=128)), repeat),
            "read": best(read, repeat),
            "export": best(export, max(1, repeat - 1)),
            "plan": best(lambda: kray.read_states(str(src), head_dim=128), repeat) / n_states,
        }
    shutil.rmtree(out, ignore_errors=True)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--states", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from kvfast import synth

    tmp = Path(args.dir or tempfile.mkdtemp(prefix="kvfast-bench-"))
    src = tmp / "states"
    src.mkdir(parents=True, exist_ok=True)
    total = 0
    for i in range(args.states):
        p = src / f"s{i:03d}.bin"
        if not p.exists():
            synth.write_state(p, cells=2048, n_layer=8, n_embd_k=1024, seed=i)
        total += p.stat().st_size
    for p in src.iterdir():  # warm the page cache
        p.read_bytes()
    t0 = time.perf_counter()
    results = {
        "single, 1 core": single(src, tmp / "out-single", args.repeat, "1"),
        f"single, all {os.cpu_count()} cores": single(src, tmp / "out-single", args.repeat, None),
        "ray, 1 node x 1 core": on_cluster(src, tmp / "out-ray", 1, args.repeat),
        "ray, 2 nodes x 1 core": on_cluster(src, tmp / "out-ray", 2, args.repeat),
    }
    gb = total / 1e9
    print(
        f"{args.states} f16 states, {total / (1 << 30):.2f} GiB, head_dim 128 ({time.perf_counter() - t0:.0f} s)"
    )
    print(f"{'':<24}" + "".join(f"{w + ' s':>10}{'GB/s':>7}" for w in ("stats", "read", "export")))
    for name, t in results.items():
        print(f"{name:<24}" + "".join(f"{t[w]:10.2f}{gb / t[w]:7.2f}" for w in ("stats", "read", "export")))
    one, two = results["ray, 1 node x 1 core"], results["ray, 2 nodes x 1 core"]
    base = results["single, 1 core"]
    for w in ("stats", "read", "export"):
        print(
            f"{w}: 2 nodes {one[w] / two[w]:.2f}x 1 node (scaling efficiency {one[w] / two[w] / 2:.0%});"
            f" 1 node {base[w] / one[w]:.2f}x the single-machine path on one core"
        )
    print(f"driver planning: {two['plan'] * 1e3:.2f} ms a state (opens it; serial on the driver)")
    out = Path("bench-out")
    out.mkdir(exist_ok=True)
    (out / "ray.json").write_text(json.dumps({"states": args.states, "bytes": total, **results}, indent=1))


if __name__ == "__main__":
    main()
