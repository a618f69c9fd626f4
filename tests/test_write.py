"""kvfast.write: the identity (every fixture written back byte for byte) and the edits, checked by
reading the written bytes back (llama.cpp's own load is in test_write_llama.py)."""

import json
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import DATA

import kvfast
import kvfast.writing.cells
from kvfast import _kvfast
from kvfast.writing.cells import cells

ALL_STATES = sorted(
    f
    for d in DATA.iterdir()
    if d.is_dir() and d.name != "models"
    for f in d.iterdir()
    if f.suffix in (".bin", ".ggsq", ".ggsn")
)
QWEN3 = DATA / "models/tiny-qwen3.gguf"
HD128 = DATA / "models/tiny-qwen3-hd128.gguf"


def open_state(path: Path, **kw: object) -> kvfast.State:
    """Open a fixture as its tests do: with its model when probe.json names one the reader needs
    (V-less, recurrent and hybrid memories)."""
    pj = path.parent / "probe.json"
    info = json.loads(pj.read_text()) if pj.exists() else {}
    if "memory" in info:
        kw.setdefault("model", DATA / "models" / info["model"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rotation guesses of model-less quantized states
        return kvfast.open(path, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("path", ALL_STATES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_identity_is_byte_for_byte(path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with open_state(path) as d:
        n = kvfast.write(d, out)
    assert out.read_bytes() == path.read_bytes()
    assert n == path.stat().st_size


def test_identity_of_the_bundled_sample(tmp_path: Path) -> None:
    with kvfast.open(kvfast.sample_path()) as d:
        kvfast.write(d, tmp_path / "s")
    assert (tmp_path / "s").read_bytes() == Path(kvfast.sample_path()).read_bytes()


# -- containers: llama.cpp's own bytes of the other containers ---------------------------------------

NEWEST = [
    d
    for d in sorted(DATA.iterdir())
    if (d / "probe.json").exists()
    and "seqs" in json.loads((d / "probe.json").read_text())
    and not any(era in d.name for era in ("2025", "2026mid"))
    and "flags" not in json.loads((d / "probe.json").read_text())  # (test_partial.py's)
]


@pytest.mark.parametrize("folder", NEWEST, ids=lambda d: d.name)
def test_containers_convert_to_llama_cpps_own_bytes(folder: Path, tmp_path: Path) -> None:
    """Every sequence file of a folder written as each other container gives the bytes llama.cpp
    wrote for that container; the whole state likewise (the token lists are the probe's)."""
    info = json.loads((folder / "probe.json").read_text())
    seqs = info["seqs"]
    for n, toks in enumerate(seqs):
        for src in (folder / f"seq-{n}.bin", folder / f"seq-{n}.ggsq"):
            with open_state(src) as d:
                kvfast.write(d, tmp_path / "a", container="ggsq", tokens=toks)
                kvfast.write(d, tmp_path / "b", container="seq", seq_id=n)
            assert (tmp_path / "a").read_bytes() == (folder / f"seq-{n}.ggsq").read_bytes()
            assert (tmp_path / "b").read_bytes() == (folder / f"seq-{n}.bin").read_bytes()
    whole = [t for s in seqs for t in s]
    with open_state(folder / "state.bin") as d:
        kvfast.write(d, tmp_path / "c", container="ggsn", tokens=whole)
        for n in range(len(seqs)):
            # a per-sequence save of a whole state: llama.cpp's own seq-N.bin
            kvfast.write(d, tmp_path / "d", container="seq", seq_id=n)
            if "swa" not in folder.name:
                # (llama.cpp's per-sequence save leaves out the sliding-window cells already out
                # of the window, which its whole state still holds; kvfast keeps them)
                assert (tmp_path / "d").read_bytes() == (folder / f"seq-{n}.bin").read_bytes()
    assert (tmp_path / "c").read_bytes() == (folder / "state.ggsn").read_bytes()
    with open_state(folder / "state.ggsn") as d:
        kvfast.write(d, tmp_path / "e", container="state")
    assert (tmp_path / "e").read_bytes() == (folder / "state.bin").read_bytes()


def test_old_eras_convert_to_the_newest(tmp_path: Path) -> None:
    """2025 states (GGSQ 2, GGSN 9 with logits, no io magic, no n_stream) written as the newest
    containers read as those, with the same cells and rows."""
    for era in ("qwen3tiny-f16-fa-2025", "qwen3tiny-f16-fa-2025may", "qwen3tiny-f16-fa-2026mid"):
        for name in ("seq-0.bin", "seq-0.ggsq", "state.bin", "state.ggsn"):
            with open_state(DATA / era / name, model=QWEN3) as d:
                for c in ("seq", "ggsq", "ggsn", "state"):
                    kvfast.write(d, tmp_path / c, container=c)
                    with kvfast.open(tmp_path / c) as e:
                        assert e.container == c and e.version == {"ggsq": 3, "ggsn": 10}.get(c)
                        assert "n_stream" in e.features and e.logits is None
                        assert e.caches[0].streams[0].pos.tolist() == d.caches[0].streams[0].pos.tolist()
                        assert e.caches[0].streams[0].seq_ids == [[0]] * 7
                        np.testing.assert_array_equal(e.values(1, "v"), d.values(1, "v"))
                        if c in ("ggsq", "ggsn") and d.tokens is not None:
                            assert e.tokens.tolist() == d.tokens.tolist()


def test_ggsq_2_keeps_the_8_byte_extension_and_3_makes_it_12(tmp_path: Path) -> None:
    with kvfast.open(DATA / "qwen2vltiny-f16-fa/seq-0.ggsq") as d:
        kvfast.write(d, tmp_path / "v2", version=2)
        with kvfast.open(tmp_path / "v2") as e:
            assert e.version == 2 and "cell ext 8" in e.features
            assert e.caches[0].streams[0].ext.tolist() == d.caches[0].streams[0].ext[:, :2].tolist()
            kvfast.write(e, tmp_path / "v3", container="ggsq")
    # the token of each cell comes back from the token list
    assert (tmp_path / "v3").read_bytes() == (DATA / "qwen2vltiny-f16-fa/seq-0.ggsq").read_bytes()


# -- keep ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "folder", ["qwen3tiny-f16-fa", "qwen3tiny-f16-nofa", "qwen3tiny-q4_0-q4_1-fa", "qwen2vltiny-f16-fa"]
)
def test_keep_drops_cells_with_their_rows(folder: str, tmp_path: Path) -> None:
    with open_state(DATA / folder / "seq-0.ggsq") as d:
        pos = d.caches[0].streams[0].pos
        mask = np.isin(pos, [0, 1, 4, 5])
        kvfast.write(d, tmp_path / "p", keep=mask)
        with kvfast.open(tmp_path / "p") as e:
            s = e.caches[0].streams[0]
            assert s.pos.tolist() == [0, 1, 4, 5]
            # token i is the token at position i: 2 and 3 keep theirs, 6 (the end) is cut off
            assert e.tokens.tolist() == d.tokens[:6].tolist()
            if d.cell_ext:
                assert s.ext.tolist() == d.caches[0].streams[0].ext[mask].tolist()
            for layer in range(2):
                for kind in ("k", "v"):
                    np.testing.assert_array_equal(
                        e.values(layer, kind, stored=True), d.values(layer, kind, stored=True)[mask]
                    )


def test_keep_takes_an_expression_over_the_cells(tmp_path: Path) -> None:
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.ggsq", model=QWEN3) as d:
        frame = cells(d, ["k_l2"])
        want = frame.filter((pl.col("k_l2") >= pl.col("k_l2").median()) | (pl.col("pos") == 6))["pos"]
        kvfast.write(
            d, tmp_path / "p", keep=(pl.col("k_l2") >= pl.col("k_l2").median()) | (pl.col("pos") == 6)
        )
        st = d.stats(by="cell", kinds=["k"]).group_by("cell").agg(pl.col("l2").mean()).sort("cell")
        assert np.allclose(frame["k_l2"].to_numpy(), st["l2"].to_numpy())
    with kvfast.open(tmp_path / "p") as e:
        assert e.caches[0].streams[0].pos.tolist() == want.to_list()
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.ggsq") as d:
        with pytest.raises(kvfast.WriteError, match="keep"):
            kvfast.write(d, tmp_path / "x", keep=[True, False])
        with pytest.raises(kvfast.WriteError, match="k_l3|does not evaluate"):
            kvfast.write(d, tmp_path / "x", keep=pl.col("k_l3") > 0)


def test_keep_in_a_whole_state_of_shared_cells(tmp_path: Path) -> None:
    """Dropping the shared prefix's last cell drops it for every sequence; each sequence written
    from the pruned whole state is its own pruned state."""
    folder = DATA / "qwen3tiny-3seq-shared"
    with kvfast.open(folder / "state.bin") as d:
        kvfast.write(d, tmp_path / "p", keep=pl.col("pos") != 3)
        with kvfast.open(tmp_path / "p") as e:
            s, s0 = e.caches[0].streams[0], d.caches[0].streams[0]
            assert s.cell_count == s0.cell_count - 1 and 3 not in s.pos.tolist()
            assert s.shared_cells == s0.shared_cells - 1
            for n in range(3):
                kvfast.write(e, tmp_path / f"s{n}", container="seq", seq_id=n)
                with kvfast.open(tmp_path / f"s{n}") as one, kvfast.open(folder / f"seq-{n}.bin") as ref:
                    keep = ref.caches[0].streams[0].pos != 3
                    np.testing.assert_array_equal(one.values(0, "k"), ref.values(0, "k")[keep])


def test_keep_keeps_the_server_blob_packed(tmp_path: Path) -> None:
    src = DATA / "gemma3-270m-server/gemma3-270m-server-f16-slot1.bin"
    with kvfast.open(src) as d:
        n = [c.streams[1].cell_count for c in d.caches]  # slot 1: stream 1 of both caches
        kvfast.write(d, tmp_path / "p", keep=pl.col("pos") != 2)
        last = int(d.caches[0].streams[1].pos.max())
        kvfast.write(d, tmp_path / "q", keep=pl.col("pos") != last)
        with kvfast.open(tmp_path / "p") as e:
            # the blob is the source's (position 2 keeps its token: token i is at position i)
            assert e.server_tokens is not None and e.token_words.tolist() == d.token_words.tolist()
            # both caches of the iSWA pair lose the token (sync)
            assert [c.streams[1].cell_count for c in e.caches] == [k - 1 for k in n]
        with kvfast.open(tmp_path / "q") as e:
            assert e.server_tokens is not None and e.server_tokens["n_tokens"] == len(d.tokens) - 1
            assert e.tokens.tolist() == d.tokens[:-1].tolist()


def test_recurrent_part_keeps_its_cells(tmp_path: Path) -> None:
    path = DATA / "qwen35tiny-f16-fa/seq-0.ggsq"
    with open_state(path) as d:
        kvfast.write(d, tmp_path / "p", keep=pl.col("pos") >= 3)
        with open_state(tmp_path / "p", model=DATA / "models/tiny-qwen35.gguf") as e:
            assert e.caches[0].streams[0].pos.tolist() == [3, 4, 5, 6]
            assert e.recurrent is not None and e.recurrent.cell_count == 1
            np.testing.assert_array_equal(e.values(0, "s"), d.values(0, "s"))


# -- values, types, sequences -------------------------------------------------------------------------


@pytest.mark.parametrize("ty", ["f16", "q8_0", "q4_1", "iq4_nl"])
def test_values_replace_a_record(ty: str, tmp_path: Path) -> None:
    src = DATA / (f"qwen3tiny-{ty}-fa" if ty in ("f16", "q8_0") else "qwen3tiny-q4_0-q4_1-fa") / "seq-0.ggsq"
    with open_state(src) as d:
        kind = "v" if ty == "q4_1" else "k"
        x = d.values(1, kind).astype(np.float32)
        new = np.round(x * 2) / 2 if ty != "iq4_nl" else x
        kvfast.write(d, tmp_path / "r", values={(1, kind): new})
        with kvfast.open(tmp_path / "r") as e:
            got = e.values(1, kind).astype(np.float32)
            assert np.abs(got - new).max() <= np.abs(new).max() / 7  # within the type's error
            np.testing.assert_array_equal(e.values(0, kind), d.values(0, kind))
        with pytest.raises(kvfast.WriteError, match="shape"):
            kvfast.write(d, tmp_path / "x", values={(1, kind): new[:3]})


def test_requantize_reads_in_the_models_basis_and_stores_rotated(tmp_path: Path) -> None:
    """f16 written as q8_0 K / q4_1 V with the head size of 128: read back (rotation undone), the
    values are the f16 ones within the type's error; the stored rows are close to llama.cpp's own
    q8_0 cache of the same prompt, and far from it without the rotation."""
    with kvfast.open(DATA / "qwen3hd128-f16-fa/seq-0.ggsq", model=HD128) as d:
        kvfast.write(d, tmp_path / "r", cache_type_k="q8_0", cache_type_v="q4_1")
        kvfast.write(d, tmp_path / "u", cache_type_k="q8_0", rotate=False)
        x = d.values(0, "k").astype(np.float32)
    native = kvfast.open(DATA / "qwen3hd128-q8_0-fa/seq-0.ggsq", model=HD128)
    with kvfast.open(tmp_path / "r", model=HD128) as e, kvfast.open(tmp_path / "u", model=HD128) as u:
        assert [(r.kind, r.group) for r in e.rotation] == [("k", 128), ("v", 64)]
        rel = np.linalg.norm(e.values(0, "k") - x) / np.linalg.norm(x)
        assert rel < 0.01
        ref = native.values(0, "k", stored=True)
        near = np.linalg.norm(e.values(0, "k", stored=True) - ref) / np.linalg.norm(ref)
        far = np.linalg.norm(u.values(0, "k", stored=True) - ref) / np.linalg.norm(ref)
        assert near < 0.05 and far > 0.5
    with (
        kvfast.open(DATA / "qwen3hd128-f16-fa/seq-0.ggsq") as d,
        pytest.raises(kvfast.WriteError, match="model="),
    ):
        kvfast.write(d, tmp_path / "x", cache_type_k="q8_0")
    with (
        kvfast.open(DATA / "qwen3tiny-f16-nofa/seq-0.ggsq") as d,
        pytest.raises(kvfast.WriteError, match="transposed"),
    ):
        kvfast.write(d, tmp_path / "x", cache_type_v="q8_0")


def test_sequences_rename_extract_and_join(tmp_path: Path) -> None:
    folder = DATA / "qwen3tiny-3seq-shared"
    with kvfast.open(folder / "seq-1.bin") as d:
        kvfast.write(d, tmp_path / "r", seq_id=5)
        with kvfast.open(tmp_path / "r") as e:
            assert e.seq_id == 5 and e.caches[0].streams[0].sequences == [5]
    with kvfast.open(folder / "state.bin") as d, pytest.raises(kvfast.WriteError, match="choose"):
        kvfast.write(d, tmp_path / "x", container="ggsq")
    a, b = kvfast.open(folder / "seq-0.ggsq"), kvfast.open(folder / "seq-2.ggsq")
    with pytest.raises(kvfast.WriteError, match="rename") as e:
        kvfast.write([a, a], tmp_path / "x", arch="qwen3")
    assert e.value.field == "seq_id" and not isinstance(e.value, kvfast.FormatError)
    with pytest.raises(kvfast.WriteError, match="arch"):
        kvfast.write([a, b], tmp_path / "x")
    kvfast.write([a, b], tmp_path / "j", arch="qwen3", seq_id=[0, 1])
    with kvfast.open(tmp_path / "j") as j:
        s = j.caches[0].streams[0]
        assert j.container == "state" and j.arch == "qwen3"
        assert s.cell_count == 9 + 15 and s.sequences == [0, 1]
        np.testing.assert_array_equal(j.values(1, "v")[9:], b.values(1, "v"))


def test_bad_arguments_are_write_errors(tmp_path: Path) -> None:
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.ggsq") as d:
        for kw, field in (
            ({"container": "gguf"}, "container"),
            ({"container": "ggsq", "version": 4}, "version"),
            ({"container": "seq", "version": 3}, "version"),
            ({"seq_id": 256}, "seq_id"),
            ({"seq_map": {0: -1}}, "seq_id"),
            ({"seq_map": {0: 2**40}}, "seq_id"),
            ({"v_trans": True, "cache_type_v": "q8_0", "rotate": False}, "v_trans"),
            ({"keep": [True] * 6}, "keep"),
            ({"cache_type_k": "q4_k"}, "cache_type_k"),
            ({"values": {(0, "r"): np.zeros((7, 64))}}, "values"),
        ):
            with pytest.raises(kvfast.WriteError) as e:
                kvfast.write(d, tmp_path / "x", **kw)  # type: ignore[arg-type]
            assert e.value.field == field and e.value.kind == "write"
    assert not list(tmp_path.iterdir())


def test_the_writers_rules_are_the_cores(tmp_path: Path) -> None:
    """Containers, versions and sequence ids as kvfast-core writes them; its refusals are
    kvfast.WriteError (one class, wherever it is imported from), the argument in ``field``."""
    assert kvfast.WriteError is kvfast.errors.WriteError is kvfast.writing.cells.WriteError
    assert _kvfast.WRITE_VERSIONS == {"seq": [], "ggsq": [2, 3], "ggsn": [9, 10], "state": []}
    assert _kvfast.MAX_SEQ == 256
    with kvfast.open(DATA / "qwen3tiny-3seq-shared/state.bin") as d:
        with pytest.raises(kvfast.WriteError, match=r"holds sequences \[0, 1, 2\], not 7") as e:
            kvfast.write(d, tmp_path / "x", seq_id=7)
        assert e.value.field == "seq_id"
        with pytest.raises(kvfast.WriteError, match="LLAMA_MAX_SEQ"):
            kvfast.write(d, tmp_path / "x", seq_id=256)
    assert not list(tmp_path.iterdir())


def test_v_trans_turns_transposed_v_into_rows_and_back(tmp_path: Path) -> None:
    """A state written without flash attention (V transposed) as one with it: llama.cpp's own bytes
    of the same prompt with flash attention, but for the values (computed otherwise); and back."""
    nofa, fa = DATA / "qwen3tiny-f16-nofa/seq-0.ggsq", DATA / "qwen3tiny-f16-fa/seq-0.ggsq"
    with kvfast.open(nofa) as d:
        kvfast.write(d, tmp_path / "rows", v_trans=False)
        kvfast.write(d, tmp_path / "q", v_trans=False, cache_type_v="q8_0", rotate=False)
        with pytest.raises(kvfast.WriteError, match="transposed"):
            kvfast.write(d, tmp_path / "x", cache_type_v="q8_0")
        with kvfast.open(tmp_path / "rows") as e, kvfast.open(fa) as ref:
            assert not e.caches[0].streams[0].v_trans and e.size == ref.size
            np.testing.assert_array_equal(e.values(1, "v"), d.values(1, "v"))
            assert e.layout()["nbytes"].to_list() == ref.layout()["nbytes"].to_list()
            kvfast.write(e, tmp_path / "back", v_trans=True)
    assert (tmp_path / "back").read_bytes() == nofa.read_bytes()
    with (
        open_state(DATA / "qwen3tiny-q8_0-fa/seq-0.ggsq") as q,
        pytest.raises(kvfast.WriteError, match="transposed"),
    ):
        kvfast.write(q, tmp_path / "x", v_trans=True)


def test_joined_sequences_share_their_common_prefix_as_llama_cpp_does(tmp_path: Path) -> None:
    """The three per-sequence states of a prompt prefix decoded once and copied to three sequences,
    joined with share=True: llama.cpp's own whole state (and session file), byte for byte; without
    sharing, the prefix's cells once per sequence."""
    folder = DATA / "qwen3tiny-3seq-shared"
    seqs = json.loads((folder / "probe.json").read_text())["seqs"]
    parts = [kvfast.open(folder / f"seq-{n}.ggsq") for n in range(3)]
    kvfast.write(parts, tmp_path / "j.state", arch="qwen3", share=True)
    assert (tmp_path / "j.state").read_bytes() == (folder / "state.bin").read_bytes()
    kvfast.write(
        parts,
        tmp_path / "j.ggsn",
        container="ggsn",
        arch="qwen3",
        share=True,
        tokens=[t for s in seqs for t in s],
    )
    assert (tmp_path / "j.ggsn").read_bytes() == (folder / "state.ggsn").read_bytes()
    kvfast.write(parts, tmp_path / "apart.state", arch="qwen3")
    with kvfast.open(tmp_path / "apart.state") as d:
        s = d.caches[0].streams[0]
        assert s.cell_count == sum(map(len, seqs)) and s.shared_cells == 0


def test_null_flags_are_refused_and_a_state_can_be_written_over_itself(tmp_path: Path) -> None:
    src = tmp_path / "s.ggsq"
    src.write_bytes((DATA / "qwen3tiny-f16-fa/seq-0.ggsq").read_bytes())
    with kvfast.open(src) as d:
        with pytest.raises(kvfast.WriteError, match="null"):
            kvfast.write(d, tmp_path / "x", keep=pl.col("piece") != "a")
        with pytest.raises(kvfast.OutputError, match="is the file this write reads"):
            kvfast.write(d, src, keep=pl.col("pos") >= 2)
        kvfast.write(d, src, keep=pl.col("pos") >= 2, replace=True)
    with kvfast.open(src) as e:
        assert e.caches[0].streams[0].pos.tolist() == [2, 3, 4, 5, 6]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.ggsq"]


def test_values_from_arrow_and_polars(tmp_path: Path) -> None:
    import pyarrow as pa

    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.ggsq") as d:
        x = d.values(0, "k").astype(np.float32) * 2
        arrow = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 64)
        for arr in (arrow, pl.Series(x), pa.chunked_array([arrow])):
            kvfast.write(d, tmp_path / "a", values={(0, "k"): arr})
            with kvfast.open(tmp_path / "a") as e:
                np.testing.assert_array_equal(e.values(0, "k"), x.astype(np.float16))


def test_writes_at_once_never_share_a_temporary_file(tmp_path: Path) -> None:
    """Eight writes at once to one path, and to paths that differ only in extension: each file
    whole, no temporary file left."""
    import threading

    src_path = DATA / "qwen3tiny-f16-fa/seq-0.bin"
    want = src_path.read_bytes()
    with kvfast.open(src_path) as src:
        targets = [tmp_path / "out.bin"] * 4 + [tmp_path / f"out.{ext}" for ext in ("a", "b", "c", "d")]
        threads = [threading.Thread(target=kvfast.write, args=(src, t)) for t in targets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.a", "out.b", "out.bin", "out.c", "out.d"]
    assert all(p.read_bytes() == want for p in tmp_path.iterdir())
