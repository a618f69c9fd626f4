"""A local S3-compatible server for the tests and the remote benchmark: moto's server mode
(``moto[server]``, a real HTTP server speaking S3; no mock of the client), on a free loopback port,
in a child process stopped on exit."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

#: Credentials moto accepts (any are accepted; these say they are for tests).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def moto_s3(start_timeout: float = 60.0) -> Iterator[dict[str, str]]:
    """Run moto's S3 server; yields the AWS variables that point a client at it."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MOTO_PORT": str(port)},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"moto_server exited with status {proc.returncode}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not answer on {url} in {start_timeout} s") from None
                time.sleep(0.2)
        yield {"AWS_ENDPOINT_URL": url, **CREDENTIALS}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
