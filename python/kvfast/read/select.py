"""One rule for what callers select: every index an integer in range, no head twice, head_dim a
positive integer dividing every row. Anything else raises :class:`kvfast.SelectionError` (a
``ValueError``), the same from every entry point: tables, statistics, addresses, values, the CLI.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvfast.errors import SelectionError
from kvfast.read.structure import Cache, Layer, Recurrent, RecurrentLayer

#: The attention caches' kinds (what tables and statistics read by default).
KINDS = ("k", "v")
#: The recurrent part's kinds: R (conv / token-shift state) and S (SSM / WKV / delta-net state).
RECURRENT_KINDS = ("r", "s")
ALL_KINDS = KINDS + RECURRENT_KINDS


def integer(name: str, value: Any) -> int:
    """`value` as an int: an int or anything with ``__index__`` (NumPy integers), never a bool."""
    if isinstance(value, bool):
        raise SelectionError(f"{name} must be an integer, not {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise SelectionError(f"{name} must be an integer, not {value!r}") from None


def index(name: str, value: Any, n: int, where: str) -> int:
    """An integer in ``0 .. n-1``; `where` says what holds the n."""
    i = integer(name, value)
    if not 0 <= i < n:
        raise SelectionError(f"{name} {i} out of range: {where}")
    return i


def positive(name: str, value: Any) -> int:
    i = integer(name, value)
    if i <= 0:
        raise SelectionError(f"{name} must be a positive integer, not {i}")
    return i


def non_negative(name: str, value: Any) -> int:
    i = integer(name, value)
    if i < 0:
        raise SelectionError(f"{name} must be 0 or more, not {i}")
    return i


def head_dim(value: Any) -> int | None:
    """``head_dim`` as given to open: None (one head spans the row) or a positive integer."""
    return None if value is None else positive("head_dim", value)


def kind(value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in ALL_KINDS:
        raise SelectionError(
            f"kind must be 'k' or 'v' (attention caches), 'r' or 's' (the recurrent part), not {value!r}"
        )
    return value.lower()


def record(layer: Layer | RecurrentLayer, k: str) -> tuple[str, int | None]:
    """(type, values per row) of one kind of a layer (type 'none' and None when it has none: no V
    in a V-less cache, no K or V in the recurrent part, no R or S in an attention cache)."""
    if isinstance(layer, RecurrentLayer):
        if k == "r":
            return layer.r_type, layer.n_embd_r
        if k == "s":
            return layer.s_type, layer.n_embd_s
        return "none", None
    if k == "k":
        return layer.k_type, layer.n_embd_k
    if k == "v":
        return layer.v_type or "none", layer.n_embd_v
    return "none", None


def _unique(name: str, values: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v in out:
            raise SelectionError(f"{name} lists {v!r} twice")
        out.append(v)
    return out


def _listed(name: str, values: Any) -> list[Any]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise SelectionError(f"{name} must be a list of integers, not {values!r}")
    return list(values)


@dataclass(frozen=True)
class Selection:
    caches: list[int] | None
    layers: list[int] | None
    kinds: list[str] | None
    heads: list[int] | None


def selection(
    caches_of: list[Cache],
    *,
    layers: Sequence[int] | None = None,
    kinds: Sequence[str] | str | None = None,
    heads: Sequence[int] | None = None,
    caches: Sequence[int] | None = None,
    recurrent: Recurrent | None = None,
) -> Selection:
    """Check a table's selection against the state: caches and layers that exist (a layer in at
    least one selected cache), kinds 'k'/'v' (and 'r'/'s' of the `recurrent` part, numbered after
    the attention caches), heads that are non-negative integers; none twice. Whether every selected
    record has the heads is kvfast-core's plan to check (a :class:`kvfast.SelectionError` too)."""
    ks = None
    if kinds is not None:
        ks = _unique(
            "kinds", [kind(k) for k in ([kinds] if isinstance(kinds, str) else _listed("kinds", kinds))]
        )
    wants_recurrent = ks is not None and any(k in RECURRENT_KINDS for k in ks)
    if wants_recurrent and recurrent is None:
        raise SelectionError("kinds 'r' and 's' are the recurrent part's, and the state has none")
    # the parts a selection may name: the attention caches, then the recurrent part
    parts: list[tuple[int, int, list[Layer] | list[RecurrentLayer]]] = [
        (c.index, c.n_layer, [ly for s in c.streams for ly in s.layers]) for c in caches_of
    ]
    if recurrent is not None:
        parts.append((recurrent.index, len(recurrent.layers), recurrent.layers))
    cs = None
    if caches is not None:
        n = len(parts)
        cs = _unique(
            "caches", [index("cache", c, n, f"the state has {n} caches") for c in _listed("caches", caches)]
        )
    chosen = [p for p in parts if cs is None or p[0] in cs]
    if not wants_recurrent and recurrent is not None:
        # K and V (the default) are the attention caches' only
        chosen = [p for p in chosen if p[0] != recurrent.index] or chosen
    ls = None
    if layers is not None:
        n = max((p[1] for p in chosen), default=0)
        where = f"the selected caches have {[p[1] for p in chosen]} layers"
        ls = _unique("layers", [index("layer", x, n, where) for x in _listed("layers", layers)])
    hs = None
    if heads is not None:
        hs = _unique("heads", [non_negative("head", h) for h in _listed("heads", heads)])
    return Selection(cs, ls, ks, hs)


def by_model_layer(
    caches_of: list[Cache],
    model_layers: Sequence[int],
    layers: Sequence[int] | None = None,
    caches: Sequence[int] | None = None,
) -> list[tuple[list[int], list[int]]]:
    """The (caches, layers) selections that hold exactly the model layers asked for: one per
    cache that holds any (an iSWA model's model layer 5 may be its second cache's layer 0, where
    ``layers=[0]`` would name model layers 0 and 5 together). Raises SelectionError for a model
    layer the state does not hold, or a state whose model-layer map is unknown."""
    if layers is not None or caches is not None:
        raise SelectionError("give model_layers, or layers and caches, not both")
    want = _unique(
        "model_layers", [non_negative("model_layer", m) for m in _listed("model_layers", model_layers)]
    )
    found: dict[int, list[int]] = {}
    held: set[int] = set()
    unknown = False
    for c in caches_of:
        for ly in max(c.streams, key=lambda s: len(s.layers)).layers if c.streams else []:
            if ly.model_layer is None:
                unknown = True
                continue
            held.add(ly.model_layer)
            if ly.model_layer in want:
                found.setdefault(c.index, []).append(ly.index)
    if unknown and not held:
        raise SelectionError("model_layers: the state's model-layer map is not known: give model= (the GGUF)")
    missing = sorted(set(want) - held)
    if missing:
        raise SelectionError(
            f"model_layers: the state holds no model layer {missing} (it holds {sorted(held)})"
        )
    return [([c], sorted(ls)) for c, ls in sorted(found.items())]
