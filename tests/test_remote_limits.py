"""Remote reads against hostile servers (a local HTTP server that also speaks enough S3, and
moto's S3 server): every request has deadlines and ends with a RemoteError instead of a hang; an
open fetches its metadata in bounded bytes and expanding a URL fetches no object; every ranged
GET is pinned to the version opened, so a rewrite between a pass's check and its GETs is a
FileChangedError, never mixed rows; an object too large to map is a RemoteError naming its size."""

from __future__ import annotations

import errno
import os
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from http_objects import Obj, Server, serve
from s3_server import moto_s3

import kvfast
from kvfast import synth
from kvfast.read import remote

DATA = Path(__file__).parent / "data"
SMALL = (DATA / "qwen3tiny-f16-fa/seq-0.bin").read_bytes()
#: deadlines small enough for a test: a request of n bytes ends within 1 s + n / 1 MB/s
FAST = {"kvfast": {"connect_timeout": 0.5, "read_timeout": 0.5, "min_rate": 1e6}}
#: credentials for the hostile server's S3 (it checks none)
S3_KEYS = {"key": "testing", "secret": "testing", "client_kwargs": {"region_name": "us-east-1"}}


def finishes(fn: Callable[[], Any], within: float = 120.0) -> Any:
    """``fn()``'s result, or its exception raised here; a test failure if it is still blocked
    after ``within`` seconds (a hang, which the deadlines exist to prevent)."""
    out: dict[str, Any] = {}

    def go() -> None:
        try:
            out["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(within)
    if t.is_alive():
        pytest.fail(f"still blocked after {within} s")
    if "error" in out:
        raise out["error"]
    return out.get("result")


@pytest.fixture
def server() -> Iterator[Server]:
    with serve({"/b/s.bin": Obj.of(SMALL)}) as srv:
        yield srv


def _s3(srv: Server, **more: Any) -> dict[str, Any]:
    return {**S3_KEYS, "endpoint_url": srv.url, **more}


# -- 11: deadlines -------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["silent", "trickle"])
def test_a_stalled_http_get_is_a_remote_error(server: Server, how: str) -> None:
    if how == "silent":
        server.silent = {"GET"}
    else:
        server.mode = "trickle"
    with pytest.raises(kvfast.RemoteError) as e:
        finishes(lambda: kvfast.open(f"{server.url}/b/s.bin", storage_options=FAST))
    assert e.value.errno == errno.ETIMEDOUT and e.value.filename == f"{server.url}/b/s.bin"
    said = str(e.value)
    assert server.url in said and "read_timeout" in said, said
    if how == "silent":
        assert "did not answer in time" in said
    else:
        assert f"of {len(SMALL)} bytes, then no more in time" in said


def test_a_lookup_that_never_answers_is_a_remote_error(server: Server) -> None:
    server.silent = {"HEAD", "GET"}
    with pytest.raises(kvfast.RemoteError, match="looking up the object failed: .* did not answer in time"):
        finishes(lambda: kvfast.open(f"{server.url}/b/s.bin", storage_options=FAST))


def test_a_pass_after_open_has_deadlines_too(tmp_path: Path) -> None:
    p = tmp_path / "s.ggsq"
    synth.write_state(p, container="ggsq", cells=256, n_layer=4, n_embd_k=1024, seed=1)
    with serve({"/s.ggsq": Obj.of(p.read_bytes())}) as srv:
        d = kvfast.open(f"{srv.url}/s.ggsq", storage_options=FAST)
        srv.mode = "trickle"
        with pytest.raises(kvfast.RemoteError, match="then no more in time"):
            finishes(lambda: d.values(3, "v"))


@pytest.mark.parametrize("how", ["silent", "trickle"])
def test_a_stalled_s3_get_is_a_remote_error(server: Server, how: str) -> None:
    """S3 (s3fs and botocore) against a server that answers HEAD and stalls GET; the deadlines
    are botocore's ``config_kwargs`` (kvfast takes its timeouts from them) and kvfast's rate."""
    if how == "silent":
        server.silent = {"GET"}
    else:
        server.mode = "trickle"
    opts = _s3(
        server, config_kwargs={"connect_timeout": 0.5, "read_timeout": 0.5, "retries": {"max_attempts": 1}}
    )
    with pytest.raises(kvfast.RemoteError) as e:
        finishes(lambda: kvfast.open("s3://b/s.bin", storage_options=opts))
    said = str(e.value)
    assert e.value.errno == errno.ETIMEDOUT or "did not answer" in said, said
    assert server.url in said, said
    assert server.requests["HEAD"] >= 1 and len(server.headers) >= 1  # a GET came


def test_kvfast_options_are_checked() -> None:
    for bad, says in (
        ({"read_timout": 1}, "unknown"),
        ({"read_timeout": 0}, "a number > 0"),
        ({"min_rate": float("inf")}, "a number > 0"),
        ({"metadata_limit": 1.5}, "whole number"),
    ):
        with pytest.raises(ValueError, match=says):
            kvfast.open("http://127.0.0.1:9/x.bin", storage_options={"kvfast": bad})
    with pytest.raises(TypeError, match="must be a dict"):
        kvfast.open("http://127.0.0.1:9/x.bin", storage_options={"kvfast": 5})


# -- 12: bounded fetches ---------------------------------------------------------------------------


def test_a_header_claiming_a_billion_cells_fetches_the_head_only() -> None:
    # 10^9 cells claimed in an 8 GiB object: their metadata (8 GB or more) would fit in it
    head = struct.pack("<4I", 0xAF143CD8, 0, 1, 10**9)
    with serve({"/huge.bin": Obj.virtual(8 << 30, head)}) as srv:
        srv.budget = 64 << 20  # a walk that fetches more ends, instead of the test
        with pytest.raises(kvfast.RemoteError) as e:
            finishes(lambda: kvfast.open(f"{srv.url}/huge.bin"))
        said = str(e.value)
        assert "cache 0 stream 0 cell_count at byte 12 claims 1000000000 cells" in said, said
        assert "metadata_limit" in said and e.value.errno == errno.EFBIG
        assert srv.sent <= 256 << 10 and srv.requests["GET"] == 1, (srv.sent, srv.requests)


def test_metadata_limit_bounds_what_an_open_fetches(tmp_path: Path) -> None:
    p = tmp_path / "s.ggsq"
    synth.write_state(p, container="ggsq", cells=64, n_layer=8, n_embd_k=1024, seed=1)
    with serve({"/s.ggsq": Obj.of(p.read_bytes())}) as srv:
        url = f"{srv.url}/s.ggsq"
        with pytest.raises(kvfast.RemoteError, match="more than the 8192 bytes a remote open fetches"):
            kvfast.open(url, storage_options={"kvfast": {"metadata_limit": 8192}})
        assert srv.sent <= 8192
        d = kvfast.open(url)
        assert d.fetched_bytes < d.size
        assert np.array_equal(d.values(5, "k"), kvfast.open(p).values(5, "k"))


def test_manifest_of_an_http_object_fetches_no_more_than_an_open() -> None:
    # a 64 MiB object: a state's first bytes, then zeros (a state that does not parse)
    with serve({"/big.bin": Obj.virtual(64 << 20, SMALL[:200])}) as srv:
        srv.budget = 8 << 20
        m = finishes(lambda: kvfast.manifest([f"{srv.url}/big.bin"]))
        assert m.height == 1 and m["error"][0] is not None
        assert srv.sent <= 256 << 10, srv.sent
        # every GET asked for a range: none for the whole object
        assert srv.headers and all("Range" in h for h in srv.headers), srv.headers


def test_a_server_that_ignores_ranges_is_an_error_not_a_download(server: Server) -> None:
    server.objects["/big.bin"] = Obj.virtual(64 << 20, SMALL[:200])
    server.ranges = False
    with pytest.raises(kvfast.RemoteError, match="expected 206 Partial Content"):
        finishes(lambda: kvfast.open(f"{server.url}/big.bin", storage_options=FAST))
    # another range than the one asked (said so in its Content-Range): refused, never misplaced
    server.ranges, server.skew = True, 4096
    with pytest.raises(kvfast.RemoteError, match=r"answered with bytes 'bytes 4096-266239/67108864'"):
        finishes(lambda: kvfast.open(f"{server.url}/big.bin", storage_options=FAST))


# -- 13: the version opened, pinned ------------------------------------------------------------------


def _two_versions(tmp: Path) -> tuple[bytes, bytes]:
    out = []
    for seed in (1, 2):
        p = tmp / f"{seed}.ggsq"
        synth.write_state(p, container="ggsq", cells=256, n_layer=4, n_embd_k=1024, seed=seed)
        out.append(p.read_bytes())
    assert len(out[0]) == len(out[1]) and out[0] != out[1]
    return out[0], out[1]


@pytest.mark.parametrize("server_says", ["if-match", "etag", "last-modified"])
def test_an_object_rewritten_after_a_passs_check_is_a_changed_file(tmp_path: Path, server_says: str) -> None:
    a, b = _two_versions(tmp_path)
    mtime_b = "Wed, 15 Nov 2023 00:00:00 GMT"
    with serve({"/s.ggsq": Obj.of(a, etag=None if server_says == "last-modified" else '"a"')}) as srv:
        url = f"{srv.url}/s.ggsq"
        d = kvfast.open(url, head_dim=128)
        srv.honour_if_match = server_says == "if-match"
        local = kvfast.open(tmp_path / "1.ggsq", head_dim=128)
        before = d.values(0, "k")  # fetched before the rewrite
        assert np.array_equal(before, local.values(0, "k"))

        def rewrite(path: str) -> None:  # right after the pass's lookup: before its GETs
            srv.objects[path] = Obj.of(
                b, etag=None if server_says == "last-modified" else '"b"', mtime=mtime_b
            )
            srv.after_head = None

        srv.after_head = rewrite
        with pytest.raises(kvfast.FileChangedError, match="changed since it was opened") as e:
            d.values(3, "k")
        assert e.value.filename == url
        if server_says == "if-match":
            assert any(h.get("If-Match") == '"a"' for h in srv.headers)
        # nothing of version b was kept: rows fetched before read as they were, the others fail
        with pytest.raises(kvfast.FileChangedError):
            d.values(3, "k")
        assert np.array_equal(d.values(0, "k"), before)


@pytest.fixture(scope="module")
def moto() -> Iterator[dict[str, str]]:
    with moto_s3() as env:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield env
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _rewrite_after_lookups(monkeypatch: pytest.MonkeyPatch, key: str, data: bytes) -> None:
    """Rewrite s3 ``key`` with ``data`` right after the next lookup of it (head_object) by the
    file system kvfast reads it with: between a pass's check of the object and its GETs."""
    fs, _ = remote.filesystem(f"s3://{key}")
    real_info, real_ainfo = fs.info, fs._info
    done: list[bool] = []

    def info(path: str, *args: Any, **kwargs: Any) -> Any:
        out = real_info(path, *args, **kwargs)
        if not done:
            done.append(True)
            fsspec.filesystem("s3", skip_instance_cache=True).pipe(key, data)
        return out

    async def ainfo(path: str, *args: Any, **kwargs: Any) -> Any:
        out = await real_ainfo(path, *args, **kwargs)
        if not done:
            done.append(True)
            await fs._pipe_file(key, data)
        return out

    monkeypatch.setattr(fs, "info", info)
    monkeypatch.setattr(fs, "_info", ainfo)


@pytest.mark.parametrize("versioned", [False, True])
def test_s3_gets_are_pinned_to_the_version_opened(
    moto: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, versioned: bool
) -> None:
    a, b = _two_versions(tmp_path)
    bucket = f"kvfast-pin-{int(versioned)}"
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir(bucket)
    if versioned:
        fs.call_s3("put_bucket_versioning", Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    key = f"{bucket}/s.ggsq"
    fs.pipe(key, a)
    d = kvfast.open(f"s3://{key}", head_dim=128)
    local = kvfast.open(tmp_path / "1.ggsq", head_dim=128)
    # the next lookup is the pass's check: the object is rewritten right after it
    _rewrite_after_lookups(monkeypatch, key, b)
    if versioned:
        # the GETs ask for the version opened: its rows, not the new version's
        assert np.array_equal(d.values(3, "k"), local.values(3, "k"))
    else:
        # If-Match the ETag opened: the new version is refused
        with pytest.raises(kvfast.FileChangedError, match="changed since it was opened"):
            d.values(3, "k")
    # either way the next pass sees the change
    with pytest.raises(kvfast.FileChangedError):
        d.values(2, "v")


# -- 14: sizes that cannot be mapped -------------------------------------------------------------------


def _maps(size: int) -> bool:
    """Whether this machine could map ``size`` bytes (the kernel's overcommit rule)."""
    try:
        mode = int(Path("/proc/sys/vm/overcommit_memory").read_text())
        info = {
            ln.split(":")[0]: int(ln.split()[1]) * 1024
            for ln in Path("/proc/meminfo").read_text().splitlines()
        }
    except OSError:
        return True
    if size >= 1 << 47:  # past the user address space of x86-64 and arm64
        return False
    return mode == 1 or (mode == 0 and size <= info["MemTotal"] + info.get("SwapTotal", 0))


@pytest.mark.parametrize("size", [10**12, 10**15, 10**18])
def test_an_object_too_large_to_map_is_a_remote_error_naming_its_size(server: Server, size: int) -> None:
    if _maps(size):
        pytest.skip(f"this machine maps {size} bytes")
    server.objects["/huge.bin"] = Obj.virtual(size, SMALL[:200])
    with pytest.raises(kvfast.RemoteError) as e:
        finishes(lambda: kvfast.open(f"{server.url}/huge.bin"))
    assert f"the object is {size} bytes" in str(e.value) and e.value.errno == errno.ENOMEM
    assert server.sent == 0
