"""What a state kvfast writes means: its sequences, positions and tokens as llama.cpp takes them,
and every state written reads back (llama.cpp's own load of these is in test_write_llama_meaning.py).

- A sequence container holds one sequence (llama.cpp loads every cell of it into the sequence it is
  loaded as): several sequences are refused there.
- A sequence state's cells that list no sequence (a 2025 build's, the recurrent part's) are its
  sequence's: renamed with ``seq_id=`` / ``seq_map=`` and joined as such.
- The token list is indexed by position (token i at position i), after any edit.
- ``sync`` drops, from the other caches, the token dropped, not every cell of its position.
"""

import json
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import DATA

import kvfast

MODELS = DATA / "models"


def quiet(path: Path, **kw: object) -> kvfast.State:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kvfast.open(path, **kw)  # type: ignore[arg-type]


def seqs(path: Path, **kw: object) -> list[list[list[int]]]:
    """The sequences of every cell, per attention cache (the recurrent part's last, if any)."""
    with quiet(path, **kw) as e:
        out = [[q for s in c.streams for q in s.seq_ids] for c in e.caches]
        if e.recurrent is not None:
            out.append(e.recurrent.stream.seq_ids)
        return out


# -- 1: a sequence container holds one sequence -----------------------------------------------------


@pytest.mark.parametrize("container", ["ggsq", "seq"])
def test_several_sequences_are_refused_as_a_sequence_container(container: str, tmp_path: Path) -> None:
    folder = DATA / "qwen3tiny-3seq-shared"
    a, b = kvfast.open(folder / "seq-0.ggsq"), kvfast.open(folder / "seq-1.ggsq")
    for kw in ({"seq_id": [0, 1]}, {"seq_id": [0, 1], "share": True}, {"seq_id": [4, 5]}):
        with pytest.raises(kvfast.WriteError, match="one sequence") as e:
            kvfast.write([a, b], tmp_path / "j", container=container, **kw)  # type: ignore[arg-type]
        assert e.value.field == "container"
    m = [
        kvfast.open(DATA / f"mamba2tiny-2seq/seq-{n}.ggsq", model=MODELS / "tiny-mamba2.gguf") for n in (0, 1)
    ]
    with pytest.raises(kvfast.WriteError, match="one sequence"):
        kvfast.write(m, tmp_path / "m", container=container, seq_id=[0, 1])
    assert not list(tmp_path.iterdir())
    # one sequence of each, joined as a whole state, is what was meant
    kvfast.write([a, b], tmp_path / "j", seq_id=[0, 1], arch="qwen3")
    assert seqs(tmp_path / "j") == [[[0]] * 9 + [[1]] * 12]


# -- 2, 3: cells that list no sequence are their state's sequence's ---------------------------------


def test_2025_sequence_states_take_the_sequence_they_are_given(tmp_path: Path) -> None:
    """2025 sequence states list no sequence in their cells: seq_id= names it, in a join and
    alone; joined without new names, two states of sequence 0 are refused (no (pos, seq) twice)."""
    era = DATA / "qwen3tiny-f16-fa-2025may"
    x, y = kvfast.open(era / "seq-0.ggsq"), kvfast.open(era / "seq-0.bin")
    assert x.caches[0].streams[0].seq_ids == [[]] * 7
    kvfast.write([x, y], tmp_path / "j", arch="qwen3", seq_id=[0, 1])
    assert seqs(tmp_path / "j") == [[[0]] * 7 + [[1]] * 7]
    with pytest.raises(kvfast.WriteError, match="rename") as e:
        kvfast.write([x, y], tmp_path / "x", arch="qwen3")
    assert e.value.field == "seq_id"
    kvfast.write(x, tmp_path / "s3", container="state", seq_id=3, arch="qwen3")
    assert seqs(tmp_path / "s3") == [[[3]] * 7]
    kvfast.write(x, tmp_path / "m2", container="ggsn", seq_map={0: 2}, arch="qwen3")
    assert seqs(tmp_path / "m2") == [[[2]] * 7]
    # written as a sequence state of its own era again, the cells list none (llama.cpp's bytes)
    kvfast.write(x, tmp_path / "again", seq_id=3)
    assert (tmp_path / "again").read_bytes() == (era / "seq-0.ggsq").read_bytes()


def test_recurrent_sequence_states_join_as_llama_cpp_holds_them(tmp_path: Path) -> None:
    """Mamba2's per-sequence states (the recurrent cell lists no sequence) joined with
    seq_id=[0, 1]: one cell per sequence, llama.cpp's own whole state of the two, byte for byte;
    hybrid (Qwen3.5) likewise, but for the order of the attention cells (llama.cpp decoded the two
    prompts in turns)."""
    for folder, model, arch in (
        ("mamba2tiny-2seq", "tiny-mamba2.gguf", "mamba2"),
        ("qwen35tiny-2seq", "tiny-qwen35.gguf", "qwen35"),
    ):
        m = MODELS / model
        parts = [kvfast.open(DATA / folder / f"seq-{n}.ggsq", model=m) for n in (0, 1)]
        kvfast.write(parts, tmp_path / f"{arch}.state", seq_id=[0, 1], arch=arch)
        with (
            kvfast.open(tmp_path / f"{arch}.state", model=m) as j,
            kvfast.open(DATA / folder / "state.bin", model=m) as ref,
        ):
            assert j.recurrent is not None and ref.recurrent is not None
            assert j.recurrent.stream.seq_ids == ref.recurrent.stream.seq_ids == [[0], [1]]
            assert j.recurrent.stream.pos.tolist() == ref.recurrent.stream.pos.tolist()
            np.testing.assert_array_equal(j.values(0, "s"), ref.values(0, "s"))
            cells = [
                sorted(zip(c.streams[0].seq_ids, c.streams[0].pos.tolist())) for c in (j.caches + ref.caches)
            ]
            assert cells[: len(j.caches)] == cells[len(j.caches) :]
        if arch == "mamba2":
            assert (tmp_path / f"{arch}.state").read_bytes() == (DATA / folder / "state.bin").read_bytes()
            # GGSQ files of the recurrent part alone name no sequence: both are sequence 0
            with pytest.raises(kvfast.WriteError, match="rename"):
                kvfast.write(parts, tmp_path / "x", arch=arch)


def test_a_sequence_written_as_a_whole_state_warns_of_its_number(tmp_path: Path) -> None:
    """Sequence 1 alone as a whole state loads only into a context of 2 sequences or more:
    kvfast says so; seq_id=0 renumbers it, and a whole state's own numbers never warn."""
    folder = DATA / "qwen3tiny-3seq-shared"
    with kvfast.open(folder / "seq-1.bin") as d:
        with pytest.warns(kvfast.WriteWarning, match=r"sequences \[1\].*at least 2.*seq_id=0"):
            kvfast.write(d, tmp_path / "one.state", container="state", arch="qwen3")
        assert seqs(tmp_path / "one.state") == [[[1]] * 12]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            kvfast.write(d, tmp_path / "zero.state", container="state", arch="qwen3", seq_id=0)
            with kvfast.open(folder / "state.bin") as w:
                kvfast.write(w, tmp_path / "w.ggsn", container="ggsn")
    assert seqs(tmp_path / "zero.state") == [[[0]] * 12]
    parts = [kvfast.open(folder / f"seq-{n}.bin") for n in (0, 2)]
    with pytest.warns(kvfast.WriteWarning, match=r"\[0, 2\].*seq_id=\[0, 1\]"):
        kvfast.write(parts, tmp_path / "j.state", arch="qwen3")


# -- 4: the token list stays indexed by position -----------------------------------------------------


def test_tokens_stay_at_their_positions_after_pruning(tmp_path: Path) -> None:
    """Dropping position 1 keeps the token list (token i is at position i, as llama-server reads
    it), so every kept cell reads back its own token; dropping the end cuts the list there."""
    src = DATA / "qwen3tiny-f16-fa/seq-0.ggsq"
    with kvfast.open(src) as d:
        before = d.cell_tokens()
        kvfast.write(d, tmp_path / "p", keep=pl.col("pos") != 1)
        kvfast.write(d, tmp_path / "t", keep=pl.col("pos") < 4)
        kvfast.write(d, tmp_path / "s", container="ggsn", arch="qwen3", keep=pl.col("pos").is_in([0, 6]))
        toks = d.tokens.tolist()
    with kvfast.open(tmp_path / "p") as e:
        assert e.tokens.tolist() == toks
        want = before.filter(pl.col("pos") != 1)
        assert e.cell_tokens()["token"].to_list() == want["token"].to_list()
    with kvfast.open(tmp_path / "t") as e:
        assert e.tokens.tolist() == toks[:4] and e.caches[0].streams[0].pos.tolist() == [0, 1, 2, 3]
    with kvfast.open(tmp_path / "s") as e:
        assert e.tokens.tolist() == toks
        assert e.cell_tokens()["token"].to_list() == [toks[0], toks[6]]


# -- 5: sync drops the token, not its position --------------------------------------------------------


def patched_positions(src: Path, out: Path, at: dict[int, int]) -> None:
    """A copy of `src` with the i32 at each byte offset set (a cell's position)."""
    b = bytearray(src.read_bytes())
    for off, v in at.items():
        b[off : off + 4] = v.to_bytes(4, "little", signed=True)
    out.write_bytes(bytes(b))


def test_sync_drops_one_cell_of_a_position_held_twice(tmp_path: Path) -> None:
    """A position a sequence holds twice (M-RoPE image tokens, llama_memory_seq_div): dropping one
    of its cells keeps the other, in one cache and in both caches of an iSWA pair (the cells of a
    position pair up in their order)."""
    # raw sequence bytes: io header 8, n_stream 4, cell_count 4, then 12 bytes per cell (pos first)
    one = tmp_path / "one.bin"
    patched_positions(DATA / "qwen3tiny-f16-fa/seq-0.bin", one, {16 + 12 * 3: 2})
    with kvfast.open(one) as d:
        assert d.caches[0].streams[0].pos.tolist() == [0, 1, 2, 2, 4, 5, 6]
        kvfast.write(d, tmp_path / "p", keep=pl.col("cell") != 3)
        with kvfast.open(tmp_path / "p") as e:
            assert e.caches[0].streams[0].pos.tolist() == [0, 1, 2, 4, 5, 6]
            np.testing.assert_array_equal(e.values(0, "k")[2], d.values(0, "k")[2])
    # LFM2 with a sliding window: cache 0 (no layer) holds positions 0-6, cache 1 positions 3-6;
    # cache 1's cells start at 16 + 7 * 12 + 8 (v_trans, n_layer) + 8 (n_stream, cell_count)
    two = tmp_path / "two.bin"
    patched_positions(DATA / "lfm2swatiny-f16-fa/seq-0.bin", two, {16 + 12 * 4: 3, 116 + 12 * 1: 3})
    model = MODELS / "tiny-lfm2-swa.gguf"
    with quiet(two, model=model) as d:
        assert [c.streams[0].pos.tolist() for c in d.caches] == [[0, 1, 2, 3, 3, 5, 6], [3, 3, 5, 6]]
        kvfast.write(d, tmp_path / "q", keep=~((pl.col("cache") == 0) & (pl.col("cell") == 4)))
        with quiet(tmp_path / "q", model=model) as e:
            assert [c.streams[0].pos.tolist() for c in e.caches] == [[0, 1, 2, 3, 5, 6], [3, 5, 6]]
            # the first cell of position 3 stays in cache 1, as in cache 0
            np.testing.assert_array_equal(e.values(0, "k", cache=1)[0], d.values(0, "k", cache=1)[0])
            assert not np.array_equal(e.values(0, "k", cache=1)[0], d.values(0, "k", cache=1)[1])


# -- 6: every state written reads back ------------------------------------------------------------------


def test_an_emptied_full_attention_cache_is_refused(tmp_path: Path) -> None:
    """An iSWA state whose full-attention cache would hold no cell while the sliding-window one
    holds some is not what llama.cpp writes (nor can a reader tell its caches apart): refused."""
    for src, kw in (
        (DATA / "gemma3-270m-f16-fa/seq-0.ggsq", {}),
        (DATA / "lfm2swatiny-f16-fa/seq-0.ggsq", {"model": MODELS / "tiny-lfm2-swa.gguf"}),
    ):
        with quiet(src, **kw) as d:
            with pytest.raises(kvfast.WriteError, match="no cell while cache 1") as e:
                kvfast.write(d, tmp_path / "x", keep=pl.col("cache") != 0, sync=False)
            assert e.value.field == "keep"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "folder,model",
    [
        ("qwen3tiny-f16-fa", "tiny-qwen3.gguf"),
        ("qwen35tiny-f16-fa", "tiny-qwen35.gguf"),
        ("lfm2tiny-f16-fa", "tiny-lfm2.gguf"),
        ("lfm2swatiny-f16-fa", "tiny-lfm2-swa.gguf"),
        ("deepseek2mla-f16-fa", "tiny-deepseek2-mla.gguf"),
    ],
)
def test_states_without_attention_cells_read_back_with_their_model(
    folder: str, model: str, tmp_path: Path
) -> None:
    """Every attention cell dropped (a 0-cell state for a plain model): each container reads back
    with model=, as llama.cpp loads it; the sliding-window cache of an iSWA pair emptied alone too."""
    with quiet(DATA / folder / "seq-0.ggsq", model=MODELS / model) as d:
        for c in ("seq", "ggsq", "ggsn", "state"):
            kvfast.write(d, tmp_path / c, container=c, keep=pl.col("pos") < 0)
            with quiet(tmp_path / c, model=MODELS / model) as e:
                assert sum(s.cell_count for k in e.caches for s in k.streams) == 0
                assert (e.recurrent is None) == (d.recurrent is None)
                if c in ("ggsq", "ggsn"):
                    assert e.tokens.tolist() == []  # no cell: the list ends before position 0
        if len(d.caches) == 2:
            kvfast.write(d, tmp_path / "w", keep=pl.col("cache") != 1, sync=False)
            with quiet(tmp_path / "w", model=MODELS / model) as e:
                assert [c.streams[0].cell_count for c in e.caches] == [7, 0]


def test_ggsn_9_of_an_m_rope_state_reads_back(tmp_path: Path) -> None:
    """GGSN 9 is the builds of the 8-byte cell extension (x, y): written so, it reads back, and
    GGSN 10 written from it is llama.cpp's own session file (the token from the token list)."""
    folder = DATA / "qwen2vltiny-f16-fa"
    with kvfast.open(folder / "state.ggsn") as d:
        kvfast.write(d, tmp_path / "v9", version=9)
        with kvfast.open(tmp_path / "v9") as e:
            assert e.version == 9 and "cell ext 8" in e.features
            assert e.caches[0].streams[0].ext.tolist() == d.caches[0].streams[0].ext[:, :2].tolist()
            kvfast.write(e, tmp_path / "v10", version=10)
    assert (tmp_path / "v10").read_bytes() == (folder / "state.ggsn").read_bytes()
    toks = json.loads((folder / "probe.json").read_text())["seqs"][0]
    with kvfast.open(folder / "seq-0.ggsq") as d:
        kvfast.write(d, tmp_path / "s9", container="ggsn", version=9, arch="qwen2vl", tokens=toks)
        with kvfast.open(tmp_path / "s9") as e:
            assert e.caches[0].streams[0].pos.tolist() == d.caches[0].streams[0].pos.tolist()
