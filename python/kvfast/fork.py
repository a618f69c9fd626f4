"""kvfast in processes made by ``fork()`` (``multiprocessing``'s default start method on Linux
before Python 3.14).

kvfast's own parallel passes (statistics, comparisons, quantization losses, exports: Rust) run in a
thread pool of kvfast's that a forked child builds again, so they work in a child forked at any
time. Polars' thread pool cannot be: a child forked after Polars started its threads hangs in the
first Polars operation that uses them (a filter, a sort, a frame made from Arrow), and every kvfast
table is a Polars frame. So a child forked while Polars' threads run gets a :class:`ForkWarning`
saying so; start such workers with ``multiprocessing.get_context("spawn")`` or ``"forkserver"``.
"""

from __future__ import annotations

import os
import re
import warnings

from kvfast.errors import ForkWarning

#: Polars' worker threads are named polars-0, polars-1, ...
_POLARS_THREAD = re.compile(r"polars-\d+")
#: whether this process's parent ran Polars' threads when it forked it (or was such a child)
_broken = False
#: `_broken` for the child of the fork under way
_pending = False


def polars_threads() -> int:
    """How many of Polars' worker threads this process runs (0 where /proc cannot tell)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    n = 0
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                n += bool(_POLARS_THREAD.fullmatch(f.read().strip()))
        except OSError:
            continue  # a thread that ended meanwhile
    return n


def polars_forked() -> bool:
    """Whether this process was forked while its parent ran Polars' threads (or from such a
    child): Polars operations may then never return here; kvfast's own passes do."""
    return _broken


def _before() -> None:
    global _pending
    _pending = _broken or polars_threads() > 0


def _in_child() -> None:
    global _broken
    _broken = _pending
    if _broken:
        warnings.warn(
            "this process was forked while Polars' threads ran: kvfast's own passes work here, but a "
            "Polars operation (every kvfast table is a Polars frame) may never return; start workers "
            "with multiprocessing.get_context('spawn') or 'forkserver' (see kvfast.fork)",
            ForkWarning,
            stacklevel=1,
        )


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before, after_in_child=_in_child)
