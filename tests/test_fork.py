"""kvfast in processes forked after a parallel pass (issue 24, item 15). rayon's global pool cannot
be re-created in a forked child: every kvfast pass runs in kvfast's own pool, which a child builds
again. Polars' pool cannot be rebuilt (not kvfast's), so the children here read kvfast's passes as
Arrow (pyarrow's pools survive a fork), and a child forked while Polars' threads ran is warned.
A child that hangs fails the test (a watchdog), it never blocks the suite."""

import multiprocessing as mp
import warnings
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa
import pytest
from conftest import DATA

import kvfast
from kvfast import _kvfast, fork
from kvfast.analysis import measure

F16 = str(DATA / "qwen3tiny-f16-fa/seq-0.bin")
Q8 = str(DATA / "qwen3tiny-q8_0-fa/seq-0.bin")
#: long enough for the slowest machine; a hang is forever
WATCHDOG_S = 120


def passes(path: str) -> dict[str, Any]:
    """Each of kvfast's parallel passes (statistics of every grouping, a quantization loss, a
    comparison) as pyarrow reads them: no Polars."""
    d = kvfast.open(path, head_dim=32)
    state, sel = d._live(), measure.select(d, None, None)
    out: dict[str, Any] = {"cell": pa.table(_kvfast.cell_stats(state, sel, 0)).column("mean").to_pylist()}
    for by, t in zip(("channel", "head", "layer"), _kvfast.aggregate_stats(state, sel, 0), strict=True):
        out[by] = pa.table(t).column("mean").to_pylist()
    out["quant_error"] = (
        pa.table(_kvfast.quant_error(state, "q4_0", sel, 0, (0, 0))[0]).column("mse").to_pylist()
    )
    other = kvfast.open(path, head_dim=32)
    out["compare"] = pa.table(_kvfast.compare(state, other._live(), sel)[0]).column("mse").to_pylist()
    out["values"] = float(d.values(0, "k").astype("float64").sum())
    return out


def in_fork(f: Any, *args: Any) -> Any:
    """`f(*args)` in a child forked now (a Pool of the fork start method), under the watchdog."""
    with mp.get_context("fork").Pool(1) as pool:
        return pool.apply_async(f, args).get(timeout=WATCHDOG_S)


@pytest.mark.parametrize("path", [F16, Q8])
def test_a_forked_child_runs_parallel_passes_after_the_parent(path: str) -> None:
    # the parent's pools started: kvfast's passes, and Polars' (State.stats hands out Polars)
    kvfast.open(path, head_dim=32).stats(by="layer")
    want = passes(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kvfast.ForkWarning)
        with mp.get_context("fork").Pool(2) as pool:
            got = pool.map_async(passes, [path, path]).get(timeout=WATCHDOG_S)
    assert got == [want, want]


def grandchild(path: str, conn: Connection) -> None:
    """In a forked child: the passes, then a child of its own forked after them."""
    passes(path)
    conn.send(in_fork(passes, path))


def test_a_child_of_a_forked_child_runs_passes() -> None:
    want = passes(F16)
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=grandchild, args=(F16, send))
    child.start()
    try:
        assert recv.poll(2 * WATCHDOG_S), "the forked child's child never answered"
        assert recv.recv() == want
    finally:
        child.join(WATCHDOG_S)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


#: the list the parent records warnings in, copied into its forked children
SEEN: dict[str, list[warnings.WarningMessage]] = {}


def in_child_seen() -> tuple[bool, list[str]]:
    return fork.polars_forked(), [w.category.__name__ for w in SEEN["list"]]


def test_a_child_forked_while_polars_threads_run_is_warned() -> None:
    kvfast.open(F16, head_dim=32).stats(by="channel")  # starts Polars' threads
    assert fork.polars_threads() > 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        SEEN["list"] = seen
        broken, categories = in_fork(in_child_seen)
    assert broken and "ForkWarning" in categories
    assert not fork.polars_forked()  # the parent's own Polars is whole
