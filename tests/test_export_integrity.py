"""Export integrity: nothing lost, nothing stale, nothing partial (issue 12, E1-E4).

A reader of an export folder must see every state whole (all its files, with its marker) or not at
all: during a run, after a SIGKILL at any point, with two runs at once over overlapping states. The
subprocess tests run this file as a script (see `_child`).
"""

import fcntl
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

import kvfast
from kvfast import synth
from kvfast.cli import main
from kvfast.dataset import export_commit, export_parquet

HERE = Path(__file__).resolve()
KEY = ["path", "cache", "stream", "layer", "kind", "cell", "seq_id", "head"]


def make_state(path: Path, n_layer: int = 4, cells: int = 8, seed: int = 0, **kw: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    synth.write_state(path, n_layer=n_layer, cells=cells, seed=seed, **kw)
    return os.path.realpath(path)


def make_states(src: Path, n: int, **kw: int) -> list[str]:
    return [make_state(src / f"s{i}.bin", seed=i, **kw) for i in range(n)]


def table(paths: list[str]) -> pl.DataFrame:
    """The rows an export of `paths` must hold (`paths` are real paths: the path column)."""
    frames = []
    for p in paths:
        with kvfast.open(p) as d:
            frames.append(d.to_polars().with_columns(dump=pl.lit(kvfast.dump_id(p)), path=pl.lit(p)))
    return pl.concat(frames).select(["dump", *KEY, "pos", "model_layer", "values"])


def read_raw(out: Path) -> pl.DataFrame:
    """What a plain reader sees: every ``*.parquet`` under OUT (every column is in the files)."""
    if not list(out.glob("**/*.parquet")):
        return pl.DataFrame(schema={"path": pl.String()})
    return pl.read_parquet(out / "**/*.parquet")


def staging(out: Path) -> Path:
    return out.parent / f".{out.name}.kvfast-staging"


def state_dirs(out: Path) -> list[Path]:
    return sorted(d for d in out.iterdir() if d.name != "_kvfast") if out.exists() else []


def check_whole(out: Path, rows_of: dict[tuple[str, int], int], raw: bool = True) -> dict[str, int]:
    """Every state visible in OUT is whole: its folder has its marker, the files and rows the marker
    names, and as many rows as that version of the source holds (`rows_of`: (path, size) -> rows);
    a reader sees exactly those rows. Returns the states present: path -> size of the version."""
    present: dict[str, int] = {}
    for d in state_dirs(out):
        marker = json.loads((d / "_kvfast.json").read_text())
        files = sorted(d.glob("**/*.parquet"))
        rows = sum(pq.read_metadata(f).num_rows for f in files)
        src = marker["source"]
        assert (len(files), rows) == (marker["files"], marker["rows"]), d
        assert rows == rows_of[(src["path"], src["size"])], d
        assert src["path"] not in present, f"{src['path']} exported twice"
        present[src["path"]] = src["size"]
    want = {p: rows_of[(p, size)] for p, size in present.items()}
    if not list(out.glob("**/*.parquet")):
        assert sum(want.values()) == 0
        return present
    # pyarrow skips _kvfast/ (where staging falls back to); a raw glob must agree when staging is beside
    readers = [pads.dataset(out, format="parquet").to_table(columns=["path"])]
    if raw:
        readers.append(read_raw(out).select("path").to_arrow())
    for t in readers:
        got = pl.from_arrow(t)
        assert isinstance(got, pl.DataFrame)
        assert dict(got.group_by("path").len().iter_rows()) == want
    return present


def rows_of(paths: list[str]) -> dict[tuple[str, int], int]:
    out = {}
    for p in paths:
        with kvfast.open(p) as d:
            out[(p, os.path.getsize(p))] = d.to_polars().height
    return out


# --- E1: the same state named twice, overlapping arguments ---------------------------------------


@pytest.mark.parametrize("jobs", [1, 2, 8])
def test_the_same_state_twice_is_exported_once(tmp_path: Path, jobs: int) -> None:
    p = make_state(tmp_path / "src" / "a.bin")
    out = tmp_path / "out"
    for _ in range(5):
        shutil.rmtree(out, ignore_errors=True)
        report = kvfast.export([p, p, p], out, jobs=jobs, on_error="skip")
        assert report.select("path", "status").rows() == [(p, "written")]
        assert check_whole(out, rows_of([p])) == {p: os.path.getsize(p)}
    assert kvfast.export([p, p], out, jobs=jobs)["status"].to_list() == ["skipped"]
    assert check_whole(out, rows_of([p])) == {p: os.path.getsize(p)}  # the data is still there


def test_overlapping_arguments_name_each_state_once(tmp_path: Path) -> None:
    src = tmp_path / "src"
    paths = make_states(src, 3)
    (tmp_path / "link.bin").symlink_to(paths[1])
    args = [str(src / "s2.bin"), str(src), str(src / ".." / "src" / "s0.bin"), str(tmp_path / "link.bin")]
    out = tmp_path / "out"
    report = kvfast.export(args, out, jobs=4, on_error="skip")
    # one row per state, under the name it was given first
    assert report.select("path", "status").rows() == [
        (str(src / "s2.bin"), "written"),
        (str(src / "s0.bin"), "written"),
        (str(src / "s1.bin"), "written"),
    ]
    assert len(state_dirs(out)) == 3
    assert read_raw(out).height == sum(rows_of(paths).values())


def test_cli_overlapping_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    paths = make_states(src, 3)
    out = tmp_path / "out"
    assert main(["export", str(src), *paths, "-o", str(out), "--jobs", "2", "--on-error", "skip"]) == 0
    assert capsys.readouterr().out.startswith("3 written;")
    assert main(["export", *paths, str(src), "-o", str(out)]) == 0
    assert capsys.readouterr().out.startswith("3 skipped;")
    assert read_raw(out).height == sum(rows_of(paths).values())


# --- E2: a state exported again replaces its earlier export whole --------------------------------


@pytest.mark.parametrize("can_exchange", [True, False])
def test_fewer_layers_leave_no_stale_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, can_exchange: bool
) -> None:
    if not can_exchange:  # the portable path: move the old folder out, then the new one in
        monkeypatch.setattr(export_commit, "exchange", lambda a, b: False)
    p = make_state(tmp_path / "src" / "a.bin", n_layer=6)
    other = make_state(tmp_path / "src" / "b.bin", n_layer=3, seed=1)
    out = tmp_path / "out"
    assert kvfast.export([p, other], out)["status"].to_list() == ["written", "written"]
    assert read_raw(out).filter(pl.col("path") == p)["layer"].unique().sort().to_list() == list(range(6))
    make_state(Path(p), n_layer=2)
    assert kvfast.export([p, other], out)["status"].to_list() == ["written", "skipped"]
    want = table([p, other])
    assert_frame_equal(read_raw(out).select(want.columns).sort(KEY), want.sort(KEY))
    a_dir = next(d for d in state_dirs(out) if d.name.startswith("a-"))
    assert sorted(x.name for x in a_dir.iterdir()) == ["_kvfast.json", "layer-0.parquet", "layer-1.parquet"]
    assert not staging(out).exists()


def test_other_options_replace_the_export_whole(tmp_path: Path) -> None:
    p = make_state(tmp_path / "src" / "a.bin")
    out = tmp_path / "out"
    kvfast.export([p], out, partition_by=("layer", "kind"))
    kvfast.export([p], out, partition_by=("cache",))
    (d,) = state_dirs(out)
    assert sorted(x.name for x in d.iterdir()) == ["_kvfast.json", "cache-0.parquet"]


# --- E3: a failed state leaves nothing behind, not even its earlier export -----------------------


def test_failed_state_takes_its_earlier_export_away(tmp_path: Path) -> None:
    src = tmp_path / "src"
    paths = make_states(src, 3)
    out = tmp_path / "out"
    assert kvfast.export(src, out)["status"].to_list() == ["written"] * 3
    raw = Path(paths[1]).read_bytes()
    Path(paths[1]).write_bytes(raw[: len(raw) // 2])
    report = kvfast.export(src, out, on_error="skip")
    assert report.select("status", "files").rows() == [("skipped", 0), ("failed", 0), ("skipped", 0)]
    assert report["error"][1].startswith("TruncatedError")
    assert check_whole(out, rows_of([paths[0], paths[2]])).keys() == {paths[0], paths[2]}
    assert not [f for f in out.rglob("*") if "s1-" in str(f)]
    Path(paths[1]).unlink()  # a source that is gone fails too (when named), and its export goes
    Path(paths[1]).write_bytes(raw)
    kvfast.export(src, out)
    Path(paths[1]).unlink()
    report = kvfast.export(paths, out, on_error="skip")
    assert report["status"].to_list() == ["skipped", "failed", "skipped"]
    assert "FileNotFoundError" in report["error"][1] and len(state_dirs(out)) == 2


# --- on_error="fail" stops the batch --------------------------------------------------------------


@pytest.mark.parametrize("jobs", [1, 2])
def test_fail_starts_no_new_state(tmp_path: Path, jobs: int) -> None:
    src = tmp_path / "src"
    (src / "a0.bin").parent.mkdir(parents=True)
    (src / "a0.bin").write_bytes(b"\x00" * 64)  # sorts first, fails
    for i in range(6):
        make_state(src / f"b{i}.bin", seed=i)
    out = tmp_path / "out"
    with pytest.raises(kvfast.ExportError) as e:
        kvfast.export(src, out, jobs=jobs, on_error="fail")
    report = e.value.report
    assert "a0.bin" in str(e.value) and report["status"][0] == "failed"
    # with one job nothing runs after it; with more, only what was running (or done) when it failed
    assert report.height == 1 if jobs == 1 else report.height < 7
    assert len(state_dirs(out)) == report.filter(status="written").height


# --- E4: leftovers, the old layout ----------------------------------------------------------------


def test_leftovers_of_dead_runs_are_removed_and_live_runs_kept(tmp_path: Path) -> None:
    p = make_state(tmp_path / "src" / "a.bin")
    out = tmp_path / "out"
    out.mkdir()
    dead = staging(out) / "run-dead"
    (dead / "a-123.x" / "layer=0").mkdir(parents=True)
    (dead / "a-123.x" / "layer=0" / "a.parquet").write_bytes(b"partial")
    live = staging(out) / "run-live"
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a run in another process holds its own
    try:
        kvfast.export([p], out)
        assert not dead.exists() and live.is_dir()
    finally:
        os.close(fd)
    assert kvfast.export([p], out)["status"].to_list() == ["skipped"]
    assert not staging(out).exists()


def test_staging_inside_out_when_it_cannot_be_beside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def inside(out: Path) -> Path:
        root = out / "_kvfast" / "staging"
        root.mkdir(parents=True, exist_ok=True)
        return root

    monkeypatch.setattr(export_commit, "_staging_root", inside)
    paths = make_states(tmp_path / "src", 2)
    out = tmp_path / "out"
    kvfast.export(paths, out)
    assert list((out / "_kvfast" / "staging").iterdir()) == []
    assert not staging(out).exists()
    check_whole(out, rows_of(paths))


def test_a_folder_in_the_old_layout_is_refused(tmp_path: Path) -> None:
    p = make_state(tmp_path / "src" / "a.bin")
    out = tmp_path / "out"
    (out / "layer=0").mkdir(parents=True)
    (out / "layer=0" / "a-0123456789.parquet").write_bytes(b"")
    with pytest.raises(kvfast.ExportError, match="layer=0"):
        kvfast.export([p], out)
    assert sorted(x.name for x in out.iterdir()) == ["layer=0"]


def test_state_folder_names_are_not_partitions(tmp_path: Path) -> None:
    p = make_state(tmp_path / "src" / "layer=9.bin")
    q = make_state(tmp_path / "src" / "_hidden.bin", seed=1)
    out = tmp_path / "out"
    kvfast.export([p, q], out)
    assert all("=" not in d.name and not d.name.startswith(("_", ".")) for d in state_dirs(out))
    umask = os.umask(0o022)
    os.umask(umask)
    assert {stat.S_IMODE(d.stat().st_mode) for d in state_dirs(out)} == {0o777 & ~umask}  # not mkdtemp's 0700
    check_whole(out, rows_of([p, q]))


# --- SIGKILL at any point, concurrent runs (subprocesses) -----------------------------------------


def _child(argv: list[str]) -> None:
    """Run one export: OUT HOOK N FLAGS JOBS STATE...; SIGKILL itself at the N-th call of HOOK."""
    out, hook, n, flags, jobs, *states = argv
    if "no-exchange" in flags:
        export_commit.exchange = lambda a, b: False
    calls = 0

    def killing(fn, after: bool = False):
        def wrapped(*a, **kw):
            nonlocal calls
            calls += 1
            if calls == int(n) and not after:
                os.kill(os.getpid(), signal.SIGKILL)
            r = fn(*a, **kw)
            if calls == int(n):
                os.kill(os.getpid(), signal.SIGKILL)
            return r

        return wrapped

    if hook == "write_table":  # in the middle of a Parquet file: after one of its row groups (a record)
        write = export_parquet.write_values
        export_parquet.write_values = lambda d, parts, dtype, advance: write(
            d, parts, dtype, killing(advance)
        )
    elif hook == "publish":  # before a publish or a retire, or between moving an old folder out and
        os.rename = killing(os.rename)  # the new one in (where directories cannot be exchanged)
        export_commit.exchange = killing(export_commit.exchange)
    elif hook == "exchange":  # right after a replace, before the old folder is deleted
        export_commit.exchange = killing(export_commit.exchange, after=True)
    elif hook == "unlink":  # while deleting a staged or replaced folder
        os.unlink = killing(os.unlink)
    print("ready", flush=True)
    go = Path(out + ".go")
    while "wait" in flags and not go.exists():
        time.sleep(0.01)
    report = kvfast.export(states, out, jobs=int(jobs), on_error="skip")
    print(json.dumps(report.rows(named=True)), flush=True)


def spawn(out: Path, states: list[str], hook: str = "none", n: int = 0, flags: str = "-", jobs: int = 2):
    args = [sys.executable, str(HERE), str(out), hook, str(n), flags, str(jobs), *states]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> list[dict]:
    stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stderr
    return json.loads(stdout.splitlines()[-1])


@pytest.mark.parametrize("flags", ["-", "no-exchange"])
def test_sigkill_at_every_kind_of_point_then_rerun(tmp_path: Path, flags: str) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    paths = make_states(src, 5, n_layer=3)
    versions = rows_of(paths)
    points = [("write_table", 1), ("write_table", 7), ("publish", 1), ("publish", 3), ("exchange", 1)]
    points += [("unlink", 2), ("publish", 2), ("write_table", 12)]
    killed = 0
    for i, (hook, n) in enumerate(points):
        # change three sources each time (a layer more or less, or broken), so states are replaced
        for j in (i % 5, (i + 2) % 5, (i + 4) % 5):
            if i == 3 and j == 0:
                Path(paths[j]).write_bytes(Path(paths[j]).read_bytes()[:300])  # fails: goes away
            else:
                make_state(Path(paths[j]), n_layer=2 + (i + j) % 3, seed=j)
                versions.update(rows_of([paths[j]]))
        proc = spawn(out, paths, hook, n, flags)
        proc.communicate()
        killed += proc.returncode == -signal.SIGKILL
        check_whole(out, versions)  # whatever was killed, nothing partial
        report = finish(spawn(out, paths, flags=flags))
        good = [p for p in paths if (p, os.path.getsize(p)) in versions]
        assert check_whole(out, versions) == {p: os.path.getsize(p) for p in good}  # nothing lost
        assert {r["path"] for r in report if r["status"] == "failed"} == set(paths) - set(good)
        assert not staging(out).exists()
    assert killed == len(points)  # every point was reached
    assert_frame_equal(read_raw(out).select(table(good).columns).sort(KEY), table(good).sort(KEY))


def test_sigkill_after_random_delays_then_rerun(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    paths = make_states(src, 8, n_layer=6, cells=96, n_embd_k=256)
    versions = rows_of(paths)
    # a whole run takes about 0.5 s on 2 cores once started: kill it anywhere in that span
    delays = [0.0, *sorted(random.Random(12).uniform(0, 0.6) for _ in range(9))]
    for i, delay in enumerate(delays):
        for j in range(i % 2, len(paths), 2):  # half the states change: exported again, replaced
            make_state(Path(paths[j]), n_layer=4 + (i + j) % 3, cells=96, n_embd_k=256, seed=j)
            versions.update(rows_of([paths[j]]))
        proc = spawn(out, paths)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(delay)
        proc.kill()
        proc.communicate()
        check_whole(out, versions)
    finish(spawn(out, paths))
    current = {p: os.path.getsize(p) for p in paths}
    assert check_whole(out, versions) == current
    assert not staging(out).exists()
    assert_frame_equal(read_raw(out).select(table(paths).columns).sort(KEY), table(paths).sort(KEY))


def test_concurrent_runs_over_overlapping_states(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    paths = make_states(src, 8, n_layer=4, cells=32)
    versions = rows_of(paths)
    for rnd in range(3):
        for j, p in enumerate(paths):  # every state changed: both runs export and replace each one
            make_state(Path(p), n_layer=2 + (rnd + j) % 3, cells=32, seed=j)
        versions.update(rows_of(paths))
        Path(str(out) + ".go").unlink(missing_ok=True)
        a = spawn(out, [str(src)], flags="wait", jobs=2)
        b = spawn(out, [paths[5], paths[1], str(src), paths[1]], flags="wait", jobs=3)
        for proc in (a, b):
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        Path(str(out) + ".go").touch()
        for proc in (a, b):
            report = finish(proc)
            assert len(report) == 8 and {r["status"] for r in report} <= {"written", "skipped"}
        assert check_whole(out, versions) == {p: os.path.getsize(p) for p in paths}
        assert not staging(out).exists()
    assert_frame_equal(read_raw(out).select(table(paths).columns).sort(KEY), table(paths).sort(KEY))


if __name__ == "__main__":
    _child(sys.argv[1:])
