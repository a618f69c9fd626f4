"""One rule for the arguments callers give: every index an integer in range, no head twice, head_dim a
positive integer dividing every row, a kind, a dtype or a cache type one of their names. Anything else
raises :class:`kvfast.SelectionError` (a ``ValueError``), the same from every entry point: tables,
statistics, addresses, values, the CLI; :func:`kvfast.write` checks its own arguments with the same
functions and raises :class:`kvfast.WriteError` naming the argument.

An integer is an ``int`` or a NumPy integer (anything with ``__index__``), never a ``bool`` (``True``
is no layer), a float (``1.0`` is no layer, ``1.5`` no token) or a string; and it must fit what it is
given to (a sequence id, a token, a position), never overflowing on its way to Rust.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvfast import _kvfast
from kvfast.errors import SelectionError
from kvfast.read.structure import Cache, Layer, Recurrent, RecurrentLayer

#: The attention caches' kinds (what tables and statistics read by default).
KINDS = ("k", "v")
#: The recurrent part's kinds: R (conv / token-shift state) and S (SSM / WKV / delta-net state).
RECURRENT_KINDS = ("r", "s")
ALL_KINDS = KINDS + RECURRENT_KINDS


#: The largest value of an int32 argument (positions, tokens, skip_first): llama.cpp's llama_pos and
#: llama_token are int32.
INT32_MAX = 2**31 - 1
#: The largest value of a u32 argument (heads, channels, cells).
UINT32_MAX = 2**32 - 1
#: llama.cpp's LLAMA_MAX_SEQ (kvfast-core's): sequence ids are 0 to 255.
MAX_SEQ: int = _kvfast.MAX_SEQ
#: What a read's ``dtype`` takes: None (as stored where the type allows it) or float32.
DTYPES = ("float32", "f32")

#: How an argument error is raised: a message to an exception (SelectionError, or WriteError naming
#: the argument for kvfast.write).
Refuse = Callable[[str], Exception]


def integer(
    name: str, value: Any, lo: int | None = None, hi: int | None = None, error: Refuse = SelectionError
) -> int:
    """`value` as an int: an int or anything with ``__index__`` (NumPy integers), never a bool, a
    float or a string; within ``lo .. hi`` where they are given."""
    if isinstance(value, (bool, np.bool_)):
        raise error(f"{name} must be an integer, not {value!r}")
    try:
        i = operator.index(value)
    except TypeError:
        raise error(f"{name} must be an integer, not {value!r}") from None
    if (lo is not None and i < lo) or (hi is not None and i > hi):
        span = (
            f"{lo} to {hi}"
            if lo is not None and hi is not None
            else f"at least {lo}"
            if lo is not None
            else f"at most {hi}"
        )
        raise error(f"{name} must be {span}, not {i}")
    return i


def index(name: str, value: Any, n: int, where: str) -> int:
    """An integer in ``0 .. n-1``; `where` says what holds the n."""
    i = integer(name, value)
    if not 0 <= i < n:
        raise SelectionError(f"{name} {i} out of range: {where}")
    return i


def positive(name: str, value: Any, hi: int = UINT32_MAX) -> int:
    i = integer(name, value, hi=hi)
    if i <= 0:
        raise SelectionError(f"{name} must be a positive integer, not {i}")
    return i


def non_negative(name: str, value: Any, hi: int = UINT32_MAX) -> int:
    i = integer(name, value, hi=hi)
    if i < 0:
        raise SelectionError(f"{name} must be 0 or more, not {i}")
    return i


def seq_id(name: str, value: Any, error: Refuse = SelectionError) -> int:
    """A sequence id: an integer 0 to 255 (llama.cpp's LLAMA_MAX_SEQ)."""
    q = integer(name, value, error=error)
    if not 0 <= q < MAX_SEQ:
        raise error(f"{name} must be 0 to {MAX_SEQ - 1} (llama.cpp's LLAMA_MAX_SEQ), not {q}")
    return q


def dtype(value: Any) -> str | None:
    """A read's ``dtype``: None or ``"float32"``."""
    if value is not None and (not isinstance(value, str) or value not in DTYPES):
        raise SelectionError(f"dtype must be None or 'float32', not {value!r}")
    return value


def cache_type(name: str, value: Any, error: Refuse = SelectionError) -> str:
    """A cache type's name, as llama.cpp writes it (``q8_0``, ``f16``, ...)."""
    from kvfast.read.ggml import TYPES

    if not isinstance(value, str) or value not in TYPES:
        raise error(f"{name} must be a cache type ({', '.join(TYPES)}), not {value!r}")
    return value


def head_dim(value: Any) -> int | None:
    """``head_dim`` as given to open: None (one head spans the row) or a positive integer."""
    return None if value is None else positive("head_dim", value)


def kind(value: Any, error: Refuse = SelectionError) -> str:
    """A kind, in lower case as every table writes it: 'k', 'v', 'r' or 's'."""
    if not isinstance(value, str) or value not in ALL_KINDS:
        raise error(
            f"kind must be 'k' or 'v' (attention caches), 'r' or 's' (the recurrent part), not {value!r}"
        )
    return value


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
        for ly in c.layers:
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
