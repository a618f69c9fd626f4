"""fsspec's file system for a URL, made once per protocol, options and credentials: the
environment's credentials, endpoint and region for S3; the clients' own timeouts set from
kvfast's deadlines (:mod:`kvfast.read.remote.limits`) unless ``storage_options`` sets them."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kvfast.errors import RemoteError
from kvfast.read.remote.limits import Limits, split
from kvfast.read.remote.names import protocol

StorageOptions = Mapping[str, Any] | None

S3 = ("s3", "s3a")
HTTP = ("http", "https")


@dataclass(frozen=True)
class Store:
    """Where an object is: its URL, fsspec's file system and the path in it, the endpoint that
    serves it (as error messages name it) and kvfast's limits for reading it."""

    url: str
    fs: Any
    path: str
    endpoint: str
    limits: Limits

    @property
    def protocol(self) -> str:
        return protocol(self.url)


def _s3_endpoint(opts: Mapping[str, Any]) -> str | None:
    client = opts.get("client_kwargs") or {}
    given = opts.get("endpoint_url") or client.get("endpoint_url")
    return str(given) if given else None


def _options(url: str, opts: dict[str, Any], limits: Limits) -> dict[str, Any]:
    p = protocol(url)
    if p in S3:
        config = {
            "connect_timeout": limits.connect_timeout,
            "read_timeout": limits.read_timeout,
            "retries": {"max_attempts": 3},
        }
        opts["config_kwargs"] = {**config, **dict(opts.get("config_kwargs") or {})}
        client = dict(opts.get("client_kwargs") or {})
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in opts:
            client.setdefault("endpoint_url", endpoint)
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            client.setdefault("region_name", region)
        if client:
            opts["client_kwargs"] = client
    elif p in HTTP:
        import aiohttp

        client = dict(opts.get("client_kwargs") or {})
        client.setdefault(
            "timeout",
            aiohttp.ClientTimeout(
                total=None, sock_connect=limits.connect_timeout, sock_read=limits.read_timeout
            ),
        )
        opts["client_kwargs"] = client
    return opts


def endpoint_of(url: str, opts: Mapping[str, Any]) -> str:
    """The endpoint that serves ``url`` with these options (fsspec's), as a message names it."""
    p = protocol(url)
    if p in HTTP:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}"
    if p in S3:
        return _s3_endpoint(opts) or "the provider's default endpoint"
    return f"{p}'s endpoint"


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


def store(url: str, storage_options: StorageOptions = None) -> Store:
    """The :class:`Store` of ``url``: fsspec's file system for it (one per protocol, options and
    credentials in the environment, shared), kvfast's limits from ``storage_options["kvfast"]``."""
    import fsspec.core  # type: ignore[import-untyped]

    limits, given = split(storage_options)
    opts = _options(url, given, limits)
    p = protocol(url)
    where = endpoint_of(url, opts)
    # one file system per protocol, options and credentials in the environment (fsspec's own
    # cache would keep a file system made before the environment changed)
    env = tuple(os.environ.get(k) for k in _ENV)
    key = (p, repr(sorted(opts.items(), key=lambda kv: kv[0])) + repr(env))
    with _LOCK:
        fs = _FILESYSTEMS.get(key)
    if fs is not None:
        return Store(url, fs, fs._strip_protocol(url), where, limits)
    try:
        fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True, **opts)
    except ImportError as e:
        raise RemoteError(
            95,
            f"{url}: reading {p}:// needs fsspec's file system for it ({e}); pip install 'kvfast[s3]' for S3",
            url,
        ) from e
    with _LOCK:
        fs = _FILESYSTEMS.setdefault(key, fs)
    return Store(url, fs, path, where, limits)


def filesystem(url: str, storage_options: StorageOptions = None) -> tuple[Any, str]:
    """fsspec's file system for ``url`` (see :func:`store`) and the path in it."""
    s = store(url, storage_options)
    return s.fs, s.path
