"""``kvfast prune`` and ``kvfast convert``: states llama.cpp loads back, written from one state."""

from __future__ import annotations

import argparse
from typing import Any

import kvfast
from kvfast import _kvfast
from kvfast.analysis import prune
from kvfast.cli.args import non_negative_int, unit_interval
from kvfast.read import ggml


def _open(args: argparse.Namespace) -> kvfast.State:
    return kvfast.open(args.path, model=args.model, head_dim=args.head_dim)


def cells_kept(d: kvfast.State, e: kvfast.State) -> str:
    """``6 of 9 cells``: the cells of `e` against those of `d`, per cache where there are several
    (an iSWA model holds a token in each of its caches: a sum would count it twice, where ``kvfast
    info`` shows each cache's cells)."""
    before = [sum(s.cell_count for s in c.streams) for c in d.caches]
    after = [sum(s.cell_count for s in c.streams) for c in e.caches]
    if len(before) == 1 and len(after) == 1:
        return f"{after[0]} of {before[0]} cells"
    each = [f"{a} of {b} (cache {i})" for i, (a, b) in enumerate(zip(after, before, strict=False))]
    return "cells per cache " + ", ".join(each)


def _report(args: argparse.Namespace, d: kvfast.State, n: int) -> None:
    with kvfast.open(args.output, model=args.model, head_dim=args.head_dim) as e:
        types = sorted({f"{ly.k_type}/{ly.v_type}" for c in e.caches for s in c.streams for ly in s.layers})
        print(
            f"{args.output}: {e.container}{'' if e.version is None else f' {e.version}'}, {n} bytes,"
            f" {cells_kept(d, e)}, K/V {', '.join(types) or '-'}"
        )


def _common(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "container": args.container,
        "version": args.version,
        "seq_id": args.seq,
        "arch": args.arch,
        "cache_type_k": args.ctk,
        "cache_type_v": args.ctv,
        "rotate": not args.no_rotate,
        "v_trans": None if args.fa is None else args.fa == "off",
        "replace": args.replace,
    }


def _cmd_prune(args: argparse.Namespace) -> int:
    keep: Any = prune.by_score(args.ratio, "k_l2", args.drop, args.sinks, args.window)
    if args.score != "key-norm" and args.queries is None:
        raise kvfast.SelectionError(f"--score {args.score} needs --queries (a probe's <id>.queries.json)")
    with _open(args) as d:
        if args.score != "key-norm":
            from kvfast.attn.scores import by_attention

            keep = by_attention(d, args.queries, args.ratio, args.score, sinks=args.sinks, window=args.window)
        n = kvfast.write(d, args.output, keep=keep, **_common(args))
        _report(args, d, n)
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    with _open(args) as d:
        n = kvfast.write(d, args.output, **_common(args))
        _report(args, d, n)
    return 0


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="the state to read")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="the state to write: a new file or a regular file replaced (never a folder, a device or a FIFO)",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="let -o be the state read, replaced once the new one is whole (refused without it)",
    )
    p.add_argument("--model", help="a GGUF model: head sizes (for the rotation of quantized types), arch")
    p.add_argument("--head-dim", type=int, help="values per head, when no model is given")
    p.add_argument(
        "--container",
        choices=list(_kvfast.WRITE_VERSIONS),
        help="seq (llama_state_seq_get_data), ggsq (seq_save_file, llama-server slots), ggsn"
        " (state_save_file), state (state_get_data); default: the source's",
    )
    p.add_argument("--version", type=int, help="GGSQ 2 or 3, GGSN 9 or 10 (default: the newest)")
    types = list(ggml.TYPES)
    p.add_argument("--ctk", choices=types, help="requantize K to this type")
    p.add_argument("--ctv", choices=types, help="requantize V to this type")
    p.add_argument(
        "--no-rotate",
        action="store_true",
        help="store quantized types unrotated (for llama.cpp run with LLAMA_ATTN_ROT_DISABLE=1)",
    )
    p.add_argument(
        "--fa",
        choices=["on", "off"],
        help="V as llama.cpp keeps it with flash attention on (a row per cell) or off (transposed);"
        " llama.cpp loads a state only into a context of the same; default: the source's",
    )
    p.add_argument(
        "--seq", type=non_negative_int, help="the sequence to write (from a whole state) or its new id"
    )
    p.add_argument(
        "--arch", help="architecture name of a whole state made from a sequence state (or --model)"
    )


def register(sub: Any) -> None:
    pr = sub.add_parser(
        "prune",
        help="drop cells by key norm (sinks and a recent window kept) and write a state llama.cpp loads",
        description="Drop a share of each cache's cells, those of the largest (or smallest) key L2 norm, keeping"
        " the first --sinks positions and the last --window; every attention cache (both of an iSWA pair)"
        " loses the same tokens; the token list stays indexed by position (token i at position i).",
        epilog="example: kvfast prune slot0.bin -o slot0-half.bin --ratio 0.5 --sinks 4 --window 16 --model m.gguf",
    )
    _options(pr)
    pr.add_argument(
        "--ratio", type=unit_interval, required=True, help="share of the unprotected cells to drop (0 to 1)"
    )
    pr.add_argument("--drop", choices=["highest", "lowest"], default="highest", help="which key norms go")
    pr.add_argument(
        "--score",
        choices=["key-norm", "h2o", "snapkv", "tova"],
        default="key-norm",
        help="what ranks the cells: the key norm (--drop), or the attention of captured queries (the least"
        " attended go): H2O's accumulated attention, SnapKV's window vote, TOVA's last query",
    )
    pr.add_argument("--queries", help="the queries of the attention scores (a probe's <id>.queries.json)")
    pr.add_argument("--sinks", type=non_negative_int, default=0, help="first positions always kept")
    pr.add_argument(
        "--window", type=non_negative_int, default=1, help="last positions always kept (default 1)"
    )
    pr.set_defaults(run=_cmd_prune)

    cv = sub.add_parser(
        "convert",
        help="write a state as another container, version or cache type",
        description="Write a state as another container (in the version llama-cpp-python 0.3.36's llama.cpp"
        " reads unless --version says), requantized with ggml's reference quantizers and stored rotated as"
        " llama.cpp stores the type, or one sequence of a whole state.",
        epilog="example: kvfast convert state.ggsn -o seq1.ggsq --container ggsq --seq 1 --ctk q8_0 --ctv q8_0 --model m.gguf",
    )
    _options(cv)
    cv.set_defaults(run=_cmd_convert)
