"""Progress of an export, in bytes of the states read (not whole states: one long state can take
minutes), shown by tqdm on stderr.

Workers advance it from several threads after each record; a state skipped or failed advances by
what is left of its size, so the bar always ends at the total. Shown when asked, or by default when
stderr is a terminal; on a terminal that reports no size (a pty whose size was never set, as some CI
runners and ``docker exec -t`` give: tqdm then draws nothing) it is drawn 80 columns wide.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any


def screen(stream: Any) -> dict[str, Any]:
    """tqdm's size options for `stream`: none where the terminal reports its size (the bar follows
    it), a fixed 80 x 20 where a terminal reports 0 x 0 (tqdm would hide the bar at row 0)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return {}
    if size.columns > 0 and size.lines > 0:
        return {"dynamic_ncols": True}
    return {"ncols": size.columns if size.columns > 0 else 80, "nrows": size.lines if size.lines > 0 else 20}


class Progress:
    """A byte counter over `total` bytes of `states` states; a no-op when not shown."""

    def __init__(self, total: int, states: int, show: bool | None) -> None:
        self._lock = threading.Lock()
        self._bar: Any = None
        self._states = states
        self._done = 0
        if show is False:
            return
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover - tqdm is a dependency
            return
        self._bar = tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc="kvfast export",
            file=sys.stderr,
            # None: shown only when stderr is a terminal; True: always
            disable=None if show is None else False,
            **screen(sys.stderr),
        )
        self._bar.set_postfix_str(f"0/{states} states", refresh=False)

    def advance(self, nbytes: int) -> None:
        if self._bar is not None and nbytes > 0:
            with self._lock:
                self._bar.update(nbytes)

    def state_done(self) -> None:
        if self._bar is not None:
            with self._lock:
                self._done += 1
                self._bar.set_postfix_str(f"{self._done}/{self._states} states")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
