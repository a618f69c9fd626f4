"""The model's geometry (head sizes, model-layer map) is set once on the binding's state at open and
used by every later pass, as the rotation is; calls no longer carry it."""

from pathlib import Path

import pytest

import kvfast
from kvfast import _kvfast, synth


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


def test_the_layer_map_is_the_cores(tmp_path: Path) -> None:
    # Python sends what the model says about its layers; kvfast-core maps the caches' layers
    p = tmp_path / "s.bin"
    synth.write_state(p, cells=3, n_layer=2, n_embd_k=64)
    state = _kvfast.State(p)
    assert state.model_layers == [[0, 1]]  # one cache alone: from the bytes
    three = {"arch": "t", "n_layer": 3, "attention": None, "swa": [False] * 3, "recurrent": None}
    with pytest.raises(
        ValueError, match=r"has 3 attention layers \(0 sliding-window\) of 3, .* \[2\] layers"
    ):
        state.set_geometry(64, 64, three)
    hybrid = {**three, "attention": [False, True, True], "recurrent": [True, False, False]}
    state.set_geometry(64, 64, hybrid)
    assert state.model_layers == [[1, 2]]
    assert state.head_dims == (64, 64)


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
