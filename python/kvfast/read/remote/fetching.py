"""The requests a remote state makes, each within kvfast's deadlines
(:mod:`kvfast.read.remote.limits`), on fsspec's event loop: looking an object up, listing, and
ranged GETs of one version of an object.

A ranged GET is pinned to the version opened: S3's ``VersionId`` where the bucket keeps
versions, and ``If-Match`` its ETag (S3 and HTTP; a weak HTTP ETag is compared, not sent); the
answer's size (``Content-Range``), ETag and (HTTP) ``Last-Modified`` are checked against it too,
for servers that ignore ``If-Match``. Another version is a :class:`kvfast.FileChangedError`,
never its bytes. A GET reads no more than it asked for: a server that does not serve ranges
(200 to a ranged GET of part of the object) is an error, not a download of the object."""

from __future__ import annotations

import asyncio
import errno
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvfast.errors import FileChangedError, KvfastError, RemoteError
from kvfast.read.remote.failures import Progress, changed, failed, late
from kvfast.read.remote.limits import LISTING_BYTES
from kvfast.read.remote.storage import HTTP, S3, Store

#: Ranged requests in flight at once for one state.
PARALLEL = 32

#: Bytes a GET's body is read by (each read within the read deadline).
CHUNK = 256 << 10

T = TypeVar("T")


@dataclass(frozen=True)
class Pin:
    """The version of an object that was opened: its size, ETag, modification time and (S3,
    where the bucket keeps versions) version id."""

    size: int
    etag: str | None
    mtime: str | None
    version: str | None = None


def _is_async(s: Store) -> bool:
    return bool(getattr(s.fs, "async_impl", False)) and getattr(s.fs, "loop", None) is not None


def run(s: Store, doing: str, nbytes: int, call: Callable[[], Awaitable[T]], blocking: Callable[[], T]) -> T:
    """``call()`` on the file system's event loop within the deadline of a request of ``nbytes``
    (``blocking()`` where the file system has no loop: its client's own timeouts then). A
    client's exception is a RemoteError naming what was done."""
    if not _is_async(s):
        try:
            return blocking()
        except Exception as e:
            raise failed(s.url, e, doing, s.endpoint) from e
    import fsspec.asyn  # type: ignore[import-untyped]

    progress = Progress()

    async def bounded() -> T:
        try:
            await _session(s)
            return await asyncio.wait_for(call(), s.limits.deadline(nbytes))
        except TimeoutError as e:
            raise late(s, doing, nbytes, progress) from e

    try:
        out: T = fsspec.asyn.sync(s.fs.loop, bounded)
    except Exception as e:
        raise _kvfast_error(s, e, doing, None) from e
    return out


def _kvfast_error(s: Store, e: Exception, doing: str, pin: Pin | None) -> KvfastError:
    """A request's exception as kvfast's: its own as they are, a 412 an object that changed,
    the client's a RemoteError."""
    if isinstance(e, (RemoteError, FileChangedError)):
        return e
    if _precondition_failed(e):
        etag = "" if pin is None else f" {pin.etag}"
        return changed(s.url, f"its ETag is no longer the one opened{etag}")
    return failed(s.url, e, doing, s.endpoint)


async def _session(s: Store) -> None:
    """The client's session made (once), within a lookup's deadline of its own: making it reads
    the client's service models, which is no request and may take a second."""
    make = getattr(s.fs, "set_session", None)
    if make is not None:
        await asyncio.wait_for(make(), s.limits.deadline(0))


def lookup(s: Store) -> dict[str, Any]:
    """fsspec's info of the object, looked up now (not from a listing), within a lookup's deadline."""

    async def call() -> dict[str, Any]:
        s.fs.invalidate_cache(s.path)
        info: dict[str, Any] = await s.fs._info(s.path)
        return info

    def blocking() -> dict[str, Any]:
        s.fs.invalidate_cache(s.path)
        info: dict[str, Any] = s.fs.info(s.path)
        return info

    return run(s, "looking up the object", 0, call, blocking)


def listing(s: Store, what: str, call: Callable[[], Awaitable[T]], blocking: Callable[[], T]) -> T:
    """A listing (a glob, a prefix's objects) within a listing's deadline."""
    return run(s, what, LISTING_BYTES, call, blocking)


def _precondition_failed(e: BaseException) -> bool:
    """Whether ``e`` (or what caused it) is a 412: the object is not the version asked for."""
    seen = 0
    cur: BaseException | None = e
    while cur is not None and seen < 8:
        resp = getattr(cur, "response", None)
        if isinstance(resp, dict):
            err = resp.get("Error") or {}
            meta = resp.get("ResponseMetadata") or {}
            if err.get("Code") == "PreconditionFailed" or meta.get("HTTPStatusCode") == 412:
                return True
        if getattr(cur, "status", None) == 412:
            return True
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return False


def _check(s: Store, pin: Pin, start: int, end: int, content_range: Any, etag: Any, mtime: Any) -> None:
    """The answer to a ranged GET is the range asked (``Content-Range``; None: the whole
    object), of the version pinned: its size, ETag and modification time."""
    if content_range is None:
        got: tuple[int, int, int] | None = (0, pin.size, pin.size)
    else:
        m = re.fullmatch(r"\s*bytes\s+(\d+)-(\d+)/(\d+)\s*", str(content_range))
        got = (int(m.group(1)), int(m.group(2)) + 1, int(m.group(3))) if m else None
    if got is not None and got[2] != pin.size:
        raise changed(s.url, f"size {pin.size} -> {got[2]}")
    if got is None or got[:2] != (start, end):
        raise RemoteError(
            errno.EIO,
            f"{s.url}: reading bytes {start} to {end} failed: {s.endpoint} answered with bytes "
            f"{content_range!r}; expected 'bytes {start}-{end - 1}/{pin.size}'",
            s.url,
        )
    if pin.etag is not None and etag is not None and str(etag) != pin.etag:
        raise changed(s.url, f"etag {pin.etag} -> {etag}")
    if pin.mtime is not None and mtime is not None and str(mtime) != pin.mtime:
        raise changed(s.url, f"mtime {pin.mtime} -> {mtime}")


async def _body(read: Callable[[int], Awaitable[bytes]], n: int, s: Store, progress: Progress) -> bytes:
    """At most ``n`` bytes of a body, each read within the read deadline."""
    chunks: list[bytes] = []
    while progress.got < n:
        async with asyncio.timeout(s.limits.read_timeout):
            chunk = await read(min(CHUNK, n - progress.got))
        if not chunk:
            break
        chunks.append(chunk)
        progress.got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _get_s3(s: Store, pin: Pin, start: int, end: int, progress: Progress) -> bytes:
    bucket, key, version = s.fs.split_path(s.path)
    kw: dict[str, Any] = {"Range": f"bytes={start}-{end - 1}"}
    if pin.etag:
        kw["IfMatch"] = pin.etag
    if version or pin.version:
        kw["VersionId"] = version or pin.version
    resp = await s.fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
    progress.answered = True
    body = resp["Body"]
    try:
        whole = resp.get("ContentRange") is None and resp.get("ContentLength") == pin.size
        _check(s, pin, start, end, None if whole else resp.get("ContentRange", ""), resp.get("ETag"), None)
        return await _body(body.read, end - start, s, progress)
    finally:
        body.close()


async def _get_http(s: Store, pin: Pin, start: int, end: int, progress: Progress) -> bytes:
    import aiohttp

    fs = s.fs
    kw = dict(fs.kwargs)
    kw.pop("timeout", None)
    headers = dict(kw.pop("headers", None) or {})
    headers["Range"] = f"bytes={start}-{end - 1}"
    headers["Accept-Encoding"] = "identity"
    if pin.etag is not None and not pin.etag.startswith("W/"):
        headers["If-Match"] = pin.etag
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=s.limits.connect_timeout, sock_read=s.limits.read_timeout
    )
    session = await fs.set_session()
    async with session.get(fs.encode_url(s.path), headers=headers, timeout=timeout, **kw) as r:
        progress.answered = True
        if r.status == 412:
            raise changed(s.url, f"its ETag is no longer the one opened {pin.etag}")
        if r.status == 404:
            raise FileNotFoundError(s.url)
        if r.status in (401, 403):
            raise PermissionError(f"HTTP {r.status}")
        whole = start == 0 and end == pin.size
        if r.status == 200 and not whole:
            raise RemoteError(
                errno.EIO,
                f"{s.url}: reading bytes {start} to {end} failed: {s.endpoint} answered 200 (the whole "
                "object) to a ranged GET; expected 206 Partial Content (a server that serves byte ranges)",
                s.url,
            )
        if r.status not in (200, 206):
            raise RemoteError(
                errno.EIO,
                f"{s.url}: reading bytes {start} to {end} failed: HTTP {r.status} {r.reason}; expected 206",
                s.url,
            )
        content_range = r.headers.get("Content-Range", "") if r.status == 206 else None
        _check(s, pin, start, end, content_range, r.headers.get("ETag"), r.headers.get("Last-Modified"))
        return await _body(r.content.read, end - start, s, progress)


async def _get_any(s: Store, pin: Pin, start: int, end: int, progress: Progress) -> bytes:
    out: bytes = await s.fs._cat_file(s.path, start=start, end=end)
    progress.answered, progress.got = True, len(out)
    return out


def get_ranges(s: Store, pin: Pin, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes of ``ranges`` (offset, length) of the version ``pin`` of the object, at most
    :data:`PARALLEL` requests at once, each within its deadline."""
    doing = f"reading {len(ranges)} ranges"
    if not _is_async(s):
        starts = [o for o, _ in ranges]
        ends = [o + n for o, n in ranges]
        paths = [s.path] * len(ranges)
        try:
            got = s.fs.cat_ranges(paths, starts, ends, on_error="raise")
        except Exception as e:  # the client's own exception types differ by protocol
            raise failed(s.url, e, doing, s.endpoint) from e
        return [bytes(b) for b in got]
    get = _get_s3 if s.protocol in S3 else _get_http if s.protocol in HTTP else _get_any

    async def one(sem: asyncio.Semaphore, o: int, n: int) -> bytes:
        async with sem:
            progress = Progress()
            what = f"reading bytes {o} to {o + n}"
            try:
                return await asyncio.wait_for(get(s, pin, o, o + n, progress), s.limits.deadline(n))
            except TimeoutError as e:
                raise late(s, what, n, progress) from e
            except Exception as e:
                err = _kvfast_error(s, e, what, pin)
                if err is e:
                    raise
                raise err from e

    if not ranges:
        return []

    async def every() -> list[bytes]:
        try:
            await _session(s)
        except TimeoutError as e:
            raise late(s, doing, 0, Progress()) from e
        sem = asyncio.Semaphore(PARALLEL)
        tasks = [asyncio.ensure_future(one(sem, o, n)) for o, n in ranges]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            errors = [t.exception() for t in tasks if t.done() and not t.cancelled()]
            first = next((e for e in errors if e is not None), None)
            if first is not None:
                raise first
            return [t.result() for t in tasks]
        finally:
            for t in tasks:
                t.cancel()

    import fsspec.asyn

    out: list[bytes] = fsspec.asyn.sync(s.fs.loop, every)
    return out
