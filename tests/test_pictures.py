"""Pictures fit for a paper (issue 14): the model's layers on every axis, integer ticks, log and
percentile colour scales with a labelled colourbar, titled panels, a cell range, skip_first, and a
layout whose text does not cross the cache dividers."""

from pathlib import Path

import numpy as np
import pytest
from conftest import DATA
from conftest import GEMMA_270M as GEMMA

import kvfast
from kvfast import synth
from kvfast.cli import main

pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg

from kvfast import plot

SLOT = DATA / "gemma3-270m-server/gemma3-270m-server-f16-slot0.bin"
HD128 = DATA / "qwen3hd128-q8_0-fa/seq-0.ggsq"
MODEL128 = DATA / "models/tiny-qwen3-hd128.gguf"


def _integer_ticks(axis) -> bool:
    lo, hi = sorted(axis.get_view_interval())
    locs = [t for t in axis.get_ticklocs() if lo <= t <= hi]
    return bool(locs) and all(float(t).is_integer() for t in locs)


def test_stats_puts_both_panels_on_the_model_layers() -> None:
    with kvfast.open(SLOT, model=GEMMA) as d:
        fig = plot.stats(d)
        FigureCanvasAgg(fig).draw()
    top, bottom = fig.axes[:2]
    for ax in (top, bottom):
        # the layers each line draws (its breaks left out: see test_picture_details)
        xs = {tuple(x for x in line.get_xdata() if not np.isnan(x)) for line in ax.get_lines()}
        assert (5, 11, 17) in xs  # cache 0: Gemma's global layers, in both panels
        assert (0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16) in xs
        assert _integer_ticks(ax.xaxis)
    assert _integer_ticks(bottom.yaxis)
    assert bottom.get_xlabel() == "model layer"
    # one colour per kind in both panels, one line style per cache
    styles = [
        {(line.get_label(), line.get_color(), line.get_linestyle()) for line in ax.get_lines()}
        for ax in fig.axes[:2]
    ]
    assert styles[0] == styles[1] and len(styles[0]) == 4


def test_stats_without_a_model_says_which_layer_axis() -> None:
    with kvfast.open(SLOT, head_dim=256) as d:
        fig = plot.stats(d)
    assert fig.axes[1].get_xlabel() == "layer within its cache"


def test_stats_skip_first_is_the_table_with_skip_first() -> None:
    with kvfast.open(SLOT, model=GEMMA) as d:
        fig = plot.stats(d, skip_first=4)
        want = d.stats(by="layer", skip_first=4).filter(cache=0, kind="k").sort("model_layer")
    line = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == "cache 0 K")
    y = np.asarray(line.get_ydata(), dtype=float)
    np.testing.assert_allclose(y[np.isfinite(y)], want["l2_mean"].to_numpy())
    assert "positions < 4 left out" in fig.texts[0].get_text()


@pytest.fixture(scope="module")
def outlier_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state whose K rows have one channel 20x the others (a planted outlier)."""
    path = tmp_path_factory.mktemp("outlier") / "o.bin"
    synth.write_state(path, cells=64, n_layer=1, n_embd_k=64, seed=3)
    with kvfast.open(path) as d:
        off = d.caches[0].streams[0].layers[0].k_offset
        x = d.values(0, "k").astype(np.float32).copy()
    x[:, 7] = 20 * np.abs(x).max()
    raw = bytearray(path.read_bytes())
    raw[off : off + x.size * 2] = x.astype("<f2").tobytes()
    path.write_bytes(bytes(raw))
    return path


def _dark_share(fig) -> float:
    """The share of the heatmap's cells in the bottom 5% of its colour scale."""
    im = fig.axes[0].get_images()[0]
    return float(np.mean(im.norm(np.ma.masked_invalid(im.get_array())) < 0.05))


def test_log_and_percentile_scales_show_what_an_outlier_hides(outlier_state: Path) -> None:
    with kvfast.open(outlier_state) as d:
        linear = plot.heatmap(d, 0, "k")
        log = plot.heatmap(d, 0, "k", scale="log")
        clipped = plot.heatmap(d, 0, "k", clip=95)
        with pytest.raises(ValueError, match="percentile"):
            plot.heatmap(d, 0, "k", clip=0)
    assert _dark_share(linear) > 0.9  # the outlier makes the rest black
    assert _dark_share(log) < 0.3 and _dark_share(clipped) < 0.3
    labels = [f.axes[-1].get_ylabel() for f in (linear, log, clipped)]
    assert labels[0] == "|value|" and "log scale" in labels[1] and "95th percentile" in labels[2]


def test_heatmap_titles_cells_and_ticks() -> None:
    with kvfast.open(HD128, model=MODEL128) as d:
        fig = plot.heatmap(d, 1, "v", per_head=True, cells=(2, 8))
        with pytest.raises(kvfast.SelectionError, match="cells 5:99"):
            plot.heatmap(d, 1, "v", cells=(5, 99))
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert [ax.get_title() for ax in panels] == ["layer 1 V head 0", "layer 1 V head 1"]
    assert "Hadamard rotation undone" in fig.texts[0].get_text()
    im = panels[0].get_images()[0]
    assert im.get_array().shape == (6, 128)
    assert tuple(im.get_extent()) == (-0.5, 127.5, 7.5, 1.5)  # rows are cells 2..7
    FigureCanvasAgg(fig).draw()
    assert _integer_ticks(panels[0].yaxis) and _integer_ticks(panels[0].xaxis)
    with kvfast.open(SLOT, model=GEMMA) as d:
        title = plot.heatmap(d, 2, "k", cache=0).axes[0].get_title()
    assert title == "cache 0 layer 2 (model layer 17) K"


def test_layout_text_stays_clear_of_the_dividers() -> None:
    with kvfast.open(SLOT) as d:
        fig = plot.layout(d)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    strip = next(ax for ax in fig.axes if ax.collections)
    dividers = [
        seg for coll in strip.collections if hasattr(coll, "get_segments") for seg in coll.get_segments()
    ]
    assert len(dividers) == 2
    for seg in dividers:
        (x0, y0), (_, y1) = strip.transData.transform(seg)
        for ax in fig.axes:
            for t in ax.texts:
                box = t.get_window_extent(renderer)
                crosses = box.x0 < x0 < box.x1 and box.y0 < max(y0, y1) and min(y0, y1) < box.y1
                assert not crosses, t.get_text()
    shades = {tuple(c.get_facecolor()[0]) for c in strip.collections if not hasattr(c, "get_segments")}
    assert len(shades) >= 4  # K and V, each in two shades: the layers are told apart


def test_plot_command_options(
    tmp_path: Path, outlier_state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "h.png"
    argv = ["plot", "heatmap", str(outlier_state), "--layer", "0", "-o", str(out)]
    assert main([*argv, "--scale", "log", "--clip", "99", "--cells", "4:20"]) == 0
    assert out.stat().st_size > 1000
    assert main([*argv, "--cells", "4:200"]) == 2
    assert "cells 4:200 out of range" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--cells", "4"])
    stats = tmp_path / "s.png"
    assert main(["plot", "stats", str(SLOT), "--head-dim", "256", "--skip-first", "2", "-o", str(stats)]) == 0
    assert (
        main(["plot", "diff", str(SLOT), str(SLOT), "--head-dim", "256", "--scale", "log", "-o", str(stats)])
        == 0
    )
