"""``kvfast show``, ``kvfast addr`` and ``kvfast plot``: the cache's bytes and numbers, looked at."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import kvfast
from kvfast.cli.args import non_negative_int, positive_int
from kvfast.errors import SelectionError
from kvfast.plot.scale import parse_cells, parse_rows
from kvfast.read import hexview
from kvfast.writing import output


def geometry_options(p: argparse.ArgumentParser, many: bool = False) -> None:
    """--head-dim and --model, for every command that splits rows into heads (`many`: a command of
    many states, whose --model may be given per folder or glob, repeated)."""
    p.add_argument("--head-dim", type=positive_int, help="values per head (default: one head spans the row)")
    if many:
        p.add_argument(
            "--model",
            action="append",
            metavar="[FOLDER=]MODEL",
            help="a GGUF model: head sizes and the model's layer order; FOLDER=MODEL (repeated) gives"
            " the states in FOLDER (or matching a glob) their own model; states no FOLDER covers use"
            " the probe manifest beside them, if any",
        )
    else:
        p.add_argument("--model", help="a GGUF model: head sizes and the model's layer order")
    p.add_argument(
        "--rotation",
        choices=["auto", "hadamard", "none"],
        default="auto",
        help="undo llama.cpp's Hadamard rotation of quantized caches: auto (where the evidence says it"
        " was applied), hadamard (wherever llama.cpp's rule applies) or none (values as stored)",
    )
    p.add_argument(
        "--pre-rope",
        action="store_true",
        help="keys before RoPE: undo llama.cpp's RoPE of each K cell from its position (needs --model)",
    )


def models(given: list[str] | None) -> str | dict[str, str] | None:
    """The --model options of a command of many states: one model, or a mapping of folders and
    globs to models (:class:`kvfast.read.opening.Opening`)."""
    if not given:
        return None
    if len(given) == 1 and "=" not in given[0]:
        return given[0]
    pairs = [m.split("=", 1) for m in given]
    bad = [m for m, pair in zip(given, pairs, strict=True) if len(pair) != 2 or not all(pair)]
    if bad:
        raise ValueError(f"--model {bad[0]}: give FOLDER=MODEL for each model when there are several")
    return {folder: model for folder, model in pairs}


def open_state(path: str, args: argparse.Namespace) -> kvfast.State:
    """Open a state with the geometry the command line gave."""
    return kvfast.open(
        path,
        head_dim=args.head_dim,
        model=args.model,
        rotation=args.rotation,
        pre_rope=getattr(args, "pre_rope", False),
    )


def _cmd_show(args: argparse.Namespace) -> int:
    with open_state(args.path, args) as d:
        rows = hexview.rows(d, args.layer, args.kind, cells=args.cells, head=args.head, cache=args.cache)
    print(json.dumps(rows, indent=1) if args.json else hexview.format_rows(rows))
    return 0


def _cmd_addr(args: argparse.Namespace) -> int:
    with open_state(args.path, args) as d:
        a = hexview.address(
            d,
            args.layer,
            args.cell,
            args.head,
            args.elem,
            args.kind,
            n_ctx=args.ctx,
            n_stream=args.streams,
            cache=args.cache,
        )
    if args.json:
        print(json.dumps(a, indent=1))
        return 0
    print(
        f"layer {a['layer']} {a['kind'].upper()}, cell {a['cell']} (pos {a['pos']}), head {a['head']}, elem {a['elem']}:"
        f" {a['type']} value {a['value']:+.6g}"
    )
    print(f"  value index in the row: {a['index_how']}")
    print(f"  in the file:        byte {a['file_offset']:,} = {a['file_how']}")
    if "tensor_offset" in a:
        print(
            f"  in the live tensor: byte {a['tensor_offset']:,} of shape {a['tensor_shape']} = {a['tensor_how']}"
        )
    else:
        print("  (give --ctx N [--streams S] for the offset in llama.cpp's live tensor)")
    return 0


def _save(fig: Any, args: argparse.Namespace) -> None:
    """The figure written at ``-o`` (see :mod:`kvfast.writing.output`), in the format its suffix
    names (PNG when it names none)."""
    fmt = os.path.splitext(args.output)[1].lstrip(".").lower() or "png"
    with output.replacing(args.output, inputs=args.paths) as tmp:
        fig.savefig(tmp, dpi=args.dpi, format=fmt)


def _scale(args: argparse.Namespace) -> str:
    """--scale of heatmap and diff: linear or log (row is attention's)."""
    if args.scale == "row":
        raise SelectionError(f"kvfast plot {args.what}: --scale row is attention's; give linear or log")
    return str(args.scale or "linear")


def _cache_layer(d: kvfast.State, args: argparse.Namespace) -> tuple[int, int]:
    """heatmap's (cache, layer within it): --layer, a model layer (as every plot command reads it),
    or --cache-layer with --cache. A state whose model-layer map is unknown (no --model, no probe
    manifest) and that has one cache takes --layer as its layer index, and says so."""
    from kvfast.read.select import by_model_layer

    if args.cache_layer is not None:
        if args.layer is not None:
            raise SelectionError(
                "kvfast plot heatmap: give --layer (a model layer) or --cache-layer, not both"
            )
        return args.cache, args.cache_layer
    if args.layer is None:
        raise SelectionError(
            "kvfast plot heatmap needs --layer (a model layer) or --cache-layer (with --cache)"
        )
    if args.cache:
        raise SelectionError(
            "kvfast plot heatmap: --layer is a model layer, whose cache is known; --cache goes with --cache-layer"
        )
    known = any(ly.model_layer is not None for c in d.caches for ly in c.layers)
    if not known and len(d.caches) == 1:
        print(
            f"kvfast: the state's model-layer map is not known (no --model): --layer {args.layer} read as"
            " the cache's layer index",
            file=sys.stderr,
        )
        return 0, args.layer
    if not known:
        raise SelectionError(
            f"--layer {args.layer} is a model layer, and the state's model-layer map is not known: give"
            " --model (the GGUF), or --cache-layer with --cache"
        )
    ((caches, layers),) = by_model_layer(d.caches, [args.layer])
    return caches[0], layers[0]


def _cmd_plot(args: argparse.Namespace) -> int:
    from kvfast.plot import figures as plot

    output.target(args.output, inputs=args.paths)
    fig: Any
    if args.what == "diff":
        if len(args.paths) != 2:
            raise ValueError("kvfast plot diff takes two states: A B")
        with open_state(args.paths[0], args) as a, open_state(args.paths[1], args) as b:
            fig = plot.diff(a, b, scale=_scale(args), match=args.match)
            _save(fig, args)
    elif args.what in ("attention", "attention-mass", "attention-html"):
        from kvfast.plot import attention as attn_plot

        if len(args.paths) != 1 or args.queries is None:
            raise ValueError(f"kvfast plot {args.what} takes one state and --queries Q.json")
        if args.cache_layer is not None:
            raise SelectionError(
                f"kvfast plot {args.what}: --cache-layer is heatmap's; give --layer (a model layer)"
            )
        with open_state(args.paths[0], args) as d:
            if args.what == "attention-html":
                from kvfast.plot.html import attention_html

                view = attention_html(
                    d,
                    args.queries,
                    layers=None if args.layer is None else [args.layer],
                    heads=args.heads,
                    rows=args.rows,
                    cells=args.cells,
                )
                with output.replacing(args.output, inputs=args.paths) as tmp:
                    view.save(tmp)
            elif args.what == "attention-mass":
                fig = attn_plot.attention_mass(d, args.queries, what=args.mass, log=args.log)
                _save(fig, args)
            else:
                if args.layer is None:
                    raise ValueError("kvfast plot attention needs --layer (a model layer)")
                fig = attn_plot.attention_map(
                    d,
                    args.queries,
                    args.layer,
                    heads=args.heads,
                    rows=args.rows,
                    cells=args.cells,
                    scale=args.scale or "log",
                )
                _save(fig, args)
    else:
        if len(args.paths) != 1:
            raise ValueError(f"kvfast plot {args.what} takes one state")
        with open_state(args.paths[0], args) as d:
            if args.what == "layout":
                fig = plot.layout(d)
            elif args.what == "heatmap":
                cache, layer = _cache_layer(d, args)
                fig = plot.heatmap(
                    d,
                    layer,
                    args.kind,
                    cache=cache,
                    per_head=args.per_head,
                    scale=_scale(args),
                    clip=args.clip,
                    cells=args.cells,
                )
            else:
                fig = plot.stats(d, outlier=args.outlier, skip_first=args.skip_first)
            _save(fig, args)
    print(f"wrote {args.output}")
    return 0


def register(sub: Any) -> None:
    show = sub.add_parser(
        "show",
        help="rows as hex bytes next to their numbers",
        description="A hex viewer that knows the format: each row's file offset, its bytes and the values they hold.",
        epilog="example: kvfast show slot0.bin --layer 3 --kind k --cells 2 --head 1 --head-dim 128",
    )
    show.add_argument("path")
    show.add_argument("--layer", type=non_negative_int, required=True, help="layer index within the cache")
    show.add_argument("--kind", choices=["k", "v"], default="k")
    show.add_argument("--cells", type=positive_int, default=3, help="how many cells (default 3)")
    show.add_argument("--head", type=non_negative_int, help="only this head's values")
    show.add_argument("--cache", type=non_negative_int, default=0)
    show.add_argument("--json", action="store_true", help="print JSON")
    geometry_options(show)
    show.set_defaults(run=_cmd_show)

    addr = sub.add_parser(
        "addr",
        help="where one value lives, in the file and in the live tensor",
        description="The byte offset of one value in the state file and in llama.cpp's live cache tensor, with the"
        " arithmetic spelled out.",
        epilog="example: kvfast addr slot0.bin --layer 5 --cell 37 --head 3 --elem 10 --head-dim 128 --ctx 4096",
    )
    addr.add_argument("path")
    addr.add_argument("--layer", type=non_negative_int, required=True)
    addr.add_argument("--cell", type=non_negative_int, required=True)
    addr.add_argument("--head", type=non_negative_int, default=0)
    addr.add_argument("--elem", type=non_negative_int, default=0)
    addr.add_argument("--kind", choices=["k", "v"], default="k")
    addr.add_argument("--cache", type=non_negative_int, default=0)
    addr.add_argument("--ctx", type=positive_int, help="context size of the live cache (n_ctx)")
    addr.add_argument(
        "--streams", type=positive_int, default=1, help="streams of the live cache (non-unified: n_seq_max)"
    )
    addr.add_argument("--json", action="store_true", help="print JSON")
    geometry_options(addr)
    addr.set_defaults(run=_cmd_addr)

    plot = sub.add_parser(
        "plot",
        help="pictures: layout, heatmap, stats, diff, attention, attention-mass (needs matplotlib: kvfast[plot]),"
        " attention-html (an interactive page)",
        description="Draw a state: its layout to scale, |values| of a layer, per-layer statistics, the error"
        " of one state against another, or the attention of captured queries (a layer's weights per head,"
        " the attention each cell received, or attention-html: one self-contained HTML page with layer and"
        " head selectors, token text and hover). --layer is a model layer in every plot command.",
        epilog="examples: kvfast plot layout slot0.bin -o layout.png;"
        " kvfast plot heatmap slot0.bin --layer 3 --kind k --per-head --head-dim 128 --scale log -o k.png;"
        " kvfast plot diff f16.bin q8.bin -o diff.png; kvfast plot diff p0.ggsq p2.ggsq --match tokens -o d.png;"
        " kvfast plot attention out/p0.ggsq --queries out/p0.queries.json --layer 5 -o attn.png;"
        " kvfast plot attention-html out/p0.ggsq --queries out/p0.queries.json -o attn.html",
    )
    plot.add_argument(
        "what",
        choices=["layout", "heatmap", "stats", "diff", "attention", "attention-mass", "attention-html"],
    )
    plot.add_argument("paths", nargs="+", help="the state (two for diff)")
    plot.add_argument("-o", "--output", required=True, help="the picture to write (attention-html: the page)")
    plot.add_argument(
        "--layer",
        type=non_negative_int,
        help="a model layer, as the model numbers them (heatmap, attention; attention-html: only this one);"
        " heatmap finds its cache from --model or the probe manifest (a state of one cache without either:"
        " its layer index)",
    )
    plot.add_argument(
        "--cache-layer",
        type=non_negative_int,
        help="heatmap: a layer by its index within --cache (in place of --layer)",
    )
    plot.add_argument(
        "--queries", help="attention, attention-mass: captured queries (a probe's <id>.queries.json)"
    )
    plot.add_argument(
        "--heads", type=non_negative_int, nargs="+", help="attention, attention-html: only these query heads"
    )
    plot.add_argument(
        "--mass",
        choices=["share", "mass"],
        default="share",
        help="attention-mass: each cell's mean share of a head's attention (sinks) or its accumulated mass (H2O)",
    )
    plot.add_argument("--kind", choices=["k", "v"], default="k")
    plot.add_argument("--cache", type=non_negative_int, default=0, help="heatmap: the cache of --cache-layer")
    plot.add_argument("--per-head", action="store_true", help="heatmap: one panel per head")
    plot.add_argument(
        "--outlier", type=float, default=4.0, help="stats: outlier channel threshold (x median)"
    )
    plot.add_argument(
        "--skip-first",
        type=non_negative_int,
        default=0,
        help="stats: leave out positions < N (attention sinks)",
    )
    plot.add_argument(
        "--scale",
        choices=["linear", "log", "row"],
        help="heatmap, diff: linear (default) or log; attention: log (default), row (each query row over"
        " its largest weight) or linear",
    )
    plot.add_argument(
        "--rows",
        type=parse_rows,
        help="attention, attention-html: only the captured query rows START:STOP (as a slice: -64: is the"
        " last 64, written --rows=-64:; attention-html's default)",
    )
    plot.add_argument("--log", action="store_true", help="attention-mass: a log y axis")
    plot.add_argument(
        "--clip", type=float, help="heatmap: cap the colour scale at this percentile of |value| (e.g. 99.5)"
    )
    plot.add_argument(
        "--cells",
        type=parse_cells,
        help="heatmap, attention, attention-html: only cells START:STOP (e.g. 0:64); attention: also"
        " sinks+recent (the first 16 and the last 64 side by side) or N+M (the first N and the last M)",
    )
    plot.add_argument(
        "--match",
        choices=["sequence", "position", "tokens"],
        default="sequence",
        help="diff: match cells by (sequence, position), position alone, or position over the common"
        " token prefix (as kvfast diff)",
    )
    plot.add_argument("--dpi", type=positive_int, default=100)
    geometry_options(plot)
    plot.set_defaults(run=_cmd_plot)
