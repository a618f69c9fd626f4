"""The files kvfast writes at a path the user names (kvfast.writing.output): only a new file or a
regular file is written (never a folder, a device, a FIFO, a socket); never the write's own input
unless replace=True; never a state a probe manifest describes; never a temporary file left behind,
and those a killed run left are removed by the next write. The same rules for every writer:
kvfast.write, the CLI's convert / prune / stats -o / manifest -o, kvfast.synth."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from conftest import DATA

import kvfast
from kvfast import synth
from kvfast.cli import main
from kvfast.probe import manifest as probe_manifest
from kvfast.writing import output

SRC = DATA / "qwen3tiny-f16-fa/seq-0.ggsq"
QWEN3 = str(DATA / "models/tiny-qwen3.gguf")
PYTHON = Path(kvfast.__file__).resolve().parent.parent


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(output.SUFFIX))


Attempt = Callable[[Path | str], str]


def _writers(capsys: pytest.CaptureFixture[str]) -> dict[str, Attempt]:
    """Each writer, as a call that is expected to be refused: the error it says."""

    def api(fn: Callable[[], object]) -> str:
        with pytest.raises(kvfast.OutputError) as e:
            fn()
        return str(e.value)

    def cli(args: list[str]) -> str:
        capsys.readouterr()
        assert main(args) == 1
        return capsys.readouterr().err

    def write(out: Path | str) -> str:
        with kvfast.open(SRC) as d:
            return api(lambda: kvfast.write(d, out))

    return {
        "write": write,
        "convert": lambda out: cli(["convert", str(SRC), "-o", str(out)]),
        "prune": lambda out: cli(["prune", str(SRC), "-o", str(out), "--ratio", "0.5", "--model", QWEN3]),
        "stats": lambda out: cli(["stats", str(SRC), "-o", str(out)]),
        "manifest": lambda out: cli(["manifest", str(SRC), "-o", str(out)]),
        "synth": lambda out: api(lambda: synth.write_state(out)),
    }


WRITERS = ["write", "convert", "prune", "stats", "manifest", "synth"]


def _special(kind: str, at: Path) -> None:
    if kind == "fifo":
        os.mkfifo(at)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(at))
        s.close()
    elif kind == "device":
        try:
            os.mknod(at, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
        except PermissionError:
            pytest.skip("making a device node needs root")
    else:
        at.mkdir()


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize(
    "kind,what",
    [("fifo", "a FIFO"), ("socket", "a socket"), ("device", "a character device"), ("dir", "a folder")],
)
def test_only_regular_files_are_replaced(
    writer: str, kind: str, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.bin"
    _special(kind, out)
    before = os.stat(out).st_mode
    link = tmp_path / "link.bin"
    link.symlink_to(out)
    for at in (out, link):  # also through a symbolic link: the link is followed, its file refused
        said = _writers(capsys)[writer](at)
        assert what in said and "not a regular file" in said, said
    assert os.stat(out).st_mode == before  # still what it was
    assert link.is_symlink()
    assert _temps(tmp_path) == []


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("name", ["", ".", "..", "sub/", "missing/out.bin"])
def test_folders_and_missing_folders_are_refused_before_anything_is_written(
    writer: str,
    name: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    monkeypatch.chdir(work)
    said = _writers(capsys)[writer](name)
    assert "folder" in said or "empty path" in said, said
    for d in (tmp_path, work, work / "sub"):
        assert _temps(d) == [] and not any(p.name.startswith(".") for p in d.iterdir())


def test_a_symlink_to_a_file_replaces_the_file(tmp_path: Path) -> None:
    real = tmp_path / "real.ggsq"
    real.write_bytes(b"old")
    link = tmp_path / "link.ggsq"
    link.symlink_to(real)
    with kvfast.open(SRC) as d:
        kvfast.write(d, link)
    assert link.is_symlink() and real.read_bytes() == SRC.read_bytes()
    assert _temps(tmp_path) == []


# -- the input itself --------------------------------------------------------------------------------


def _same_file_paths(tmp_path: Path) -> tuple[Path, list[Path]]:
    state = tmp_path / "s.ggsq"
    shutil.copy(SRC, state)
    (tmp_path / "sym.ggsq").symlink_to(state)
    os.link(state, tmp_path / "hard.ggsq")
    return state, [state, tmp_path / "sym.ggsq", tmp_path / "hard.ggsq"]


@pytest.mark.parametrize("command", ["convert", "prune"])
def test_the_cli_does_not_write_over_its_input_without_replace(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, names = _same_file_paths(tmp_path)
    before = state.read_bytes()
    extra = ["--ratio", "0.5"] if command == "prune" else []
    for out in names:
        args = [command, str(state), "-o", str(out), "--ctk", "q8_0", "--model", QWEN3, *extra]
        assert main(args) == 1
        assert "is the file this write reads" in capsys.readouterr().err
        assert state.read_bytes() == before
    assert (
        main([command, str(state), "-o", str(state), "--ctk", "q8_0", "--model", QWEN3, *extra, "--replace"])
        == 0
    )
    with kvfast.open(state, model=QWEN3) as e:
        assert e.caches[0].streams[0].layers[0].k_type == "q8_0"
    assert _temps(tmp_path) == []


def test_write_refuses_its_input_unless_replace(tmp_path: Path) -> None:
    state, names = _same_file_paths(tmp_path)
    with kvfast.open(names[1]) as d:  # opened through the link
        for out in names:
            with pytest.raises(kvfast.OutputError, match="replace=True"):
                kvfast.write(d, out, keep=pl.col("pos") != 1)
        kvfast.write(d, names[1], keep=pl.col("pos") != 1, replace=True)
        # the state opened keeps reading its own bytes after its file is replaced
        assert d.caches[0].streams[0].cell_count == 7
    with kvfast.open(state) as e:
        assert e.caches[0].streams[0].pos.tolist() == [0, 2, 3, 4, 5, 6]
    assert (
        names[1].is_symlink() and names[2].read_bytes() == SRC.read_bytes()
    )  # a rename: the hard link keeps the old
    # joined sources: any of them
    other = tmp_path / "o.ggsq"
    shutil.copy(DATA / "qwen3tiny-3seq-shared/seq-1.ggsq", other)
    with kvfast.open(state) as a, kvfast.open(other) as b, pytest.raises(kvfast.OutputError):
        kvfast.write([a, b], other, seq_id=[0, 1])


def _probe_folder(tmp_path: Path) -> Path:
    """A probe's output: a state and the manifest naming it."""
    folder = tmp_path / "probe"
    folder.mkdir()
    shutil.copy(SRC, folder / "p0.ggsq")
    g = kvfast.ModelGeometry.from_gguf(QWEN3)
    row = {
        "prompt_id": "p0",
        "status": "ok",
        "state": "p0.ggsq",
        "whole_state": None,
        "pieces": [],
        "arch": g.arch,
        "n_layer": g.n_layer,
        "head_dim_k": g.head_dim_k,
        "head_dim_v": g.head_dim_v,
        "n_head_kv": list(g.n_head_kv),
        "swa": list(g.swa),
        "ctk": "f16",
        "ctv": "f16",
        "attn_rot": True,
    }
    pl.DataFrame([row]).write_parquet(folder / probe_manifest.NAME)
    return folder


def test_a_state_a_probe_manifest_describes_is_never_written_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _probe_folder(tmp_path)
    state = folder / "p0.ggsq"
    before, manifest = state.read_bytes(), (folder / probe_manifest.NAME).read_bytes()
    for extra in ([], ["--replace"]):
        assert main(["convert", str(state), "-o", str(state), "--ctk", "q8_0", *extra]) == 1
        assert "probe manifest" in capsys.readouterr().err
    with kvfast.open(SRC) as d, pytest.raises(kvfast.OutputError, match="probe manifest"):
        kvfast.write(d, state, replace=True)
    assert state.read_bytes() == before and (folder / probe_manifest.NAME).read_bytes() == manifest
    # a name the manifest does not give is written, in the same folder
    assert (
        main(["convert", str(state), "-o", str(folder / "p0-q8.ggsq"), "--ctk", "q8_0", "--model", QWEN3])
        == 0
    )
    assert _temps(folder) == []


# -- temporary files ---------------------------------------------------------------------------------


def test_a_killed_write_leaves_a_temporary_file_the_next_write_removes(tmp_path: Path) -> None:
    out = tmp_path / "out.ggsq"
    code = (
        "import os, signal, sys\n"
        "from kvfast.writing import output\n"
        "with output.replacing(sys.argv[1]) as tmp:\n"
        "    tmp.write_bytes(b'x' * 100000)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PYTHON)}
    for _ in range(3):  # each run sweeps what the one before left: one full temporary file at most
        r = subprocess.run([sys.executable, "-c", code, str(out)], env=env, check=False)
        assert r.returncode == -signal.SIGKILL
        left = _temps(tmp_path)
        assert len(left) == 1 and (tmp_path / left[0]).stat().st_size == 100000 and not out.exists()
    with kvfast.open(SRC) as d:
        kvfast.write(d, out)
    assert _temps(tmp_path) == [] and out.read_bytes() == SRC.read_bytes()


def test_a_live_write_keeps_its_temporary_file(tmp_path: Path) -> None:
    out = tmp_path / "out.ggsq"
    with output.replacing(out) as tmp:
        tmp.write_bytes(b"first")
        with kvfast.open(SRC) as d:
            kvfast.write(d, out)  # sweeps: the live temporary file stays
        assert tmp.exists() and out.read_bytes() == SRC.read_bytes()
    assert out.read_bytes() == b"first" and _temps(tmp_path) == []


def test_an_error_while_writing_or_renaming_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.bin"
    with kvfast.open(DATA / "qwen3tiny-f16-fa-2025may/seq-0.bin") as d:
        # a whole state of a sequence state needs the arch: refused as the bytes are written
        with pytest.raises(kvfast.WriteError, match="arch"):
            kvfast.write(d, out, container="state")
        assert _temps(tmp_path) == [] and not out.exists()

        def failing(a: object, b: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(output.os, "replace", failing)
        with pytest.raises(OSError, match="No space"):
            kvfast.write(d, out)
    assert _temps(tmp_path) == [] and not out.exists()


def test_export_and_probe_folders_are_checked(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"")
    with pytest.raises(kvfast.OutputError, match="not a folder"):
        kvfast.export([SRC], f)
    with pytest.raises(kvfast.OutputError, match="empty path"):
        output.folder("")
    assert output.folder(tmp_path / "new" / "one").is_dir()
