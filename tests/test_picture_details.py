"""Pictures for a paper (issue 27): states told apart in diff's title, one tick label size, channel
ticks at powers of two, a head drawn as a column of its own width, diff's match option, token
labels that fit, stats lines that break where a cache has no layer, a layout legend of what the
file holds, and figures that show themselves in a notebook without pyplot."""

import itertools
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import DATA
from conftest import GEMMA_270M as GEMMA

import kvfast
from kvfast.cli import main
from kvfast.probe import manifest as probe_manifest

pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg

from kvfast import plot
from kvfast.plot import comparison, style

SERVER = DATA / "gemma3-270m-server"
SLOT = SERVER / "gemma3-270m-server-f16-slot0.bin"
QWEN = DATA / "qwen3tiny-f16-fa/seq-0.ggsq"
HD128 = DATA / "qwen3hd128-f16-fa/seq-0.ggsq"
MODEL128 = DATA / "models/tiny-qwen3-hd128.gguf"
WORDS = ["<bos>", "The", " capital", " of", " France", " is", " Paris", ".", " The", " capital"]


def _drawn(fig):
    FigureCanvasAgg(fig).draw()
    return fig


def _tick_labels(fig) -> list:
    """Every visible, non-empty tick label of every axes (colourbars too)."""
    out = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                for label in (tick.label1, tick.label2):
                    inside = lo - 1e-9 <= tick.get_loc() <= hi + 1e-9
                    if label.get_visible() and label.get_text() and inside:
                        out.append(label)
    return out


@pytest.fixture(scope="module")
def gemma_with_pieces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma's slot beside a probe manifest that records its geometry and its first cells' pieces."""
    folder = tmp_path_factory.mktemp("pieces")
    shutil.copy(SLOT, folder / "slot0.bin")
    g = GEMMA
    row = {
        "prompt_id": "slot0",
        "status": "ok",
        "state": "slot0.bin",
        "whole_state": None,
        "pieces": WORDS,
        "arch": g.arch,
        "n_layer": g.n_layer,
        "head_dim_k": g.head_dim_k,
        "head_dim_v": g.head_dim_v,
        "n_head_kv": list(g.n_head_kv),
        "swa": list(g.swa),
        "recurrent": None,
        "attention": None,
        "v_less": g.v_less,
        "n_layer_trunk": g.n_layer_trunk,
        "attn_rot": False,
        "llama_build": "test",
    }
    pl.DataFrame([row]).write_parquet(folder / probe_manifest.NAME)
    return folder / "slot0.bin"


@pytest.fixture(scope="module")
def same_names(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The f16 and q8_0 states of one prompt under one file name in two folders."""
    root = tmp_path_factory.mktemp("runs")
    paths = []
    for t in ("f16", "q8_0"):
        (root / t).mkdir()
        shutil.copy(DATA / f"qwen3tiny-{t}-fa/seq-0.ggsq", root / t / "long.ggsq")
        paths.append(root / t / "long.ggsq")
    return paths[0], paths[1]


def test_diff_names_the_states_apart_with_their_cache_types(same_names: tuple[Path, Path]) -> None:
    a, b = (kvfast.open(p, head_dim=32) for p in same_names)
    title = plot.diff(a, b).texts[0].get_text().replace("\n", " ")
    assert "q8_0/long.ggsq (q8_0) against f16/long.ggsq (f16)" in title
    assert comparison.distinct_names("/r/x/s.bin", "/r/y/s.bin") == ("x/s.bin", "y/s.bin")
    assert comparison.distinct_names("/r/x/a.bin", "/r/x/b.bin") == ("a.bin", "b.bin")
    assert comparison.distinct_names("/r/x/a.bin", "/r/x/a.bin") == ("a.bin", "a.bin")
    q4 = kvfast.open(DATA / "qwen3tiny-q4_0-q4_1-fa/seq-0.ggsq", head_dim=32)
    assert comparison.cache_types(q4) == "K q4_0, V q4_1"


def test_every_tick_label_has_one_size(gemma_with_pieces: Path, same_names: tuple[Path, Path]) -> None:
    g = kvfast.open(gemma_with_pieces)
    a, b = (kvfast.open(p, head_dim=32) for p in same_names)
    figures = {
        "layout": plot.layout(g),
        "heatmap": plot.heatmap(g, 0, "k", cache=1),
        "heatmap per head": plot.heatmap(kvfast.open(HD128, model=MODEL128), 0, "v", per_head=True),
        "heatmap log": plot.heatmap(g, 1, "v", scale="log"),
        "stats": plot.stats(g),
        "diff": plot.diff(a, b),
        "diff log": plot.diff(a, b, scale="log"),
    }
    for name, fig in figures.items():
        labels = _tick_labels(_drawn(fig))
        assert labels, name
        sizes = {round(t.get_fontsize(), 3) for t in labels}
        assert sizes == {style.TICK}, (name, sizes)
    pieces = [t.get_text() for t in figures["heatmap"].axes[0].get_yticklabels()]
    assert "4 ' France'" in pieces


def test_heatmap_labels_every_cell_that_fits_and_no_more(gemma_with_pieces: Path) -> None:
    d = kvfast.open(gemma_with_pieces)
    fig = _drawn(plot.heatmap(d, 0, "k", cache=1))
    labels = [t for t in fig.axes[0].get_yticklabels() if t.get_text()]
    assert len(labels) == 20  # the slot's 20 cells, each labelled: the picture grows to hold them
    assert {t.get_fontsize() for t in labels} == {style.TICK}
    boxes = [t.get_window_extent() for t in labels]
    assert all(b1.y1 <= b0.y0 + 0.5 or b0.y1 <= b1.y0 + 0.5 for b0, b1 in itertools.pairwise(boxes))


def test_heatmap_channel_ticks_fall_at_powers_of_two_and_heads_are_divided() -> None:
    g = kvfast.open(SLOT, model=GEMMA)
    ax = plot.heatmap(g, 0, "k", cache=1).axes[0]
    assert list(ax.get_xticks()) == list(range(0, 256, 32))
    two = plot.heatmap(kvfast.open(HD128, model=MODEL128), 0, "k").axes[0]  # 2 heads of 128
    assert list(two.get_xticks()) == list(range(0, 256, 32))
    dividers = [ln.get_xdata()[0] for ln in two.get_lines()]
    assert dividers == [127.5] and "2 heads of 128" in two.get_xlabel()
    one = plot.heatmap(kvfast.open(HD128, model=MODEL128), 0, "k", per_head=True).axes[0]
    assert list(one.get_xticks()) == list(range(0, 128, 16)) and not one.get_lines()
    assert style.channel_step(192) == 32 and style.channel_step(64) == 8 and style.channel_step(1) == 1


def test_diff_draws_a_head_as_a_column_of_its_own_width() -> None:
    """Gemma's one KV head is a narrow column, not the panel's width: a head is as wide in a model
    of one KV head as in one of two."""

    def head_width(a: kvfast.State, b: kvfast.State) -> float:
        fig = _drawn(plot.diff(a, b))
        ax = fig.axes[0]
        heads = len(ax.get_xticks())
        return ax.get_position().width * fig.get_figwidth() / heads

    one = head_width(
        kvfast.open(SLOT, model=GEMMA), kvfast.open(SERVER / "gemma3-270m-server-q8_0-slot0.bin", model=GEMMA)
    )
    two = head_width(
        kvfast.open(QWEN, head_dim=32), kvfast.open(DATA / "qwen3tiny-q8_0-fa/seq-0.ggsq", head_dim=32)
    )
    assert one < 1.5 and 0.66 < one / two < 1.5
    qwen = plot.diff(
        kvfast.open(QWEN, head_dim=32), kvfast.open(DATA / "qwen3tiny-q8_0-fa/seq-0.ggsq", head_dim=32)
    )
    assert [ln.get_xdata()[0] for ln in qwen.axes[0].get_lines()] == [0.5]  # between heads 0 and 1


def test_diff_matches_cells_as_compare_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shared = DATA / "qwen3tiny-3seq-shared"
    p0, p2 = (kvfast.open(shared / f"seq-{i}.ggsq", head_dim=32) for i in (0, 2))
    with pytest.raises(kvfast.MatchError):
        plot.diff(p0, p2)
    fig = plot.diff(p0, p2, match="tokens")
    assert "cells matched by tokens" in fig.texts[0].get_text().replace("\n", " ")
    im = fig.axes[0].get_images()[0]
    assert np.nanmax(im.get_array()) == 0  # the shared prefix: the same K
    with pytest.raises(ValueError, match="match must be"):
        plot.diff(p0, p2, match="order")  # type: ignore[arg-type]
    out = tmp_path / "d.png"
    args = ["plot", "diff", str(shared / "seq-0.ggsq"), str(shared / "seq-2.ggsq"), "-o", str(out)]
    assert main([*args, "--match", "tokens"]) == 0 and out.stat().st_size > 1000
    assert main(args) == 1
    assert "match" in capsys.readouterr().err


def test_stats_lines_break_where_a_cache_has_no_layer() -> None:
    fig = plot.stats(kvfast.open(SLOT, model=GEMMA))
    for ax in fig.axes[:2]:
        for line in ax.get_lines():
            x = np.asarray(line.get_xdata(), dtype=float)
            y = np.asarray(line.get_ydata(), dtype=float)
            # a segment joins two points only where both are drawn: their layers are consecutive
            for i in range(len(x) - 1):
                if np.isfinite(y[i]) and np.isfinite(y[i + 1]):
                    assert x[i + 1] - x[i] == 1, (line.get_label(), x)
        swa = next(ln for ln in ax.get_lines() if ln.get_label() == "cache 1 K")
        x = np.asarray(swa.get_xdata(), dtype=float)
        assert x[np.isfinite(x)].tolist() == [i for i in range(17) if i % 6 != 5]
        assert np.isnan(x).sum() == 2  # broken at global layers 5 and 11


def test_layout_legend_lists_what_the_file_holds() -> None:
    def legend(path: Path) -> list[str]:
        fig = plot.layout(kvfast.open(path))
        return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]

    assert "logits" not in legend(SLOT) and "K rows" in legend(SLOT)
    assert "logits" in legend(DATA / "qwen3tiny-f16-fa-2025/state.ggsn")
    mamba = legend(DATA / "mamba2tiny-f32/seq-0.bin")  # the recurrent part alone: R and S
    assert "R rows (recurrent)" in mamba and "S rows (recurrent)" in mamba and "K rows" not in mamba
    fig = plot.layout(kvfast.open(DATA / "lfm2swatiny-f16-fa/seq-0.bin"))  # a cache of no layer
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "cache 0: no layers" in texts and "recurrent part (cache 2)" in texts


def test_figures_show_themselves_without_pyplot() -> None:
    code = (
        "import sys, kvfast\n"
        "from kvfast import plot\n"
        f"d = kvfast.open({str(QWEN)!r}, head_dim=32)\n"
        "for fig in (plot.layout(d), plot.heatmap(d, 0), plot.stats(d), plot.diff(d, d)):\n"
        "    png = fig._repr_png_()\n"
        "    assert png[:8] == b'\\x89PNG\\r\\n\\x1a\\n', png[:8]\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
    fig = plot.layout(kvfast.open(QWEN))
    back = pickle.loads(pickle.dumps(fig))  # a Picture pickles as any figure
    assert type(back) is type(fig) and back._repr_png_()[:4] == b"\x89PNG"
