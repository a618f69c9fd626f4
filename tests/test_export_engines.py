"""Parquet every engine reads the same way (issue 14): Polars, pyarrow, pandas and DuckDB read an
export's files to the same table, with the same column types, as kvfast.scan gives."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.dataset as pads
import pytest
from conftest import DATA
from polars.testing import assert_frame_equal

import kvfast
from kvfast.cli import main
from kvfast.dataset import export_progress

F16 = str(DATA / "qwen3tiny-f16-fa/seq-0.bin")
Q8 = str(DATA / "qwen3tiny-q8_0-fa/seq-0.bin")
KEY = ["dump", "cache", "stream", "layer", "kind", "cell", "seq_id", "head"]
INDEX = {"dump": "str", "path": "str", "cache": "i32", "layer": "i32", "kind": "str", "head": "i32"}


def scanned(paths: list[str], **kw) -> pl.DataFrame:
    return kvfast.scan(paths, head_dim=32, **kw).collect().sort(KEY)


def values_of(df: pl.DataFrame) -> np.ndarray:
    return np.stack(df.sort(KEY)["values"].to_numpy()).astype(np.float32)


def test_every_engine_reads_the_default_export_alike(tmp_path: Path) -> None:
    out = tmp_path / "out"
    kvfast.export([F16, Q8], out, head_dim=32)
    want = scanned([F16, Q8])
    assert want.schema["values"] == pl.Array(pl.Float32, 32)  # one type: q8_0 needs float32
    # Polars: a glob, no hive partitioning needed: every column is in the files, typed
    got = pl.read_parquet(out / "**/*.parquet")
    assert_frame_equal(got.sort(KEY), want)
    # pyarrow: the folder (the markers start with "_": skipped)
    t = pads.dataset(out, format="parquet").to_table()
    assert t.schema.field("layer").type == pa.uint16() and t.schema.field("cache").type == pa.uint8()
    assert_frame_equal(pl.from_arrow(t).sort(KEY), want)  # type: ignore[union-attr]
    # pandas (through pyarrow): the folder, with its default hive partitioning
    pd = pytest.importorskip("pandas")
    frame = pd.read_parquet(out)
    assert str(frame["layer"].dtype) == "uint16" and len(frame) == want.height
    assert sorted(set(frame["dump"])) == sorted(set(want["dump"]))
    # DuckDB: a glob; fixed-size lists come back as FLOAT[] (Parquet has no fixed size): cast them
    duckdb = pytest.importorskip("duckdb")
    rel = duckdb.sql(
        f"SELECT * REPLACE (values::FLOAT[32] AS values) FROM read_parquet('{out}/**/*.parquet')"
    )
    types = dict(zip(rel.columns, map(str, rel.types), strict=True))
    assert types["layer"] == "USMALLINT" and types["cache"] == "UTINYINT" and types["values"] == "FLOAT[32]"
    back = pl.from_arrow(rel.arrow())
    assert isinstance(back, pl.DataFrame) and back.height == want.height
    np.testing.assert_array_equal(values_of(back), values_of(want))


HYBRID = DATA / "qwen35tiny-f16-fa/state.bin"  # attention K/V, then a recurrent part (R and S)
MODELS = DATA / "models"


def test_every_engine_reads_the_value_table_of_a_hybrid_export(tmp_path: Path) -> None:
    """The recurrent rows of a hybrid state (other widths than K and V) are outside every documented
    read of the value table (issue 24, item 16): before, they sat in ``recurrent/kind-*.parquet``,
    which the globs and pyarrow read as well, and every engine failed on the mixed schemas."""
    model = MODELS / json.loads((HYBRID.parent / "probe.json").read_text())["model"]
    out = tmp_path / "out"
    kvfast.export([HYBRID], out, model=model)
    with kvfast.open(HYBRID, model=model) as d:
        assert d.recurrent is not None
    rows = kvfast.scan([HYBRID], model=model).collect().height
    kv = {"k", "v"}
    got = pl.read_parquet(out / "**/*.parquet")
    assert got.height == rows and set(got["kind"]) == kv
    assert pl.scan_parquet(out / "**/*.parquet").select(pl.len()).collect().item() == rows
    t = pads.dataset(out, format="parquet").to_table()
    assert t.num_rows == rows and set(t.column("kind").to_pylist()) == kv
    pd = pytest.importorskip("pandas")
    frame = pd.read_parquet(out)
    assert len(frame) == rows and set(frame["kind"].astype(str)) == kv
    duckdb = pytest.importorskip("duckdb")
    ((n, kinds),) = duckdb.sql(
        f"SELECT count(*), list(DISTINCT kind::VARCHAR) FROM read_parquet('{out}/**/*.parquet')"
    ).fetchall()
    assert n == rows and set(kinds) == kv
    assert kvfast.scan_export(out).collect().height == rows
    # the recurrent part: its own documented path, one kind at a time
    with kvfast.open(HYBRID, model=model) as d:
        for kind in "rs":
            df = pl.read_parquet(out / f"*/_recurrent/kind-{kind}.parq")
            assert set(df["kind"]) == {kind}
            for ly in d.recurrent.layers:  # type: ignore[union-attr]
                got_rows = np.stack(df.filter(layer=ly.index)["values"].to_numpy())
                np.testing.assert_array_equal(got_rows, d.values(ly.index, kind))


def test_an_export_of_the_old_recurrent_layout_is_done_again(tmp_path: Path) -> None:
    model = MODELS / json.loads((HYBRID.parent / "probe.json").read_text())["model"]
    out = tmp_path / "out"
    kvfast.export([HYBRID], out, model=model)
    (state,) = (p for p in out.iterdir() if p.is_dir() and not p.name.startswith("_"))
    old = state / "recurrent"
    old.mkdir()
    (old / "kind-r.parquet").write_bytes((state / "_recurrent/kind-r.parq").read_bytes())
    assert kvfast.export([HYBRID], out, model=model)["status"].to_list() == ["written"]
    assert not old.exists() and (state / "_recurrent/kind-r.parq").is_file()
    assert kvfast.export([HYBRID], out, model=model)["status"].to_list() == ["skipped"]


def test_native_types_keep_f16_and_read_back_through_scan_export(tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = kvfast.export([F16, Q8], out, head_dim=32, dtype="native")
    f16_dir, q8_dir = (out / d for d in report["dump"])
    assert json.loads((f16_dir / "_kvfast.json").read_text())["values"] == ["float16"]
    assert json.loads((q8_dir / "_kvfast.json").read_text())["values"] == ["float32"]
    assert pl.read_parquet(f16_dir / "layer-0.parquet").schema["values"] == pl.Array(pl.Float16, 32)
    assert pl.read_parquet(q8_dir / "layer-0.parquet").schema["values"] == pl.Array(pl.Float32, 32)
    want = scanned([F16, Q8])
    got = kvfast.scan_export(out).collect()
    assert_frame_equal(got.sort(KEY), want)
    # pyarrow with the export's schema (without it, it would cast every file to the first one's type)
    t = pads.dataset(out, format="parquet", schema=kvfast.export_schema(out)).to_table()
    assert t.schema.field("values").type.value_type == pa.float32()
    np.testing.assert_array_equal(values_of(pl.from_arrow(t)), values_of(want))  # type: ignore[arg-type]
    duckdb = pytest.importorskip("duckdb")
    back = pl.from_arrow(duckdb.sql(f"SELECT * FROM read_parquet('{out}/**/*.parquet')").arrow())
    np.testing.assert_array_equal(values_of(back), values_of(want))  # type: ignore[arg-type]


def test_the_default_type_is_one_for_the_whole_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    kvfast.export([Q8], out, head_dim=32)
    kvfast.export([F16], out, head_dim=32)  # joins the float32 already there
    assert {f.schema["values"] for f in map(pl.read_parquet, out.glob("**/*.parquet"))} == {
        pl.Array(pl.Float32, 32)
    }
    other = tmp_path / "other"
    kvfast.export([F16], other, head_dim=32)
    with pytest.warns(UserWarning, match="mix"):
        kvfast.export([Q8], other, head_dim=32)
    assert_frame_equal(kvfast.scan_export(other).collect().sort(KEY), scanned([F16, Q8]))


def test_hive_layout_keeps_the_columns_in_the_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(F16, src / "a.bin")
    out = tmp_path / "out"
    (row,) = kvfast.export([src / "a.bin"], out, head_dim=32, hive=True).iter_rows(named=True)
    folder = out / row["dump"]
    assert sorted(p.name for p in folder.iterdir()) == ["_kvfast.json", "layer=0", "layer=1"]
    want = scanned([str(src / "a.bin")])
    assert_frame_equal(pl.read_parquet(out / "**/*.parquet").sort(KEY), want)
    # pyarrow infers hive keys as int32 and refuses the files' uint16: the export's schema says
    t = pads.dataset(out, format="parquet", partitioning="hive", schema=kvfast.export_schema(out)).to_table()
    assert t.schema.field("layer").type == pa.uint16() and t.num_rows == want.height
    pd = pytest.importorskip("pandas")
    assert str(pd.read_parquet(out, partitioning=None)["layer"].dtype) == "uint16"
    # the layout is part of the options: the default replaces the hive folders whole
    kvfast.export([src / "a.bin"], out, head_dim=32)
    assert sorted(p.name for p in folder.iterdir()) == ["_kvfast.json", "layer-0.parquet", "layer-1.parquet"]


def test_dump_is_stable_across_working_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "runs" / "q8").mkdir(parents=True)
    shutil.copy(Q8, tmp_path / "runs" / "q8" / "p0.bin")
    (tmp_path / "link").symlink_to(tmp_path / "runs")
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    first = kvfast.export(["runs/q8/p0.bin"], out, head_dim=32)
    monkeypatch.chdir(tmp_path / "runs")
    again = kvfast.export(["./q8/p0.bin"], out, head_dim=32)
    via_link = kvfast.export([tmp_path / "link" / "q8" / "p0.bin"], out, head_dim=32)
    assert first["dump"].to_list() == again["dump"].to_list() == via_link["dump"].to_list()
    assert again["status"].to_list() == via_link["status"].to_list() == ["skipped"]
    df = pl.read_parquet(out / "**/*.parquet")
    real = os.path.realpath(tmp_path / "runs/q8/p0.bin")
    assert df["dump"].unique().to_list() == [kvfast.dump_id(real)] == first["dump"].to_list()
    assert df["path"].unique().to_list() == [real]
    assert kvfast.dump_id(real).startswith("p0-")


def test_progress_counts_every_byte_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = export_progress.Progress.advance

    def counting(self: export_progress.Progress, n: int) -> None:
        seen.append(n)
        real(self, n)

    monkeypatch.setattr(export_progress.Progress, "advance", counting)
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x00" * 100)
    paths = [F16, Q8, str(bad)]
    total = sum(os.path.getsize(p) for p in paths)
    out = tmp_path / "out"
    kvfast.export(paths, out, head_dim=32, on_error="skip", progress=False)
    assert sum(seen) == total and len(seen) > len(paths)  # several steps per state (its records)
    seen.clear()
    kvfast.export(paths, out, head_dim=32, on_error="skip", progress=False)  # skipped ones count too
    assert sum(seen) == total


def _on_a_pty(code: str, rows: int, cols: int) -> str:
    """Run `code` in a child whose stderr is a pseudo-terminal of that size; its stderr."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    child = subprocess.Popen([sys.executable, "-c", code], stderr=slave, stdout=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        out += chunk
    assert child.wait() == 0, out
    os.close(master)
    return out.decode(errors="replace")


@pytest.mark.parametrize(("rows", "cols"), [(24, 100), (0, 0)])
def test_progress_bar_shows_bytes_on_a_terminal_even_one_without_a_size(
    tmp_path: Path, rows: int, cols: int
) -> None:
    # a pty whose size was never set reports 0 x 0: tqdm alone draws nothing there
    code = f"import kvfast; kvfast.export([{F16!r}, {Q8!r}], {str(tmp_path / 'o')!r}, head_dim=32)"
    err = _on_a_pty(code, rows, cols)
    assert "kvfast export: 100%" in err and "2/2 states" in err
    assert f"{sum(os.path.getsize(p) for p in (F16, Q8)) / 1024:.2f}k" in err  # bytes, not states
    assert "kvfast export" not in _on_a_pty(
        code.replace("head_dim=32", "head_dim=32, progress=False"), rows, cols
    )


def test_cli_export_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.bin").write_bytes(b"nope")
    argv = ["export", F16, str(tmp_path / "bad.bin"), "-o", str(tmp_path / "o"), "--head-dim", "32"]
    assert main([*argv, "--json", "--on-error", "skip", "--no-progress", "--dtype", "native"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in rows] == ["written", "failed"]
    assert rows[0]["dump"] == kvfast.dump_id(F16) and rows[0]["rows"] > 0
    assert "not a llama.cpp state" in rows[1]["error"]
