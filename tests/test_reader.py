"""kvfast.open on every real llama.cpp state in tests/data, checked against facts established here."""

import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA, FOLDERS, probe, proc_status_kb

import kvfast
from kvfast import synth


def expected_container(path: Path) -> tuple[str, int | None]:
    old = path.parent.name.endswith(("-2025", "-2025may", "-2026mid"))
    return {
        ".ggsq": ("ggsq", 2 if old else 3),
        ".ggsn": ("ggsn", 9 if old else 10),
    }.get(path.suffix, ("seq" if path.name.startswith("seq-") else "state", None))


def common_prefix(seqs: list[list[int]]) -> int:
    n = 0
    while all(len(s) > n for s in seqs) and len({s[n] for s in seqs}) == 1:
        n += 1
    return n


def test_every_fixture_opens_with_its_container_and_version(state_file: Path) -> None:
    with kvfast.open(state_file) as d:
        assert (d.container, d.version) == expected_container(state_file)
        assert d.size == state_file.stat().st_size
        assert d.row_bytes + d.output_bytes + d.meta_bytes == d.size


def test_cells_positions_and_sequences(state_file: Path) -> None:
    p = probe(state_file.parent)
    seqs = p["seqs"]
    with kvfast.open(state_file) as d:
        for cache in d.caches:
            [stream] = [s for s in cache.streams if s.cell_count]
            if state_file.name.startswith("seq-"):
                n = int(state_file.stem.split("-")[1])
                assert stream.cell_count == len(seqs[n])
                assert stream.pos.tolist() == list(range(len(seqs[n])))
                if "2025may" in state_file.parent.name:
                    # builds before mid-2025 write n_seq_id = 0 in sequence states
                    assert stream.seq_ids == [[]] * len(seqs[n])
                else:
                    assert stream.seq_ids == [[n]] * len(seqs[n])
            else:
                shared = common_prefix(seqs) if len(seqs) > 1 else 0
                assert stream.cell_count == sum(map(len, seqs)) - shared * (len(seqs) - 1)
                by_pos_shared = [ids for pos, ids in zip(stream.pos, stream.seq_ids) if len(ids) > 1]
                assert len(by_pos_shared) == (shared if len(seqs) > 1 else 0)
                for q, toks in enumerate(seqs):
                    cells = [pos for pos, ids in zip(stream.pos, stream.seq_ids) if q in ids]
                    assert sorted(cells) == list(range(len(toks)))


def test_tokens(state_file: Path) -> None:
    seqs = probe(state_file.parent)["seqs"]
    with kvfast.open(state_file) as d:
        if state_file.suffix == ".ggsq":
            n = int(state_file.stem.split("-")[1])
            assert d.tokens.tolist() == seqs[n]
        elif state_file.suffix == ".ggsn":
            assert d.tokens.tolist() == [t for s in seqs for t in s]
        else:
            assert d.tokens is None


def test_layers_types_and_row_sizes(state_file: Path) -> None:
    p = probe(state_file.parent)
    gemma = state_file.parent.name.startswith("gemma3")
    n_embd = {"tiny-qwen3.gguf": 64, "tiny-qwen2vl.gguf": 32, "tiny-qwen3-hd128.gguf": 256}.get(
        p["model"], 256
    )
    with kvfast.open(state_file) as d:
        assert [c.n_layer for c in d.caches] == ([3, 15] if gemma else [2])
        for c in d.caches:
            for s in c.streams:
                assert s.v_trans == (p["fa"] == "off")
                for ly in s.layers:
                    assert (ly.k_type, ly.v_type) == (p["ctk"], p["ctv"])
                    assert ly.n_embd_k == ly.n_embd_v == n_embd
                    assert ly.k_nbytes == synth.row_bytes(ly.k_type, n_embd) * s.cell_count


def test_offsets_by_hand_qwen3_f16() -> None:
    # io magic + seq_id + n_stream + cell_count + 7 x (pos, n_seq_id, seq_id) + v_trans + n_layer
    first_header = 4 + 4 + 4 + 4 + 7 * 12 + 4 + 4
    row = 64 * 2
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin") as d:
        layers = d.caches[0].streams[0].layers
        assert layers[0].k_offset == first_header + 12
        assert layers[1].k_offset == layers[0].k_offset + 7 * row + 12
        assert layers[0].v_offset == layers[1].k_offset + 7 * row + 12
        raw = (DATA / "qwen3tiny-f16-fa/seq-0.bin").read_bytes()
        assert struct.unpack_from("<iQ", raw, first_header) == (1, row)
        k = np.frombuffer(raw, "<f2", count=7 * 64, offset=layers[0].k_offset).reshape(7, 64)
        np.testing.assert_array_equal(d.values(0, "k"), k)


def test_worked_example_of_the_format_doc(tmp_path: Path) -> None:
    # Qwen3-0.6B shape: 28 layers, 8 KV heads x 128, f16, flash attention, 7 tokens
    path = tmp_path / "w.bin"
    assert synth.write_state(path, cells=7, n_layer=28, n_embd_k=1024) == 803_596
    with kvfast.open(path) as d:
        assert (d.row_bytes, d.meta_bytes) == (802_816, 780)
        assert d.caches[0].streams[0].layers[0].k_offset == 120
        lay = d.layout()
        assert lay["offset"][0] == 0
        assert (lay["offset"] + lay["nbytes"]).to_list()[:-1] == lay["offset"].to_list()[1:]
        assert int(lay["nbytes"].sum()) == 803_596
        assert int(lay.filter(role="rows")["nbytes"].sum()) == 802_816


def test_layout_tiles_the_file(state_file: Path) -> None:
    with kvfast.open(state_file) as d:
        lay = d.layout()
        assert set(lay.columns) >= {"offset", "nbytes", "what", "cache", "stream", "kind", "layer", "type"}
        ends = (lay["offset"] + lay["nbytes"]).to_list()
        assert lay["offset"].to_list() == [0] + ends[:-1]
        assert ends[-1] == d.size
        rows = lay.filter(what="k rows")
        n_layers = sum(c.n_layer for c in d.caches)
        assert rows.height == n_layers


def test_two_caches_of_gemma3() -> None:
    for f in ("seq-0.bin", "seq-0.ggsq", "state.bin", "state.ggsn"):
        with kvfast.open(DATA / "gemma3-270m-f16-fa" / f) as d:
            assert len(d.caches) == 2
            assert d.caches[1].offset > d.caches[0].offset
            if f.startswith("state"):
                assert d.arch == "gemma3"


def test_cell_extension_of_mrope() -> None:
    toks = probe(DATA / "qwen2vltiny-f16-fa")["seqs"][0]
    for f in ("seq-0.bin", "seq-0.ggsq", "state.bin", "state.ggsn"):
        with kvfast.open(DATA / "qwen2vltiny-f16-fa" / f) as d:
            assert d.cell_ext
            ext = d.caches[0].streams[0].ext
            assert ext.shape == (6, 3)
            assert ext[:, 2].tolist() == toks
            assert ext[:, 0].tolist() == list(range(6))
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin") as d:
        assert not d.cell_ext and d.caches[0].streams[0].ext is None


def test_cell_ext_given_by_the_caller_must_fit() -> None:
    with pytest.raises(kvfast.FormatError):
        kvfast.open(DATA / "qwen2vltiny-f16-fa/seq-0.bin", cell_ext=False)
    with pytest.raises(kvfast.FormatError):
        kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin", cell_ext=True)
    assert kvfast.open(DATA / "qwen2vltiny-f16-fa/seq-0.bin", cell_ext=True).cell_ext


def test_eras_are_named() -> None:
    d = kvfast.open(DATA / "qwen3tiny-f16-fa-2025may/state.bin")
    assert "no n_stream" in d.features and "outputs" in d.features
    d = kvfast.open(DATA / "qwen3tiny-f16-fa-2025/seq-0.bin")
    assert "no io magic" in d.features and d.seq_id is None
    d = kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin")
    assert "io magic" in d.features and d.seq_id == 0


@pytest.mark.parametrize("folder", ["qwen3tiny-f16-fa-2025", "qwen3tiny-f16-fa-2025may"])
def test_logits_of_ggsn_9(folder: str) -> None:
    path = DATA / folder / "state.ggsn"
    raw = path.read_bytes()
    n_tok = struct.unpack_from("<I", raw, 8)[0]
    at = 12 + 4 * n_tok
    arch_len = struct.unpack_from("<I", raw, at)[0]
    at += 4 + arch_len
    n_out = struct.unpack_from("<I", raw, at)[0]
    at += 4 + 4 * n_out
    n_logits = struct.unpack_from("<Q", raw, at)[0]
    expect = np.frombuffer(raw, "<f4", count=n_logits, offset=at + 8)
    with kvfast.open(path) as d:
        assert d.logits.shape == (n_out, n_logits // n_out) == (1, 256)
        np.testing.assert_array_equal(d.logits.ravel(), expect)
        assert d.output_pos.tolist() == [6]
    with kvfast.open(DATA / "qwen3tiny-f16-fa/state.ggsn") as d:
        assert d.logits is None


def test_transposed_v_is_flagged() -> None:
    with kvfast.open(DATA / "qwen3tiny-f16-nofa/state.ggsn") as d:
        assert d.caches[0].streams[0].v_trans


def test_close_and_context_manager() -> None:
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin") as d:
        v = d.values(0, "k")
        assert d.size > 0
    assert d.closed
    for use in (
        lambda: d.size,
        lambda: d.caches,
        lambda: d.layout(),
        lambda: d.to_polars(),
        lambda: d.tokens,
    ):
        with pytest.raises(kvfast.ClosedError, match="closed"):
            use()
    assert v.shape == (7, 64) and np.isfinite(v).all()  # arrays handed out stay valid
    d.close()  # twice is fine


def test_open_reads_metadata_not_rows(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    size = synth.write_state(path, cells=4096, n_layer=16, n_embd_k=1024)  # 256 MiB of rows
    before = proc_status_kb("RssFile")
    with kvfast.open(path) as d:
        assert d.row_bytes == 4096 * 16 * 2 * 2048
        assert d.size == size
        touched_kb = proc_status_kb("RssFile") - before
    assert touched_kb < 16 * 1024, f"opening touched {touched_kb} KiB of a {size >> 20} MiB state"


@pytest.mark.parametrize("container", ["seq", "ggsq", "ggsn", "state"])
@pytest.mark.parametrize("ty", list(synth.TYPES))
def test_synthetic_states_of_every_type(tmp_path: Path, container: str, ty: str) -> None:
    path = tmp_path / "s.bin"
    synth.write_state(path, container=container, k_type=ty, v_type="f16" if ty == "q4_0" else ty)
    with kvfast.open(path) as d:
        assert d.container == container
        ly = d.caches[0].streams[0].layers[0]
        assert ly.k_type == ty and ly.n_embd_k == 64


def test_folders_all_tested() -> None:
    assert len(FOLDERS) == 14
