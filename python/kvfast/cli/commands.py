"""The ``kvfast`` command line (also ``python -m kvfast``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import polars as pl

import kvfast
from kvfast.cli import views as cli_views
from kvfast.cli import warned
from kvfast.cli import write as cli_write
from kvfast.cli.args import BROKEN_PIPE, USAGE, non_negative_int, positive_int, require_paths
from kvfast.errors import ProbeCrashError
from kvfast.read import ggml, memory
from kvfast.read.state import State
from kvfast.writing import output


def _describe(dump: State) -> dict[str, Any]:
    caches = []
    for c in dump.caches:
        streams = []
        for s in c.streams:
            streams.append(
                {
                    "index": s.index,
                    "cells": s.cell_count,
                    "pos_min": int(s.pos.min()) if s.cell_count else None,
                    "pos_max": int(s.pos.max()) if s.cell_count else None,
                    "sequences": s.sequences,
                    "shared_cells": s.shared_cells,
                    "v_trans": s.v_trans,
                    "layers": [
                        {
                            "layer": ly.index,
                            "model_layer": ly.model_layer,
                            "k_type": ly.k_type,
                            "n_embd_k": ly.n_embd_k,
                            "v_type": ly.v_type,
                            "n_embd_v": ly.n_embd_v,
                            "k_offset": ly.k_offset,
                            "v_offset": ly.v_offset,
                            "k_nbytes": ly.k_nbytes,
                            "v_nbytes": ly.v_nbytes,
                        }
                        for ly in s.layers
                    ],
                }
            )
        caches.append({"index": c.index, "offset": c.offset, "streams": streams})
    tokens = dump.tokens
    return {
        "path": dump.path,
        "container": dump.container,
        "version": dump.version,
        "features": dump.features,
        "arch": dump.arch,
        "seq_id": dump.seq_id,
        "cell_ext": dump.cell_ext,
        "n_tokens": None if tokens is None else len(tokens),
        "server_tokens": dump.server_tokens,
        "rotation": [dataclasses.asdict(r) for r in dump.rotation],
        "size": dump.size,
        "row_bytes": dump.row_bytes,
        "output_bytes": dump.output_bytes,
        "meta_bytes": dump.meta_bytes,
        "head_dim_k": dump.head_dim_k,
        "head_dim_v": dump.head_dim_v,
        "caches": caches,
        **memory.describe(dump),
    }


def _print_info(d: dict[str, Any]) -> None:
    version = "" if d["version"] is None else f" version {d['version']}"
    print(f"{d['path']}")
    print(f"  container  {d['container']}{version}  ({', '.join(d['features'])})")
    for key in ("arch", "seq_id", "n_tokens"):
        if d[key] is not None:
            print(f"  {key:<10} {d[key]}")
    st = d["server_tokens"]
    if st is not None:
        print(
            f"  tokens     llama-server packed blob version {st['version']}: {st['n_tokens']} tokens,"
            f" {len(st['media'])} media chunk(s)"
        )
    if d["cell_ext"]:
        print("  cells carry the M-RoPE extension")
    if d["head_dim_k"] is not None:
        print(f"  head_dim   K {d['head_dim_k']}, V {d['head_dim_v']}")
    print(
        f"  bytes      {d['size']:,} = rows {d['row_bytes']:,} + outputs {d['output_bytes']:,}"
        f" + metadata {d['meta_bytes']:,}"
    )
    for c in d["caches"]:
        print(f"  cache {c['index']} at byte {c['offset']:,}: {len(c['streams'])} stream(s)")
        for s in c["streams"]:
            if not s["cells"]:
                print(f"    stream {s['index']}: empty")
                continue
            v = "V transposed (flash attention off)" if s["v_trans"] else "V per cell"
            shared = f", {s['shared_cells']} shared" if s["shared_cells"] else ""
            print(
                f"    stream {s['index']}: {s['cells']} cells, pos {s['pos_min']}..{s['pos_max']},"
                f" sequences {s['sequences']}{shared}, {v}"
            )
            print(
                f"      {'layer':>5}  {'K':<7}{'values':>7}  {'V':<7}{'values':>7}  {'K offset':>12}  {'V offset':>12}"
            )
            for ly in s["layers"]:
                print(
                    f"      {ly['layer']:>5}  {ly['k_type']:<7}{ly['n_embd_k']:>7}  {ly['v_type'] or '-':<7}"
                    f"{ly['n_embd_v'] or 0:>7}  {ly['k_offset']:>12,}  {ly['v_offset'] or 0:>12,}"
                )
    memory.print_info(d)
    for r in d["rotation"]:
        if r["undone"] or not ggml.is_float(r["type"]):
            state = f"undone (groups of {r['group']})" if r["undone"] else "values as stored"
            doubt = "" if r["certain"] else " [undecided: see --rotation]"
            print(
                f"  rotation   cache {r['cache']} {r['kind'].upper()} {r['type']}: {state}{doubt}; {r['evidence']}"
            )


def _cmd_info(args: argparse.Namespace) -> int:
    path = args.path or kvfast.sample_path()
    with cli_views.open_state(path, args) as dump:
        d = _describe(dump)
    if args.json:
        print(json.dumps(d, indent=1))
    else:
        _print_info(d)
    return 0


def _checked(args: argparse.Namespace, inputs: Sequence[str]) -> list[str]:
    """The inputs of a command with ``-o``, its output path checked before any work (see
    :mod:`kvfast.writing.output`)."""
    if args.output is not None:  # -o "" is refused, not taken for no -o
        output.target(args.output, inputs=inputs)
    return list(inputs)


def _write_parquet(df: pl.DataFrame, args: argparse.Namespace, inputs: Sequence[str]) -> None:
    with output.replacing(args.output, inputs=inputs) as tmp:
        df.write_parquet(tmp)
    print(f"wrote {df.height} rows to {args.output}")


def _emit(df: pl.DataFrame, args: argparse.Namespace, inputs: Sequence[str]) -> None:
    if args.output is not None:
        _write_parquet(df, args, inputs)
    elif args.json:
        print((df if args.rows is None else df.head(args.rows)).write_json())
    else:
        with pl.Config(tbl_rows=20 if args.rows is None else args.rows, tbl_cols=-1, tbl_width_chars=200):
            print(df)


def _attention_view(dump: State, args: argparse.Namespace) -> pl.DataFrame:
    """``kvfast stats --queries Q``: each cell's attention share, accumulated mass (H2O) and key
    norm, ranked by each (:func:`kvfast.attn.sinks`), sorted by ``--sort``."""
    from kvfast.attn.scores import sinks

    given = [f"--{n.replace('_', '-')}" for n in ("by", "layers", "kinds", "skip_first") if getattr(args, n)]
    if given:
        raise ValueError(
            f"kvfast stats --queries: {given[0]} does not apply to the attention view (one row per cell;"
            " --model-layers and --caches select)"
        )
    df = sinks(dump, args.queries, layers=args.model_layers)
    if args.caches is not None:
        df = df.filter(pl.col("cache").is_in(args.caches))
    return df.sort("cache", f"{args.sort}_rank", "stream", "cell")


def _cmd_stats(args: argparse.Namespace) -> int:
    inputs = _checked(args, [args.path] + ([] if args.queries is None else [args.queries]))
    with cli_views.open_state(args.path, args) as dump:
        if args.queries is not None:
            _emit(_attention_view(dump, args), args, inputs)
            return 0
        df = dump.stats(
            by=args.by or "layer",
            layers=args.layers,
            kinds=args.kinds,
            skip_first=args.skip_first,
            model_layers=args.model_layers,
            caches=args.caches,
        )
    _emit(df, args, inputs)
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    inputs = _checked(args, [args.a, args.b])
    with cli_views.open_state(args.a, args) as a, cli_views.open_state(args.b, args) as b:
        df = kvfast.compare(
            a,
            b,
            by=args.by,
            layers=args.layers,
            kinds=args.kinds,
            match=args.match,
            caches=args.caches,
            model_layers=args.model_layers,
        )
    _emit(df, args, inputs)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    report = kvfast.export(
        args.states,
        args.output,
        what="stats" if args.stats else "values",
        by=args.by,
        partition_by=tuple(args.partition_by),
        jobs=args.jobs,
        head_dim=args.head_dim,
        model=cli_views.models(args.model),
        rotation=args.rotation,
        on_error=args.on_error,
        dtype=args.dtype,
        hive=args.hive,
        progress=args.progress,
        pre_rope=getattr(args, "pre_rope", False),
    )
    counts = report.group_by("status").len().sort("status")
    if args.json:
        print(report.write_json())
    else:
        print(
            ", ".join(f"{n} {s}" for s, n in counts.iter_rows())
            + f"; {report['rows'].sum():,} rows in {args.output}"
        )
    for path, err in report.filter(status="failed").select("path", "error").iter_rows():
        print(f"failed: {path}: {err}", file=sys.stderr)
    return 1 if report.filter(status="failed").height else 0


def _cmd_manifest(args: argparse.Namespace) -> int:
    require_paths(args.states)  # a state that fails to open is a row; a path that is not there, an error
    inputs = _checked(args, args.states)
    df = kvfast.manifest(args.states)
    if args.output is not None:
        _write_parquet(df, args, inputs)
    elif args.json:
        print((df if args.rows is None else df.head(args.rows)).write_json())
    else:
        with pl.Config(
            tbl_rows=50 if args.rows is None else args.rows,
            tbl_cols=-1,
            tbl_width_chars=200,
            fmt_str_lengths=80,
        ):
            print(df)
    return 0


def _window(text: str) -> int | str:
    """--queries: a positive window or 'all'."""
    if text == "all":
        return text
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise argparse.ArgumentTypeError(f"expected a positive number of positions or 'all', not {text!r}")


def _cmd_probe(args: argparse.Namespace) -> int:
    from kvfast.probe import guard as probe_guard
    from kvfast.probe import rerun
    from kvfast.probe import runner as probe

    text: str | None = args.shared_prefix
    prefix: str | list[int] | None = text
    if text is not None and text.strip().startswith("["):
        prefix = [int(t) for t in json.loads(text)]  # token ids, for models without a tokenizer
    if args.count:
        return _count_tokens(args, prefix)
    if args.output is None:
        raise kvfast.SelectionError("kvfast probe: -o/--output is required (unless --count)")
    try:  # in a child process: a crash of llama.cpp (SIGILL: built for another CPU) is reported
        man = probe_guard.run(
            args.model,
            args.prompts,
            args.output,
            ctk=args.ctk,
            ctv=args.ctv,
            fa=args.fa == "on",
            parallel=args.parallel,
            n_ctx=args.ctx,
            gpu_layers=args.gpu_layers,
            generate=args.generate,
            shared_prefix=prefix,
            unified=not args.non_unified,
            whole_state=args.whole_state,
            queries=args.queries,
        )
    except ProbeCrashError as e:
        print(f"kvfast probe: error: {e}", file=sys.stderr)
        return 128 + e.signal
    counts = man.group_by("status").len().sort("status")
    done = rerun.summary(man)  # what this run made, made again (and why) or kept
    print(
        ", ".join(f"{n} {s}" for s, n in counts.iter_rows())
        + (f"; {done}" if done else "")
        + f"; manifest in {args.output}/{probe.MANIFEST}"
    )
    for pid, err in man.filter(pl.col("status") != "ok").select("prompt_id", "error").iter_rows():
        print(f"skipped {pid}: {err}", file=sys.stderr)
    return 0


def _count_tokens(args: argparse.Namespace, prefix: str | list[int] | None) -> int:
    """``kvfast probe MODEL PROMPTS --count``: a line per prompt, its tokens and whether it fits."""
    from kvfast.probe.count import count

    df = count(
        args.model,
        args.prompts,
        n_ctx=args.ctx,
        parallel=args.parallel,
        unified=not args.non_unified,
        generate=args.generate,
        shared_prefix=prefix,
    )
    for pid, n, cells, room, fits in df.iter_rows():
        extra = f" ({cells} cells with the prefix and generated tokens)" if cells != n else ""
        verdict = "fits" if fits else f"does not fit: {cells} > {room}, too_long"
        print(f"{pid}\t{n} tokens{extra}\t{verdict} (--ctx {args.ctx})")
    too = df.filter(~pl.col("fits")).height
    print(f"{df.height} prompts, {df.height - too} fit, {too} too long", file=sys.stderr)
    return 0


def _states(p: argparse.ArgumentParser) -> None:
    p.add_argument("states", nargs="+", help="state files, a glob pattern or a directory")


def _table_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--layers", type=non_negative_int, nargs="+", help="only these layers (index within the cache)"
    )
    p.add_argument(
        "--model-layers",
        type=non_negative_int,
        nargs="+",
        help="only these layers of the model (its own numbering, across an iSWA model's two caches;"
        " needs the model's layer map: --model, or a probe manifest)",
    )
    p.add_argument(
        "--caches", type=non_negative_int, nargs="+", help="only these caches (an iSWA state has two)"
    )
    p.add_argument(
        "--kinds",
        nargs="+",
        choices=["k", "v", "r", "s"],
        help="only K or V; R or S: the recurrent part's (one at a time: their rows differ in width)",
    )
    cli_views.geometry_options(p)
    p.add_argument("-o", "--output", help="write Parquet here instead of printing")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    p.add_argument(
        "--rows", type=non_negative_int, help="rows to print (default 20) or give as JSON (default all)"
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvfast", description="Look inside llama.cpp KV-cache states.")
    p.add_argument("--version", action="version", version=f"kvfast {kvfast.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    info = sub.add_parser(
        "info",
        help="print a state's structure",
        description="Print a state's containers, caches, streams, cells and layers.",
        epilog="example: kvfast info slot0.bin   (no PATH: the bundled sample state)",
    )
    info.add_argument("path", nargs="?", help="a state file (default: the bundled sample)")
    info.add_argument("--json", action="store_true", help="print JSON")
    cli_views.geometry_options(info)
    info.set_defaults(run=_cmd_info)

    stats = sub.add_parser(
        "stats",
        help="statistics per cell, channel, head or layer",
        description="Statistics of a state's K and V values, computed in Rust.",
        epilog="examples: kvfast stats slot0.bin --by channel --head-dim 128 -o channels.parquet;"
        " kvfast stats out/p0.ggsq --queries out/p0.queries.json --sort mass   (sinks, heavy hitters)",
    )
    stats.add_argument("path", help="a state file")
    stats.add_argument(
        "--by", choices=["cell", "channel", "head", "layer"], help="a row per ... (default: layer)"
    )
    stats.add_argument(
        "--queries",
        help="the attention view instead: per cell, the share of attention it received, the mass it"
        " accumulated (H2O's heavy hitters) and its key norm, each with its rank, from captured queries"
        " (a probe's <id>.queries.json; needs the model: --model or the queries' own)",
    )
    stats.add_argument(
        "--sort",
        choices=["share", "mass", "k_l2"],
        default="share",
        help="--queries: order by the rank of share (sinks), mass (heavy hitters) or k_l2 (smallest first)",
    )
    stats.add_argument(
        "--skip-first", type=non_negative_int, default=0, help="leave out positions < N (attention sinks)"
    )
    _table_options(stats)
    stats.set_defaults(run=_cmd_stats)

    diff = sub.add_parser(
        "diff",
        help="errors of state B against state A, cells matched by (sequence, position)",
        description="Compare two states of the same tokens (an f16 cache against a q8_0 one, two runs).",
        epilog="example: kvfast diff f16/seq-0.bin q8_0/seq-0.bin --by layer",
    )
    diff.add_argument("a", help="the reference state")
    diff.add_argument("b", help="the state compared to it")
    diff.add_argument("--by", choices=["cell", "layer"], default="layer")
    diff.add_argument(
        "--match",
        choices=["sequence", "position", "tokens"],
        default="sequence",
        help="match cells by (sequence, position), position alone, or position over the common token prefix",
    )
    _table_options(diff)
    diff.set_defaults(run=_cmd_diff)

    exp = sub.add_parser(
        "export",
        help="write many states as Parquet (a folder per state, a file per layer)",
        description="Export the value table (or statistics) of many states to Parquet: streaming, parallel,"
        " resumable (unchanged states already exported are skipped), atomic.",
        epilog="example: kvfast export dumps/ -o parquet/ --jobs 4 --on-error skip",
    )
    _states(exp)
    exp.add_argument("-o", "--output", required=True, help="output folder")
    exp.add_argument("--stats", action="store_true", help="export statistics instead of values")
    exp.add_argument(
        "--by", choices=["cell", "channel", "head", "layer"], default="cell", help="with --stats"
    )
    exp.add_argument(
        "--partition-by",
        nargs="*",
        default=["auto"],
        choices=["auto", "cache", "layer", "model_layer", "kind"],
        help="auto: a file per layer; for a state of several caches (iSWA) per model layer where the"
        " model's map is known, else per cache and layer; or these keys",
    )
    exp.add_argument("--jobs", type=int, help="states written at once (default: all cores)")
    exp.add_argument("--on-error", choices=["skip", "fail"], default="fail")
    exp.add_argument(
        "--dtype",
        choices=["float32", "native"],
        help="values type: float32, or native (each file its own: f16 stays f16); default: one type"
        " for the whole output (float16 when every state is f16, else float32)",
    )
    exp.add_argument("--hive", action="store_true", help="partitions as key=value folders (layer=3/)")
    exp.add_argument("--json", action="store_true", help="print the report as JSON rows")
    exp.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="a bar of bytes read on stderr (default: when stderr is a terminal)",
    )
    cli_views.geometry_options(exp, many=True)
    exp.set_defaults(run=_cmd_export)

    man = sub.add_parser(
        "manifest",
        help="one row of metadata per state",
        description="List states with their container, version, arch, caches, layers, cells and types.",
        epilog="example: kvfast manifest dumps/ -o manifest.parquet",
    )
    _states(man)
    man.add_argument("-o", "--output", help="write Parquet here instead of printing")
    man.add_argument("--json", action="store_true", help="print JSON rows")
    man.add_argument(
        "--rows", type=non_negative_int, help="rows to print (default 50) or give as JSON (default all)"
    )
    man.set_defaults(run=_cmd_manifest)

    cli_views.register(sub)
    cli_write.register(sub)

    pr = sub.add_parser(
        "probe",
        help="run llama.cpp over prompts and save every state with a manifest (needs kvfast[probe])",
        description="Decode prompts as batches of parallel sequences in one llama.cpp context and save each"
        " sequence's state (GGSQ), optionally each batch's whole state, and a manifest (Parquet).",
        epilog="example: kvfast probe model.gguf prompts.jsonl -o runs/q8 --ctk q8_0 --ctv q8_0 --parallel 4",
    )
    pr.add_argument("model", help="a GGUF model")
    pr.add_argument("prompts", help="a text file (one prompt a line) or JSONL (id, prompt or tokens)")
    pr.add_argument("-o", "--output", help="output folder (required unless --count)")
    pr.add_argument(
        "--count",
        action="store_true",
        help="run nothing: print each prompt's token count and whether it fits --ctx (the model's"
        " vocabulary alone is loaded)",
    )
    types = list(ggml.TYPES)
    pr.add_argument("--ctk", choices=types, default="f16", help="K cache type (default: %(default)s)")
    pr.add_argument("--ctv", choices=types, default="f16", help="V cache type (default: %(default)s)")
    pr.add_argument(
        "--fa", choices=["on", "off"], default="on", help="flash attention (off: V transposed; default: on)"
    )
    pr.add_argument(
        "--parallel",
        type=positive_int,
        default=1,
        help="sequences decoded at once (1 to 256; default: %(default)s)",
    )
    pr.add_argument(
        "--ctx",
        type=positive_int,
        default=4096,
        help="context size in cells (default: %(default)s): --count tells which prompts fit",
    )
    pr.add_argument(
        "--gpu-layers",
        type=int,
        default=0,
        help="layers offloaded to the GPU (CUDA builds; default: %(default)s)",
    )
    pr.add_argument(
        "--generate",
        type=non_negative_int,
        default=0,
        help="tokens to generate greedily before saving (default: %(default)s)",
    )
    pr.add_argument("--shared-prefix", help="text decoded once and shared by every sequence of a batch")
    pr.add_argument("--non-unified", action="store_true", help="one cache stream per sequence")
    pr.add_argument("--whole-state", action="store_true", help="also save each batch's whole state")
    pr.add_argument(
        "--queries",
        metavar="W",
        type=_window,
        help="capture every attention layer's queries of the last W positions of each prompt (or 'all')"
        " and of the generated tokens: OUT/<id>.queries.npy + .json (kvfast.attention reads them)",
    )
    pr.set_defaults(run=_cmd_probe)
    return p


def _quiet_stdout() -> None:
    """The reader of stdout went away: send what is still buffered nowhere, without a message."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see :mod:`kvfast.cli.args`)."""
    args = _parser().parse_args(argv)
    try:
        with warned.gathered():
            code = int(args.run(args))
            sys.stdout.flush()
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return BROKEN_PIPE
    except kvfast.SelectionError as e:
        print(f"kvfast {args.command}: error: {e}", file=sys.stderr)
        return USAGE
    except (kvfast.KvfastError, OSError, ValueError, ImportError, RuntimeError) as e:
        print(f"kvfast: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
