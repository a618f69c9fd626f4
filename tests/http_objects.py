"""A local HTTP server of objects for the remote tests, on a free loopback port, in a thread: it
serves byte ranges (HEAD: size, ETag, Last-Modified; GET with a Range: 206 and Content-Range;
If-Match honoured: 412 when it does not match), speaks enough S3 for s3fs (path-style HEAD and
GET of /bucket/key, S3's XML errors), counts the requests and the body bytes it sent, and
misbehaves when told: never answers a GET, trickles a GET's body a byte at a time, rewrites an
object after a GET, ignores If-Match. Objects can be virtual (their bytes made per range), so a
test can serve an 8 GiB object without holding it."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Obj:
    """An object: its size and the bytes of any range of it (``read(start, end)``)."""

    size: int
    read: Callable[[int, int], bytes]
    etag: str | None = '"v1"'
    mtime: str | None = field(default_factory=lambda: formatdate(1_700_000_000, usegmt=True))

    @staticmethod
    def of(data: bytes, etag: str | None = '"v1"', mtime: str | None = None) -> Obj:
        o = Obj(len(data), lambda s, e: data[s:e], etag)
        if mtime is not None:
            o.mtime = mtime
        return o

    @staticmethod
    def virtual(size: int, head: bytes, etag: str = '"v1"') -> Obj:
        """``size`` bytes: ``head``, then zeros (made per range, never held)."""

        def read(s: int, e: int) -> bytes:
            out = head[s:e]
            return out + bytes(max(0, e - max(s, len(head))))

        return Obj(size, read, etag)


@dataclass
class Server:
    """What the server serves and how it behaves; what it served."""

    url: str = ""
    objects: dict[str, Obj] = field(default_factory=dict)
    #: "ok", or "trickle" (a GET's body a byte per ``interval``)
    mode: str = "ok"
    interval: float = 0.05
    #: methods never answered ("GET", "HEAD")
    silent: set[str] = field(default_factory=set)
    honour_if_match: bool = True
    #: whether a GET with a Range gets that range (206), or the whole object (200)
    ranges: bool = True
    #: bytes a ranged GET's answer starts after the range asked (a server that answers another range)
    skew: int = 0
    #: body bytes served at most: later GETs get a 503 (a test of bounded fetching ends)
    budget: int | None = None
    #: called as each HEAD is answered (before its headers are sent) and after each GET is, with
    #: the object's path (rewrite an object here)
    after_head: Callable[[str], None] | None = None
    after_get: Callable[[str], None] | None = None
    requests: Counter[str] = field(default_factory=Counter)
    sent: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, method: str, n: int = 0) -> None:
        with self.lock:
            self.requests[method] += 1
            self.sent += n


def _handler(srv: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _obj(self) -> Obj | None:
            return srv.objects.get(self.path.split("?", 1)[0])

        def _error(self, status: int, code: str) -> None:
            body = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _version(self, o: Obj) -> None:
            if o.etag is not None:
                self.send_header("ETag", o.etag)
            if o.mtime is not None:
                self.send_header("Last-Modified", o.mtime)

        def _silent(self) -> bool:
            if self.command not in srv.silent:
                return False
            srv.count(self.command)
            srv.stop.wait()
            self.close_connection = True
            return True

        def do_HEAD(self) -> None:
            if self._silent():
                return
            srv.count("HEAD")
            o = self._obj()
            if o is None:
                return self._error(404, "NoSuchKey")
            self.send_response(200)
            self.send_header("Content-Length", str(o.size))
            self.send_header("Accept-Ranges", "bytes")
            self._version(o)
            # before the answer leaves: the client's next request cannot reach the server first
            if srv.after_head is not None:
                srv.after_head(self.path.split("?", 1)[0])
            self.end_headers()

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            with srv.lock:
                srv.headers.append(dict(self.headers))
            if self._silent():
                return
            o = self._obj()
            if o is None:
                srv.count("GET")
                return self._error(404, "NoSuchKey")
            if srv.budget is not None and srv.sent >= srv.budget:
                srv.count("GET")
                return self._error(503, "SlowDown")
            want = self.headers.get("If-Match")
            if want is not None and srv.honour_if_match and want != o.etag:
                srv.count("GET")
                return self._error(412, "PreconditionFailed")
            m = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "")) if srv.ranges else None
            start, end = (int(m.group(1)), int(m.group(2) or o.size - 1) + 1) if m else (0, o.size)
            start, end = min(start + srv.skew, o.size - 1), min(end + srv.skew, o.size)
            body = o.read(start, end)
            self.send_response(206 if m else 200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self._version(o)
            if m:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{o.size}")
            self.end_headers()
            sent = 0
            try:
                if srv.mode == "trickle":
                    for i in range(len(body)):
                        if srv.stop.wait(srv.interval):
                            break
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        sent += 1
                else:
                    self.wfile.write(body)
                    sent = len(body)
            except OSError:  # the client gave up
                self.close_connection = True
            srv.count("GET", sent)
            if srv.after_get is not None:
                srv.after_get(path)

    return Handler


@contextmanager
def serve(objects: dict[str, Obj] | None = None) -> Iterator[Server]:
    """Serve ``objects`` (by path, ``/bucket/key``) on a free loopback port; yields the
    :class:`Server` (its ``url`` the base URL), stopped on exit (stalled requests let go)."""
    srv = Server(objects=dict(objects or {}))

    class Threads(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 64

    httpd = Threads(("127.0.0.1", 0), _handler(srv))
    srv.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.stop.set()
        httpd.shutdown()
        httpd.server_close()
