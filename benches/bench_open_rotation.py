"""Open benchmark of the rotation decision: `kvfast.open(path)` with the default `rotation="auto"`
against `rotation="none"` on quantized states (`kvfast.synth`, q8_0 K and V, no model: the values
test decides), best of --repeat, page cache warm. The decision reads a sample of rows (at most 512
cells of six records per cache and kind), so its cost must not grow with the state:

- a 238 MiB state: 28 layers x 4,096 cells of 1,024 values;
- the long state of `bench_long.py`: 32,768 cells of Qwen3-8B's shape (36 layers, K and V of 1,024
  values), 2.4 GiB in q8_0 (--long-cells 0 leaves it out).

Prints a table (the ratio auto / none) and writes bench-out/open_rotation.json.

    python benches/bench_open_rotation.py [--dir DIR] [--repeat 20] [--long-cells 32768]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

from timing import best

import kvfast
from kvfast import synth


def open_state(path: Path, rotation: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no model: the values test may not be sure
        with kvfast.open(path, rotation=rotation) as d:  # type: ignore[arg-type]
            assert d.caches[0].streams[0].cell_count > 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the states (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--long-cells", type=int, default=32768, help="cells of the long state (0: none)")
    args = ap.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    shapes = [("238 MiB q8_0", 4096, 28)]
    if args.long_cells:
        shapes.append((f"{args.long_cells // 1024}k-token Qwen3-8B shape q8_0", args.long_cells, 36))
    results = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for name, cells, n_layer in shapes:
            path = Path(tmp) / f"{cells}.bin"
            size = synth.write_state(
                path, cells=cells, n_layer=n_layer, n_embd_k=1024, k_type="q8_0", v_type="q8_0"
            )
            open_state(path, "auto")  # page cache warm
            none = best(lambda p=path: open_state(p, "none"), args.repeat)
            auto = best(lambda p=path: open_state(p, "auto"), args.repeat)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with kvfast.open(path) as d:
                    decided = [(r.kind, r.undone, r.certain) for r in d.rotation]
            results[name] = {
                "bytes": size,
                "none_s": none,
                "auto_s": auto,
                "ratio": auto / none,
                "decided": decided,
            }
            path.unlink()
    print("| state | size | open, rotation='none' | open, 'auto' | auto / none |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['bytes'] / 2**20:,.0f} MiB | {r['none_s'] * 1e3:.2f} ms | {r['auto_s'] * 1e3:.2f} ms"
            f" | {r['ratio']:.1f}x |"
        )
    out = Path("bench-out")
    out.mkdir(exist_ok=True)
    (out / "open_rotation.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
