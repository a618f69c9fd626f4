"""Small things that each cost a user minutes (issue 14): messages, reprs, counts, CLI options."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA

import kvfast
from kvfast import synth
from kvfast.cli import main


@pytest.mark.parametrize("text", ["hello\n", "prompt,id\nThe cat sat,1\n" * 30])
def test_a_text_file_is_not_a_state(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "notes.txt"
    f.write_text(text)
    with pytest.raises(kvfast.FormatError, match="not a llama.cpp state") as e:
        kvfast.open(f)
    assert not isinstance(e.value, kvfast.TruncatedError)
    assert (e.value.offset, e.value.field) == (0, "magic")
    assert main(["info", str(f)]) == 1
    err = capsys.readouterr().err
    assert "not a llama.cpp state" in err and "cells" not in err.split("(no magic")[0]


def test_reprs_of_caches_and_streams_are_short(tmp_path: Path) -> None:
    path = tmp_path / "long.bin"
    synth.write_state(path, cells=7700, n_layer=18)
    with kvfast.open(path) as d:
        text = repr(d.caches)
        assert len(text) < 300, text
        assert "cells=7700" in text and "pos=0..7699" in text and "seq_ids=[0]" in text
        assert "layers=18" in text and "n_layer=18" in text
        assert len(repr(d.caches[0].streams[0])) < 120


def test_dump_html_in_notebooks() -> None:
    q8 = DATA / "qwen3hd128-q8_0-fa/seq-0.ggsq"
    with kvfast.open(q8, model=DATA / "models/tiny-qwen3-hd128.gguf") as d:
        page = d._repr_html_()
    assert "head_dim K 128" in page and "q8_0 x 256" in page and "undone (groups of 128)" in page
    d = kvfast.open(kvfast.sample_path())
    page = d._repr_html_()
    assert page.startswith("<div>") and page.endswith("</div>")
    assert "ggsq v3" in page and "148,156 bytes" in page and "layers 0-14" in page and "f16 x 256" in page
    assert "<script" not in page
    d.close()
    assert "(closed)" in d._repr_html_()


def test_dump_html_escapes_the_path(tmp_path: Path) -> None:
    path = tmp_path / "<b>x&y.bin"
    synth.write_state(path)
    with kvfast.open(path) as d:
        page = d._repr_html_()
    assert "&lt;b&gt;x&amp;y.bin" in page and "<b>x&y" not in page


def test_count_is_values_and_cells_is_cells_in_every_summary() -> None:
    with kvfast.open(DATA / "qwen3tiny-3seq-shared/state.bin", head_dim=32) as d:
        n_cells = sum(s.cell_count for s in d.caches[0].streams)
        assert d.to_polars(layers=[0], kinds="k", heads=[0]).height > n_cells  # shared cells
        for skip in (0, 4):
            cells = n_cells - sum(int((s.pos < skip).sum()) for s in d.caches[0].streams)
            ch = d.stats(by="channel", skip_first=skip)
            head = d.stats(by="head", skip_first=skip)
            layer = d.stats(by="layer", skip_first=skip)
            for df in (ch, head, layer):
                assert df.columns[df.columns.index("count") + 1] == "cells"
                assert df["cells"].unique().to_list() == [cells]
            # no NaN here: count is every value (count + nan is, whatever the values)
            assert (ch["count"] == ch["cells"]).all() and (ch["nan"] == 0).all()
            assert (head["count"] == head["cells"] * 32).all()
            n_embd = d.caches[0].streams[0].layers[0].n_embd_k
            assert (layer["count"] == layer["cells"] * n_embd).all()


def test_stats_json_honours_rows(capsys: pytest.CaptureFixture[str]) -> None:
    sample = kvfast.sample_path()
    assert main(["stats", sample, "--json"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert len(every) == 36  # 18 layers x K, V: JSON gives every row unless --rows says otherwise
    assert main(["stats", sample, "--json", "--rows", "3"]) == 0
    assert json.loads(capsys.readouterr().out) == every[:3]
    assert main(["manifest", sample, "--json", "--rows", "0"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["stats", sample, "--rows", "2"]) == 0
    assert "shape: (36, 14)" in capsys.readouterr().out


def test_upcast_avoids_the_float16_traps() -> None:
    import polars as pl

    df = pl.DataFrame(
        {
            "values": pl.Series([[358.5, 2.0]], dtype=pl.Array(pl.Float16, 2)),
            "tokens": pl.Series([[1.5]], dtype=pl.List(pl.Float16)),
            "n": [1],
        }
    )
    sq = pl.col("values").arr.eval(pl.element().pow(2)).arr.sum()
    assert df.select(sq).item() == float("inf")  # the trap: the sum of squares overflows in f16
    up = kvfast.upcast(df)
    assert up.schema == {
        "values": pl.Array(pl.Float32, 2),
        "tokens": pl.List(pl.Float32),
        "n": pl.Int64,
    }
    assert up.select(sq.sqrt()).item() == pytest.approx((358.5**2 + 4) ** 0.5)
    assert kvfast.upcast(df.lazy(), pl.Float64).collect_schema()["values"] == pl.Array(pl.Float64, 2)
    plain = df.select("n")
    assert kvfast.upcast(plain) is plain
    with kvfast.open(kvfast.sample_path()) as d:
        t = d.to_polars()
    norms = kvfast.upcast(t).select(sq.sqrt()).to_series()
    want = np.linalg.norm(np.stack(t["values"].to_numpy()).astype(np.float64), axis=1)
    np.testing.assert_allclose(norms.to_numpy(), want, rtol=1e-6)


def test_a_layer_of_another_cache_says_which(capsys: pytest.CaptureFixture[str]) -> None:
    sample = kvfast.sample_path()  # Gemma 3: cache 0 holds 3 global layers, cache 1 the other 15
    assert main(["show", sample, "--layer", "3"]) == 2
    assert "cache 0 has 3 layers; cache 1 has 15 (--cache 1, or cache=1)" in capsys.readouterr().err
    assert main(["show", sample, "--layer", "3", "--cache", "1", "--cells", "1"]) == 0
    with kvfast.open(sample) as d, pytest.raises(kvfast.SelectionError, match="cache=1"):
        d.values(3, "k")
    with kvfast.open(sample) as d, pytest.raises(kvfast.SelectionError) as e:
        d.values(20, "k")
    assert "cache 1" not in str(e.value)  # no cache has layer 20: no hint
