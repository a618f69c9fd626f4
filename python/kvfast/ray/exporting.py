"""``kvfast.export`` on a Ray cluster: one task per state, each exporting it where it runs.

Each task runs the single-machine export of one state (:func:`kvfast.dataset.export.export_one`): it stages
the state's files in its own run folder of :class:`kvfast.dataset.export_commit.Commit` and publishes them
with one rename, so every state is atomic, a state already exported and unchanged is skipped (the
export resumes), and several workers and processes may export into one OUT at once. The output
folder must be one file system that every worker mounts (the publishing rename and its ``flock``
locks work within one file system). The driver decides the values' type once (``dtype=None``: one
type for the whole of OUT), keeps at most as many tasks running as the cluster has CPUs, starts no
new state once one failed with ``on_error="fail"`` and raises :class:`kvfast.ExportError` with the
report, as ``kvfast.export`` does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import ray

from kvfast.dataset.export import Outcomes, export_one, plan_export, source_size
from kvfast.dataset.export_commit import Commit
from kvfast.dataset.export_progress import Progress
from kvfast.dataset.states import Paths
from kvfast.model.rotation import Mode
from kvfast.ray.plan import where
from kvfast.read.opening import Models


def _one(opts: Any, path: str, real: str) -> dict[str, Any]:
    """Export one state on a worker, in a staging run of its own; its report row."""
    quiet = Progress(0, 1, False)
    with Commit(opts.out) as commit:
        return export_one(opts, commit, quiet, path, real)


def export(
    paths: Paths,
    out_dir: str | os.PathLike[str],
    what: str = "values",
    partition_by: Sequence[str] = ("auto",),
    head_dim: int | None = None,
    model: Models = None,
    on_error: str = "fail",
    by: str = "cell",
    dtype: str | None = None,
    rotation: Mode = "auto",
    hive: bool = False,
    progress: bool | None = None,
    pre_rope: bool = False,
    tasks: int | None = None,
    ray_remote_args: dict[str, Any] | None = None,
) -> pl.DataFrame:
    """:func:`kvfast.export` with every state exported by a Ray task on the cluster: the same files,
    markers, options, report and errors. ``tasks``: states exported at once (default: the cluster's
    CPUs); ``ray_remote_args``: options of the tasks (``num_cpus``, ``memory``, a node label...).
    ``progress``: a bar of bytes of the states done, on the driver's stderr."""
    # the real path of the output: the workers may run elsewhere in the file system
    files, opts = plan_export(
        paths,
        Path(os.path.realpath(out_dir)),
        what,
        partition_by,
        head_dim,
        model,
        on_error,
        by,
        dtype,
        rotation,
        hive,
        pre_rope,
    )
    if not ray.is_initialized():
        ray.init()
    cpus = ray.cluster_resources().get("CPU", 1)  # type: ignore[no-untyped-call]
    n_jobs = max(1, tasks or int(cpus))
    remote = ray.remote(_one).options(**{"num_cpus": 1, "max_retries": 2, **(ray_remote_args or {})})
    sizes = {f: source_size(real, opts.opening.storage_options) for f, real in files.items()}
    bar = Progress(sum(sizes.values()), len(files), progress)
    outcomes = Outcomes(files, on_error)
    todo = iter(files.items())
    running: dict[Any, str] = {}
    while True:
        # no new state is started once one has failed with on_error="fail"
        while outcomes.failed is None and len(running) < n_jobs and (item := next(todo, None)) is not None:
            running[remote.remote(opts, where(item[0]), item[1])] = item[0]
        if not running:
            break
        done, _ = ray.wait(list(running), num_returns=1)
        for ref in done:
            path = running.pop(ref)
            outcomes.add({**_result(ref, path, files[path]), "path": path})  # as given, as kvfast.export
            bar.advance(sizes[path])
            bar.state_done()
    bar.close()
    return outcomes.report()


def _result(ref: Any, path: str, real: str) -> dict[str, Any]:
    """The task's report row; a task that died (its worker crashed, its node was lost after the
    retries) is a failed state, as an exception inside it would be."""
    try:
        row: dict[str, Any] = ray.get(ref)
    except Exception as e:  # noqa: BLE001 - every failure is reported
        from kvfast.dataset.states import dump_id

        cause = getattr(e, "cause", None) or e
        row = {
            "path": path,
            "dump": dump_id(real),
            "status": "failed",
            "rows": 0,
            "files": 0,
            "error": f"{type(cause).__name__}: {cause}",
        }
    return row
