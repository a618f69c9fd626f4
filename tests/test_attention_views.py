"""What attention is for in a state's views: sinks by attention share next to sinks by key norm and
heavy hitters by accumulated mass (kvfast.attn.sinks, ``kvfast stats --queries``), and the pictures
(kvfast.plot.attention_map, attention_mass) whose drawn arrays are the tables' numbers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import DATA
from test_attention import QWEN3, STATE, random_queries, sidecar

import kvfast
from kvfast import attn
from kvfast.cli import main

KEYS = ["cache", "stream", "cell"]
WORDS = ["<bos>", "The", " cat", " sat", " on", " the", " mat"]


def test_sinks_and_heavy_hitters_in_one_table() -> None:
    with kvfast.open(STATE, model=QWEN3) as st:
        q = random_queries([2, 3, 4, 5, 6], seed=7)
        s = attn.sinks(st, q)
        assert s.columns == [
            "cache", "stream", "cell", "pos", "piece", "share", "mass", "k_l2", "share_rank", "mass_rank", "k_l2_rank",
        ]  # fmt: skip
        m = attn.mass(st, q).group_by("cell").agg(pl.col("mass").sum(), pl.col("queries").sum()).sort("cell")
        by_cell = s.sort("cell")
        # share: the mean share of a query head's attention; mass: H2O's accumulated attention
        np.testing.assert_allclose(by_cell["share"], m["mass"] / m["queries"], rtol=1e-12)
        np.testing.assert_allclose(
            by_cell["mass"], attn.scores(st, q, "h2o").sort("cell")["score"], rtol=1e-12
        )
        norms = st.stats(by="cell", kinds=["k"]).group_by("cell").agg(pl.col("l2").mean()).sort("cell")
        np.testing.assert_allclose(by_cell["k_l2"], norms["l2"], rtol=1e-12)
        # each rank in its own direction: share and mass from the largest, key norm from the smallest
        assert s["share_rank"].to_list() == sorted(s["share_rank"].to_list())
        assert s.filter(pl.col("share_rank") == 1)["share"][0] == s["share"].max()
        assert s.filter(pl.col("mass_rank") == 1)["mass"][0] == s["mass"].max()
        assert s.filter(pl.col("k_l2_rank") == 1)["k_l2"][0] == s["k_l2"].min()
        assert s["piece"].null_count() == s.height  # the tiny model has no vocabulary
        # the early cells are seen by more queries: they lead by mass more than by share
        assert s.filter(pl.col("mass_rank") == 1)["pos"][0] <= 2
        one = attn.sinks(st, q, layers=[1])
        m1 = attn.mass(st, q, layers=[1]).group_by("cell").agg(pl.col("mass").sum()).sort("cell")
        np.testing.assert_allclose(one.sort("cell")["mass"], m1["mass"], rtol=1e-12)


@pytest.fixture
def with_pieces(tmp_path: Path) -> Path:
    """The tiny state beside a probe manifest that records its tokens' pieces (taken when the state
    is opened without a model: the queries name theirs)."""
    shutil.copy(STATE, tmp_path / "seq-0.ggsq")
    row = {
        "prompt_id": "seq-0",
        "status": "ok",
        "state": "seq-0.ggsq",
        "whole_state": None,
        "pieces": WORDS,
        "arch": "qwen3",
        "n_layer": 2,
        "head_dim_k": 32,
        "head_dim_v": 32,
        "n_head_kv": [2, 2],
        "swa": [False, False],
        "recurrent": None,
        "attention": None,
        "v_less": False,
        "n_layer_trunk": None,
        "attn_rot": False,
        "llama_build": "test",
    }
    pl.DataFrame([row]).write_parquet(tmp_path / "manifest.parquet")
    return tmp_path / "seq-0.ggsq"


def test_stats_command_gives_the_attention_view(
    tmp_path: Path, with_pieces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    q = random_queries([3, 4, 5, 6], seed=5)
    side = sidecar(q, tmp_path / "q.queries")
    base = ["stats", str(with_pieces), "--queries", str(side), "--json"]  # the queries name the model
    assert main(base) == 0
    got = pl.DataFrame(json.loads(capsys.readouterr().out))
    with kvfast.open(with_pieces) as st:
        want = attn.sinks(st, q)
    assert got["cell"].to_list() == want["cell"].to_list()  # by share rank
    np.testing.assert_allclose(got["share"], want["share"], rtol=1e-12)
    assert got.sort("cell")["piece"].to_list() == WORDS
    assert main([*base, "--sort", "mass"]) == 0
    by_mass = pl.DataFrame(json.loads(capsys.readouterr().out))
    assert by_mass["mass_rank"].to_list() == sorted(by_mass["mass_rank"].to_list())
    assert by_mass["mass"][0] == want["mass"].max()
    assert main([*base, "--sort", "k_l2", "--model-layers", "0"]) == 0
    layer0 = pl.DataFrame(json.loads(capsys.readouterr().out))
    with kvfast.open(with_pieces) as st:
        np.testing.assert_allclose(
            layer0.sort("cell")["mass"], attn.sinks(st, q, layers=[0]).sort("cell")["mass"]
        )
    assert layer0["k_l2"][0] == layer0["k_l2"].min()
    assert main([*base, "--by", "cell"]) != 0
    assert "--by does not apply to the attention view" in capsys.readouterr().err
    out = tmp_path / "view.parquet"
    assert main([*base[:-1], "-o", str(out)]) == 0
    assert pl.read_parquet(out).height == 7


def test_attention_map_draws_the_weights(with_pieces: Path) -> None:
    pytest.importorskip("matplotlib")
    from kvfast import plot

    with kvfast.open(with_pieces) as st:
        q = random_queries([2, 4, 6], seed=9)
        fig = plot.attention_map(st, q, 1)
        w = attn.attention(st, q, layers=[1])
        panels = [ax for ax in fig.axes if ax.images]
        assert len(panels) == 4  # a panel per query head
        for h, ax in enumerate(panels):
            img = ax.images[0].get_array()
            assert img.shape == (3, 7)  # 3 queries x 7 cells
            want = np.full((3, 7), np.nan)
            for r, p in enumerate([2, 4, 6]):
                part = w.filter((pl.col("head") == h) & (pl.col("query_pos") == p))
                want[r, part["cell"].to_numpy()] = part["weight"].to_numpy()
            np.testing.assert_array_equal(np.ma.getmaskarray(img), np.isnan(want))  # unseen cells blank
            np.testing.assert_allclose(img.filled(np.nan), want, rtol=1e-6, atol=0)  # float32 of the same
            assert ax.get_title() == f"model layer 1 head {h}"
        labels = [t.get_text() for t in panels[0].get_xticklabels()]
        assert labels[:2] == ["0 '<bos>'", "1 'The'"]  # token pieces on the cell axis
        part = plot.attention_map(st, q, 0, heads=[2], cells=(2, 7))
        (only,) = [ax for ax in part.axes if ax.images]
        assert only.images[0].get_array().shape == (3, 5) and only.get_title() == "model layer 0 head 2"
        with pytest.raises(kvfast.SelectionError, match="model layer 5"):
            plot.attention_map(st, q, 5)


def test_attention_mass_draws_each_cells_share(with_pieces: Path) -> None:
    pytest.importorskip("matplotlib")
    from kvfast import plot

    with kvfast.open(with_pieces) as st:
        q = random_queries([3, 5, 6], seed=2)
        view = attn.sinks(st, q).sort("cell")
        for what in ("share", "mass"):
            fig = plot.attention_mass(st, q, what=what)
            (ax,) = fig.axes
            heights = [p.get_height() for p in ax.patches]
            np.testing.assert_allclose(heights, view[what], rtol=1e-12)
            assert [t.get_text() for t in ax.get_xticklabels()][-1] == "6 ' mat'"
        with pytest.raises(ValueError, match="what must be"):
            plot.attention_mass(st, q, what="norm")  # type: ignore[arg-type]


def test_pictures_of_an_iswa_capture(tmp_path: Path) -> None:
    """Queries llama.cpp computed for the tiny iSWA Gemma 3 (window 4): a panel per cache, and a
    sliding layer's map blank outside its window."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("llama_cpp")
    from kvfast import plot, probe

    model = DATA / "models/tiny-gemma3-attn.gguf"
    prompt = [{"id": "a", "tokens": [68, 32, 130, 60, 253, 230, 241, 194, 107, 48]}]
    # the whole state: a sequence save keeps only the sliding-window cache's last window
    man = probe.run(model, prompt, tmp_path, queries=6, whole_state=True, progress=False)
    with kvfast.open(tmp_path / man["whole_state"][0]) as st:
        q = attn.Queries.load(tmp_path / man["queries"][0])
        fig = plot.attention_mass(st, q)
        assert len(fig.axes) == 2  # the sliding-window cache and the global one
        sliding = plot.attention_map(st, q, 0, heads=[0])
        img = next(ax for ax in sliding.axes if ax.images).images[0].get_array()
        seen = (~np.ma.getmaskarray(img)).sum(axis=1)
        assert img.shape == (6, 10) and seen.tolist() == [4] * 6  # each query sees its window of 4
        full = plot.attention_map(st, q, 2, heads=[0])
        img = next(ax for ax in full.axes if ax.images).images[0].get_array()
        assert (~np.ma.getmaskarray(img)).sum(axis=1).tolist() == [5, 6, 7, 8, 9, 10]  # causal


def test_plot_command_draws_attention(
    tmp_path: Path, with_pieces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    side = sidecar(random_queries([4, 5, 6], seed=4), tmp_path / "q.queries")
    for what, extra in (
        ("attention", ["--layer", "1", "--heads", "0", "1", "--cells", "2:7"]),
        ("attention-mass", []),
    ):
        out = tmp_path / f"{what}.png"
        assert main(["plot", what, str(with_pieces), "--queries", str(side), *extra, "-o", str(out)]) == 0
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        main(["plot", "attention", str(with_pieces), "--queries", str(side), "-o", str(tmp_path / "x.png")])
        != 0
    )
    assert "needs --layer" in capsys.readouterr().err
    assert main(["plot", "attention-mass", str(with_pieces), "-o", str(tmp_path / "y.png")]) != 0
    assert "--queries" in capsys.readouterr().err
