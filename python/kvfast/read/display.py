"""How a state shows itself in a notebook: ``State._repr_html_`` (a short summary, never the rows)."""

from __future__ import annotations

import html
from itertools import groupby
from typing import TYPE_CHECKING

from kvfast.read import ggml

if TYPE_CHECKING:
    from kvfast.read.opened import OpenState
    from kvfast.read.structure import Layer, Stream

_STYLE = "border-collapse:collapse;font-size:90%;text-align:left"
_CELL = "padding:1px 8px;text-align:left"


def _row(*cells: object, head: bool = False) -> str:
    tag = "th" if head else "td"
    return "<tr>" + "".join(f'<{tag} style="{_CELL}">{html.escape(str(c))}</{tag}>' for c in cells) + "</tr>"


def _span(indices: list[int]) -> str:
    return str(indices[0]) if len(indices) == 1 else f"{indices[0]}-{indices[-1]}"


def _layer_groups(layers: list[Layer]) -> list[list[Layer]]:
    """Runs of consecutive layers of the same types and widths."""

    def shape(ly: Layer) -> tuple[object, ...]:
        return (ly.k_type, ly.n_embd_k, ly.v_type, ly.n_embd_v)

    return [list(run) for _, run in groupby(layers, key=shape)]


def _stream_text(s: Stream) -> str:
    if not s.cell_count:
        return f"stream {s.index}: empty"
    seqs = s.sequences
    shown = ", ".join(map(str, seqs[:8])) + (" ..." if len(seqs) > 8 else "")
    v = "V transposed" if s.v_trans else "V per cell"
    return f"stream {s.index}: {s.cell_count:,} cells, pos {s.pos.min()}..{s.pos.max()}, seq {shown}; {v}"


def dump_html(d: OpenState) -> str:
    """An HTML summary of an open state: container, size, caches, streams, layer types, rotation."""
    if d.closed:
        return f"<b>kvfast.State</b> {html.escape(d.path)} (closed)"
    version = "" if d.version is None else f" v{d.version}"
    head = [
        f"<b>kvfast.State</b> <code>{html.escape(d.path)}</code>",
        html.escape(
            f"{d.container}{version}"
            + ("" if d.arch is None else f", arch {d.arch}")
            + f": {d.size:,} bytes = rows {d.row_bytes:,} + outputs {d.output_bytes:,}"
            f" + metadata {d.meta_bytes:,}"
        ),
    ]
    tokens = d.tokens
    if tokens is not None:
        head.append(html.escape(f"{len(tokens):,} tokens stored"))
    if d.head_dim_k is not None:
        head.append(html.escape(f"head_dim K {d.head_dim_k}, V {d.head_dim_v}"))
    if d.partial is not None:
        head.append(html.escape(f"partial (PARTIAL_ONLY): the {d.partial.absent} is absent"))
    if d.rows_on_device:
        head.append(html.escape("no row in the bytes (ON_DEVICE)"))
    rows = [_row("cache", "stream / layers", "K", "V", "model layers", head=True)]
    for c in d.caches:
        shown = c.streams[:4]
        for s in shown:
            rows.append(_row(c.index, _stream_text(s), "", "", ""))
        if len(c.streams) > len(shown):
            rows.append(_row(c.index, f"... {len(c.streams) - len(shown)} more streams", "", "", ""))
        for group in _layer_groups(c.layers):
            ly = group[0]
            mls = [x.model_layer for x in group]
            model = "" if None in mls else ", ".join(map(str, mls))
            v = "-" if ly.v_type is None else f"{ly.v_type} x {ly.n_embd_v}"
            span = _span([x.index for x in group])
            rows.append(_row(c.index, f"layers {span}", f"{ly.k_type} x {ly.n_embd_k}", v, model))
    rec = d.recurrent
    if rec is not None:  # the recurrent part: R and S in the K and V columns, said so
        rows.append(_row(rec.index, f"recurrent: {rec.cell_count} cell(s), one per sequence", "R", "S", ""))
        mls = [ly.model_layer for ly in rec.layers]
        r0 = rec.layers[0]
        rows.append(
            _row(
                rec.index,
                f"layers {_span([ly.index for ly in rec.layers])} of the model's {rec.n_layer}",
                f"{r0.r_type} x {r0.n_embd_r}",
                f"{r0.s_type} x {r0.n_embd_s}",
                "" if None in mls else ", ".join(map(str, mls)),
            )
        )
    table = f'<table style="{_STYLE}">' + "".join(rows) + "</table>"
    rot = [
        html.escape(
            f"rotation: cache {r.cache} {r.kind.upper()} {r.type}: "
            + (f"undone (groups of {r.group})" if r.undone else "values as stored")
            + ("" if r.certain else " [undecided]")
        )
        for r in d.rotation
        if r.undone or not ggml.is_float(r.type)
    ]
    return "<div>" + "<br>".join(head) + table + "<br>".join(rot) + "</div>"
