"""Collections of states as a researcher keeps them (issue 27): folders searched recursively,
globs that skip folders and non-states, a model per folder, and an export of states of several
models (each state's values at its own width, read one width at a time by every engine)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from conftest import dataset_table, model_with_vocab
from polars.testing import assert_frame_equal

import kvfast
from kvfast.cli import main
from kvfast.dataset import expand
from kvfast.dataset.export_read import export_files, widths
from kvfast.read.opening import Opening

DATA = Path(__file__).parent / "data"
MLA_MODEL = DATA / "models/tiny-deepseek2-mla.gguf"
KEY = ["dump", "cache", "layer", "kind", "stream", "cell", "head"]
SEQ = json.loads((DATA / "qwen3tiny-f16-fa/probe.json").read_text())["seqs"][0]


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
                dataset_table(
                    kvfast.open(runs / s / "seq-0.ggsq", model=MLA_MODEL if s.startswith("mla") else None),
                    dtype="float32",  # one type in OUT: q8_0 and q4_0 need float32
                )
                for s in states
            ]
        )
        got = kvfast.scan_export(out, head_dim=width).collect()
        assert_frame_equal(got.sort(KEY), want.sort(KEY))
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


def _export_tree(runs: Path, out: Path, vocab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The tree exported in one command: tiny Qwen3 (f16, q8_0, q4_0) with a vocabulary (and its
    geometry: heads of 32), Gemma 3 (f16) by its probe manifests, the MLA model by its GGUF."""
    tiny, mla = f"{runs / 'tiny'}={vocab}", f"{runs / 'mla'}={MLA_MODEL}"
    assert main(["export", str(runs), "-o", str(out), "--model", tiny, "--model", mla]) == 0
    assert capsys.readouterr().out.startswith(f"{len(STATES)} written")


def test_done_when_a_tree_of_two_models_and_three_cache_types_reads_back_alike_everywhere(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 27's "done when": one command exports the tree, and Polars, pyarrow, pandas and DuckDB
    read each width back with the same rows, types and values, the cache types, tokens and pieces
    included; f16 rows are set against q8_0 rows of the same prompt by ``k_type`` alone."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.dataset as pads

    vocab = tmp_path / "vocab.gguf"
    model_with_vocab(vocab, [f"w{i}" for i in range(300)])
    out = tmp_path / "out"
    _export_tree(runs, out, vocab, capsys)
    pd = pytest.importorskip("pandas")
    duckdb = pytest.importorskip("duckdb")
    for width, states in [(256, ["gemma/f16"]), (192, ["mla/f16"]), (32, STATES[2:])]:
        files = export_files(out, head_dim=width)
        want = kvfast.scan_export(out, head_dim=width).collect().sort(KEY)
        models = {"tiny": vocab, "mla": MLA_MODEL}
        made = [
            dataset_table(
                kvfast.open(runs / s / "seq-0.ggsq", model=models.get(s.split("/")[0])), dtype="float32"
            )
            for s in states
        ]
        assert_frame_equal(want, pl.concat(made).sort(KEY))
        assert set(want["k_type"]) == {s.split("/")[1] for s in states}
        # Polars
        assert_frame_equal(pl.read_parquet(files).sort(KEY), want)
        # pyarrow: the schema every file holds, the same table
        table = pads.dataset(files, format="parquet").to_table()
        assert table.schema == kvfast.export_schema(out, head_dim=width)
        assert table.schema.field("k_type").type == pa.dictionary(pa.uint8(), pa.string(), ordered=True)
        assert_frame_equal(pl.from_arrow(table).sort(KEY), want)  # type: ignore[arg-type]
        # pandas: numpy types where no value is null, categories for the Enums
        frame = pd.read_parquet(files)
        dtypes = {c: str(t) for c, t in frame.dtypes.items()}
        assert {k: dtypes[k] for k in ("cache", "layer", "seq_id", "cell", "pos", "head", "token")} == {
            "cache": "uint8",
            "layer": "uint16",
            "seq_id": "uint8",
            "cell": "uint32",
            "pos": "int32",
            "head": "uint16",
            "token": "int32",
        }
        assert dtypes["kind"] == dtypes["k_type"] == dtypes["v_type"] == "category"
        assert list(frame.columns) == want.columns
        back = pl.from_pandas(frame).with_columns(pl.col("values").list.to_array(width)).cast(want.schema)
        assert_frame_equal(back.sort(KEY), want)
        # DuckDB: text for the Enums, the values' lists cast to their width
        rel = duckdb.sql(f"SELECT * REPLACE (values::FLOAT[{width}] AS values) FROM read_parquet({files!r})")
        types = dict(zip(rel.columns, map(str, rel.types), strict=True))
        assert (types["k_type"], types["token"], types["piece"], types["layer"]) == (
            "VARCHAR",
            "INTEGER",
            "VARCHAR",
            "USMALLINT",
        )
        back = pl.from_arrow(rel.arrow())
        assert isinstance(back, pl.DataFrame)
        assert_frame_equal(back.cast(want.schema).sort(KEY), want)  # type: ignore[arg-type]
    # the model's vocabulary gives the tiny states' pieces; Gemma's probe model is not here: null
    tiny = kvfast.scan_export(out, head_dim=32)
    one = tiny.filter(k_type="q8_0", layer=0, kind="k", head=0).collect().sort("cell")
    assert one["token"].to_list() == SEQ and one["piece"].to_list() == [f"w{t}" for t in SEQ]
    gemma = kvfast.scan_export(out, head_dim=256).collect()
    assert gemma["piece"].null_count() == gemma.height and gemma["token"].null_count() == 0
    # f16 against q8_0 of one prompt: a filter on k_type, a join on the cell's key, no manifest
    on = ["layer", "kind", "cell", "head", "token"]
    f16 = tiny.filter(k_type="f16").select(*on, "values")
    q8 = tiny.filter(k_type="q8_0").select(*on, "values")
    pairs = f16.join(q8, on=on, suffix="_q8").collect()
    assert pairs.height == f16.collect().height == q8.collect().height == 2 * 2 * 7 * 2
    a, b = np.stack(pairs["values"].to_numpy()), np.stack(pairs["values_q8"].to_numpy())
    rel_err = np.linalg.norm(a - b) / np.linalg.norm(a)
    assert 0 < rel_err < 0.05, rel_err  # q8_0 is close to f16, not equal
    files = export_files(out, head_dim=32)
    counts = duckdb.sql(f"SELECT k_type, count(*) FROM read_parquet({files!r}) GROUP BY k_type").fetchall()
    assert sorted(counts) == sorted(tiny.group_by("k_type").len().collect().rows())


def test_done_when_hugging_face_datasets_reads_the_tree_alike(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # local files: nothing asks the hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    vocab = tmp_path / "vocab.gguf"
    model_with_vocab(vocab, [f"w{i}" for i in range(300)])
    out = tmp_path / "out"
    _export_tree(runs, out, vocab, capsys)
    files = export_files(out, head_dim=32)
    want = kvfast.scan_export(out, head_dim=32).collect().sort(KEY)
    ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == want.height
    got = pl.from_arrow(ds.data.table)
    assert isinstance(got, pl.DataFrame) and got.columns == want.columns
    assert_frame_equal(got.cast(want.schema).sort(KEY), want)
