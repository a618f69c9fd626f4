"""kvfast-core opens: one call into the extension walks the bytes and decides the geometry, the
model-layer map, the model's fit, the rotation and the RoPE; every later pass reads it from there."""

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA, STATE_FILES

import kvfast
from kvfast import _kvfast, synth
from kvfast.model import ModelGeometry


def test_head_sizes_are_set_once_at_open(tmp_path: Path) -> None:
    p = tmp_path / "s.bin"
    synth.write_state(p, cells=5, n_layer=2, n_embd_k=64)
    with kvfast.open(p, head_dim=32) as d:
        state = d._live()
        assert state.head_dims == (32, 32)
        assert state.model_layers == d._model_layers
        # the table takes no geometry: it splits rows by the heads set at open
        df = d.to_polars(layers=[0], kinds=["k"])
        assert sorted(df["head"].unique().to_list()) == [0, 1]
        assert df.height == 5 * 2
    with kvfast.open(p) as d:
        assert d._live().head_dims == (None, None)
        assert d.to_polars(layers=[0], kinds=["k"])["head"].unique().to_list() == [0]


def _geometry(n_layer: int, **kw: Any) -> ModelGeometry:
    return ModelGeometry("t", n_layer, 64, 64, (1,) * n_layer, (False,) * n_layer, **kw)


def test_the_layer_map_is_the_cores(tmp_path: Path) -> None:
    # Python gives what the model says about its layers; kvfast-core maps the caches' layers
    p = tmp_path / "s.bin"
    synth.write_state(p, cells=3, n_layer=2, n_embd_k=64)
    state, info = _kvfast.open(p)
    assert state.model_layers == info["model_layers"] == [[0, 1]]  # one cache alone: from the bytes
    with pytest.raises(
        kvfast.ModelMismatchError, match=r"has 3 attention layers \(0 sliding-window\) of 3, .* \[2\] layers"
    ):
        _kvfast.open(p, model=_geometry(3))
    # the model keeps layers 1 and 2 in its attention cache (its recurrent part not known: the walk
    # reads what the bytes hold)
    state, info = _kvfast.open(p, model=_geometry(3, attention=(False, True, True)))
    assert state.model_layers == [[1, 2]]
    assert info["head_dims"] == state.head_dims == (64, 64)


def test_the_model_must_fit_the_rows(tmp_path: Path) -> None:
    p = tmp_path / "s.bin"
    synth.write_state(p, cells=3, n_layer=2, n_embd_k=64)
    wide = ModelGeometry("t", 2, 64, 64, (2, 2), (False, False))
    with pytest.raises(kvfast.ModelMismatchError, match="model layer 0: the model has 2 KV heads x 64 = 128"):
        kvfast.open(p, model=wide)
    with pytest.raises(kvfast.ModelMismatchError, match="head_dim=32 but the model's key_length is 64"):
        _kvfast.open(p, model=_geometry(2), head_dim=32)
    with pytest.raises(kvfast.SelectionError, match="head_dim 48 does not divide the 64 values per K row"):
        kvfast.open(p, head_dim=48)
    with pytest.raises(ValueError, match="rotation must be 'auto', 'hadamard' or 'none', not 'maybe'"):
        kvfast.open(p, rotation="maybe")  # type: ignore[arg-type]


def test_the_value_plan_is_the_tables(tmp_path: Path) -> None:
    # the values column scan and export declare over many states: each state's part from the core
    p = tmp_path / "s.bin"
    synth.write_state(p, cells=3, n_layer=2, n_embd_k=128, n_embd_v=64)
    with kvfast.open(p) as d:
        assert d._live().value_plan() == ("float16", [64, 128])
    with kvfast.open(p, head_dim=64) as d:
        assert d._live().value_plan() == ("float16", [64])
        assert d.to_arrow().schema.field("values").type.list_size == 64
    q = tmp_path / "q.bin"
    synth.write_state(q, cells=3, n_layer=1, n_embd_k=64, k_type="q8_0")
    with kvfast.open(q, rotation="none") as d:
        assert d._live().value_plan() == ("float32", [64])


def _calls_into_the_extension(fn: Callable[[], object]) -> list[str]:
    """The calls into ``kvfast._kvfast`` that ``fn`` makes (functions and State methods)."""
    seen: list[str] = []

    def profile(frame: object, event: str, arg: Any) -> None:
        if event != "c_call":
            return
        owner = getattr(arg, "__self__", None)
        if getattr(arg, "__module__", None) == "kvfast._kvfast" or isinstance(owner, _kvfast.State):
            seen.append(getattr(arg, "__qualname__", repr(arg)))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("path", STATE_FILES, ids=lambda p: str(p.relative_to(DATA)))
def test_open_makes_at_most_two_calls_into_the_extension(path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calls = _calls_into_the_extension(lambda: kvfast.open(path))
    assert calls == ["open"]


@pytest.mark.parametrize(
    ("state", "model"),
    [
        ("qwen3tiny-q8_0-fa/seq-0.ggsq", "tiny-qwen3.gguf"),
        ("lfm2tiny-f16-fa/seq-0.ggsq", "tiny-lfm2.gguf"),
        ("deepseek2mla-q8_0-fa/seq-0.ggsq", "tiny-deepseek2-mla.gguf"),
        ("qwen35tiny-q8_0-fa/seq-0.ggsq", "tiny-qwen35.gguf"),
    ],
)
def test_open_with_a_model_makes_at_most_two_calls(state: str, model: str) -> None:
    models = DATA / "models"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calls = _calls_into_the_extension(lambda: kvfast.open(DATA / state, model=models / model))
    assert len(calls) <= 2, calls
    assert calls[-1] == "open"
