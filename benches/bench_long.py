"""Long-context benchmark: a 32k-token state of a Qwen3-8B-shaped model (36 layers, 8 KV heads x 128:
K and V rows of 1,024 values; 4.8 GB in f16, 2.6 GB in q8_0), written by `kvfast.synth` into a
temporary folder (deleted at the end), and the same at half the tokens to check that each step's
time is linear in the bytes it touches.

Each step runs in a fresh interpreter; the parent samples the child's anonymous memory (RssAnon:
mapped file pages are page cache, not the process's) every 10 ms for its peak, and the child reports
the step's own time (imports and interpreter start-up left out). Steps:

- open: `kvfast.open` and its structure (`.caches`): metadata only, so milliseconds;
- stats: `stats(by="layer")` of the whole state (every row read; a small result);
- stats-cell-layer: `stats(by="cell", layers=[k])`, one layer's per-(cell, head) table;
- scan-layer: `kvfast.scan(path).filter(layer == k).collect()`: one layer's values (its rows only);
- export: `kvfast.export` of the whole state to Parquet (the default: one file per layer).

`stats(by="cell")` of the whole state is not a step: its result alone (one row per cell, layer,
kind and head: 18.9 M rows of ~77 bytes at 32k tokens) is larger than the memory bound.
Prints a table (bytes touched, seconds, GB/s, CPU seconds of all threads, peak RssAnon, and the
ratio of full-size to half-size CPU time: 2 is linear; CPU time rather than wall time, which a
machine shared with other work makes noisy) and writes bench-out/long.json. Needs about 8 GB of
free disk for the states, plus what export writes.

    python benches/bench_long.py [--dir DIR] [--tokens 32768] [--types f16,q8_0] [--skip export]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import PeakRssAnon

from kvfast import synth

N_LAYER, N_EMBD, HEAD_DIM, LAYER = 36, 1024, 128, 17
RSS_LIMIT = 512 << 20

CHILD = r"""
import json, sys, time
import polars as pl
import kvfast

def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0

step, path, out, layer = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
before = rss_anon()
t, cpu = time.perf_counter(), time.process_time()
if step == "open":
    with kvfast.open(path, head_dim=128) as d:
        touched = sum(c.streams[0].cell_count for c in d.caches) * 12  # pos, count, one seq id a cell
elif step == "stats":
    with kvfast.open(path, head_dim=128) as d:
        res = d.stats(by="layer")
        touched = sum(ly.k_nbytes + (ly.v_nbytes or 0) for ly in d.caches[0].streams[0].layers)
elif step == "stats-cell-layer":
    with kvfast.open(path, head_dim=128) as d:
        res = d.stats(by="cell", layers=[layer])
        ly = d.caches[0].streams[0].layers[layer]
        touched = ly.k_nbytes + (ly.v_nbytes or 0)
elif step == "scan-layer":
    res = kvfast.scan(path, head_dim=128).filter(pl.col("layer") == layer).collect()
    with kvfast.open(path, head_dim=128) as d:
        ly = d.caches[0].streams[0].layers[layer]
        touched = ly.k_nbytes + (ly.v_nbytes or 0)
        assert res.height == d.caches[0].streams[0].cell_count * 2 * 8, res.height
elif step == "export":
    report = kvfast.export(path, out, head_dim=128)
    assert (report["status"] == "written").all(), report
    with kvfast.open(path, head_dim=128) as d:
        touched = sum(ly.k_nbytes + (ly.v_nbytes or 0) for ly in d.caches[0].streams[0].layers)
else:
    raise SystemExit(f"unknown step {step}")
seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
print(json.dumps({"seconds": seconds, "cpu_s": cpu, "touched": touched, "rss_before": before}))
"""

STEPS = ("open", "stats", "stats-cell-layer", "scan-layer", "export")


def run_step(step: str, path: Path, out: Path, repeat: int) -> dict[str, float] | str:
    """The best time of `repeat` runs of a step (each in a fresh interpreter) and the peak RssAnon
    over all of them; or why it failed (the last line of its error)."""
    best: dict[str, float] = {}
    peak = 0
    for _ in range(repeat):
        if out.exists():
            shutil.rmtree(out)
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, step, str(path), str(out), str(LAYER)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        watch = PeakRssAnon(proc, 0.01)
        stdout, stderr = proc.communicate()
        peak = max(peak, watch.join())
        if proc.returncode != 0:
            return f"failed (status {proc.returncode}): " + (stderr.strip().splitlines() or [""])[-1][:200]
        got = json.loads(stdout.strip().splitlines()[-1])
        if not best or got["seconds"] < best["seconds"]:
            best = got
    if out.exists():
        shutil.rmtree(out)
    return {**best, "rss_peak": peak}


def warm(path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(64 << 20)
        while f.readinto(buf):
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the states (default: a temp dir)")
    ap.add_argument("--tokens", type=int, default=32768, help="tokens of the full-size state")
    ap.add_argument("--types", default="f16,q8_0")
    ap.add_argument("--skip", default="", help="steps to leave out, comma-separated")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each step but export (best time)")
    args = ap.parse_args()
    skip = {s for s in args.skip.split(",") if s}
    steps = [s for s in STEPS if s not in skip]
    results: dict[str, dict[str, dict[str, float]]] = {}
    failed: dict[str, str] = {}
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="kvfast-long-") as tmp:
        for ty in args.types.split(","):
            for tokens in (args.tokens // 2, args.tokens):
                name = f"{ty}-{tokens}"
                path = Path(tmp) / f"{name}.bin"
                t = time.perf_counter()
                size = synth.write_state(path, cells=tokens, n_layer=N_LAYER, n_embd_k=N_EMBD, k_type=ty)
                written = time.perf_counter() - t
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
                print(
                    f"{name}: wrote {size / 1e9:.2f} GB in {written:.1f} s (kvfast.synth streams it:"
                    f" this process's peak RSS so far {peak / 2**20:.0f} MiB)",
                    flush=True,
                )
                warm(path)
                results[name] = {"state": {"bytes": size, "write_s": written, "writer_peak_rss": peak}}
                for step in steps:
                    r = run_step(step, path, Path(tmp) / "export", 1 if step == "export" else args.repeat)
                    if isinstance(r, str):
                        print(f"  {step:<17}{r}", flush=True)
                        failed[f"{name} {step}"] = r
                        continue
                    results[name][step] = r
                    print(
                        f"  {step:<17}{r['seconds']:9.3f} s {r['touched'] / 1e9:8.3f} GB"
                        f" {r['touched'] / r['seconds'] / 1e9:7.2f} GB/s  RssAnon {r['rss_peak'] / 2**20:6.0f} MiB",
                        flush=True,
                    )
                path.unlink()
    print()
    print(
        f"{'state':<12}{'step':<18}{'GB':>7}{'s':>9}{'GB/s':>7}{'CPU s':>8}{'RssAnon MiB':>12}{'x half':>8}  ok"
    )
    ok = True
    for name, res in results.items():
        ty, tokens = name.split("-")
        half = results.get(f"{ty}-{int(tokens) // 2}")
        for step in steps:
            if step not in res:
                ok = False
                print(f"{name:<12}{step:<18}{failed[f'{name} {step}']}")
                continue
            r = res[step]
            # CPU seconds (every thread's), not wall: a machine shared with other work slows the
            # wall clock of one run and not of another; the work done is what must be linear
            ratio = r["cpu_s"] / half[step]["cpu_s"] if half and step in half else float("nan")
            fine = r["rss_peak"] < RSS_LIMIT and (half is None or step == "open" or ratio < 2.6)
            ok &= fine
            print(
                f"{name:<12}{step:<18}{r['touched'] / 1e9:7.3f}{r['seconds']:9.3f}"
                f"{r['touched'] / r['seconds'] / 1e9:7.2f}{r['cpu_s']:8.2f}{r['rss_peak'] / 2**20:12.0f}"
                f"{ratio:8.2f}  {'yes' if fine else 'NO'}"
            )
    print(
        "RssAnon below 512 MiB and full-size CPU time within 2.6x the half-size one (2x is linear):",
        "all" if ok else "NOT all",
    )
    out = Path("bench-out")
    out.mkdir(exist_ok=True)
    (out / "long.json").write_text(json.dumps({"results": results, "failed": failed}, indent=1))


if __name__ == "__main__":
    main()
