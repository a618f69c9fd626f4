"""Collections of states as a researcher keeps them (issue 27): folders searched recursively,
globs that skip folders and non-states, a model per folder, and an export of states of several
models (each state's values at its own width, read one width at a time by every engine)."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import kvfast
from kvfast.cli import main
from kvfast.dataset import expand
from kvfast.dataset.export_read import export_files, widths
from kvfast.read.opening import Opening

DATA = Path(__file__).parent / "data"
MLA_MODEL = DATA / "models/tiny-deepseek2-mla.gguf"
KEY = ["dump", "cache", "layer", "kind", "stream", "cell", "head"]


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """runs/ of two probe models (tiny Qwen3 f16, q8_0, q4_0; Gemma 3 f16) and an MLA model with
    no manifest, in folders two deep, with manifests and a note beside the states."""
    root = tmp_path / "runs"
    for src, dest in [
        ("qwen3tiny-f16-fa", "tiny/f16"),
        ("qwen3tiny-q8_0-fa", "tiny/q8_0"),
        ("qwen3tiny-q4_0-q4_1-fa", "tiny/q4_0"),
        ("gemma3-270m-f16-fa", "gemma/f16"),
        ("deepseek2mla-f16-fa", "mla/f16"),
    ]:
        (root / dest).mkdir(parents=True)
        for f in (DATA / src).iterdir():
            if f.name in ("seq-0.ggsq", "probe.json"):
                shutil.copy(f, root / dest / f.name)
    (root / "tiny/notes.txt").write_text("f16 against q8_0 and q4_0\n")
    (root / ".hidden").mkdir()
    shutil.copy(DATA / "qwen3tiny-f16-fa/seq-0.ggsq", root / ".hidden/seq-0.ggsq")
    return root


STATES = ["gemma/f16", "mla/f16", "tiny/f16", "tiny/q4_0", "tiny/q8_0"]


def test_a_folder_is_searched_recursively(runs: Path) -> None:
    assert expand(runs) == [str(runs / s / "seq-0.ggsq") for s in STATES]


def test_a_glob_skips_folders_hidden_files_and_non_states(runs: Path) -> None:
    assert expand(str(runs / "**/*")) == [str(runs / s / "seq-0.ggsq") for s in STATES]
    assert expand(str(runs / "tiny/*/*")) == [str(runs / s / "seq-0.ggsq") for s in STATES[2:]]


def test_a_model_per_folder_longest_key_first(runs: Path) -> None:
    how = Opening(model={str(runs): "a.gguf", str(runs / "mla"): str(MLA_MODEL), str(runs / "t*"): "t.gguf"})
    assert how.model_for(runs / "mla/f16/seq-0.ggsq") == str(MLA_MODEL)
    assert how.model_for(runs / "gemma/f16/seq-0.ggsq") == str(Path("a.gguf").resolve())
    assert how.model_for(runs / "tiny/f16/seq-0.ggsq") == str(Path("t.gguf").resolve())
    assert Opening(model={str(runs / "mla"): str(MLA_MODEL)}).model_for(runs / "tiny/x.ggsq") is None
    with pytest.raises(ValueError, match="empty mapping"):
        Opening(model={})


def test_an_export_of_several_models_keeps_each_width_and_every_engine_reads_one(
    runs: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    report = kvfast.export(runs, out, model={str(runs / "mla"): MLA_MODEL}, on_error="fail")
    assert report["status"].to_list() == ["written"] * len(STATES)
    assert widths(out) == [64, 192, 256]
    with pytest.raises(ValueError, match=r"widths \(head sizes\) \[64, 192, 256\].*head_dim="):
        kvfast.scan_export(out)
    for width, states in [(256, ["gemma/f16"]), (192, ["mla/f16"]), (64, STATES[2:])]:
        want = pl.concat(
            [
                kvfast.open(runs / s / "seq-0.ggsq", model=MLA_MODEL if s.startswith("mla") else None)
                .to_polars()
                .with_columns(dump=pl.lit(kvfast.dump_id(runs / s / "seq-0.ggsq")))
                for s in states
            ],
            how="diagonal_relaxed",
        )
        got = kvfast.scan_export(out, head_dim=width).collect()
        cols = [c for c in want.columns if c != "path"]
        assert_frame_equal(got.select(cols).sort(KEY), want.select(cols).sort(KEY), check_dtypes=False)
        files = export_files(out, head_dim=width)
        n = got.height
        assert pl.scan_parquet(files).select(pl.len()).collect().item() == n
        pyarrow_dataset = pytest.importorskip("pyarrow.dataset")
        assert pyarrow_dataset.dataset(files, format="parquet").count_rows() == n
        pandas = pytest.importorskip("pandas")
        assert len(pandas.read_parquet(files)) == n
        duckdb = pytest.importorskip("duckdb")
        assert duckdb.sql(f"SELECT count(*) FROM read_parquet({files!r})").fetchall() == [(n,)]


def test_cli_exports_a_tree_with_a_model_per_folder(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(["export", str(runs), "-o", str(out), "--model", f"{runs / 'mla'}={MLA_MODEL}"])
    assert code == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith(f"{len(STATES)} written")
    assert main(["export", str(runs), "-o", str(out), "--model", "a.gguf", "--model", "b.gguf"]) == 1
    assert "FOLDER=MODEL" in capsys.readouterr().err


def test_a_scan_of_several_widths_says_what_to_do(runs: Path) -> None:
    with pytest.raises(ValueError, match="different widths .head sizes. .64, 256.*scan each model"):
        kvfast.scan([runs / "tiny", runs / "gemma"])
