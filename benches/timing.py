"""What every benchmark here times with: the best of several runs, and the peak anonymous memory
of a child process."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def best(fn: Callable[[], object], repeat: int) -> float:
    """The shortest of `repeat` runs of `fn`, in seconds (its result freed before the next run)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
        del out
    return min(times)


class PeakRssAnon:
    """The largest RssAnon of a running child process (its own memory: mapped file pages count in
    VmRSS, not here), sampled every `every` seconds from a thread until the child exits; started
    at once, :meth:`join` gives it in bytes once the child is done."""

    def __init__(self, proc: subprocess.Popen[Any], every: float) -> None:
        self.peak = 0
        self._proc, self._every = proc, every
        self._thread = threading.Thread(target=self._sample)
        self._thread.start()

    def _sample(self) -> None:
        status = Path(f"/proc/{self._proc.pid}/status")
        while self._proc.poll() is None:
            try:
                for line in status.read_text().splitlines():
                    if line.startswith("RssAnon:"):
                        self.peak = max(self.peak, int(line.split()[1]) * 1024)
            except OSError:
                pass
            time.sleep(self._every)

    def join(self) -> int:
        self._thread.join()
        return self.peak
