"""Writer memory benchmark: the peak anonymous memory of `kvfast.write` on a generated 1 GiB state
(28 layers of 1024 f16 values per cell, K and V), with no edit, half the cells kept, K and V
requantized to q8_0, and V turned from rows to transposed and back. Each write runs in a fresh
interpreter; the parent samples the child's RssAnon (mapped file pages are page cache, not the
process's: VmRSS counts them, RssAnon does not) every 10 ms for the peak, and the child reports its
RssAnon after opening the state, before the write. Prints a table and writes
bench-out/write_memory.json.

    python benches/bench_write_memory.py [--dir DIR] [--gib 1.0] [--label NAME]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import PeakRssAnon

CHILD = r"""
import sys, numpy as np, kvfast
src, out, case = sys.argv[1:4]

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

with kvfast.open(src, head_dim=128) as d:
    n = d.caches[0].streams[0].cell_count
    kw = {}
    if case == "keep half":
        kw["keep"] = np.arange(n) % 2 == 0
    elif case == "q8_0":
        kw.update(cache_type_k="q8_0", cache_type_v="q8_0")
    elif case.startswith("v_trans"):
        kw["v_trans"] = case.endswith("on")
    print(anon(), flush=True)
    kvfast.write(d, out, **kw)
"""

CASES = [
    ("fa", "no edit"),
    ("fa", "keep half"),
    ("fa", "q8_0"),
    ("fa", "v_trans on"),
    ("nofa", "v_trans off"),
]


def run(src: Path, out: Path, case: str) -> tuple[float, int, int]:
    """Wall seconds, peak RssAnon and RssAnon before the write of one case in a fresh interpreter."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(src), str(out), case], stdout=subprocess.PIPE, text=True
    )
    watch = PeakRssAnon(proc, 0.01)
    stdout, _ = proc.communicate()
    peak = watch.join()
    if proc.returncode:
        raise SystemExit(f"{case}: the child failed with {proc.returncode}")
    out.unlink()
    return time.perf_counter() - t, peak, int(stdout.split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--dir", default=None, help="where the states are generated (default: a temporary folder)"
    )
    ap.add_argument("--gib", type=float, default=1.0, help="size of the generated states")
    ap.add_argument("--label", default="kvfast", help="the name of this run in the JSON")
    a = ap.parse_args()
    from kvfast import synth

    n_layer, n_embd = 28, 1024
    cells = int(a.gib * (1 << 30) / (n_layer * 2 * n_embd * 2))
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        d = Path(tmp)
        size = {}
        for name, trans in (("fa", False), ("nofa", True)):
            size[name] = synth.write_state(
                d / f"{name}.ggsq",
                container="ggsq",
                cells=cells,
                n_layer=n_layer,
                n_embd_k=n_embd,
                v_trans=trans,
            )
        print(f"{a.label}: states of {cells} cells, {size['fa'] / (1 << 20):.0f} MiB")
        print(f"{'source':<7}{'write':<14}{'seconds':>9}{'RssAnon before MiB':>20}{'peak RssAnon MiB':>18}")
        rows = []
        for src, case in CASES:
            t, peak, before = run(d / f"{src}.ggsq", d / "out.ggsq", case)
            mib = 1 << 20
            print(f"{src:<7}{case:<14}{t:>9.2f}{before / mib:>20.0f}{peak / mib:>18.0f}")
            rows.append({"source": src, "case": case, "s": t, "anon_before": before, "peak_anon": peak})
    out = Path("bench-out")
    out.mkdir(exist_ok=True)
    path = out / "write_memory.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    saved[a.label] = {"state_bytes": size["fa"], "cells": cells, "runs": rows}
    path.write_text(json.dumps(saved, indent=1))


if __name__ == "__main__":
    main()
