"""The model's layers as the key (issue 27): an iSWA state's two caches each number their layers
from 0 (Gemma 3: model layer 5 is the full-attention cache's layer 0, model layer 0 the sliding
cache's), so ``model_layers=`` / ``--model-layers`` select the model's own layers, and an export
of such a state has a file per model layer."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from test_rotation import _gemma3_header

import kvfast
from kvfast.cli import main

DATA = Path(__file__).parent / "data"
GEMMA = DATA / "gemma3-270m-f16-fa/seq-0.ggsq"
KEY = ["cache", "layer", "kind", "stream", "cell", "seq_id", "head"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "gemma3.gguf"
    _gemma3_header(path)
    return path


def test_model_layers_select_the_models_own_layers(model: Path) -> None:
    with kvfast.open(GEMMA, model=model) as d:
        full = d.to_polars()
        # --layers 0 takes both caches' layer 0: model layers 5 and 0 together
        assert sorted(full.filter(layer=0)["model_layer"].unique().to_list()) == [0, 5]
        got = d.to_polars(model_layers=[0, 5, 7])
        want = full.filter(pl.col("model_layer").is_in([0, 5, 7]))
        assert_frame_equal(got.sort(KEY), want.sort(KEY))
        for by in ("layer", "head", "channel", "cell"):
            s = d.stats(by=by, model_layers=[5, 6])
            assert sorted(s["model_layer"].unique().to_list()) == [5, 6]
            every = d.stats(by=by).filter(pl.col("model_layer").is_in([5, 6]))
            assert_frame_equal(s.sort(s.columns[:8]), every.sort(s.columns[:8]))
        q = d.quant_error("q8_0", model_layers=[11])
        assert q["model_layer"].unique().to_list() == [11]
        c = kvfast.compare(d, d, by="layer", model_layers=[0, 11])
        assert sorted(c["model_layer"].to_list()) == [0, 0, 11, 11] and c["mse"].max() == 0
        only_full = d.stats(by="layer", caches=[0])
        assert sorted(only_full["model_layer"].unique().to_list()) == [5, 11, 17]


def test_model_layers_say_what_is_wrong(model: Path) -> None:
    with kvfast.open(GEMMA, model=model) as d:
        with pytest.raises(kvfast.SelectionError, match=r"no model layer \[18\]"):
            d.stats(model_layers=[18])
        with pytest.raises(kvfast.SelectionError, match="not both"):
            d.to_polars(layers=[0], model_layers=[0])
    with kvfast.open(GEMMA) as d, pytest.raises(kvfast.SelectionError, match="map is not known: give model="):
        d.stats(model_layers=[0])


def test_an_iswa_export_has_a_file_per_model_layer(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    kvfast.export([GEMMA], out, model=model)
    (folder,) = [p for p in out.iterdir() if not p.name.startswith(("_", "."))]
    names = sorted(p.name for p in folder.glob("*.parquet"))
    assert names == sorted(f"model_layer-{m}.parquet" for m in range(18))
    five = pl.read_parquet(folder / "model_layer-5.parquet")
    assert five["model_layer"].unique().to_list() == [5] and five["cache"].unique().to_list() == [0]
    # without the model's map: a file per cache and layer, never two caches in one file
    kvfast.export([GEMMA], tmp_path / "plain")
    (plain,) = [p for p in (tmp_path / "plain").iterdir() if not p.name.startswith(("_", "."))]
    assert "cache-1.layer-14.parquet" in {p.name for p in plain.glob("*.parquet")}


def test_cli_model_layers_and_caches(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["stats", str(GEMMA), "--model", str(model), "--by", "layer", "--json"]
    assert main([*args, "--model-layers", "5", "0"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted({r["model_layer"] for r in rows}) == [0, 5]
    assert main([*args, "--caches", "0"]) == 0
    assert sorted({r["model_layer"] for r in json.loads(capsys.readouterr().out)}) == [5, 11, 17]
    assert main(["diff", str(GEMMA), str(GEMMA), "--model", str(model), "--model-layers", "3", "--json"]) == 0
    assert {r["model_layer"] for r in json.loads(capsys.readouterr().out)} == {3}
