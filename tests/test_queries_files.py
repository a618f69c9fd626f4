"""A queries sidecar that is truncated, corrupt or says nonsense is refused with a QueriesError naming
the file, the field and what was expected (a KvfastError), never a KeyError, a TypeError or a crash
later in the attention pass."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvfast
from kvfast import attn

ROWS, WIDTH = 3, 2 * 4 * 8


def sidecar(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    values = np.arange(ROWS * WIDTH, dtype=np.float32).reshape(ROWS, WIDTH)
    np.save(tmp_path / "x.queries.npy", values)
    side = {
        "format": "kvfast-queries",
        "version": 1,
        "values": "x.queries.npy",
        "shape": [ROWS, WIDTH],
        "rows": {"pos": [0, 1, 2], "seq": [0, 0, 0]},
        "layers": [
            {"model_layer": 0, "offset": 0, "n_head": 4, "head_dim": 8},
            {"model_layer": 1, "offset": 32, "n_head": 4, "head_dim": 8},
        ],
    }
    p = tmp_path / "x.queries.json"
    p.write_text(json.dumps(side))
    return p, side


def test_a_whole_sidecar_loads(tmp_path: Path) -> None:
    p, _ = sidecar(tmp_path)
    q = attn.Queries.load(p)
    assert q.layer(1).shape == (ROWS, 4, 8) and q.layer(1)[0, 0, 0] == 32


def edit(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def f(side: dict[str, Any]) -> None:
        target, *path = key.split(".")
        d = side
        for k in [target, *path][:-1]:
            d = d[int(k)] if isinstance(d, list) else d[k]
        last = [target, *path][-1]
        if isinstance(d, list):
            d[int(last)] = value
        elif value is KeyError:
            del d[last]
        else:
            d[last] = value

    return f


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (edit("values", KeyError), "values"),
        (edit("values", 7), "values"),
        (edit("values", "../x.queries.npy"), "values"),
        (edit("values", "missing.npy"), "values"),
        (edit("shape", [ROWS]), "shape"),
        (edit("shape", [ROWS, WIDTH + 1]), "shape"),
        (edit("rows", KeyError), "rows"),
        (edit("rows.pos", [0, 1]), "rows.pos"),
        (edit("rows.seq", ["a", 0, 0]), "rows.seq"),
        (edit("rows.pos", [0, 1.5, 2]), "rows.pos"),
        (edit("layers", {"model_layer": 0}), "layers"),
        (edit("layers.1", {"model_layer": 1, "offset": 32}), "layers[1].n_head"),
        (edit("layers.1.offset", 40), "layers[1]"),
        (edit("layers.1.head_dim", -8), "layers[1].head_dim"),
        (edit("layers.1.model_layer", 0), "layers[1].model_layer"),
        (edit("layers.0.sinks", [0.5]), "layers[0].sinks"),
        (edit("layers.0.llama_scale", "big"), "layers[0].llama_scale"),
    ],
)
def test_a_sidecar_that_says_nonsense_is_refused(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], field: str
) -> None:
    p, side = sidecar(tmp_path)
    change(side)
    p.write_text(json.dumps(side))
    with pytest.raises(kvfast.QueriesError) as e:
        attn.Queries.load(p)
    assert e.value.field == field and str(p) in str(e.value)
    assert isinstance(e.value, kvfast.KvfastError) and isinstance(e.value, ValueError)


def test_a_truncated_sidecar_names_the_offset(tmp_path: Path) -> None:
    p, _ = sidecar(tmp_path)
    text = p.read_text()
    p.write_text(text[: len(text) // 2])
    with pytest.raises(kvfast.QueriesError, match="not JSON") as e:
        attn.Queries.load(p)
    assert e.value.offset is not None and 0 < e.value.offset <= len(text) // 2


def test_truncated_or_foreign_values_are_refused(tmp_path: Path) -> None:
    p, _ = sidecar(tmp_path)
    npy = tmp_path / "x.queries.npy"
    whole = npy.read_bytes()
    npy.write_bytes(whole[: len(whole) - 16])
    with pytest.raises(kvfast.QueriesError) as e:
        attn.Queries.load(p)
    assert e.value.field == "values" and "x.queries.npy" in str(e.value)
    npy.write_bytes(b"not an npy file at all")
    with pytest.raises(kvfast.QueriesError):
        attn.Queries.load(p)
    np.save(npy, np.zeros((ROWS, WIDTH), np.float64))
    with pytest.raises(kvfast.QueriesError, match="float32"):
        attn.Queries.load(p)
