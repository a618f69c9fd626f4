"""kvfast show / addr / plot on the fixtures: exit codes, key numbers, and pictures that are real PNGs."""

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA

import kvfast
from kvfast import plot
from kvfast.cli import main

F16 = DATA / "qwen3tiny-f16-fa/seq-0.bin"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def assert_picture(path: Path) -> None:
    w, h = png_size(path)
    assert 300 <= w <= 4000 and 200 <= h <= 3000
    import matplotlib.image

    img = matplotlib.image.imread(path)
    assert img.std() > 0.01, "the picture is blank"
    assert path.stat().st_size > 5000


def test_show_rows_hold_the_file_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    raw = F16.read_bytes()
    assert (
        main(
            [
                "show",
                str(F16),
                "--layer",
                "1",
                "--kind",
                "k",
                "--cells",
                "2",
                "--head",
                "1",
                "--head-dim",
                "32",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["cell"] for r in rows] == [0, 1]
    with kvfast.open(F16, head_dim=32) as d:
        k = d.values(1, "k")
        for r in rows:
            assert r["offset"] == d.address(layer=1, cell=r["cell"], head=1, elem=0)
            assert bytes.fromhex(r["hex"]) == raw[r["offset"] : r["offset"] + 64]
            np.testing.assert_array_equal(
                np.array(r["values"], np.float32), k[r["cell"], 32:64].astype(np.float32)
            )
    assert main(["show", str(F16), "--layer", "0", "--cells", "1"]) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith("cell 0  pos 0  seq [0]  f16 at byte 120") and "  128  " not in out.splitlines()[1][:6]
    )


def test_show_quantized_and_transposed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(DATA / "qwen3tiny-q8_0-fa/seq-0.bin"), "--layer", "0", "--cells", "1"]) == 0
    out = capsys.readouterr().out
    assert "block 0:" in out and "block 1:" in out
    assert (
        main(
            [
                "show",
                str(DATA / "qwen3tiny-f16-nofa/seq-0.bin"),
                "--layer",
                "0",
                "--kind",
                "v",
                "--cells",
                "1",
                "--json",
            ]
        )
        == 0
    )
    [r] = json.loads(capsys.readouterr().out)
    assert r["transposed"] and len(bytes.fromhex(r["hex"])) == 64 * 2


def test_addr_spells_out_the_worked_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvfast import synth

    path = tmp_path / "w.bin"
    synth.write_state(path, cells=40, n_layer=28, n_embd_k=1024)
    args = [
        "addr",
        str(path),
        "--layer",
        "5",
        "--cell",
        "37",
        "--head",
        "3",
        "--elem",
        "10",
        "--head-dim",
        "128",
        "--ctx",
        "4096",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "byte 76,564" in out and "cell 37 x 2,048" in out and "[1024, 4096, 1]" in out
    assert main([*args, "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    raw = path.read_bytes()
    assert a["tensor_offset"] == 76_564
    assert np.frombuffer(raw, "<f2", count=1, offset=a["file_offset"])[0] == np.float16(a["value"])
    assert (
        main(["addr", str(path), "--layer", "0", "--cell", "1", "--ctx", "4096", "--streams", "4", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["tensor_shape"] == "[1024, 1024, 4]"


def test_addr_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # a selection the state does not have is a usage error: exit status 2
    assert main(["addr", str(F16), "--layer", "9", "--cell", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "layer 9 out of range" in err
    assert main(["addr", str(F16), "--layer", "0", "--cell", "99"]) == 2
    assert "cell 99 out of range" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["layout", str(DATA / "gemma3-270m-f16-fa/state.ggsn")],
        ["layout", str(DATA / "qwen3tiny-f16-fa-2025/state.ggsn")],
        ["heatmap", str(F16), "--layer", "1", "--kind", "v"],
        ["heatmap", str(DATA / "gemma3-270m-f16-fa/seq-0.bin"), "--cache-layer", "2", "--cache", "1"],
        ["heatmap", str(F16), "--layer", "0", "--per-head", "--head-dim", "32"],
        ["stats", str(DATA / "gemma3-270m-f16-fa/state.ggsn")],
        ["diff", str(F16), str(DATA / "qwen3tiny-q4_0-q4_1-fa/seq-0.ggsq"), "--head-dim", "32"],
    ],
    ids=lambda a: "-".join(a[:1] + [Path(a[1]).parent.name]),
)
def test_plots_write_real_pictures(
    tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.png"
    assert main(["plot", *args, "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert_picture(out)


def test_plot_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", "heatmap", str(F16), "-o", str(tmp_path / "x.png")]) == 2  # a usage error
    assert "--layer" in capsys.readouterr().err
    assert main(["plot", "diff", str(F16), "-o", str(tmp_path / "x.png")]) == 1
    assert not (tmp_path / "x.png").exists()


def test_python_figures() -> None:
    d = kvfast.open(DATA / "gemma3-270m-f16-fa/state.ggsn")
    fig = plot.layout(d)
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "per token per layer K 512 B" in texts and "per token 15,360 B" in texts
    assert len(plot.heatmap(d, 0, per_head=False).axes) == 2  # the panel and its colorbar
    assert plot.per_token(d)[0].startswith("cache 0: 3 layers")


@pytest.mark.parametrize("command", ["info", "stats", "diff", "export", "manifest", "show", "addr", "plot"])
def test_every_command_has_help_with_an_example(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert "example" in capsys.readouterr().out
