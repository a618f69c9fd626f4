"""Draws the pictures of the documentation with kvfast.plot, from the bundled sample and the
fixtures of tests/data, into the folder given (run from the repository's root by pictures.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import kvfast  # noqa: E402
import kvfast.plot  # noqa: E402
import polars as pl  # noqa: E402

DATA = Path("tests/data")
SERVER = DATA / "gemma3-270m-server"
HD128 = DATA / "qwen3hd128-q8_0-fa/seq-0.ggsq"
HD128_F16 = DATA / "qwen3hd128-f16-fa/seq-0.ggsq"
HD128_MODEL = DATA / "models/tiny-qwen3-hd128.gguf"
# PNG metadata without the matplotlib version: the same picture has the same bytes
SAVE = {"dpi": 110, "metadata": {"Software": None}}


def drift(out: Path) -> None:
    """compare of a real q8_0 run against the simulation of quant_error, per layer (Gemma 3)."""
    import matplotlib.pyplot as plt

    f16 = kvfast.open(SERVER / "gemma3-270m-server-f16-slot0.bin")
    q8 = kvfast.open(SERVER / "gemma3-270m-server-q8_0-slot0.bin")
    real = kvfast.compare(f16, q8, by="layer").filter(pl.col("kind") == "k").sort("model_layer")
    sim = f16.quant_error("q8_0", by="layer").filter(pl.col("kind") == "k").sort("model_layer")
    fig, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    ax.plot(real["model_layer"], 100 * real["rel"], "o-", label="compare(f16, q8_0 run): a real q8_0 run")
    ax.plot(sim["model_layer"], 100 * sim["rel"], "s--", label='f16.quant_error("q8_0"): the simulation')
    ax.set_xlabel("model layer")
    ax.set_ylabel("relative error of K, %")
    ax.set_title("Gemma 3 270M, one llama-server slot: f16 against q8_0")
    ax.legend(fontsize=8)
    fig.savefig(out / "drift.png", **SAVE)


def main() -> None:
    out = Path(sys.argv[1])
    with kvfast.open(kvfast.sample_path()) as d:
        kvfast.plot.layout(d).savefig(out / "layout.png", **SAVE)
        kvfast.plot.heatmap(d, 0, "k", per_head=True, scale="log").savefig(out / "heatmap.png", **SAVE)
        kvfast.plot.stats(d).savefig(out / "stats.png", **SAVE)
    with kvfast.open(HD128, model=HD128_MODEL) as q, kvfast.open(HD128_F16, model=HD128_MODEL) as f:
        kvfast.plot.diff(f, q).savefig(out / "diff.png", **SAVE)
    f16 = kvfast.open(SERVER / "gemma3-270m-server-f16-slot0.bin")
    q8 = kvfast.open(SERVER / "gemma3-270m-server-q8_0-slot0.bin")
    kvfast.plot.diff(f16, q8).savefig(out / "diff-gemma3.png", **SAVE)
    drift(out)


if __name__ == "__main__":
    main()
