"""Many states as one dataset: scans with pushdown, manifest, Parquet export."""

import os
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.dataset as pads
import pytest
from conftest import DATA, dataset_table
from polars.testing import assert_frame_equal

import kvfast
from kvfast import dataset
from kvfast.cli import main
from kvfast.dataset import export_parquet

F16 = sorted(str(p) for p in DATA.glob("qwen3tiny-f16-fa*/seq-0.*"))
KEY = ["dump", "cache", "stream", "layer", "kind", "cell", "seq_id", "head"]


def eager(paths: list[str], **kw) -> pl.DataFrame:
    frames = []
    for p in paths:
        with kvfast.open(p, head_dim=32) as d:
            frames.append(dataset_table(d, **kw))
    return pl.concat(frames)


def test_scan_equals_concatenated_to_polars() -> None:
    got = kvfast.scan(F16, head_dim=32).collect()
    assert_frame_equal(got.sort(KEY), eager(F16).sort(KEY))
    assert got.schema["values"] == pl.Array(pl.Float16, 32)


def test_scan_of_a_directory_and_a_glob() -> None:
    d = kvfast.scan(DATA / "qwen3tiny-3seq-shared", head_dim=32).select("dump").unique().collect()
    assert d.height == 8
    g = kvfast.scan(str(DATA / "qwen3tiny-3seq-shared" / "seq-*.bin"), head_dim=32).collect()
    assert set(g["path"].unique().to_list()) == {
        str(DATA.resolve() / f"qwen3tiny-3seq-shared/seq-{i}.bin") for i in range(3)
    }
    want = {kvfast.dump_id(DATA / f"qwen3tiny-3seq-shared/seq-{i}.bin") for i in range(3)}
    assert set(g["dump"].unique().to_list()) == want


def test_record_predicates_read_only_those_records() -> None:
    lf = kvfast.scan(F16, head_dim=32)
    dataset.READS.clear()
    got = lf.filter(pl.col("layer") == 1, pl.col("kind") == "v").collect()
    assert dataset.READS["records"] == len(F16)
    want = eager(F16).filter(layer=1, kind="v")
    assert_frame_equal(got.sort(KEY), want.sort(KEY))
    dataset.READS.clear()
    one = lf.filter(pl.col("dump") == kvfast.dump_id(F16[0]), pl.col("layer") == 0).collect()
    assert dataset.READS["records"] == 2 and one.height == 7 * 2 * 2


def test_index_predicates_skip_records_without_rows() -> None:
    lf = kvfast.scan(DATA / "qwen3tiny-3seq-shared", head_dim=32)
    dataset.READS.clear()
    got = lf.filter(pl.col("pos") >= 12, pl.col("head") == 1).collect()
    # only the states holding sequence 2 (15 positions) have cells at 12..14
    assert set(got["path"].unique().to_list()) == {
        str(DATA.resolve() / f"qwen3tiny-3seq-shared/{f}")
        for f in ("seq-2.bin", "seq-2.ggsq", "state.bin", "state.ggsn")
    }
    assert dataset.READS["records"] == 4 * 4
    want = eager(dataset.expand(DATA / "qwen3tiny-3seq-shared")).filter(
        pl.col("pos") >= 12, pl.col("head") == 1
    )
    assert_frame_equal(got.sort(KEY), want.sort(KEY))


def test_value_predicates_and_projection() -> None:
    lf = kvfast.scan(F16, head_dim=32)
    got = lf.filter(pl.col("values").arr.max() > 2.5).select("dump", "pos").collect()
    want = eager(F16).filter(pl.col("values").arr.max() > 2.5).select("dump", "pos")
    assert_frame_equal(got.sort("dump", "pos"), want.sort("dump", "pos"))
    dataset.READS.clear()
    counts = lf.group_by("layer").len().collect()
    assert dataset.READS["records"] == 0  # no values asked for: no value bytes read
    assert sorted(counts["len"].to_list()) == [len(F16) * 7 * 2 * 2] * 2


def test_row_limit_is_exact() -> None:
    lf = kvfast.scan(F16, head_dim=32)
    for n in (0, 1, 5, 29, 10_000):
        assert lf.head(n).collect().height == min(n, len(F16) * 56)
    assert lf.filter(pl.col("kind") == "v").head(9).collect()["kind"].to_list() == ["v"] * 9


def test_mixed_types_decode_to_float32() -> None:
    paths = [str(DATA / "qwen3tiny-f16-fa/seq-0.bin"), str(DATA / "qwen3tiny-q8_0-fa/seq-0.bin")]
    got = kvfast.scan(paths, head_dim=32).collect()
    assert got.schema["values"] == pl.Array(pl.Float32, 32)
    assert_frame_equal(got.sort(KEY), eager(paths, dtype="float32").sort(KEY))


def test_scan_stats() -> None:
    paths = dataset.expand(DATA / "qwen3tiny-3seq-shared")
    for by in ("cell", "channel", "layer"):
        got = kvfast.scan_stats(paths, by=by).filter(pl.col("layer") == 1).collect()
        frames = [dataset.stats_frame(kvfast.open(p), by) for p in paths]
        want = pl.concat(frames).filter(layer=1)
        assert_frame_equal(got, want)


def test_manifest(tmp_path: Path) -> None:
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x00" * 7)
    good = DATA / "gemma3-270m-f16-fa/state.ggsn"
    m = kvfast.manifest([good, bad])
    row = m.row(0, named=True)
    assert (row["container"], row["version"], row["arch"], row["caches"], row["layers"]) == (
        "ggsn",
        10,
        "gemma3",
        2,
        18,
    )
    assert (row["cells"], row["k_types"], row["n_tokens"], row["error"]) == (8, "f16", 8, None)
    assert m.row(1, named=True)["error"].startswith("TruncatedError")


def _read_back(out: Path) -> pl.DataFrame:
    return pl.read_parquet(out / "**/*.parquet")


def test_export_values_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = kvfast.export(F16, out, head_dim=32, jobs=2)
    assert report["status"].to_list() == ["written"] * len(F16)
    src = eager(F16)
    assert report["rows"].sum() == src.height
    back = _read_back(out)
    assert back.schema["values"] == pl.Array(pl.Float16, 32)
    assert_frame_equal(back.select(src.columns).sort(KEY), src.sort(KEY))
    ds = pads.dataset(out, format="parquet")
    t = ds.to_table()
    assert str(t.schema.field("values").type.value_type) == "halffloat"
    assert t.num_rows == src.height
    vals = np.stack(
        pl.from_arrow(t).sort(KEY).to_arrow().column("values").to_numpy(zero_copy_only=False)  # type: ignore[union-attr]
    )
    np.testing.assert_array_equal(vals, np.stack(src.sort(KEY)["values"].to_numpy()))


def test_export_is_resumable(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for p in F16[:2]:
        shutil.copy(p, src / Path(p).name)
    out = tmp_path / "out"
    assert kvfast.export(src, out, head_dim=32)["status"].to_list() == ["written", "written"]
    assert kvfast.export(src, out, head_dim=32)["status"].to_list() == ["skipped", "skipped"]
    changed = sorted(src.iterdir())[1]
    changed.write_bytes(changed.read_bytes())  # new mtime: exported again
    assert kvfast.export(src, out, head_dim=32)["status"].to_list() == ["skipped", "written"]
    assert kvfast.export(src, out, head_dim=16)["status"].to_list() == ["written", "written"]  # other options


def test_export_errors_skip_or_fail(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(F16[0], src / "a.bin")
    (src / "b.bin").write_bytes(Path(F16[0]).read_bytes()[:1000])  # truncated
    shutil.copy(F16[1], src / "c.ggsq")
    out = tmp_path / "skip"
    report = kvfast.export(src, out, head_dim=32, on_error="skip")
    assert report["status"].to_list() == ["written", "failed", "written"]
    err = report.filter(status="failed")["error"][0]
    assert err.startswith("TruncatedError") and "byte" in err
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert not any(f.startswith(("b-", ".")) for f in files)
    out = tmp_path / "fail"
    with pytest.raises(kvfast.ExportError) as e:
        kvfast.export(src, out, head_dim=32, on_error="fail", jobs=1)
    assert "b.bin" in str(e.value) and "failed" in e.value.report["status"].to_list()
    assert not [p for p in out.rglob("*") if p.is_file() and (p.name.startswith(("b-", ".")))]


def test_export_crash_leaves_nothing_partial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = export_parquet.write_values
    calls = {"n": 0}

    def flaky(d, parts, dtype, advance, **kw):  # the state fails after its first row group
        def advancing(n: int) -> None:
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError("disk full")
            advance(n)

        return real(d, parts, dtype, advancing, **kw)

    monkeypatch.setattr(export_parquet, "write_values", flaky)
    out = tmp_path / "out"
    report = kvfast.export([F16[0]], out, head_dim=32, on_error="skip", partition_by=())
    assert report["status"].to_list() == ["failed"] and "disk full" in report["error"][0]
    assert [p for p in out.rglob("*") if p.is_file()] == []
    monkeypatch.setattr(export_parquet, "write_values", real)
    assert kvfast.export([F16[0]], out, head_dim=32, partition_by=())["status"].to_list() == ["written"]


def test_export_stats(tmp_path: Path) -> None:
    paths = dataset.expand(DATA / "qwen3tiny-3seq-shared")
    out = tmp_path / "stats"
    kvfast.export(paths, out, what="stats", by="layer", partition_by=("layer", "kind"))
    back = pl.read_parquet(out / "**/*.parquet")
    want = pl.concat([dataset.stats_frame(kvfast.open(p), "layer") for p in paths])
    assert_frame_equal(
        back.select(want.columns).sort("dump", "layer", "kind"), want.sort("dump", "layer", "kind")
    )


def test_cli_export_and_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["export", *F16, "-o", str(out), "--head-dim", "32", "--jobs", "2"]) == 0
    assert f"{len(F16)} written" in capsys.readouterr().out
    assert main(["manifest", str(DATA / "qwen3tiny-f16-fa"), "--json"]) == 0
    assert '"container":"ggsn"' in capsys.readouterr().out.replace(" ", "")
    (tmp_path / "bad.bin").write_bytes(b"nope")
    assert main(["export", str(tmp_path / "bad.bin"), "-o", str(out), "--on-error", "skip"]) == 1
    assert "failed:" in capsys.readouterr().err


def test_an_opening_opens_as_kvfast_open_and_pickles_with_its_model_path(tmp_path: Path) -> None:
    import pickle

    from kvfast.read.opening import Opening

    state = DATA / "qwen3tiny-3seq-shared" / "state.bin"
    model = DATA / "models" / "tiny-qwen3.gguf"
    how = Opening(model=model, pre_rope=True, storage_options={"anon": True})
    assert how.model == os.path.abspath(model)  # a path stays a path: each open reads the GGUF itself
    again = pickle.loads(pickle.dumps(how))
    assert again == how and isinstance(again.model, str)
    with again.open(state) as d, kvfast.open(state, model=model, pre_rope=True) as want:
        assert d.pre_rope and d.model == want.model
        assert d.to_polars(layers=[0], kinds="k").equals(want.to_polars(layers=[0], kinds="k"))
    assert Opening(model=model).geometry() == kvfast.ModelGeometry.from_gguf(model)
    rel = Opening(model=os.path.relpath(model))
    assert rel.model == os.path.abspath(model)  # the workers' working directory is not the driver's
    # the core's own refusal, at open, for export as for kvfast.open
    with pytest.raises(kvfast.PreRopeError, match="needs the model's GGUF") as e:
        Opening(head_dim=32, pre_rope=True).open(state)
    with pytest.raises(kvfast.PreRopeError, match="needs the model's GGUF") as e2:
        kvfast.export([state], tmp_path / "out", head_dim=32, pre_rope=True, on_error="skip")
    assert str(e2.value) == str(e.value) and e2.value.field == "model"
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*/_kvfast.json"))
