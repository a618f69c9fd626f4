"""Reproducers of issue 12 (hostile inputs), kept as tests: corrupt states read with a wrong
meaning, non-regular files, OS errors without their path, hostile models, nonsense selections, the
CLI's usage errors and broken pipes, and files that change under the map."""

from __future__ import annotations

import ctypes
import errno
import io
import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from conftest import DATA

import kvfast
from kvfast import synth
from kvfast._kvfast import State
from kvfast.cli import main
from kvfast.model import MAX_LAYERS, ModelGeometry

SEQ = DATA / "qwen3tiny-f16-fa/seq-0.bin"
GGSQ = DATA / "qwen3tiny-f16-fa/seq-0.ggsq"
MODEL = DATA / "models/tiny-qwen3.gguf"


def _run(code: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run Python code in a child: a hang fails the test through the timeout, a crash through the
    return code, and neither takes pytest down."""
    return subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=timeout, **kw
    )


# -- S1, S2: corrupt states that used to parse with another meaning --------------------------------


def test_s1_a_cell_of_a_ggsq_state_gaining_a_sequence_is_refused() -> None:
    raw = bytearray(GGSQ.read_bytes())
    (n_token,) = struct.unpack_from("<I", raw, 8)
    memory = 12 + 4 * n_token
    n_seq_at = memory + 12  # n_stream, cell_count, cell 0's pos, then its n_seq_id
    assert struct.unpack_from("<iIi", raw, memory + 8) == (0, 1, 0)
    raw[n_seq_at : n_seq_at + 4] = struct.pack("<I", 2)
    with pytest.raises(kvfast.FormatError) as e:
        State.from_bytes(bytes(raw))
    assert e.value.field == "cache 0 stream 0 cell 0 n_seq_id"
    assert e.value.offset == n_seq_at and e.value.kind == "format"
    assert "own sequence only" in str(e.value) and f"byte {n_seq_at}" in str(e.value)


def _cache_bytes(seq_ids: list[list[int]], n_stream_field: bool = True) -> bytes:
    f = io.BytesIO()
    synth.write_cache(
        f,
        n_layer=1,
        n_embd_k=8,
        n_embd_v=8,
        pos=list(range(len(seq_ids))),
        seq_ids=seq_ids,
        n_stream_field=n_stream_field,
        rng=np.random.default_rng(0),
    )
    return f.getvalue()


def test_s1_sequence_states_hold_their_one_sequence() -> None:
    io_header = struct.pack("<Ii", synth.IO_MAGIC, 0)
    State.from_bytes(io_header + _cache_bytes([[0], [0], [0]]))
    with pytest.raises(kvfast.FormatError) as e:
        State.from_bytes(io_header + _cache_bytes([[0], [1]]))
    assert e.value.field == "cache 0 stream 0 cell 1 seq_id" and e.value.offset == 16 + 12 + 8
    with pytest.raises(kvfast.FormatError) as e:
        State.from_bytes(struct.pack("<Ii", synth.IO_MAGIC, 2) + _cache_bytes([[0]]))
    assert "the seq_id of the header" in str(e.value)
    ggsq = struct.pack("<III", synth.GGSQ_MAGIC, 3, 0)
    State.from_bytes(ggsq + _cache_bytes([[4], [4]]))
    with pytest.raises(kvfast.FormatError, match="cell 1 seq_id"):
        State.from_bytes(ggsq + _cache_bytes([[4], [5]]))


def test_s1_whole_state_cells_hold_some_sequence() -> None:
    arch = struct.pack("<I", 5) + b"qwen3"
    d = State.from_bytes(arch + _cache_bytes([[0, 1], [1]]))
    assert d.info()["container"] == "state"
    with pytest.raises(kvfast.FormatError) as e:
        State.from_bytes(arch + _cache_bytes([[0, 1], []]))
    assert e.value.field is not None and e.value.field.startswith("cache 0 stream 0 cell 1 n_seq_id")
    assert e.value.offset == 9 + 8 + 16 + 4


def test_s2_n_stream_zero_is_not_an_empty_cache_then_another() -> None:
    raw = bytearray((DATA / "qwen3tiny-f16-fa-2025/seq-0.bin").read_bytes())
    assert struct.unpack_from("<II", raw, 0) == (1, 7)  # n_stream, cell_count: no io magic
    raw[0:4] = struct.pack("<I", 0)
    with pytest.raises(kvfast.FormatError) as e:
        State.from_bytes(bytes(raw))
    assert e.value.offset == 0 and e.value.field is not None
    assert e.value.field.startswith("cache 0 stream 0 cell_count")
    assert "never followed by one holding cells" in str(e.value)


# -- N1 and OS errors: non-regular files never hang; errors carry the path --------------------------


def test_n1_a_fifo_state_or_model_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = f"""
import kvfast, json
out = []
for kw in ({{}}, {{"model": {str(fifo)!r}}}):
    path = {str(fifo)!r} if not kw else {str(SEQ)!r}
    try:
        kvfast.open(path, **kw)
    except OSError as e:
        out.append([type(e).__name__, e.errno, e.filename, str(e)])
print(json.dumps(out))
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    for name, code_, filename, msg in json.loads(r.stdout):
        assert (name, code_, filename) == ("OSError", errno.EINVAL, str(fifo))
        assert "a FIFO, not a regular file" in msg


def test_os_errors_carry_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.bin"
    with pytest.raises(FileNotFoundError) as e:
        kvfast.open(missing)
    assert e.value.filename == str(missing) and e.value.errno == errno.ENOENT
    with pytest.raises(FileNotFoundError) as e:
        kvfast.open(SEQ, model=tmp_path / "missing.gguf")
    assert e.value.filename == str(tmp_path / "missing.gguf")
    with pytest.raises(IsADirectoryError) as e:
        kvfast.open(tmp_path)
    assert e.value.filename == str(tmp_path)
    assert main(["info", str(missing)]) == 1


def _drop_dac_override() -> None:
    """In the child: root without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, so modes apply to it."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_permission_errors_carry_the_path(tmp_path: Path) -> None:
    p = tmp_path / "secret.bin"
    shutil.copy(SEQ, p)
    p.chmod(0)
    code = f"""
import kvfast
try:
    kvfast.open({str(p)!r})
except PermissionError as e:
    print(e.errno, e.filename)
"""
    try:
        r = _run(code, preexec_fn=_drop_dac_override if os.geteuid() == 0 else None)
    except subprocess.SubprocessError as e:
        pytest.skip(f"cannot run a child without the DAC capabilities: {e}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(errno.EACCES), str(p)]
    r = subprocess.run(
        [sys.executable, "-m", "kvfast", "info", str(p)],
        check=False,
        capture_output=True,
        text=True,
        preexec_fn=_drop_dac_override if os.geteuid() == 0 else None,
    )
    assert r.returncode == 1 and str(p) in r.stderr and "Permission denied" in r.stderr


# -- G1, G2: hostile models -------------------------------------------------------------------------

_T = gguf.GGUFValueType
_GOOD: dict[str, tuple[Any, Any]] = {
    "qwen3.block_count": (2, _T.UINT32),
    "qwen3.attention.head_count": (4, _T.UINT32),
    "qwen3.attention.head_count_kv": (2, _T.UINT32),
    "qwen3.attention.key_length": (32, _T.UINT32),
    "qwen3.embedding_length": (128, _T.UINT32),
}


def _model(tmp_path: Path, **changes: tuple[Any, Any]) -> Path:
    kv = dict(_GOOD)
    kv.update({k.replace("__", "."): v for k, v in changes.items()})
    p = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(p), "qwen3")
    for k, (v, t) in kv.items():
        w.add_key_value(k, v, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return p


def test_g1_a_huge_block_count_is_refused_before_allocating(tmp_path: Path) -> None:
    p = _model(tmp_path, qwen3__block_count=(2**31 - 1, _T.UINT32))
    assert p.stat().st_size < 400
    with pytest.raises(kvfast.ModelMismatchError) as e:
        ModelGeometry.from_gguf(p)
    assert e.value.field == "qwen3.block_count" and f"{MAX_LAYERS:,}" in str(e.value)
    with pytest.raises(kvfast.ModelMismatchError):
        kvfast.open(SEQ, model=p)


def test_g1_counts_in_the_header_are_bounded_by_the_file(tmp_path: Path) -> None:
    good = _model(tmp_path).read_bytes()
    # the first key's length field (after magic, version, n_tensors, n_kv) claims 2**40 bytes
    bad = bytearray(good)
    bad[24:32] = struct.pack("<Q", 1 << 40)
    p = tmp_path / "long.gguf"
    p.write_bytes(bytes(bad))
    with pytest.raises(kvfast.FormatError) as e:
        kvfast._kvfast.gguf_metadata(p)
    assert e.value.offset == 24 and "fits the file" in str(e.value)
    bad = bytearray(good)
    bad[16:24] = struct.pack("<Q", 1 << 62)  # n_kv
    p.write_bytes(bytes(bad))
    with pytest.raises(kvfast.FormatError) as e:
        kvfast._kvfast.gguf_metadata(p)
    assert e.value.offset == 16


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("qwen3.attention.key_length", ("abc", _T.STRING)),
        ("qwen3.attention.head_count_kv", ("2", _T.STRING)),
        ("qwen3.attention.key_length", (32.9, _T.FLOAT32)),
        ("qwen3.attention.key_length", (True, _T.BOOL)),
        ("qwen3.attention.head_count_kv", ([2, 2, 2], _T.ARRAY)),
        ("qwen3.block_count", (0, _T.UINT32)),
        ("qwen3.attention.value_length", (-32, _T.INT32)),
    ],
)
def test_g2_metadata_of_the_wrong_type_names_the_key(
    tmp_path: Path, key: str, value: tuple[Any, Any]
) -> None:
    p = _model(tmp_path, **{key.replace(".", "__"): value})
    with pytest.raises(kvfast.ModelMismatchError) as e:
        ModelGeometry.from_gguf(p)
    assert e.value.field == key and key in str(e.value)
    assert isinstance(e.value, kvfast.KvfastError)


def test_g2_a_good_model_still_reads(tmp_path: Path) -> None:
    g = ModelGeometry.from_gguf(_model(tmp_path))
    assert (g.n_layer, g.head_dim_k, g.head_dim_v, g.n_head_kv) == (2, 32, 32, (2, 2))
    with kvfast.open(SEQ, model=MODEL) as d:
        assert (d.head_dim_k, d.head_dim_v) == (32, 32)


# -- A1, A2: one rule for selections ----------------------------------------------------------------

BAD_CALLS: list[tuple[str, Callable[[kvfast.State], Any]]] = [
    ("address cell 1.5", lambda d: d.address(0, 1.5)),  # type: ignore[arg-type]
    ("address layer -1", lambda d: d.address(-1, 0)),
    ("address head -1", lambda d: d.address(0, 0, head=-1)),
    ("address head 2", lambda d: d.address(0, 0, head=2)),
    ("address elem 32", lambda d: d.address(0, 0, elem=32)),
    ("address cache -1", lambda d: d.address(0, 0, cache=-1)),
    ("address stream -1", lambda d: d.address(0, 0, stream=-1)),
    ("address cell 7", lambda d: d.address(0, 7)),
    ("address kind x", lambda d: d.address(0, 0, kind="x")),
    ("address layer True", lambda d: d.address(True, 0)),
    ("tensor n_stream 0", lambda d: d.tensor_address(0, 0, n_ctx=4096, n_stream=0)),
    ("tensor n_ctx -1", lambda d: d.tensor_address(0, 0, n_ctx=-1)),
    ("values layer 5", lambda d: d.values(layer=5)),
    ("values cache -1", lambda d: d.values(layer=0, cache=-1)),
    ("to_polars layers [5]", lambda d: d.to_polars(layers=[5])),
    ("to_polars layers [-1]", lambda d: d.to_polars(layers=[-1])),
    ("to_polars heads [0,0,0]", lambda d: d.to_polars(heads=[0, 0, 0])),
    ("to_polars heads [2]", lambda d: d.to_polars(heads=[2])),
    ("to_polars heads [-1]", lambda d: d.to_polars(heads=[-1])),
    ("to_polars kinds ['x']", lambda d: d.to_polars(kinds=["x"])),
    ("to_arrow layers [0,0]", lambda d: d.to_arrow(layers=[0, 0])),
    ("to_arrow layers 'ab'", lambda d: d.to_arrow(layers="ab")),  # type: ignore[arg-type]
    ("stats layers [5]", lambda d: d.stats(layers=[5])),
    ("stats skip_first -1", lambda d: d.stats(skip_first=-1)),
    ("quant_error layers [5]", lambda d: d.quant_error("q8_0", layers=[5])),
    ("compare layers [5]", lambda d: kvfast.compare(d, d, layers=[5])),
]


@pytest.mark.parametrize(("name", "call"), BAD_CALLS, ids=[n for n, _ in BAD_CALLS])
def test_a2_nonsense_selections_raise_one_error_type(name: str, call: Callable[[kvfast.State], Any]) -> None:
    with kvfast.open(SEQ, head_dim=32) as d, pytest.raises(kvfast.SelectionError) as e:
        call(d)
    assert isinstance(e.value, ValueError) and isinstance(e.value, kvfast.KvfastError)
    assert e.value.kind == "selection"


@pytest.mark.parametrize("head_dim", [0, -1, 5, 63, 2.0, "32", True])
def test_a1_head_dim_is_checked_once_at_open(head_dim: Any) -> None:
    with pytest.raises(kvfast.SelectionError, match="head_dim"):
        kvfast.open(SEQ, head_dim=head_dim)


def test_a1_good_selections_still_work() -> None:
    with kvfast.open(SEQ, head_dim=32) as d:
        assert d.address(1, 2, head=1, elem=3, kind="v") == d.address(np.int64(1), 2, 1, 3, "v")
        assert d.to_polars(heads=[1], layers=[1], kinds="k").height == 7
        assert d.to_polars(layers=[]).height == 0
        assert d.values(layer=1, kind="v", stream=0).shape == (7, 64)
        assert d.tensor_address(0, 3, n_ctx=8, n_stream=1) == 3 * 128
        assert d.stats(layers=[0], skip_first=2).height > 0
    with kvfast.open(DATA / "gemma3-270m-f16-fa/state.bin") as g:
        # a layer in one of the selected caches is a valid selection (cache 0 has 3, cache 1 has 15)
        assert set(g.to_polars(layers=[5], kinds=["k"])["cache"].unique()) == {1}


# -- CLI: usage errors, info's geometry, broken pipes ----------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--head-dim", "0"],
        ["--head-dim", "-3"],
        ["--head-dim", "5"],
        ["--cells", "-1"],
        ["--head", "7", "--head-dim", "32"],
        ["--layer", "9"],
    ],
)
def test_cli_show_usage_errors_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["show", str(SEQ), *(["--layer", "0"] if "--layer" not in args else []), *args]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own usage errors
        code = e.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert "kvfast show: error:" in err and "Traceback" not in err


def test_cli_addr_rejects_a_head_dim_that_does_not_divide(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["addr", str(SEQ), "--layer", "0", "--cell", "0", "--head-dim", "5"]) == 2
    assert "does not divide" in capsys.readouterr().err


def test_cli_info_takes_head_dim_and_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(SEQ), "--head-dim", "32", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["head_dim_k"], d["head_dim_v"]) == (32, 32)
    assert main(["info", str(SEQ), "--model", str(MODEL)]) == 0
    assert "head_dim   K 32, V 32" in capsys.readouterr().out
    assert main(["info", str(SEQ), "--head-dim", "5"]) == 2


def test_cli_exits_quietly_when_the_reader_goes_away() -> None:
    # more output than a pipe holds, so the writer is still writing when the reader closes
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvfast",
            "stats",
            str(DATA / "gemma3-270m-f16-fa/state.bin"),
            "--by",
            "channel",
        ]
        + ["--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.read(10)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141
    assert err == ""


# -- files that change under the map ---------------------------------------------------------------


def test_a_truncated_state_raises_instead_of_faulting(tmp_path: Path) -> None:
    p = tmp_path / "s.bin"
    shutil.copy(DATA / "qwen3tiny-f16-fa/state.bin", p)
    code = f"""
import os, kvfast
d = kvfast.open({str(p)!r}, head_dim=32)
os.truncate({str(p)!r}, 200)
for call in (lambda: d.values(layer=1, kind="v"), lambda: d.to_polars(), lambda: d.stats()):
    try:
        call()
        print("read")
    except kvfast.FileChangedError as e:
        print(type(e).__name__, e.kind, e.filename, "size" in str(e))
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"FileChangedError changed {p} True"] * 3


def test_a_state_rewritten_in_place_or_replaced_raises(tmp_path: Path) -> None:
    p = tmp_path / "s.bin"
    shutil.copy(SEQ, p)
    d = kvfast.open(p)
    before = d.values(layer=0).copy()
    st = p.stat()
    with open(p, "r+b") as f:  # same size, new bytes (what llama-server does to a slot file)
        f.seek(st.st_size - 64)
        f.write(b"\x00" * 64)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(kvfast.FileChangedError, match="modification time"):
        d.values(layer=0)
    with pytest.raises(kvfast.FileChangedError):
        d.to_polars()
    d.close()
    shutil.copy(SEQ, p)
    d = kvfast.open(p)
    q = tmp_path / "new.bin"
    shutil.copy(SEQ, q)
    os.replace(q, p)  # a new file under the same name
    with pytest.raises(kvfast.FileChangedError, match="another file"):
        d.stats()
    assert np.array_equal(kvfast.open(p).values(layer=0), before)


def test_mmap_false_reads_a_copy_immune_to_changes(tmp_path: Path) -> None:
    p = tmp_path / "s.bin"
    shutil.copy(SEQ, p)
    d = kvfast.open(p, mmap=False, head_dim=32)
    want = kvfast.open(SEQ).values(layer=0)
    os.truncate(p, 100)
    got = d.values(layer=0)
    assert np.array_equal(got, want)
    assert d.to_polars().height == 2 * 2 * 7 * 2
    p.unlink()
    assert d.stats(by="layer").height == 4
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = _run(
        f"import kvfast\ntry:\n    kvfast.open({str(fifo)!r}, mmap=False)\nexcept OSError as e:\n    print(e.errno)"
    )
    assert r.stdout.strip() == str(errno.EINVAL)


def test_n1_a_fifo_as_the_probe_manifest_beside_a_state_is_ignored(tmp_path: Path) -> None:
    from kvfast.probe import MANIFEST

    shutil.copy(SEQ, tmp_path / "s.bin")
    os.mkfifo(tmp_path / MANIFEST)
    r = _run(f"import kvfast\nprint(kvfast.open({str(tmp_path / 's.bin')!r}).size)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(SEQ.stat().st_size)
