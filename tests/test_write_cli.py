"""``kvfast prune`` and ``kvfast convert``."""

from pathlib import Path

import polars as pl
import pytest
from conftest import DATA

import kvfast
from kvfast.cli import main

HD128 = str(DATA / "models/tiny-qwen3-hd128.gguf")
QWEN3 = str(DATA / "models/tiny-qwen3.gguf")


def test_prune_by_key_norm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = DATA / "qwen3hd128-f16-fa/seq-0.ggsq"
    out = tmp_path / "p.ggsq"
    assert main(["prune", str(src), "-o", str(out), "--ratio", "0.5", "--sinks", "1", "--model", HD128]) == 0
    assert "6 of 9 cells" in capsys.readouterr().out
    with kvfast.open(src, model=HD128) as d, kvfast.open(out) as e:
        pos = e.caches[0].streams[0].pos.tolist()
        assert pos[0] == 0 and pos[-1] == 8 and len(pos) == 6
        # the dropped cells are those of the largest mean key norm among positions 1 to 7
        norms = d.stats(by="cell", kinds=["k"]).group_by("pos").agg(pl.col("l2").mean()).sort("pos")
        middle = norms.filter((norms["pos"] > 0) & (norms["pos"] < 8)).sort("l2", descending=True)
        assert set(middle["pos"][:3].to_list()).isdisjoint(pos)
        # the token list stays indexed by position: every kept cell has its own token
        assert e.tokens.tolist() == d.tokens.tolist()
        assert e.cell_tokens()["token"].to_list() == [d.tokens[p] for p in pos]


def test_prune_keeps_sinks_and_window_of_both_iswa_caches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = DATA / "gemma3-270m-server/gemma3-270m-server-f16-slot0.bin"
    out = tmp_path / "g.bin"
    args = [
        "prune",
        str(src),
        "-o",
        str(out),
        "--ratio",
        "1",
        "--sinks",
        "4",
        "--window",
        "8",
        "--head-dim",
        "256",
    ]
    assert main(args) == 0
    # cells per cache, as kvfast info shows them: each cache holds every token (not 24 of 40)
    assert "cells per cache 12 of 20 (cache 0), 12 of 20 (cache 1)," in capsys.readouterr().out
    with kvfast.open(out) as e:
        for c in e.caches:
            assert c.streams[0].pos.tolist() == [0, 1, 2, 3, *range(12, 20)]
        # the blob keeps the tokens of the dropped positions 4-11 (token i is at position i)
        assert e.server_tokens is not None and e.server_tokens["n_tokens"] == 20


def test_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.ggsq"
    src = DATA / "qwen3tiny-3seq-shared/state.ggsn"
    args = [
        "convert",
        str(src),
        "-o",
        str(out),
        "--container",
        "ggsq",
        "--seq",
        "1",
        "--ctk",
        "q8_0",
        "--model",
        QWEN3,
    ]
    assert main(args) == 0
    assert "ggsq 3" in capsys.readouterr().out
    with kvfast.open(out, model=QWEN3) as e:
        s = e.caches[0].streams[0]
        assert s.sequences == [1] and s.cell_count == 12 and s.layers[0].k_type == "q8_0"
    # a whole state from a sequence state needs the arch
    seq = DATA / "qwen3tiny-f16-fa-2025may/seq-0.bin"
    assert main(["convert", str(seq), "-o", str(tmp_path / "x"), "--container", "ggsn"]) == 1
    assert "--arch" in capsys.readouterr().err
    assert (
        main(["convert", str(seq), "-o", str(tmp_path / "x"), "--container", "ggsn", "--arch", "qwen3"]) == 0
    )
    with kvfast.open(tmp_path / "x") as e:
        assert (e.container, e.version, e.arch) == ("ggsn", 10, "qwen3")
    # quantized types need the head size (the rotation)
    assert main(["convert", str(src), "-o", str(tmp_path / "y"), "--ctk", "q8_0"]) == 1
    assert "--no-rotate" in capsys.readouterr().err


def test_convert_to_flash_attention(tmp_path: Path) -> None:
    out = tmp_path / "fa.ggsq"
    src = DATA / "qwen3tiny-f16-nofa/seq-0.ggsq"
    assert main(["convert", str(src), "-o", str(out), "--fa", "on", "--ctv", "q8_0", "--model", QWEN3]) == 0
    with kvfast.open(out, model=QWEN3) as e:
        s = e.caches[0].streams[0]
        assert not s.v_trans and s.layers[0].v_type == "q8_0"
