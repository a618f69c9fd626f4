"""The columns scans and exports add to a state's value table (issue 27): ``k_type`` and ``v_type``
(the layer's cache types) and ``token`` and ``piece`` (the cell's), the same in ``scan``, in an
export read back, and in ``to_polars(tokens=True)``; pushdown on them; and what a null ``seq_id``
of a 2025 sequence state means, read in pandas."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from conftest import DATA, dataset_table, model_with_vocab
from polars.testing import assert_frame_equal
from test_probe_manifest import manifest_row

import kvfast
from kvfast import dataset
from kvfast.dataset import INDEX_SCHEMA
from kvfast.probe import manifest as probe_manifest
from kvfast.read.schema import GGML_TYPE

F16 = DATA / "qwen3tiny-f16-fa/seq-0.ggsq"
Q8 = DATA / "qwen3tiny-q8_0-fa/seq-0.ggsq"
SEQ = json.loads((DATA / "qwen3tiny-f16-fa/probe.json").read_text())["seqs"][0]
KEY = ["dump", "cache", "stream", "layer", "kind", "cell", "seq_id", "head"]
ADDED = ["k_type", "v_type", "token", "piece"]


@pytest.fixture
def vocab(tmp_path: Path) -> Path:
    """tiny-qwen3 with a vocabulary: token t is "w<t>"."""
    model = tmp_path / "vocab.gguf"
    model_with_vocab(model, [f"w{i}" for i in range(300)])
    return model


def test_the_added_columns_and_their_types() -> None:
    assert {k: INDEX_SCHEMA[k] for k in ADDED} == {
        "k_type": GGML_TYPE,
        "v_type": GGML_TYPE,
        "token": pl.Int32(),
        "piece": pl.String(),
    }
    assert GGML_TYPE.categories.to_list()[:5] == ["f32", "f16", "bf16", "q8_0", "q4_0"]
    assert {"k_type", "v_type"} <= dataset.RECORD_COLS and {"token", "piece"} <= dataset.INDEX_COLS


def test_scan_and_export_hold_the_cache_types_tokens_and_pieces(tmp_path: Path, vocab: Path) -> None:
    lf = kvfast.scan([F16, Q8], model=vocab)
    got = lf.collect()
    want = []
    for p in (F16, Q8):
        with kvfast.open(p, model=vocab) as d:
            want.append(dataset_table(d, dtype="float32"))
    assert_frame_equal(got.sort(KEY), pl.concat(want).sort(KEY))
    assert got.group_by("dump").agg(pl.col("k_type").unique(), pl.col("v_type").unique()).sort(
        "dump"
    ).rows() == sorted([(kvfast.dump_id(F16), ["f16"], ["f16"]), (kvfast.dump_id(Q8), ["q8_0"], ["q8_0"])])
    # to_polars(tokens=True)'s meaning: cell i of the prompt holds token SEQ[i], whose text is w<SEQ[i]>
    one = got.filter(dump=kvfast.dump_id(F16), layer=0, kind="k", head=0).sort("cell")
    assert one["token"].to_list() == SEQ
    assert one["piece"].to_list() == [f"w{t}" for t in SEQ]
    # the export writes the same columns, typed alike, in Rust
    out = tmp_path / "out"
    kvfast.export([F16, Q8], out, model=vocab)
    back = kvfast.scan_export(out).collect()
    assert back.schema == got.schema
    assert_frame_equal(back.sort(KEY), got.sort(KEY))
    assert pl.read_parquet_schema(next(out.glob("*/*.parquet"))) == pl.Schema(got.schema)


def test_without_a_vocabulary_pieces_are_null_and_without_tokens_tokens_too(tmp_path: Path) -> None:
    raw = DATA / "qwen3tiny-f16-fa/seq-0.bin"  # raw bytes: no token list
    got = kvfast.scan([F16, raw], head_dim=32).collect()
    assert got["piece"].null_count() == got.height
    assert got.filter(pl.col("token").is_null())["dump"].unique().to_list() == [kvfast.dump_id(raw)]
    kvfast.export([F16, raw], tmp_path / "out", head_dim=32)
    assert_frame_equal(kvfast.scan_export(tmp_path / "out").collect().sort(KEY), got.sort(KEY))


def test_pieces_recorded_by_a_probe_manifest(tmp_path: Path) -> None:
    """A probe manifest beside the state records the prompt's pieces: they are the piece column."""
    shutil.copy(F16, tmp_path / "p.ggsq")
    pieces = [f"<{t}>" for t in SEQ]
    pl.DataFrame([manifest_row("p.ggsq", pieces=pieces)]).write_parquet(tmp_path / probe_manifest.NAME)
    got = kvfast.scan(tmp_path / "p.ggsq").filter(layer=1, kind="v", head=1).collect().sort("cell")
    assert got["piece"].to_list() == pieces
    kvfast.export(tmp_path / "p.ggsq", tmp_path / "out")
    back = kvfast.scan_export(tmp_path / "out").filter(layer=1, kind="v", head=1).collect().sort("cell")
    assert back["piece"].to_list() == pieces and back["token"].to_list() == SEQ


def test_cache_types_choose_records_and_tokens_rows_before_values_are_read(vocab: Path) -> None:
    lf = kvfast.scan([F16, Q8], model=vocab)
    dataset.READS.clear()
    q8 = lf.filter(pl.col("k_type") == "q8_0").collect()
    assert set(q8["dump"]) == {kvfast.dump_id(Q8)}
    assert dataset.READS["records"] == 4  # Q8's two layers' K and V: F16's never read
    dataset.READS.clear()
    assert lf.filter(v_type="f32").collect().is_empty() and dataset.READS["records"] == 0
    dataset.READS.clear()
    first = lf.filter(pl.col("token") == SEQ[0], kind="k").collect()
    assert set(first["cell"]) == {0} and first.height == 2 * 2 * 2  # 2 states, 2 layers, 2 heads
    assert dataset.READS["records"] == 4
    dataset.READS.clear()
    cells = lf.filter(piece=f"w{SEQ[3]}").select("dump", "cell").unique().collect()
    assert cells["cell"].to_list() == [3, 3] and dataset.READS["records"] == 0  # no values asked


def test_an_mla_cache_has_no_v_type_and_the_recurrent_part_no_type_nor_token(tmp_path: Path) -> None:
    mla = DATA / "deepseek2mla-f16-fa/seq-0.ggsq"
    model = DATA / "models/tiny-deepseek2-mla.gguf"
    got = kvfast.scan(mla, model=model).collect()
    assert (
        set(got["kind"]) == {"k"}
        and set(got["k_type"]) == {"f16"}
        and got["v_type"].null_count() == got.height
    )
    hybrid = DATA / "lfm2tiny-f16-fa/seq-0.ggsq"
    kvfast.export(hybrid, tmp_path / "out")
    for f in (tmp_path / "out").glob("*/recurrent/*.parquet"):
        r = pl.read_parquet(f)
        assert r.select(ADDED).null_count().row(0) == (r.height,) * 4, f.name
    attention = kvfast.scan_export(tmp_path / "out").collect()
    assert set(attention["k_type"]) == {"f16"} and attention["token"].null_count() == 0


def test_seq_id_of_a_2025_sequence_state_is_null_and_pandas_reads_it_as_a_nullable_integer(
    tmp_path: Path,
) -> None:
    """Sequence states of builds before mid-2025 list no sequence in their cells and record none
    anywhere (no io magic in raw bytes, none in GGSQ): the sequence is the one the caller of
    llama_state_seq_get_data asked for, unknown to the bytes. seq_id is null there, and pandas
    reads it as float64 unless told to keep nullable integers."""
    may = sorted((DATA / "qwen3tiny-f16-fa-2025may").glob("seq-0.*"))
    august = sorted((DATA / "qwen3tiny-f16-fa-2025").glob("seq-0.*"))
    for p in may:
        with kvfast.open(p, head_dim=32) as d:
            assert d.seq_id is None and all(s.sequences == [] for c in d.caches for s in c.streams)
    out = tmp_path / "out"
    kvfast.export([*may, *august, F16], out, head_dim=32)
    back = kvfast.scan_export(out).collect()
    nulls = back.filter(pl.col("seq_id").is_null())
    assert set(nulls["dump"]) == {kvfast.dump_id(p) for p in may}
    assert set(back.filter(pl.col("seq_id").is_not_null())["seq_id"]) == {0}  # recorded in the cells
    pd = pytest.importorskip("pandas")
    plain = pd.read_parquet(out)
    assert str(plain["seq_id"].dtype) == "float64"  # numpy integers have no null: NaN
    for backend, dtype in [("numpy_nullable", "UInt8"), ("pyarrow", "uint8[pyarrow]")]:
        frame = pd.read_parquet(out, dtype_backend=backend)
        assert str(frame["seq_id"].dtype) == dtype, backend
        assert int(frame["seq_id"].isna().sum()) == nulls.height
        assert str(frame["token"].dtype) == dtype.replace("UInt8", "Int32").replace("uint8", "int32")
        known = frame[frame["seq_id"].notna()]
        assert set(known["seq_id"].astype(int)) == {0}


def test_a_state_exported_before_the_columns_is_exported_again_and_old_files_read_as_null(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    raw = DATA / "qwen3tiny-f16-fa/seq-0.bin"
    assert kvfast.export([F16, raw], out, head_dim=32)["status"].to_list() == ["written"] * 2
    # as an earlier kvfast left them: markers without the value table's columns, files without ADDED
    import pyarrow.parquet as pq

    old = out / kvfast.dump_id(F16)
    marker = json.loads((old / "_kvfast.json").read_text())
    assert marker["options"]["columns"] == list(INDEX_SCHEMA)
    del marker["options"]["columns"]
    (old / "_kvfast.json").write_text(json.dumps(marker))
    for f in old.glob("*.parquet"):
        pq.write_table(pq.read_table(f).drop_columns(ADDED), f)
    # read as it is: one schema over both, nulls where a file lacks a column
    assert kvfast.export_schema(out).names == [*INDEX_SCHEMA, "values"]
    mixed = kvfast.scan_export(out).collect()
    assert mixed.filter(dump=kvfast.dump_id(F16))["k_type"].null_count() == 2 * 2 * 7 * 2
    assert set(mixed.filter(dump=kvfast.dump_id(raw))["k_type"]) == {"f16"}
    # the next run exports the stale state again, and leaves the current one
    report = kvfast.export([F16, raw], out, head_dim=32)
    assert report["status"].to_list() == ["written", "skipped"]
    assert set(kvfast.scan_export(out).collect()["k_type"]) == {"f16"}
