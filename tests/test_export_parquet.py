"""kvfast.export's Parquet writer (issue 15): the files it writes in Rust are the value table for
Polars, pyarrow and DuckDB alike (float16 values kept, bit for bit), one row group per record, and
an export's memory is bounded by a row group (a record, or a range of its cells), not a state. The encodings the benchmark tries
(BYTE_STREAM_SPLIT, no compression, small pages) read back the same."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import DATA, dataset_table
from polars.testing import assert_frame_equal

import kvfast
from kvfast import synth
from kvfast.dataset import dump_id, export_parquet

F16 = str(DATA / "qwen3tiny-f16-fa/seq-0.bin")
Q8 = str(DATA / "qwen3tiny-q8_0-fa/seq-0.bin")
KEY = ["dump", "cache", "stream", "layer", "kind", "cell", "seq_id", "head"]


def want(path: str, dtype: str | None = None, head_dim: int = 32) -> pl.DataFrame:
    """What an export of `path` must hold: the state's own value table, with its dump and path,
    its layer's cache types and its cells' tokens."""
    with kvfast.open(path, head_dim=head_dim) as d:
        return dataset_table(d, dtype=dtype)


def values_of(df: pl.DataFrame) -> np.ndarray:
    return np.stack(df.sort(KEY)["values"].to_numpy())


def read_three(files: list[Path]) -> dict[str, pl.DataFrame]:
    """The files as Polars, pyarrow and DuckDB read them (DuckDB's FLOAT[] lists cast back); DuckDB
    left out where it refuses BYTE_STREAM_SPLIT (of float16: DuckDB 2.0 reads it for FLOAT only)."""
    names = [str(f) for f in files]
    duckdb = pytest.importorskip("duckdb")
    got = {"polars": pl.read_parquet(names), "pyarrow": pl.from_arrow(pq.ParquetDataset(names).read())}
    try:
        got["duckdb"] = pl.from_arrow(duckdb.sql(f"SELECT * FROM read_parquet({names!r})").arrow())
    except duckdb.Error as e:
        if "BYTE_STREAM_SPLIT" not in str(e):
            raise
    return {k: v for k, v in got.items() if isinstance(v, pl.DataFrame)}


@pytest.mark.parametrize("dtype", [None, "float32", "native"])
def test_every_reader_gets_the_value_table(tmp_path: Path, dtype: str | None) -> None:
    report = kvfast.export([F16], tmp_path / "out", head_dim=32, dtype=dtype)
    files = sorted((tmp_path / "out").glob("*/*.parquet"))
    assert len(files) == report["files"][0] == 2  # a file per layer
    exp = want(F16, "float32" if dtype == "float32" else None)
    f16 = dtype != "float32"
    assert exp.schema["values"] == pl.Array(pl.Float16 if f16 else pl.Float32, 32)
    got = read_three(files)
    assert_frame_equal(got["polars"].sort(KEY), exp.sort(KEY))  # every type, Float16 included
    assert_frame_equal(got["pyarrow"].sort(KEY), exp.sort(KEY))
    assert set(got) == {"polars", "pyarrow", "duckdb"}
    for name, df in got.items():  # DuckDB reads FLOAT16 as FLOAT: the same numbers
        assert df.height == exp.height, name
        np.testing.assert_array_equal(values_of(df).astype(np.float32), values_of(exp).astype(np.float32))
        assert sorted(df["layer"].unique().to_list()) == [0, 1], name


def test_parquet_types_one_row_group_per_record_no_value_statistics(tmp_path: Path) -> None:
    kvfast.export([F16, Q8], tmp_path / "out", head_dim=32, dtype="native")
    f16_file = tmp_path / "out" / dump_id(F16) / "layer-1.parquet"
    meta = pq.read_metadata(f16_file)
    leaf = meta.schema.column(meta.num_columns - 1)
    assert (leaf.physical_type, str(leaf.logical_type), leaf.max_definition_level) == (
        "FIXED_LEN_BYTE_ARRAY",
        "Float16",
        3,
    )
    assert meta.num_row_groups == 2  # K and V of the layer: one row group each
    for g in range(meta.num_row_groups):
        col = meta.row_group(g).column(meta.num_columns - 1)
        assert col.statistics is None and col.compression == "ZSTD" and "PLAIN" in col.encodings
        assert meta.row_group(g).num_rows == want(F16).filter(layer=1).height // 2
    q8 = pq.read_metadata(tmp_path / "out" / dump_id(Q8) / "layer-0.parquet")
    assert q8.schema.column(q8.num_columns - 1).physical_type == "FLOAT"
    # the Arrow schema Polars reads: the index columns' own types (kind's Enum too)
    assert pl.read_parquet_schema(f16_file) == pl.Schema(want(F16).schema)


@pytest.mark.parametrize(
    "settings",
    [{"split": True}, {"zstd": None}, {"page_bytes": 1000}, {"page_bytes": 1}, {"zstd": 9, "split": True}],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()),
)
def test_other_encodings_read_back_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: dict[str, object]
) -> None:
    monkeypatch.setattr(export_parquet, "SETTINGS", {**export_parquet.SETTINGS, **settings})
    kvfast.export([F16, Q8], tmp_path / "out", head_dim=32, dtype="native")
    for path in (F16, Q8):
        files = sorted((tmp_path / "out" / dump_id(path)).glob("*.parquet"))
        exp = want(path)
        got = read_three(files)
        assert_frame_equal(got["polars"].sort(KEY), exp.sort(KEY))
        assert_frame_equal(got["pyarrow"].sort(KEY), exp.sort(KEY))
        if "duckdb" in got or not settings.get("split") or path != F16:
            np.testing.assert_array_equal(
                values_of(got["duckdb"]).astype(np.float32), values_of(exp).astype(np.float32)
            )
    pages = pq.ParquetFile(tmp_path / "out" / dump_id(F16) / "layer-0.parquet")
    col = pages.metadata.row_group(0).column(pages.metadata.num_columns - 1)
    assert ("BYTE_STREAM_SPLIT" in col.encodings) == bool(settings.get("split"))


def test_a_long_record_is_several_row_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # row groups of at most 300 bytes of values (a cell's 64 values are 128 bytes as f16, 256 as
    # float32): each 7-cell record of the fixture is several, decoded a group at a time
    monkeypatch.setattr(export_parquet, "SETTINGS", {**export_parquet.SETTINGS, "row_group_bytes": 300})
    kvfast.export([F16, Q8], tmp_path / "out", head_dim=32, dtype="native")
    for path in (F16, Q8):
        files = sorted((tmp_path / "out" / dump_id(path)).glob("*.parquet"))
        meta = pq.read_metadata(files[0])
        # K and V of the layer, each in groups of 2 cells (f16) or 1 (float32)
        assert meta.num_row_groups == (8 if path == F16 else 14)
        exp = want(path)
        assert_frame_equal(pl.read_parquet(files).sort(KEY), exp.sort(KEY))
        got = read_three(files)["duckdb"]
        np.testing.assert_array_equal(values_of(got).astype(np.float32), values_of(exp).astype(np.float32))


@pytest.mark.parametrize(
    ("path", "dtype", "head_dim"),
    [
        (str(DATA / "qwen3tiny-f16-nofa/seq-0.bin"), "native", 32),  # V transposed, kept f16
        (str(DATA / "qwen3tiny-f16-nofa/seq-0.bin"), "float32", 32),  # V transposed, decoded
        (str(DATA / "qwen3hd128-q8_0-fa/seq-0.bin"), None, 128),  # q8_0 rotated back, a range at a time
    ],
)
def test_records_decoded_a_range_of_cells_at_a_time_are_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, dtype: str | None, head_dim: int
) -> None:
    monkeypatch.setattr(export_parquet, "SETTINGS", {**export_parquet.SETTINGS, "row_group_bytes": 1})
    kvfast.export([path], tmp_path / "out", head_dim=head_dim, dtype=dtype)
    files = sorted((tmp_path / "out" / dump_id(path)).glob("*.parquet"))
    exp = want(path, None if dtype == "native" else dtype, head_dim)
    cells = exp.select("cache", "stream", "layer", "kind", "cell").unique().height
    # a row group per cell of each record
    assert sum(pq.read_metadata(f).num_row_groups for f in files) == cells
    assert_frame_equal(pl.read_parquet(files).sort(KEY), exp.sort(KEY))


def test_a_partition_of_records_of_two_head_sizes_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "kv.bin"
    synth.write_state(src, n_layer=2, cells=4, n_embd_k=64, n_embd_v=32)  # K 64 wide, V 32: one head each
    report = kvfast.export([src], tmp_path / "out", dtype="float32", on_error="skip")
    assert report["status"].to_list() == ["failed"]
    assert "different types or head sizes" in report["error"][0]
    assert not list((tmp_path / "out").glob("**/*.parquet"))  # nothing left of the failed state
    # a partition per kind holds one head size: written
    report = kvfast.export([src], tmp_path / "out", dtype="float32", partition_by=("layer", "kind"))
    assert report["status"].to_list() == ["written"] and report["files"][0] == 4


CHILD = r"""
import sys, threading, time
from pathlib import Path
import kvfast

def anon():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

src, small, out = sys.argv[1], sys.argv[2], sys.argv[3]
kvfast.export(small, out + "-warm", head_dim=128, progress=False)  # imports, thread pools (a small state)
base = anon()
peak = base
done = threading.Event()

def sample():
    global peak
    while not done.is_set():
        peak = max(peak, anon())
        time.sleep(0.002)

t = threading.Thread(target=sample)
t.start()
kvfast.export(src, out, head_dim=128, progress=False)
done.set()
t.join()
print(peak - base)
"""


def test_memory_is_bounded_by_a_record_not_a_state(tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    # 16 layers of K and V, 4 MiB a record (8192 cells of 256 f16 values): 128 MiB of rows
    size = synth.write_state(src, cells=8192, n_layer=16, n_embd_k=256)
    small = tmp_path / "small.bin"
    synth.write_state(small, cells=64, n_layer=2, n_embd_k=256)
    record = 8192 * 256 * 2
    env = {**os.environ, "RAYON_NUM_THREADS": "2"}  # two partitions written at once, whatever the machine
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(src), str(small), str(tmp_path / "out")],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    grown = int(run.stdout.split()[-1])
    # a record and its encoded copy per worker: a quarter of the state at most
    assert grown < 8 * record <= size // 4, f"RssAnon grew {grown >> 20} MiB over a {size >> 20} MiB state"
    assert len(list((tmp_path / "out").glob("*/*.parquet"))) == 16
