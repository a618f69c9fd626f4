"""States in object storage: ``kvfast.open("s3://bucket/key")`` without downloading them whole.

A URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, anything `fsspec <https://filesystem-spec.readthedocs.io>`_
has a file system for) is read by ranged requests into a sparse copy of the object (an anonymous
map of its size: pages never fetched cost no memory). The walk fetches the object's head, then
the cell metadata and record headers it reads, in a few rounds (kvfast-core's ``sparse``); every
later pass (values, tables, statistics, comparisons, scans, exports) first checks that the
object is unchanged (size, ETag, modification time: else :class:`kvfast.FileChangedError`) and
fetches the rows of the records it reads, the pages not fetched yet, in parallel requests (fsspec's ``cat_ranges``).
A pass never reads a byte that was not fetched: that is checked in Rust
(:class:`kvfast.NotFetchedError`), never zeros in its place. ``file://`` URLs and plain paths
stay memory-mapped.

Credentials and the endpoint come from the standard AWS variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``), or from ``storage_options``
(fsspec's / s3fs's options: ``key``, ``secret``, ``endpoint_url``, ``client_kwargs``, ...), as
Polars and pyarrow take them. Requests time out (connect 10 s, read 60 s, 3 attempts, unless
``storage_options`` says otherwise), so an endpoint that does not answer is an error, not a hang.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kvfast.errors import FileChangedError, RemoteError

#: Options of fsspec's S3 file system (s3fs) when ``storage_options`` does not give them: timeouts
#: and retries, so that no request waits for ever.
S3_DEFAULTS: dict[str, Any] = {
    "config_kwargs": {"connect_timeout": 10, "read_timeout": 60, "retries": {"max_attempts": 3}},
}

StorageOptions = Mapping[str, Any] | None

#: Ranged requests in flight at once for one state.
PARALLEL = 32


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an object in storage (a URL other than ``file://``)."""
    p = os.fspath(path)
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", p)
    return m is not None and m.group(1).lower() not in ("file", "local")


def local_path(path: str | os.PathLike[str]) -> str:
    """A plain path for a ``file://`` URL (and any path)."""
    p = os.fspath(path)
    return p[len("file://") :] if p.lower().startswith("file://") else p


def _options(url: str, storage_options: StorageOptions) -> dict[str, Any]:
    opts = dict(storage_options or {})
    if url.split("://", 1)[0].lower() in ("s3", "s3a"):
        for k, v in S3_DEFAULTS.items():
            opts.setdefault(k, v)
        client = dict(opts.get("client_kwargs") or {})
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in opts:
            client.setdefault("endpoint_url", endpoint)
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            client.setdefault("region_name", region)
        if client:
            opts["client_kwargs"] = client
    return opts


_LOCK = threading.Lock()
_FILESYSTEMS: dict[tuple[str, str], Any] = {}
#: The environment a file system's credentials and endpoint come from.
_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)


def filesystem(url: str, storage_options: StorageOptions = None) -> tuple[Any, str]:
    """fsspec's file system for ``url`` (one per protocol and options, shared) and the path in it;
    without ``storage_options``, the environment's credentials and endpoint."""
    import fsspec.core  # type: ignore[import-untyped]

    opts = _options(url, storage_options)
    protocol = url.split("://", 1)[0].lower()
    # one file system per protocol, options and credentials in the environment (fsspec's own
    # cache would keep a file system made before the environment changed)
    env = tuple(os.environ.get(k) for k in _ENV)
    key = (protocol, repr(sorted(opts.items(), key=lambda kv: kv[0])) + repr(env))
    with _LOCK:
        fs = _FILESYSTEMS.get(key)
    if fs is not None:
        return fs, fs._strip_protocol(url)
    try:
        fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True, **opts)
    except ImportError as e:
        raise RemoteError(
            95,
            f"{url}: reading {protocol}:// needs fsspec's file system for it ({e}); "
            "pip install 'kvfast[s3]' for S3",
            url,
        ) from e
    with _LOCK:
        fs = _FILESYSTEMS.setdefault(key, fs)
    return fs, path


def _failed(url: str, e: BaseException, doing: str) -> RemoteError:
    """A client's exception as a RemoteError that names the URL and what was expected."""
    if isinstance(e, RemoteError):
        return e
    name = type(e).__name__
    text = str(e) or name
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the provider's default endpoint"
    if isinstance(e, FileNotFoundError):
        why = "no such object (expected an existing object: check the bucket and the key)"
    elif "Credential" in name or "credential" in text.lower():
        why = (
            "no credentials (expected AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, or "
            "storage_options={'key': ..., 'secret': ...}; storage_options={'anon': True} for a public bucket)"
        )
    elif isinstance(e, PermissionError):
        why = "access refused (expected credentials allowed to read the object)"
    elif "connect" in text.lower() or "timeout" in name.lower() or "timed out" in text.lower():
        why = f"the endpoint did not answer ({endpoint}; expected an S3-compatible server there)"
    else:
        why = f"{name}: {text}"
    return RemoteError(2 if isinstance(e, FileNotFoundError) else 5, f"{url}: {doing} failed: {why}", url)


class _Fetcher:
    """``fetch(ranges) -> list[bytes]`` for kvfast-core: the ranges of one object, in parallel,
    after checking that the object is still the one opened (its size, ETag and modification
    time), as a local state checks its file before each pass."""

    def __init__(self, url: str, fs: Any, path: str, stamp: dict[str, Any]) -> None:
        self.url, self.fs, self.path, self.stamp = url, fs, path, stamp
        self.checked = True  # just looked up: the walk's first round needs no second look

    def __call__(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        if not self.checked:
            now = _stamp(self.fs, self.path, self.url)
            if now != self.stamp:
                what = ", ".join(f"{k} {self.stamp[k]} -> {now[k]}" for k in now if now[k] != self.stamp[k])
                err = FileChangedError(f"{self.url} changed since it was opened: {what}; open it again")
                err.filename = self.url  # type: ignore[attr-defined]  # set by the binding too
                raise err
        self.checked = False
        starts = [o for o, _ in ranges]
        ends = [o + n for o, n in ranges]
        # at most PARALLEL requests at once (fsspec's async file systems: s3, gcs, http, ...)
        batch = {"batch_size": PARALLEL} if getattr(self.fs, "async_impl", False) else {}
        try:
            got = self.fs.cat_ranges([self.path] * len(ranges), starts, ends, on_error="raise", **batch)
        except Exception as e:  # the client's own exception types differ by protocol
            raise _failed(self.url, e, f"reading {len(ranges)} ranges") from e
        return [bytes(b) for b in got]


def real(path: str | os.PathLike[str]) -> str:
    """What names a state for ids and deduplication: a URL as given (its protocol lowercased),
    a path as its real path."""
    p = os.fspath(path)
    if is_url(p):
        scheme, rest = p.split("://", 1)
        return f"{scheme.lower()}://{rest}"
    return os.path.realpath(local_path(p))


def dump_id_of_url(url: str) -> str:
    """The stable id of a remote state: the object's stem and 10 hex digits of the URL's SHA-1."""
    u = real(url)
    name = u.rstrip("/").rsplit("/", 1)[-1]
    stem = name.rsplit(".", 1)[0] if "." in name else name
    stem = re.sub(r"[^A-Za-z0-9_.+-]", "_", stem).lstrip("._") or "state"
    return f"{stem}-{hashlib.sha1(u.encode()).hexdigest()[:10]}"


def _stamp(fs: Any, path: str, url: str) -> dict[str, Any]:
    """The object's size, ETag and modification time, looked up now (not from a listing)."""
    try:
        fs.invalidate_cache(path)
        i = fs.info(path)
    except Exception as e:
        raise _failed(url, e, "looking up the object") from e
    if i.get("type") == "directory":
        raise RemoteError(21, f"{url}: a prefix (a folder), not an object: give a state's key", url)
    mtime = i.get("LastModified") or i.get("mtime") or i.get("last_modified")
    etag = i.get("ETag") or i.get("etag") or i.get("md5")
    return {"size": int(i["size"]), "etag": None if etag is None else str(etag), "mtime": str(mtime)}


def info(url: str, storage_options: StorageOptions = None) -> dict[str, Any]:
    """The object's size and what tells its version (ETag, modification time), as stored now."""
    fs, path = filesystem(url, storage_options)
    return _stamp(fs, path, url)


def source(
    url: str, storage_options: StorageOptions = None
) -> tuple[int, Callable[[list[tuple[int, int]]], list[bytes]]]:
    """The state at ``url`` as :func:`kvfast._kvfast.open` reads it: its size, and the callable
    that fetches byte ranges of it (the object's version checked at each fetch)."""
    fs, path = filesystem(url, storage_options)
    stamp = _stamp(fs, path, url)
    return int(stamp["size"]), _Fetcher(url, fs, path, stamp)


def expand(url: str, suffixes: set[str], storage_options: StorageOptions = None) -> list[str]:
    """A URL's state objects, as URLs: a glob's matches, a prefix's objects of ``suffixes``, or
    the object itself, listed with ``storage_options``; the caller opens them with the same ones
    (:class:`kvfast.read.opening.Opening` carries them to each open)."""
    fs, path = filesystem(url, storage_options)
    protocol = url.split("://", 1)[0]
    try:
        if any(c in path for c in "*?["):
            found = sorted(fs.glob(path))
        elif fs.isdir(path):
            found = sorted(
                p
                for p in fs.find(path, maxdepth=1)
                if os.path.splitext(p)[1] in suffixes and not os.path.basename(p).startswith(".")
            )
        else:
            return [url]
    except Exception as e:
        raise _failed(url, e, "listing the objects") from e
    return [f"{protocol}://{p}" for p in found]
