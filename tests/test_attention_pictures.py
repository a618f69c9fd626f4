"""Attention pictures that read at long contexts: the map drawn from kvfast.attn.dense (never the
long weights table) in memory of the order of the drawn array, its colour scales, the zoom on the
sinks and the recent window with token text on both axes, the mass plot's first bar clear of the
axis, one meaning of --layer across the plot commands; and the interactive HTML view, opened in a
real headless Chromium."""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from browser import dump_dom, element_attrs
from test_attention import random_queries, sidecar
from test_attention_views import WORDS, with_pieces  # noqa: F401 (a fixture)

import kvfast
from kvfast import attn
from kvfast.cli import main

pytest.importorskip("matplotlib")

from kvfast import plot
from kvfast.plot import grid as grid_mod
from kvfast.plot.html import attention_html


def _panels(fig: object) -> list[object]:
    return [ax for ax in fig.axes if ax.images]  # type: ignore[attr-defined]


def test_attention_map_reads_the_dense_array_not_the_table(
    with_pieces: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    q = random_queries([1, 2, 3, 4, 5, 6], seed=3)
    with kvfast.open(with_pieces) as st:
        want = attn.dense(st, q, 1).weights

        def no_table(*a: object, **k: object) -> None:
            raise AssertionError("the picture went through the weights table")

        monkeypatch.setattr(attn.weights, "attention", no_table)
        fig = plot.attention_map(st, q, 1, rows=(2, 5), scale="linear")
        panels = _panels(fig)
        assert len(panels) == 4
        for h, ax in enumerate(panels):
            img = ax.images[0].get_array()  # type: ignore[attr-defined]
            np.testing.assert_array_equal(img.filled(np.nan), want[h, 2:5])
        # the query axis: positions and the tokens' pieces
        ys = [t.get_text() for t in panels[0].get_yticklabels()]  # type: ignore[attr-defined]
        assert ys[0] == "3 ' sat'"


def test_pooled_grid_keeps_each_blocks_largest_weight(with_pieces: Path) -> None:  # noqa: F811
    """Past max_rows x max_cols a drawn value is the largest weight of its block: the array held is
    the picture's, not the layer's (a sink stays visible)."""
    q = random_queries(list(range(7)), seed=11)
    with kvfast.open(with_pieces) as st:
        full = attn.dense(st, q, 0).weights
        g = grid_mod.attention_grid(st, q, 0, max_rows=3, max_cols=4)
    assert (g.row_step, g.col_step) == (3, 2) and g.pooled
    got = g.stacked()
    assert got.shape == (4, 3, 4)
    for i in range(3):
        for j in range(4):
            block = full[:, 3 * i : 3 * i + 3, 2 * j : 2 * j + 2]
            seen = ~np.isnan(block)
            for h in range(4):
                want = block[h][seen[h]].max() if seen[h].any() else np.nan
                np.testing.assert_array_equal(got[h, i, j], np.float32(want))
    assert g.query_pos.tolist() == [0, 3, 6] and g.parts[0].cell.tolist() == [0, 2, 4, 6]


def test_pooled_grid_reads_in_chunks(with_pieces: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The rows are read a chunk at a time: no one read holds more than the chunk's weights."""
    q = random_queries(list(range(7)), seed=12)
    shapes: list[tuple[int, ...]] = []
    real = attn.dense

    def counting(*a: object, **k: object) -> object:
        d = real(*a, **k)  # type: ignore[arg-type]
        shapes.append(d.weights.shape)
        return d

    monkeypatch.setattr(attn, "dense", counting)
    monkeypatch.setattr(grid_mod, "CHUNK_VALUES", 4 * 7 * 2)  # two rows of 4 heads x 7 cells
    with kvfast.open(with_pieces) as st:
        g = grid_mod.attention_grid(st, q, 1)
        np.testing.assert_array_equal(g.stacked(), real(st, q, 1).weights)
    assert max(s[1] for s in shapes) == 2 and len(shapes) == 1 + 4


def test_colour_scales(with_pieces: Path) -> None:  # noqa: F811
    from matplotlib.colors import LogNorm, Normalize

    q = random_queries([2, 4, 6], seed=9)
    with kvfast.open(with_pieces) as st:
        w = attn.dense(st, q, 1).weights
        log = _panels(plot.attention_map(st, q, 1))[0]
        assert isinstance(log.images[0].norm, LogNorm)  # type: ignore[attr-defined]  # the default
        row = _panels(plot.attention_map(st, q, 1, scale="row"))
        for h, ax in enumerate(row):
            img = ax.images[0].get_array().filled(np.nan)  # type: ignore[attr-defined]
            np.testing.assert_allclose(np.nanmax(img, axis=1), 1.0)  # each row over its largest
            np.testing.assert_allclose(img, w[h] / np.nanmax(w[h], axis=1, keepdims=True))
            assert type(ax.images[0].norm) is Normalize  # type: ignore[attr-defined]
        with pytest.raises(kvfast.SelectionError, match="scale must be one of log, row, linear"):
            plot.attention_map(st, q, 1, scale="sqrt")


def test_sinks_and_recent_side_by_side(with_pieces: Path) -> None:  # noqa: F811
    q = random_queries([4, 5, 6], seed=1)
    with kvfast.open(with_pieces) as st:
        w = attn.dense(st, q, 0, heads=[1]).weights
        fig = plot.attention_map(st, q, 0, heads=[1], cells="2+3")
        left, right = _panels(fig)
        np.testing.assert_array_equal(left.images[0].get_array().filled(np.nan), w[0, :, :2])  # type: ignore[attr-defined]
        np.testing.assert_array_equal(right.images[0].get_array().filled(np.nan), w[0, :, 4:])  # type: ignore[attr-defined]
        xs = [t.get_text() for ax in (left, right) for t in ax.get_xticklabels()]  # type: ignore[attr-defined]
        assert xs == ["0 '<bos>'", "1 'The'", "4 ' on'", "5 ' the'", "6 ' mat'"]  # every cell, token text
        assert not left.spines["right"].get_visible() and not right.spines["left"].get_visible()  # type: ignore[attr-defined]
        assert left.get_title(loc="left") == "model layer 0 head 1"  # type: ignore[attr-defined]
        # the default counts meet in a short cache: one range of every cell
        (one,) = _panels(plot.attention_map(st, q, 0, heads=[1], cells="sinks+recent"))
        assert one.images[0].get_array().shape == (3, 7)  # type: ignore[attr-defined]
        with pytest.raises(kvfast.SelectionError, match="cells 'sinks': give .*'N\\+M'"):
            plot.attention_map(st, q, 0, cells="sinks")


def test_attention_mass_first_bar_clear_of_the_axis(with_pieces: Path) -> None:  # noqa: F811
    q = random_queries([3, 5, 6], seed=2)
    with kvfast.open(with_pieces) as st:
        (ax,) = plot.attention_mass(st, q).axes
        first = ax.patches[0]
        assert ax.get_xlim()[0] < first.get_x() - 0.5  # a margin between the y axis and <bos>
        assert ax.get_xlim()[1] > ax.patches[-1].get_x() + ax.patches[-1].get_width() + 0.5
        (lg,) = plot.attention_mass(st, q, log=True).axes
        assert lg.get_yscale() == "log"


def test_plot_layer_is_a_model_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--layer names a model layer in every plot command: heatmap finds its cache (Gemma 3's model
    layer 5 is the full-attention cache's layer 0, model layer 0 the sliding one's), --cache-layer
    keeps the index within a cache reachable."""
    import matplotlib.figure
    from test_model_layers import GEMMA
    from test_rotation import _gemma3_header

    model = tmp_path / "gemma3.gguf"
    _gemma3_header(model)
    out = tmp_path / "h.png"
    titles: list[str] = []
    orig = matplotlib.figure.Figure.savefig

    def keep(self: matplotlib.figure.Figure, *a: object, **k: object) -> None:
        titles.append(self.axes[0].get_title())
        orig(self, *a, **k)

    base = ["plot", "heatmap", str(GEMMA), "--model", str(model), "-o", str(out)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.figure.Figure, "savefig", keep)
        assert main([*base, "--layer", "5"]) == 0
        assert main([*base, "--cache-layer", "0", "--cache", "0"]) == 0
        assert main([*base, "--layer", "7"]) == 0
        assert main([*base, "--cache-layer", "6", "--cache", "1"]) == 0  # 0-4, 6, 7: the 7th
    assert titles[0] == titles[1] and "model layer 5" in titles[0], titles
    assert titles[2] == titles[3] and "model layer 7" in titles[2], titles
    assert main([*base, "--layer", "0", "--cache-layer", "0"]) == 2
    assert "not both" in capsys.readouterr().err
    # without the model the map is not known: a state of two caches is refused, in one line
    assert main(["plot", "heatmap", str(GEMMA), "--layer", "5", "-o", str(out)]) == 2
    assert (
        "--layer 5 is a model layer, and the state's model-layer map is not known" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    assert "--layer LAYER a model layer, as the model numbers them" in " ".join(
        capsys.readouterr().out.split()
    )


# -- the interactive view --------------------------------------------------------------------------


def _embedded(page: str) -> dict[str, object]:
    m = re.search(r'<script type="application/json" id="kvfast-data">(.*?)</script>', page, re.DOTALL)
    assert m is not None
    data: dict[str, object] = json.loads(m.group(1))
    return data


def _weights(layer: dict[str, object], shape: tuple[int, ...]) -> np.ndarray:
    raw = base64.b64decode(str(layer["weights"]))
    return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)


def test_html_view_embeds_the_weights_as_float16(with_pieces: Path) -> None:  # noqa: F811
    q = random_queries([2, 3, 4, 5, 6], seed=4)
    with kvfast.open(with_pieces) as st:
        view = attention_html(st, q, heads=[0, 3], cells="2+3")
        data = _embedded(view.html)
        assert [x["model_layer"] for x in data["layers"]] == [0, 1]  # type: ignore[index]
        assert data["heads"] == [0, 3]
        assert data["rows"] == {"pos": [2, 3, 4, 5, 6], "seq": [0] * 5, "piece": WORDS[2:]}
        for layer in data["layers"]:  # type: ignore[attr-defined]
            d = attn.dense(st, q, layer["model_layer"], heads=[0, 3]).weights
            want = np.concatenate([d[:, :, :2], d[:, :, 4:]], axis=2)
            got = _weights(layer, want.shape)
            np.testing.assert_allclose(got, want.astype(np.float16).astype(np.float32), rtol=0, atol=0)
            assert [p["piece"] for p in layer["parts"]] == [WORDS[:2], WORDS[4:]]
        assert "<script src" not in view.html and "http" not in view.html.split("<script")[0]
        frame = view._repr_html_()
        assert frame.startswith("<iframe srcdoc=") and "&lt;!DOCTYPE html&gt;" in frame
        # the default rows: the last 256 captured; a selection past the cap is refused in one line
        grid_rows = _embedded(attention_html(st, q, layers=[1], rows=(-2, None)).html)["rows"]
        assert grid_rows["pos"] == [5, 6]  # type: ignore[index]
        import kvfast.plot.html as html_mod

        mp = pytest.MonkeyPatch()
        mp.setattr(html_mod, "MAX_VALUES", 50)
        try:
            with pytest.raises(
                kvfast.SelectionError, match=r"more than 50 weights .*2 layers x 4 heads x 5 rows x 2 cells"
            ):
                attention_html(st, q, rows=(0, None))
            # with neither rows nor cells given, the view shows fewer cells to fit the cap:
            # 2 layers x 4 heads x 5 rows x 5 cells, the first cell and the last four
            mp.setattr(html_mod, "MAX_VALUES", 200)
            parts = _embedded(attention_html(st, q).html)["layers"][0]["parts"]  # type: ignore[index]
            assert [p["piece"] for p in parts] == [WORDS[:1], WORDS[-4:]]
        finally:
            mp.undo()


def test_html_view_draws_in_a_browser(tmp_path: Path, with_pieces: Path) -> None:  # noqa: F811
    side = sidecar(random_queries([3, 4, 5, 6], seed=5), tmp_path / "q.queries")
    page = tmp_path / "view.html"
    argv = ["plot", "attention-html", str(with_pieces), "--queries", str(side), "--heads", "1", "2"]
    assert main([*argv, "--rows=-3:", "-o", str(page)]) == 0
    dom = dump_dom(page.resolve().as_uri())
    attrs = element_attrs(dom, "kvfast-status")
    assert "data-error" not in attrs, attrs
    # 3 query rows over 7 cells, causal: each sees the cells up to its position
    assert attrs["data-drawn"] == str(5 + 6 + 7) and attrs["data-layer"] == "0" and attrs["data-head"] == "1"
    # the selectors: the model layers (with their cache) and the heads asked for
    assert '<option value="1">1 (cache 0)</option>' in dom and '<option value="1">2</option>' in dom


# -- a long prompt ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 2,600-token prompt of the tiny iSWA Gemma 3 (six micro-batches), every query captured."""
    if not os.environ.get("KVFAST_REQUIRE_PROBE"):
        pytest.importorskip("llama_cpp")
    from conftest import DATA

    from kvfast import probe

    out = tmp_path_factory.mktemp("long")
    toks = [int(t) for t in np.random.default_rng(1).integers(1, 250, 2600)]
    man = probe.run(
        DATA / "models/tiny-gemma3-attn.gguf",
        [{"id": "long", "tokens": toks}],
        out,
        n_ctx=4096,
        queries="all",
        whole_state=True,
        progress=False,
    )
    r = man.row(0, named=True)
    return out / r["whole_state"], out / r["queries"]


def test_long_attention_map_holds_the_pictures_array_not_the_layers(
    long_capture: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """2,600 queries over 2,600 cells: 4 heads of 27 MB each as the layer's array; the picture reads
    them a chunk at a time and keeps the largest of each 3 x 3 block."""
    state, queries = long_capture
    reads: list[int] = []
    real = attn.dense

    def counting(*a: object, **k: object) -> object:
        d = real(*a, **k)  # type: ignore[arg-type]
        reads.append(d.weights.nbytes)
        return d

    monkeypatch.setattr(attn, "dense", counting)
    with kvfast.open(state) as st:
        fig = plot.attention_map(st, queries, 2)  # a global layer: every cell
        panels = _panels(fig)
        assert len(panels) == 4
        shape = panels[0].images[0].get_array().shape  # type: ignore[attr-defined]
        assert shape == (867, 867)  # ceil(2600 / 3) both ways
        assert max(reads) <= 4 * grid_mod.CHUNK_VALUES
        assert "the largest of 3 rows x 3 cells" in fig._suptitle.get_text()  # type: ignore[attr-defined]
        # the first cell (<bos>) of a late block is one query's own weight or the block's largest
        w = real(st, queries, 2, rows=(2598, 2600), cells=(0, 3)).weights
        img = panels[1].images[0].get_array()  # type: ignore[attr-defined]
        np.testing.assert_allclose(img[-1, 0], np.nanmax(w[1]), rtol=1e-6)


def test_long_html_view_selects_sinks_and_recent(long_capture: tuple[Path, Path], tmp_path: Path) -> None:
    state, queries = long_capture
    page = tmp_path / "long.html"
    argv = ["plot", "attention-html", str(state), "--queries", str(queries), "--layer", "2", "-o", str(page)]
    assert main(argv) == 0
    data = _embedded(page.read_text())
    (layer,) = data["layers"]  # type: ignore[misc]
    assert [(p["start"], p["stop"]) for p in layer["parts"]] == [(0, 64), (2600 - 960, 2600)]
    assert data["rows"]["pos"] == list(range(2600 - 256, 2600))  # type: ignore[index]
    assert page.stat().st_size < 4 * 256 * 1024 * 2 * 4 // 3 + 200_000  # float16, base64, + the axes
    attrs = element_attrs(dump_dom(page.resolve().as_uri()), "kvfast-status")
    # causal: the sinks seen by every row, of the recent cells those at or before the row's position
    seen = 256 * 64 + sum(p - (2600 - 960) + 1 for p in range(2600 - 256, 2600))
    assert "data-error" not in attrs and int(attrs["data-drawn"]) == seen
