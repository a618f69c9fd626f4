"""An interactive view of attention, in the manner of BertViz's head and model views: one
self-contained HTML file (script, style and data inline; nothing fetched, so it works offline and
from ``file://``) with a model-layer and a head selector, the query rows' and the cells' token text,
the weight, token and position of a cell on hover, a query row's attention over the text on click,
and zoom on the sinks and the recent window. In a notebook an :class:`HtmlView` shows itself (an
iframe).

The embedded data is bounded: weights as float16 (base64), at most :data:`MAX_VALUES` of them
(layers x heads x rows x cells). Unless told otherwise the view takes the last :data:`ROWS` query
rows and, for a cache of more than :data:`CELLS` cells, its first :data:`SINKS` and last
:data:`RECENT` cells; a selection past the cap is refused in one line that says what to narrow.
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from kvfast.attn.queries import Queries
from kvfast.attn.weights import Incomplete, QueriesArg
from kvfast.errors import SelectionError
from kvfast.plot.grid import Grid, attention_grid
from kvfast.plot.scale import CellsArg
from kvfast.read.state import State

__all__ = ["HtmlView", "attention_html"]

MAX_VALUES = 4_000_000
"""Weights embedded at most (8 MB of float16, about 11 MB of base64)."""
ROWS = 256
"""Query rows shown when ``rows`` is not given: the last ones captured."""
CELLS = 1024
"""A cache of more cells is shown as its first :data:`SINKS` and last :data:`RECENT` cells when
``cells`` is not given."""
SINKS = 64
RECENT = 960
ZOOM_SINKS = 32
"""The "sinks" zoom: the first cells drawn."""
ZOOM_RECENT = 128
"""The "recent" zoom: the last cells drawn."""


@dataclass(frozen=True)
class HtmlView:
    """One self-contained HTML page (:attr:`html`): :meth:`save` writes it; a notebook shows it
    (``_repr_html_``: an iframe whose ``srcdoc`` is the page)."""

    html: str
    height: int = 760

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the page at ``path`` (UTF-8); returns the path."""
        p = Path(path)
        p.write_text(self.html, encoding="utf-8")
        return p

    def _repr_html_(self) -> str:
        doc = html.escape(self.html, quote=True)
        return (
            f'<iframe srcdoc="{doc}" style="width:100%;height:{self.height}px;border:0" '
            'sandbox="allow-scripts"></iframe>'
        )


#: What the page says of a layer whose shown rows are all blank.
BLANK = (
    "no query shown sees every cell it saw in llama.cpp (a sequence save keeps only the last "
    "window of a sliding-window cache): rows left blank; the probe's whole state (--whole-state) "
    "holds them all"
)


def _layer_data(g: Grid) -> dict[str, Any]:
    w = g.stacked().astype(np.float16)
    blank = bool(w.size) and bool(np.isnan(w).all(axis=(0, 2)).all())
    offset, parts = 0, []
    for p in g.parts:
        parts.append(
            {
                "start": p.start,
                "stop": p.stop,
                "offset": offset,
                "cell": p.cell.tolist(),
                "pos": p.pos.tolist(),
                "piece": p.piece,
            }
        )
        offset += p.weights.shape[2]
    return {
        "model_layer": g.model_layer,
        "cache": g.cache,
        "n_cells": g.n_cells,
        "n_cols": offset,
        "parts": parts,
        "blank": BLANK if blank else None,
        "weights": base64.b64encode(np.ascontiguousarray(w).astype("<f2").tobytes()).decode("ascii"),
    }


def attention_html(
    state: State,
    queries: QueriesArg,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    rows: tuple[int | None, int | None] | None = None,
    cells: CellsArg = None,
    model: str | os.PathLike[str] | None = None,
    incomplete: Incomplete = "skip",
    title: str | None = None,
) -> HtmlView:
    """The interactive view of the attention of model layers ``layers`` (None: every layer the
    queries hold), query heads ``heads`` (None: all), query rows ``rows`` (as a slice; None: the
    last :data:`ROWS`) over ``cells`` (as :func:`kvfast.plot.attention_map` takes them; None: all,
    or the first :data:`SINKS` and the last :data:`RECENT` of a cache of more than :data:`CELLS`).
    At most :data:`MAX_VALUES` weights are embedded: a larger selection raises
    :class:`kvfast.SelectionError` naming what to narrow."""
    q = queries if isinstance(queries, Queries) else Queries.load(queries)
    chosen = [lay.model_layer for lay in q.layers] if layers is None else [int(x) for x in layers]
    if not chosen:
        raise SelectionError("the queries hold no layer to show")
    rows, cells = _fitting(q, chosen, heads, rows, cells)
    data: list[dict[str, Any]] = []
    total = 0
    first: Grid | None = None
    for layer in chosen:
        want = cells
        g = attention_grid(
            state,
            q,
            layer,
            rows=rows,
            cells=want,
            heads=heads,
            model=model,
            incomplete=incomplete,
            max_rows=1 << 62,
            max_cols=1 << 62,
        )
        size = int(np.prod(g.stacked().shape))
        total += size
        if total > MAX_VALUES:
            n_rows, n_cols = len(g.query_pos), sum(p.weights.shape[2] for p in g.parts)
            raise SelectionError(
                f"the view would embed more than {MAX_VALUES:,} weights ({len(chosen)} layers x"
                f" {len(g.heads)} heads x {n_rows} rows x {n_cols} cells): narrow layers=, heads=, rows= or cells="
            )
        first = first or g
        data.append(_layer_data(g))
    assert first is not None
    name = os.path.basename(state.path)
    heading = title or f"{name}: attention of {len(first.query_pos)} queries"
    page = {
        "title": heading,
        "heads": first.heads,
        "multi_seq": len(set(first.seq_id.tolist())) > 1,
        "rows": {
            "pos": first.query_pos.tolist(),
            "seq": first.seq_id.tolist(),
            "piece": first.query_piece,
        },
        "zoom_sinks": ZOOM_SINKS,
        "zoom_recent": ZOOM_RECENT,
        "layers": data,
    }
    # JSON inside a script element: "</" would end it
    blob = json.dumps(page, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    template = (files("kvfast") / "data" / "attention_view.html").read_text(encoding="utf-8")
    text = template.replace("__TITLE__", html.escape(heading)).replace("__DATA__", blob, 1)
    return HtmlView(text)


def _fitting(
    q: Queries,
    layers: list[int],
    heads: Sequence[int] | None,
    rows: tuple[int | None, int | None] | None,
    cells: CellsArg,
) -> tuple[tuple[int | None, int | None], CellsArg]:
    """The rows and cells shown where not given: the last :data:`ROWS` rows and the first
    :data:`SINKS` and last :data:`RECENT` cells, fewer of each (of those not given) where the
    layers and heads shown would embed more than :data:`MAX_VALUES` weights with them (a model of
    many layers)."""
    n_heads = {lay.model_layer: lay.n_head for lay in q.layers}
    planes = sum(len(heads) if heads is not None else n_heads.get(il, 1) for il in layers)
    per = max(1, MAX_VALUES // max(1, planes))  # the weights of one head of one layer
    n = len(q.pos)
    n_rows = min(ROWS, n) if rows is None else len(range(*slice(*rows).indices(n)))
    n_cols = SINKS + RECENT
    if n_rows * n_cols > per:
        if rows is None:
            n_rows = min(n_rows, max(32, per // n_cols))
        if cells is None:
            n_cols = max(2, per // max(1, n_rows))
    sinks = min(SINKS, max(1, n_cols // 8))
    return (
        rows if rows is not None else (-n_rows, None),
        cells if cells is not None else f"{sinks}+{n_cols - sinks}",
    )
