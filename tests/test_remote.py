"""States in object storage, on a real local S3-compatible server (moto's server mode, started
here): everything read from s3:// equals the same state read from its file; a one-layer query
fetches about that layer's bytes; storage errors are KvfastErrors naming what was expected, and
nothing hangs; local paths and file:// URLs stay memory-mapped."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import polars as pl
import pytest
import s3fs  # noqa: F401  (the test extra installs it: these tests run, never skip)
from polars.testing import assert_frame_equal
from s3_server import moto_s3

import kvfast
from kvfast import synth
from kvfast.read import remote

DATA = Path(__file__).parent / "data"
MODELS = DATA / "models"
BUCKET = "kvfast-tests"

#: (state, open options): every container, a quantized rotated cache, an iSWA server slot, a
#: hybrid memory, a V-less MLA cache, a whole state of shared cells.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("qwen3hd128-q8_0-fa/seq-0.ggsq", {"model": MODELS / "tiny-qwen3-hd128.gguf"}),
    ("gemma3-270m-server/gemma3-270m-server-f16-slot0.bin", {"head_dim": 256}),
    ("qwen35tiny-f16-fa/seq-0.ggsq", {"model": MODELS / "tiny-qwen35.gguf"}),
    ("deepseek2mla-f16-fa/state.ggsn", {"model": MODELS / "tiny-deepseek2-mla.gguf"}),
    ("qwen3tiny-3seq-shared/state.bin", {}),
    ("qwen3tiny-f16-fa/seq-0.bin", {}),
]


@pytest.fixture(scope="session")
def s3() -> Iterator[dict[str, str]]:
    """moto's S3 server, the AWS variables pointing at it, and a bucket of the fixture states."""
    with moto_s3() as env:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            fs = fsspec.filesystem("s3", skip_instance_cache=True)
            fs.mkdir(BUCKET)
            for rel, _ in CASES:
                fs.put(str(DATA / rel), f"{BUCKET}/{rel}")
            for p in sorted((DATA / "qwen3tiny-f16-fa").iterdir()):
                if p.suffix in (".bin", ".ggsq", ".ggsn"):
                    fs.put(str(p), f"{BUCKET}/many/{p.name}")
            yield env
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def url(rel: str) -> str:
    return f"s3://{BUCKET}/{rel}"


def _dumps(rel: str, opts: dict[str, Any]) -> tuple[kvfast.State, kvfast.State]:
    return kvfast.open(url(rel), **opts), kvfast.open(DATA / rel, **opts)


@pytest.mark.filterwarnings("ignore::kvfast.RotationWarning")
@pytest.mark.parametrize(("rel", "opts"), CASES, ids=[c[0] for c in CASES])
def test_a_remote_state_reads_as_its_file(s3: dict[str, str], rel: str, opts: dict[str, Any]) -> None:
    r, loc = _dumps(rel, opts)
    assert r.remote and not loc.remote
    assert (r.size, r.container, r.version, r.arch, r.features) == (
        loc.size,
        loc.container,
        loc.version,
        loc.arch,
        loc.features,
    )
    assert_frame_equal(r.layout(), loc.layout())
    assert [(x.cache, x.kind, x.undone, x.group) for x in r.rotation] == [
        (x.cache, x.kind, x.undone, x.group) for x in loc.rotation
    ]
    if loc.tokens is not None:
        assert np.array_equal(r.tokens, loc.tokens)
    for c_r, c_l in zip(r.caches, loc.caches, strict=True):
        for s_r, s_l in zip(c_r.streams, c_l.streams, strict=True):
            assert np.array_equal(s_r.pos, s_l.pos)
            assert np.array_equal(s_r.seq_id_values, s_l.seq_id_values)
    # values of every record, the long table, the statistics, losses and a comparison
    for ci, cache in enumerate(loc.caches):
        for li in range(cache.n_layer):
            for kind in ("k", "v"):
                try:
                    want = loc.values(li, kind, cache=ci)
                except kvfast.SelectionError:
                    continue
                assert np.array_equal(r.values(li, kind, cache=ci), want, equal_nan=True)
    assert r.to_arrow().equals(loc.to_arrow())
    for by in ("cell", "channel", "layer"):
        assert_frame_equal(r.stats(by=by), loc.stats(by=by))
    if loc.recurrent is not None:
        assert np.array_equal(r.values(0, "s"), loc.values(0, "s"))
    else:
        assert_frame_equal(r.quant_error("q4_0"), loc.quant_error("q4_0"))
    assert_frame_equal(kvfast.compare(r, loc, by="layer"), kvfast.compare(loc, loc, by="layer"))
    assert r.fetched_bytes <= r.size


def _synth_28(tmp: Path) -> Path:
    p = tmp / "synth28.ggsq"
    synth.write_state(p, container="ggsq", cells=256, n_layer=28, n_embd_k=1024, seed=3)
    return p


def test_one_layer_of_28_fetches_about_a_28th(s3: dict[str, str], tmp_path: Path) -> None:
    p = _synth_28(tmp_path)
    fs = fsspec.filesystem("s3")
    fs.put(str(p), f"{BUCKET}/synth/28.ggsq")
    d = kvfast.open(url("synth/28.ggsq"), head_dim=128)
    size = d.size
    meta = d.fetched_bytes
    # the metadata: the head, cells and record headers, a few rounds, no rows
    assert meta < 1 << 20 and d.fetch_rounds <= 4, (meta, d.fetch_rounds)
    layer = d.stats(by="channel", layers=[7])
    one = d.fetched_bytes - meta
    assert size / 28 * 0.95 <= one <= size / 28 + (64 << 10), (one, size)
    assert_frame_equal(layer, kvfast.open(p, head_dim=128).stats(by="channel", layers=[7]))
    # read again: nothing more fetched
    d.values(7, "k")
    d.values(7, "v")
    assert d.fetched_bytes - meta == one
    # everything: the whole object, each byte once
    d.to_arrow()
    assert d.fetched_bytes == size


def test_scan_scan_stats_export_read_s3_as_files(s3: dict[str, str], tmp_path: Path) -> None:
    local = str(DATA / "qwen3tiny-f16-fa")
    prefix = url("many/")
    drop = ["dump", "path"]
    key = ["path_name", "cache", "stream", "layer", "kind", "cell", "seq_id", "head"]

    def named(lf: pl.LazyFrame) -> pl.DataFrame:
        df = lf.collect().with_columns(path_name=pl.col("path").str.split("/").list.last())
        return df.drop(drop).sort(key[: len([k for k in key if k in df.columns])])

    got = named(kvfast.scan(prefix, head_dim=32).filter(pl.col("layer") == 1))
    want = named(kvfast.scan(local, head_dim=32).filter(pl.col("layer") == 1))
    assert got.height > 0
    assert_frame_equal(got, want)
    assert kvfast.scan(prefix, head_dim=32).collect()["path"].str.starts_with("s3://").all()
    stats_r = kvfast.scan_stats(url("many/*.ggsq"), by="channel", head_dim=32).collect()
    stats_l = kvfast.scan_stats(local + "/*.ggsq", by="channel", head_dim=32).collect()
    assert_frame_equal(stats_r.drop(drop), stats_l.drop(drop))
    out_r, out_l = tmp_path / "r", tmp_path / "l"
    rep = kvfast.export(prefix, out_r, jobs=2)
    assert set(rep["status"]) == {"written"}
    kvfast.export(local, out_l, jobs=2)
    a = pl.scan_parquet(f"{out_r}/**/*.parquet").collect()
    b = pl.scan_parquet(f"{out_l}/**/*.parquet").collect()
    sort = ["layer", "kind", "cell", "seq_id", "head"]
    a = a.with_columns(n=pl.col("path").str.split("/").list.last()).drop(drop).sort(["n", *sort])
    b = b.with_columns(n=pl.col("path").str.split("/").list.last()).drop(drop).sort(["n", *sort])
    assert_frame_equal(a, b)
    # unchanged objects are skipped on the next run (their marker records size and ETag)
    again = kvfast.export(prefix, out_r, jobs=2)
    assert set(again["status"]) == {"skipped"}
    # storage_options given explicitly: the same objects
    opts = {"key": s3["AWS_ACCESS_KEY_ID"], "secret": s3["AWS_SECRET_ACCESS_KEY"]}
    assert kvfast.scan(prefix, head_dim=32, storage_options=opts).select(pl.len()).collect().item() > 0


def test_an_object_rewritten_after_open_is_a_changed_file(s3: dict[str, str], tmp_path: Path) -> None:
    fs = fsspec.filesystem("s3")
    for seed in (1, 2):
        synth.write_state(
            tmp_path / f"{seed}.ggsq", container="ggsq", cells=256, n_layer=4, n_embd_k=1024, seed=seed
        )
    fs.put(str(tmp_path / "1.ggsq"), f"{BUCKET}/rewritten.ggsq")
    d = kvfast.open(url("rewritten.ggsq"))
    first = d.values(3, "k")  # fetched now: a later rewrite does not change it
    fs.put(str(tmp_path / "2.ggsq"), f"{BUCKET}/rewritten.ggsq")  # same size, other bytes
    with pytest.raises(kvfast.FileChangedError, match="changed since it was opened") as e:
        d.values(3, "v")
    assert e.value.filename == url("rewritten.ggsq")
    assert np.array_equal(d.values(3, "k"), first)


def test_missing_objects_and_buckets_are_remote_errors(s3: dict[str, str]) -> None:
    for u in (url("nope.ggsq"), "s3://no-such-bucket-kvfast/x.bin"):
        with pytest.raises(kvfast.RemoteError, match="no such object") as e:
            kvfast.open(u)
        assert isinstance(e.value, kvfast.KvfastError) and isinstance(e.value, OSError)
        assert e.value.filename == u and e.value.kind == "remote"
        assert u in str(e.value)


def test_a_truncated_object_is_a_truncated_state(s3: dict[str, str]) -> None:
    b = (DATA / "qwen3tiny-f16-fa/seq-0.bin").read_bytes()
    fsspec.filesystem("s3").pipe(f"{BUCKET}/cut.bin", b[: len(b) // 2])
    with pytest.raises(kvfast.FormatError) as e:
        kvfast.open(url("cut.bin"))
    assert "expected" in str(e.value) or "truncated" in str(e.value)
    local = DATA.parent / "cut-local.bin"
    try:
        local.write_bytes(b[: len(b) // 2])
        with pytest.raises(type(e.value)) as want:
            kvfast.open(local)
        assert str(want.value) == str(e.value)
    finally:
        local.unlink()


def test_no_credentials_is_a_remote_error_that_says_so(
    s3: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(kvfast.RemoteError, match="credentials"):
        kvfast.open(url("qwen3tiny-f16-fa/seq-0.bin"))


def test_an_endpoint_that_does_not_answer_fails_in_time(s3: dict[str, str]) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = {
        "endpoint_url": f"http://127.0.0.1:{port}",
        "config_kwargs": {"connect_timeout": 1, "read_timeout": 1, "retries": {"max_attempts": 1}},
    }
    with pytest.raises(kvfast.RemoteError, match="did not answer") as e:
        kvfast.open(url("qwen3tiny-f16-fa/seq-0.bin"), storage_options=opts)
    # the endpoint given, not the environment's (moto's, here) nor the provider's default
    assert f"http://127.0.0.1:{port}" in str(e.value), str(e.value)
    assert s3["AWS_ENDPOINT_URL"] not in str(e.value)


def test_local_paths_and_file_urls_stay_mapped(tmp_path: Path) -> None:
    p = DATA / "qwen3tiny-f16-fa/seq-0.bin"
    for given in (p, str(p), f"file://{p}"):
        with kvfast.open(given) as d:
            assert not d.remote and d.fetched_bytes == 0 and d.fetch_rounds == 0
            start = d._live().map_address
            v = d.values(0, "k")
            if v.ctypes.data % 2 == 0 and d.container != "ggsq":
                # an aligned f16 record is a view of the file's map, as before
                assert start <= v.ctypes.data < start + d.size
    assert not remote.is_url(str(p)) and not remote.is_url(f"file://{p}")
    assert remote.is_url("s3://b/k") and remote.is_url("gs://b/k") and remote.is_url("https://h/k")


def test_ray_reads_states_from_s3(s3: dict[str, str]) -> None:
    kray = pytest.importorskip("kvfast.ray")
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # the workers' credentials and endpoint: the same variables (a cluster started before them
    # gets them with the tasks)
    ds = kray.read_states(
        url("many/"), head_dim=32, layer=1, ray_remote_args={"runtime_env": {"env_vars": dict(s3)}}
    )
    got = kray.to_polars(ds)
    want = kvfast.scan(DATA / "qwen3tiny-f16-fa", head_dim=32).filter(pl.col("layer") == 1).collect()
    sort = ["n", "cache", "stream", "kind", "cell", "seq_id", "head"]
    got = got.with_columns(n=pl.col("path").str.split("/").list.last()).drop("dump", "path").sort(sort)
    want = want.with_columns(n=pl.col("path").str.split("/").list.last()).drop("dump", "path").sort(sort)
    assert_frame_equal(got, want)
