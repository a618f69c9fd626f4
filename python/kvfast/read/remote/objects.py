"""A remote state's object: its version looked up (size, ETag, modification time, S3 version id),
the fetch kvfast-core calls for its ranges (the version checked before each pass and pinned on
every GET), and a URL expanded to the objects it names."""

from __future__ import annotations

import os
from typing import Any

from kvfast.errors import RemoteError
from kvfast.read.remote.failures import changed
from kvfast.read.remote.fetching import Pin, get_ranges, listing, lookup
from kvfast.read.remote.limits import Limits
from kvfast.read.remote.names import protocol
from kvfast.read.remote.storage import HTTP, StorageOptions, Store, store


def _stamp(s: Store) -> tuple[dict[str, Any], Pin]:
    """The object's size, ETag and modification time, looked up now (not from a listing), and
    the version to pin its GETs to."""
    i = lookup(s)
    if i.get("type") == "directory":
        raise RemoteError(21, f"{s.url}: a prefix (a folder), not an object: give a state's key", s.url)
    mtime = i.get("LastModified") or i.get("mtime") or i.get("last_modified") or i.get("Last-Modified")
    etag = i.get("ETag") or i.get("etag") or i.get("md5")
    if i.get("size") is None:
        raise RemoteError(
            5,
            f"{s.url}: looking up the object failed: {s.endpoint} gave no size (expected Content-Length)",
            s.url,
        )
    size, tag = int(i["size"]), None if etag is None else str(etag)
    stamp: dict[str, Any] = {"size": size, "etag": tag, "mtime": str(mtime)}
    version = i.get("VersionId")
    pin = Pin(
        size,
        tag,
        # the modification time an HTTP answer carries, to compare (S3's comes as a date)
        str(i["Last-Modified"]) if i.get("Last-Modified") else None,
        str(version) if version and version != "null" else None,
    )
    return stamp, pin


class Fetcher:
    """``fetch(ranges) -> list[bytes]`` for kvfast-core: the ranges of one version of an object
    (:class:`~kvfast.read.remote.fetching.Pin`), in parallel, after checking that the object is
    still the one opened (its size, ETag and modification time), as a local state checks its
    file before each pass."""

    def __init__(self, s: Store, stamp: dict[str, Any], pin: Pin) -> None:
        self.store, self.stamp, self.pin = s, stamp, pin
        self.url = s.url
        self.checked = True  # just looked up: the walk's first round needs no second look

    @property
    def limits(self) -> Limits:
        return self.store.limits

    def __call__(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        if not self.checked:
            now, _ = _stamp(self.store)
            if now != self.stamp:
                what = ", ".join(f"{k} {self.stamp[k]} -> {now[k]}" for k in now if now[k] != self.stamp[k])
                raise changed(self.url, what)
        self.checked = False
        return get_ranges(self.store, self.pin, ranges)


def info(url: str, storage_options: StorageOptions = None) -> dict[str, Any]:
    """The object's size and what tells its version (ETag, modification time), as stored now."""
    return _stamp(store(url, storage_options))[0]


def source(url: str, storage_options: StorageOptions = None) -> tuple[int, Fetcher]:
    """The state at ``url`` as :func:`kvfast._kvfast.open` reads it: its size, and the callable
    that fetches byte ranges of it (the object's version checked at each fetch, pinned on each
    GET; ``fetch.limits.metadata_limit`` the most bytes its walk fetches)."""
    s = store(url, storage_options)
    stamp, pin = _stamp(s)
    return int(stamp["size"]), Fetcher(s, stamp, pin)


def expand(url: str, suffixes: set[str], storage_options: StorageOptions = None) -> list[str]:
    """A URL's state objects, as URLs: a glob's matches, a prefix's objects of ``suffixes``, or
    the object itself, listed with ``storage_options``; the caller opens them with the same ones
    (:class:`kvfast.read.opening.Opening` carries them to each open). Over HTTP, where every URL
    is also a page of links, only a URL ending in ``/`` is listed (its page fetched): any other is
    the object itself, not fetched here."""
    s = store(url, storage_options)
    fs, path = s.fs, s.path
    p = url.split("://", 1)[0]

    def objects(found: list[str]) -> list[str]:
        return sorted(
            f for f in found if os.path.splitext(f)[1] in suffixes and not os.path.basename(f).startswith(".")
        )

    if any(c in path for c in "*?["):
        found = listing(s, "listing the objects", lambda: fs._glob(path), lambda: fs.glob(path))
        found = sorted(found)
    else:
        # a folder's objects; an http(s) URL is one only when it ends in /: fsspec's isdir GETs the
        # whole object to tell
        if protocol(url) in HTTP:
            is_dir = path.endswith("/")
        else:
            is_dir = listing(s, "listing the objects", lambda: fs._isdir(path), lambda: fs.isdir(path))
        if not is_dir:
            return [url]
        found = objects(
            listing(
                s,
                "listing the objects",
                lambda: fs._find(path, maxdepth=1),
                lambda: fs.find(path, maxdepth=1),
            )
        )
    if protocol(url) in HTTP:
        return [str(f) for f in found]
    return [f"{p}://{f}" for f in found]
