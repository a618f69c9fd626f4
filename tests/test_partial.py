"""States of ``llama_state_seq_get_data_ext``'s flags and of empty sequences (make_partial.py):
PARTIAL_ONLY (a hybrid's recurrent part alone, an iSWA model's sliding-window cache alone: what
llama-server's context checkpoints hold), ON_DEVICE (every header and cell, no row), and a sequence
that holds no cell. Each opens with and without its model and reads as the independent reading
(memory_bytes.py) does; kvfast's writes of them load back into llama.cpp with the matching flags."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA, FLAGGED_FOLDERS, probe
from memory_bytes import read

import kvfast
from kvfast.cli import main
from kvfast.probe.replay import Replay

MODELS = DATA / "models"
FILES = sorted(f for d in FLAGGED_FOLDERS for f in d.iterdir() if f.suffix in (".bin", ".ggsq"))
PARTIAL_ONLY, ON_DEVICE = 1, 2
# the model layers of the cache PARTIAL_ONLY leaves out (None: the flag changes nothing)
ABSENT = {
    "gemma3tiny-partial": ("full-attention cache", [1, 3]),
    "qwen35tiny-partial": ("attention cache", [3]),
    "lfm2tiny-partial": ("attention cache", [2, 4]),
    "lfm2swatiny-partial": ("full-attention cache", []),
    "mamba2tiny-partial": None,
    "qwen3tiny-partial": None,
}


def _model(folder: Path) -> Path:
    return MODELS / probe(folder)["model"]


def _open(path: Path, model: bool = True, of: Path | None = None) -> kvfast.State:
    """``path`` opened with the model of its folder (of ``of``'s), or without one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kvfast.open(path, model=_model(of or path.parent) if model else None)


@pytest.fixture(params=FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def flagged_file(request: pytest.FixtureRequest) -> Path:
    return request.param


def test_the_fixtures_cover_every_flag_and_memory() -> None:
    assert {d.name for d in FLAGGED_FOLDERS} == set(ABSENT)
    memories = {probe(d)["memory"] for d in FLAGGED_FOLDERS}
    assert memories == {"kv", "kv iswa", "recurrent", "hybrid", "hybrid iswa"}
    for d in FLAGGED_FOLDERS:
        files = probe(d)["files"]
        assert {f.name: f.stat().st_size for f in d.iterdir() if f.name != "probe.json"} == files


def test_every_state_reads_as_llama_cpp_wrote_it(flagged_file: Path) -> None:
    """Cells, sequences, values and the model layer of every record: the independent reading's,
    with the model; without it the same cells and values."""
    spec, parts = read(flagged_file)
    device = "device" in flagged_file.name
    for with_model in (True, False):
        with _open(flagged_file, with_model) as d:
            assert d.rows_on_device is device
            assert ("rows on device" in d.features) is device
            attention = [p for p in parts if p.kind == "kv"]
            assert len(d.caches) == spec.kv_caches
            for c, part, layers in zip(d.caches, attention, spec.model_layers, strict=True):
                s = next((x for x in c.streams if x.cell_count), c.streams[0])
                assert list(s.pos) == part.pos and s.seq_ids == part.seqs
                if with_model:
                    assert [ly.model_layer for ly in s.layers] == (list(layers) if part.cells else [])
                for r in part.recs:
                    if device:
                        with pytest.raises(kvfast.SelectionError, match="ON_DEVICE"):
                            d.values(r.layer, r.kind, cache=c.index)
                        continue
                    got = d.values(r.layer, r.kind, cache=c.index, dtype="float32")
                    np.testing.assert_array_equal(got, r.values)
            rec = d.recurrent
            if not spec.recurrent_layers:
                assert rec is None
                continue
            part = parts[-1]
            assert rec is not None and (rec.cell_count, rec.n_layer) == (part.cells, part.n_layer)
            assert list(rec.stream.pos) == part.pos
            if with_model:
                assert [ly.model_layer for ly in rec.layers] == list(spec.recurrent_model_layers)
            for r in part.recs:
                if device and r.n:
                    with pytest.raises(kvfast.SelectionError, match="ON_DEVICE"):
                        d.values(r.layer, r.kind)
                elif not device:
                    got = d.values(r.layer, r.kind)
                    np.testing.assert_array_equal(
                        got.reshape(part.cells, -1) if part.cells else got[:, :0], r.values
                    )


def test_partial_says_what_the_model_has_that_the_state_lacks(flagged_file: Path) -> None:
    absent = ABSENT[flagged_file.parent.name] if ".partial" in flagged_file.name else None
    with _open(flagged_file) as d:
        got = None if d.partial is None else (d.partial.absent, d.partial.model_layers)
        assert got == absent
        assert ("partial (PARTIAL_ONLY)" in d._repr_html_()) is (absent is not None)
    with _open(flagged_file, model=False) as d:
        assert d.partial is None  # the bytes alone do not say which memory they are part of


def test_a_partial_state_holds_the_whole_states_values_of_what_it_keeps() -> None:
    for folder in FLAGGED_FOLDERS:
        with _open(folder / "seq-0.bin") as whole, _open(folder / "seq-0.partial.bin") as part:
            skip = len(whole.caches) - len(part.caches)
            for c in part.caches:
                w = whole.caches[c.index + skip]
                assert [ly.model_layer for ly in c.streams[0].layers] == [
                    ly.model_layer for ly in w.streams[0].layers
                ]
                for ly in c.streams[0].layers:
                    for kind in "kv":
                        np.testing.assert_array_equal(
                            part.values(ly.index, kind, cache=c.index),
                            whole.values(ly.index, kind, cache=w.index),
                        )
            if part.recurrent is not None:
                assert whole.recurrent is not None
                for ly in part.recurrent.layers:
                    for kind in "rs":
                        np.testing.assert_array_equal(
                            part.values(ly.index, kind), whole.values(ly.index, kind)
                        )


def test_kvfast_info_says_partial_and_what_is_absent(capsys: pytest.CaptureFixture[str]) -> None:
    f = DATA / "lfm2tiny-partial/seq-0.partial.bin"
    assert main(["info", str(f), "--model", str(MODELS / "tiny-lfm2.gguf")]) == 0
    out = capsys.readouterr().out
    assert "PARTIAL_ONLY" in out and "model's attention cache (model layers [2, 4]) is absent" in out
    assert "model layer 0: RS (cache 0 layer 0); 1: RS (cache 0 layer 1); 3: RS (cache 0 layer 2)" in out
    assert main(["info", str(f), "--model", str(MODELS / "tiny-lfm2.gguf"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["memory"], d["partial"]) == ("hybrid", {"absent": "attention cache", "model_layers": [2, 4]})
    f = DATA / "gemma3tiny-partial/seq-0.partial-device.bin"
    assert main(["info", str(f), "--model", str(MODELS / "tiny-gemma3.gguf")]) == 0
    out = capsys.readouterr().out
    assert "model's full-attention cache (model layers [1, 3]) is absent" in out
    assert "LLAMA_STATE_SEQ_FLAGS_ON_DEVICE" in out


def test_writes_keep_the_flags_container(tmp_path: Path) -> None:
    with (
        _open(DATA / "qwen35tiny-partial/seq-0.partial.bin") as d,
        pytest.raises(kvfast.WriteError, match="PARTIAL_ONLY.*container 'seq'"),
    ):
        kvfast.write(d, tmp_path / "x.ggsq", container="ggsq")
    with _open(DATA / "qwen35tiny-partial/seq-0.device.bin") as d:
        for edit in ({"seq_id": 1}, {"container": "ggsq"}, {"keep": np.ones(7, bool)}):
            with pytest.raises(kvfast.WriteError, match="ON_DEVICE"):
                kvfast.write(d, tmp_path / "x.bin", **edit)  # type: ignore[arg-type]


def test_unedited_writes_are_the_bytes(flagged_file: Path, tmp_path: Path) -> None:
    for with_model in (True, False):
        with _open(flagged_file, with_model) as d:
            out = tmp_path / flagged_file.name
            assert kvfast.write(d, out) == flagged_file.stat().st_size
            assert out.read_bytes() == flagged_file.read_bytes()


# -- loaded back into llama.cpp ---------------------------------------------------------------------

# (CI sets KVFAST_REQUIRE_PROBE=1: there a missing llama_cpp fails instead of skipping)
needs_llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None and not os.environ.get("KVFAST_REQUIRE_PROBE"),
    reason="llama-cpp-python is not installed",
)

NEXT, JUNK = 7, 99  # the token decoded after the prompt, and one decoded to be rolled back


def _get(r: Replay, seq: int, flags: int) -> bytes:
    L, ctx = r.L, r.r.ctx
    n = L.llama_state_seq_get_size_ext(ctx, seq, flags)
    buf = (ctypes.c_uint8 * max(n, 1))()
    assert L.llama_state_seq_get_data_ext(ctx, buf, n, seq, flags) == n
    return bytes(buf[:n])


def _set(r: Replay, data: bytes, seq: int, flags: int) -> int:
    buf = (ctypes.c_uint8 * max(len(data), 1)).from_buffer_copy(data or b"\0")
    return int(r.L.llama_state_seq_set_data_ext(r.r.ctx, buf, len(data), seq, flags))


def _written(src: Path, out: Path, **edit: object) -> bytes:
    with _open(src) as d:
        kvfast.write(d, out, **edit)  # type: ignore[arg-type]
    return out.read_bytes()


PARTIAL_FOLDERS = [d for d in FLAGGED_FOLDERS if ABSENT[d.name] is not None]


@needs_llama
@pytest.mark.parametrize("folder", PARTIAL_FOLDERS, ids=lambda p: p.name)
def test_a_written_checkpoint_restores_as_llama_server_restores_one(folder: Path, tmp_path: Path) -> None:
    """llama-server's checkpoint restore: the sequence went on past the checkpoint (a token decoded
    at position 7), the partial state is loaded with PARTIAL_ONLY, the attention cache is cut back
    to the checkpoint; the next token's logits are those of the whole state's. kvfast's write of the
    partial state (unedited, and with its sequence renamed) does what llama.cpp's own does, and
    reads back as what it wrote."""
    prompt = probe(folder)["seqs"][0]
    whole = (folder / "seq-0.bin").read_bytes()
    own = (folder / "seq-0.partial.bin").read_bytes()
    with Replay(_model(folder), n_seq=2) as r:
        assert _set(r, whole, 0, 0) == len(whole)
        ref = r.step(NEXT, len(prompt))
        for seq, data in [
            (0, own),
            (0, _written(folder / "seq-0.partial.bin", tmp_path / "a.bin")),
            (1, _written(folder / "seq-0.partial.bin", tmp_path / "b.bin", seq_id=1)),
        ]:
            r.clear()
            assert _set(r, whole, seq, 0) == len(whole)
            r.step(JUNK, len(prompt), seq)  # past the checkpoint: its recurrent state moved on
            assert _set(r, data, seq, PARTIAL_ONLY) == len(data)
            assert _get(r, seq, PARTIAL_ONLY) == data
            assert r.L.llama_memory_seq_rm(r.r.mem, seq, len(prompt), -1)
            got = r.step(NEXT, len(prompt), seq)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
        # the checkpoint matters: without it the sequence is not the prompt's
        r.clear()
        _set(r, whole, 0, 0)
        r.step(JUNK, len(prompt))
        moved = r.step(NEXT, len(prompt) + 1)
        assert not np.allclose(moved, ref, rtol=1e-3, atol=1e-3)


@needs_llama
def test_an_edited_sliding_window_checkpoint_loads_with_its_values(tmp_path: Path) -> None:
    """New K values for the sliding-window cache of a Gemma 3 checkpoint: llama.cpp loads them, the
    state read back holds them, and the next token's logits move."""
    folder = DATA / "gemma3tiny-partial"
    src = folder / "seq-0.partial.bin"
    with _open(src) as d:
        k = d.values(0, "k", cache=0)
        new = (k * 0.25).astype(np.float32)
        kvfast.write(d, tmp_path / "edited.bin", values={(0, 0, "k"): new})
    data = (tmp_path / "edited.bin").read_bytes()
    whole = (folder / "seq-0.bin").read_bytes()
    prompt = probe(folder)["seqs"][0]
    with Replay(_model(folder), n_seq=2) as r:
        _set(r, whole, 0, 0)
        ref = r.step(NEXT, len(prompt))
        r.clear()
        _set(r, whole, 0, 0)
        assert _set(r, data, 0, PARTIAL_ONLY) == len(data)
        back = _get(r, 0, PARTIAL_ONLY)
        got = r.step(NEXT, len(prompt))
    assert back == data
    (tmp_path / "back.bin").write_bytes(back)
    with _open(tmp_path / "back.bin", of=folder) as b:
        np.testing.assert_array_equal(b.values(0, "k", cache=0), new.astype(np.float16).astype(np.float32))
    assert not np.allclose(got, ref, rtol=1e-3, atol=1e-3)


@needs_llama
@pytest.mark.parametrize("folder", FLAGGED_FOLDERS, ids=lambda p: p.name)
def test_an_empty_sequence_loads_and_stays_empty(folder: Path, tmp_path: Path) -> None:
    """The empty sequence's states, written by kvfast (unedited, renamed, and the GGSQ as raw
    sequence bytes), load into a sequence of a context that holds another and leave it empty."""
    whole = (folder / "seq-0.bin").read_bytes()
    cases = [
        ((folder / "seq-1.bin").read_bytes(), 1, 0),
        (_written(folder / "seq-1.bin", tmp_path / "a.bin"), 1, 0),
        (_written(folder / "seq-1.bin", tmp_path / "b.bin", seq_id=0), 0, 0),
        # (an empty GGSQ names no sequence: the io header's is given)
        (_written(folder / "seq-1.ggsq", tmp_path / "c.bin", container="seq", seq_id=1), 1, 0),
        (_written(folder / "seq-1.partial.bin", tmp_path / "d.bin"), 1, PARTIAL_ONLY),
    ]
    with Replay(_model(folder), n_seq=2) as r:
        for data, seq, flags in cases:
            r.clear()
            other = 1 - seq
            assert _set(r, whole, other, 0) == len(whole)
            assert _set(r, data, seq, flags) == len(data)
            assert r.seq_pos_max(seq) == -1 and r.seq_pos_max(other) == len(probe(folder)["seqs"][0]) - 1
            assert _get(r, seq, flags) == data


@needs_llama
@pytest.mark.parametrize("folder", FLAGGED_FOLDERS, ids=lambda p: p.name)
def test_a_written_device_state_loads_in_the_context_that_holds_its_rows(
    folder: Path, tmp_path: Path
) -> None:
    """ON_DEVICE bytes name rows llama.cpp keeps in the context: kvfast's write of them (unedited)
    restores the sequence there, as llama.cpp's own bytes do."""
    prompt = probe(folder)["seqs"][0]
    with Replay(_model(folder), n_seq=2) as r:
        r.prompt(prompt)
        host = _get(r, 0, 0)
        for flags in (ON_DEVICE, ON_DEVICE | PARTIAL_ONLY):
            dev = _get(r, 0, flags)
            path = tmp_path / "dev.bin"
            path.write_bytes(dev)
            with _open(path, of=folder) as d:
                assert d.rows_on_device
                out = tmp_path / "written.bin"
                kvfast.write(d, out)
            data = out.read_bytes()
            assert data == dev
            if flags & PARTIAL_ONLY:
                continue  # (the attention part was not saved: restoring it alone is the checkpoint test's)
            r.clear()
            assert _set(r, data, 0, ON_DEVICE) == len(data)
            assert _get(r, 0, 0) == host
