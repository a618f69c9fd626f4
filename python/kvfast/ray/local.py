"""A Ray cluster of several nodes on this machine, for tests and benchmarks: a head and more worker
nodes, each its own ``ray start --block`` (its own raylet and object store) with a few CPUs, and
this process connected as the driver. Leaving it stops exactly the processes it started.

    with LocalCluster(nodes=2, cpus=1) as cluster:
        ...  # ray is initialized, connected to cluster.address
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

import ray

from kvfast.errors import ClusterError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalCluster:
    """`nodes` nodes of `cpus` CPUs each on this machine; `env` is added to the nodes' environment
    (``RAYON_NUM_THREADS=1`` makes a node's Rust work use one core, say). Token authentication is
    off (``RAY_AUTH_MODE=disabled``, for the nodes and this process): every port is on 127.0.0.1."""

    def __init__(self, nodes: int = 2, cpus: int = 1, env: dict[str, str] | None = None) -> None:
        self.nodes = nodes
        self.cpus = cpus
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        self.procs: list[subprocess.Popen[bytes]] = []
        # short: Ray's socket paths have a length limit
        self.tmp = Path(tempfile.mkdtemp(prefix="kvray-", dir="/tmp"))
        self.address = f"127.0.0.1:{_free_port()}"
        self._saved = os.environ.get("RAY_AUTH_MODE")

    def _start(self, args: list[str], name: str) -> None:
        cli = str(Path(sys.executable).parent / "ray")
        common = [
            f"--num-cpus={self.cpus}",
            "--node-ip-address=127.0.0.1",
            "--disable-usage-stats",
            f"--dashboard-agent-listen-port={_free_port()}",
            "--block",
        ]
        with (self.tmp / f"{name}.log").open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [cli, "start", *args, *common],
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def _wait(self, ok: Callable[[], bool], what: str) -> None:
        for _ in range(240):  # two minutes
            if ok():
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        logs = "\n".join(f.read_text(errors="replace")[-3000:] for f in sorted(self.tmp.glob("*.log")))
        self.stop()
        raise ClusterError(f"the local Ray cluster did not come up ({what}):\n{logs}")

    def _head_up(self) -> bool:
        cli = str(Path(sys.executable).parent / "ray")
        probe = [cli, "status", f"--address={self.address}"]
        return subprocess.run(probe, env=self.env, capture_output=True, check=False).returncode == 0

    def _all_up(self) -> bool:
        nodes = ray.nodes()  # type: ignore[no-untyped-call]
        return len([n for n in nodes if n["Alive"]]) >= self.nodes

    def start(self) -> str:
        port = self.address.rsplit(":", 1)[1]
        head = ["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={self.tmp / 'ray'}"]
        self._start(head, "head")
        self._wait(self._head_up, "head")
        for i in range(1, self.nodes):
            self._start([f"--address={self.address}"], f"node{i}")
        os.environ["RAY_AUTH_MODE"] = "disabled"
        ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False)
        self._wait(self._all_up, f"{self.nodes} nodes")
        return self.address

    def stop(self) -> None:
        """Disconnect, then stop the nodes (each ``ray start --block`` stops what it started)."""
        ray.shutdown()
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()
        if self._saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = self._saved
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
