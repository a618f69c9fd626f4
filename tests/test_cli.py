import json
import subprocess
import sys

from conftest import DATA

from kvfast.cli import main


def test_info_on_the_bundled_sample(capsys) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "ggsq version 3" in out
    assert "148,156 = rows 147,456 + outputs 0 + metadata 700" in out
    assert "cache 1 at byte 24,804" in out


def test_info_json_and_python_m() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "kvfast", "info", "--json", str(DATA / "qwen3tiny-3seq-shared/state.bin")],
        capture_output=True,
        text=True,
        check=True,
    )
    d = json.loads(r.stdout)
    assert d["container"] == "state" and d["arch"] == "qwen3"
    [s] = d["caches"][0]["streams"]
    assert (s["cells"], s["shared_cells"], s["sequences"]) == (28, 4, [0, 1, 2])
    assert d["row_bytes"] + d["meta_bytes"] == d["size"] == 14777


def test_info_error_is_one_line(capsys) -> None:
    assert main(["info", str(DATA / "models/tiny-qwen3.gguf")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "byte 0" in err and "Traceback" not in err


def test_stats_command(tmp_path, capsys) -> None:
    path = DATA / "qwen3tiny-f16-fa/seq-0.bin"
    assert main(["stats", str(path)]) == 0
    out = capsys.readouterr().out
    assert "l2_mean" in out and "shape: (4," in out
    pq = tmp_path / "cells.parquet"
    assert main(["stats", str(path), "--by", "cell", "--head-dim", "32", "-o", str(pq)]) == 0
    import polars as pl

    df = pl.read_parquet(pq)
    assert df.height == 2 * 2 * 7 * 2 and "argmax" in df.columns
    assert main(["stats", str(path), "--by", "channel", "--json", "--kinds", "k", "--layers", "1"]) == 0
    rows = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert len(rows) == 64 and {"outlier_ratio", "absmax"} <= set(rows[0])


def test_diff_command(capsys) -> None:
    a, b = DATA / "qwen3tiny-f16-fa/seq-0.bin", DATA / "qwen3tiny-q8_0-fa/seq-0.ggsq"
    assert main(["diff", str(a), str(b), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 4 and all(r["cosine_min"] > 0.9999 for r in rows)
    assert main(["diff", str(a), str(DATA / "gemma3-270m-f16-fa/seq-0.bin")]) == 1
    assert "KV caches" in capsys.readouterr().err


def test_manifest_of_a_path_that_is_not_there_is_an_error(tmp_path, capsys) -> None:
    assert main(["manifest", str(tmp_path / "nope") + "/"]) == 1
    err = capsys.readouterr().err
    assert "nope/: no such file or directory" in err and err.count("\n") == 1
    good = str(DATA / "qwen3tiny-f16-fa/seq-0.bin")
    assert main(["manifest", good, str(tmp_path / "gone.bin")]) == 1
    assert "gone.bin: no such file or directory" in capsys.readouterr().err
    (tmp_path / "bad.bin").write_bytes(b"nope")  # a file that is not a state is a row with its error
    assert main(["manifest", good, str(tmp_path / "bad.bin"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["error"] is None and rows[1]["error"].startswith("FormatError: bad magic")
