"""Remote benchmark: a 28-layer state (`kvfast.synth`, f16, 1,024 cells of 1,024 values per K and
V row: 2 MiB per record, 112 MiB) in a local S3-compatible server (moto's server mode, started
here), read by kvfast from s3:// against a plain script that downloads the object whole (fsspec,
as boto3 would) and computes the same statistics with NumPy.

Counts the bytes kvfast fetched: opening (the metadata walk), one layer's per-channel statistics
(about 1/28 of the state plus the metadata), every layer's; and times each (best of --repeat, a
fresh open each time, so nothing is fetched already). The bytes are what a real bucket would
serve. moto's times are not a bucket's: it copies the whole object for every ranged GET and
serves requests one at a time (a 4 KiB range of a 112 MiB object takes about 0.1 s), which
punishes exactly the ranged reads kvfast makes; so the same queries are also timed over HTTP
(fsspec's http://, the same ranged requests) from a small threaded server of the file's ranges on
loopback, as a bucket serves them. Prints a table and writes bench-out/remote.json.

    python benches/bench_remote.py [--repeat 3] [--cells 1024]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
from timing import best

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from s3_server import moto_s3

import kvfast
from kvfast import synth

N_LAYER = 28
N_EMBD = 1024
HEAD_DIM = 128
LAYER = 7


def plain_channel_stats(fs: object, key: str, records: tuple[int, int, int, int]) -> list[np.ndarray]:
    """What a script without kvfast does: download the object whole, then NumPy over one layer's K
    and V records (their offsets taken from the format: given here)."""
    whole = fs.cat(key)  # type: ignore[attr-defined]
    out = []
    for offset, nbytes in (records[:2], records[2:]):
        rows = np.frombuffer(whole, dtype="<f2", count=nbytes // 2, offset=offset).reshape(-1, N_EMBD)
        x = rows.astype(np.float64)
        out.append(np.stack([x.mean(0), x.std(0), np.abs(x).max(0)]))
    return out


@contextlib.contextmanager
def serve_ranges(root: Path) -> Iterator[str]:
    """Serve the files of ``root`` over HTTP with Range requests (HEAD gives the size), one thread
    per request, on a free loopback port; yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _file(self) -> Path:
            return root / self.path.lstrip("/")

        def do_HEAD(self) -> None:
            f = self._file()
            self.send_response(200)
            self.send_header("Content-Length", str(f.stat().st_size))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

        def do_GET(self) -> None:
            f = self._file()
            size = f.stat().st_size
            m = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            start, end = (int(m.group(1)), int(m.group(2) or size - 1)) if m else (0, size - 1)
            end = min(end, size - 1)
            with open(f, "rb") as fh:
                fh.seek(start)
                body = fh.read(end - start + 1)
            self.send_response(206 if m else 200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            if m:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            self.wfile.write(body)

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # the client's parallel requests (the default 5 drops SYNs)

    server = Server(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def queries(
    url: str, fs: object, key: str, offsets: tuple[int, int, int, int], want: object, repeat: int
) -> dict[str, tuple[float, int, int]]:
    """(seconds, bytes fetched, rounds) of each query on ``url`` (``fs``/``key``: the same object
    for the plain script)."""
    fetched: dict[str, tuple[int, int]] = {}

    def run(name: str, query: Callable[[kvfast.State], object]) -> Callable[[], object]:
        def once() -> object:
            d = kvfast.open(url, head_dim=HEAD_DIM)
            out = query(d)
            fetched[name] = (d.fetched_bytes, d.fetch_rounds)
            return out

        return once

    def one(d: kvfast.State) -> object:
        out = d.stats(by="channel", layers=[LAYER])
        assert out.equals(want)
        return out

    def plain() -> object:
        return plain_channel_stats(fs, key, offsets)

    out = {}
    for name, fn in (
        ("open", run("open", lambda d: d)),
        ("one layer", run("one layer", one)),
        ("every layer", run("every layer", lambda d: d.stats(by="channel"))),
    ):
        t = best(fn, repeat)
        out[name] = (t, *fetched[name])
    out["plain: download whole + NumPy, one layer"] = (best(plain, repeat), -1, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cells", type=int, default=1024)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, moto_s3() as env:
        os.environ.update(env)
        import fsspec

        path = Path(tmp) / "state28.ggsq"
        size = synth.write_state(
            path, container="ggsq", cells=args.cells, n_layer=N_LAYER, n_embd_k=N_EMBD, seed=1
        )
        fs = fsspec.filesystem("s3")
        fs.mkdir("bench")
        fs.put(str(path), "bench/state28.ggsq")
        url = "s3://bench/state28.ggsq"
        local = kvfast.open(path, head_dim=HEAD_DIM)
        rec = local.caches[0].streams[0].layers[LAYER]
        want = local.stats(by="channel", layers=[LAYER])

        offsets = (rec.k_offset, rec.k_nbytes, rec.v_offset, rec.v_nbytes)
        results = {"s3 (moto)": queries(url, fs, "bench/state28.ggsq", offsets, want, args.repeat)}
        with serve_ranges(Path(tmp)) as base:
            http = fsspec.filesystem("http")
            results["http (threaded range server)"] = queries(
                f"{base}/state28.ggsq", http, f"{base}/state28.ggsq", offsets, want, args.repeat
            )
        rows = []
        print(f"state: {N_LAYER} layers, {args.cells} cells, {size / 2**20:.1f} MiB (best of {args.repeat})")
        print(f"{'server':30} {'query':42} {'fetched':>12} {'of state':>9} {'rounds':>7} {'time':>9}")
        for server, res in results.items():
            for name, (t, b, r) in res.items():
                b = size if b < 0 else b
                print(f"{server:30} {name:42} {b / 2**20:8.2f} MiB {b / size:9.4f} {r:7d} {t:8.3f}s")
                rows.append(
                    {
                        "server": server,
                        "query": name,
                        "bytes": b,
                        "ratio": b / size,
                        "rounds": r,
                        "seconds": t,
                    }
                )
        one, opened = results["s3 (moto)"]["one layer"][1], results["s3 (moto)"]["open"][1]
        print(
            f"one layer: {(one - opened) / (size / N_LAYER):.3f} x 1/{N_LAYER} of the state,"
            f" plus {opened / 2**20:.2f} MiB of metadata"
        )
        out = Path("bench-out")
        out.mkdir(exist_ok=True)
        (out / "remote.json").write_text(json.dumps({"size": size, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
