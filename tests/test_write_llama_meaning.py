"""States kvfast writes, loaded by llama.cpp (llama-cpp-python's C API, kvfast.probe.replay), mean
what was asked: the sequences, positions and tokens llama.cpp holds after loading them, read back
from a whole state llama.cpp saves of its own cache (see test_write_meaning.py for the bytes).

CI installs llama-cpp-python and sets KVFAST_REQUIRE_PROBE=1, so there a missing llama_cpp fails
instead of skipping.
"""

import json
import os
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import DATA

import kvfast

if not os.environ.get("KVFAST_REQUIRE_PROBE"):
    pytest.importorskip("llama_cpp")
from kvfast.probe.replay import LoadError, Replay

MODELS = DATA / "models"
QWEN3, MAMBA2, LFM2SWA = (
    MODELS / "tiny-qwen3.gguf",
    MODELS / "tiny-mamba2.gguf",
    MODELS / "tiny-lfm2-swa.gguf",
)
NEXT = 7


def opened(path: Path, **kw: object) -> kvfast.State:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kvfast.open(path, **kw)  # type: ignore[arg-type]


def held(r: Replay, out: Path, model: Path) -> list[list[tuple[int, list[int]]]]:
    """What llama.cpp holds: (position, sequences) of every cell of each cache (the recurrent part
    last), read from the whole state llama.cpp saves of its cache."""
    r.save(out, "state_data")
    with opened(out, model=model) as e:
        caches = [
            [(int(p), q) for s in c.streams for p, q in zip(s.pos.tolist(), s.seq_ids)] for c in e.caches
        ]
        if e.recurrent is not None:
            st = e.recurrent.stream
            caches.append(list(zip(st.pos.tolist(), st.seq_ids)))
        return caches


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_2025_sequences_load_as_the_sequences_asked(tmp_path: Path) -> None:
    """Two 2025 sequence states (their cells list no sequence) joined with seq_id=[0, 1]: llama.cpp
    holds 7 cells of sequence 0 and 7 of sequence 1, and both go on alike; one alone written with
    seq_id=3 is sequence 3 (sequence 0 empty)."""
    era = DATA / "qwen3tiny-f16-fa-2025may"
    x, y = kvfast.open(era / "seq-0.ggsq"), kvfast.open(era / "seq-0.bin")
    kvfast.write([x, y], tmp_path / "j.state", arch="qwen3", seq_id=[0, 1])
    kvfast.write(x, tmp_path / "s3.state", container="state", seq_id=3, arch="qwen3")
    with Replay(QWEN3, ctk="f16", n_seq=2) as r:
        r.load(tmp_path / "j.state")
        assert held(r, tmp_path / "h", QWEN3) == [[(p, [0]) for p in range(7)] + [(p, [1]) for p in range(7)]]
        a, b = r.step(NEXT, 7, 0), r.step(NEXT, 7, 1)
        assert a.argmax() == b.argmax() and rel(b, a) < 1e-5
    with Replay(QWEN3, ctk="f16", n_seq=4) as r:
        r.load(tmp_path / "s3.state")
        assert (r.seq_pos_max(3), r.seq_pos_max(0)) == (6, -1)


def test_joined_recurrent_sequences_load_each_into_its_own(tmp_path: Path) -> None:
    """Mamba2's two per-sequence states joined with seq_id=[0, 1]: llama.cpp takes one recurrent
    cell per sequence (it refused the same cell twice: 'duplicate tail'), and sequence 1 goes on
    as its own state loaded alone does."""
    parts = [opened(DATA / f"mamba2tiny-2seq/seq-{n}.ggsq", model=MAMBA2) for n in (0, 1)]
    kvfast.write(parts, tmp_path / "j.state", arch="mamba2", seq_id=[0, 1])
    with Replay(MAMBA2, ctk="f16") as r:
        r.load(DATA / "mamba2tiny-2seq/seq-1.ggsq")
        alone = r.step(NEXT, 5)
    with Replay(MAMBA2, ctk="f16", n_seq=2) as r:
        r.load(tmp_path / "j.state")
        assert (r.seq_pos_max(0), r.seq_pos_max(1)) == (6, 4)
        assert held(r, tmp_path / "h", MAMBA2)[-1] == [(6, [0]), (4, [1])]
        got = r.step(NEXT, 5, 1)
        assert got.argmax() == alone.argmax() and rel(got, alone) < 1e-5


def test_a_renumbered_sequence_loads_into_one_sequence(tmp_path: Path) -> None:
    """Sequence 1 written as a whole state (kvfast warns): a context of one sequence refuses it, as
    the warning says; renumbered with seq_id=0 it loads there."""
    with kvfast.open(DATA / "qwen3tiny-3seq-shared/seq-1.bin") as d:
        with pytest.warns(kvfast.WriteWarning):
            kvfast.write(d, tmp_path / "one.state", container="state", arch="qwen3")
        kvfast.write(d, tmp_path / "zero.state", container="state", arch="qwen3", seq_id=0)
    with Replay(QWEN3, ctk="f16") as r:
        with pytest.raises(LoadError):
            r.load(tmp_path / "one.state")
        r.clear()
        r.load(tmp_path / "zero.state")
        assert r.seq_pos_max(0) == 11


def test_a_pruned_token_list_is_indexed_by_position(tmp_path: Path) -> None:
    """A GGSQ pruned inside keeps its token list: token i is the token at position i, the next
    position (llama-server's pos_next) is the token count, one past the last cell; pruned at its
    end, the list ends at the last kept cell."""
    toks = json.loads((DATA / "qwen3tiny-f16-fa/probe.json").read_text())["seqs"][0]
    n = len(toks)
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.ggsq") as d:
        kvfast.write(d, tmp_path / "inside.ggsq", keep=pl.col("pos") != 1)
        kvfast.write(d, tmp_path / "end.ggsq", keep=pl.col("pos") < n - 2)
    with Replay(QWEN3, ctk="f16") as r:
        r.load(tmp_path / "inside.ggsq")
        assert r.tokens == toks and r.seq_pos_max() + 1 == len(r.tokens)
        assert [p for p, _ in held(r, tmp_path / "h", QWEN3)[0]] == [0, *range(2, n)]
        r.clear()
        r.load(tmp_path / "end.ggsq")
        assert r.tokens == toks[: n - 2] and r.seq_pos_max() + 1 == len(r.tokens)
        assert np.isfinite(r.step(NEXT, len(r.tokens))).all()


def test_sync_drops_one_of_two_cells_of_a_position_in_both_caches(tmp_path: Path) -> None:
    """LFM2 with a sliding window, position 3 decoded twice: dropping its second cell from the
    full-attention cache drops that cell from the sliding-window cache too and keeps the first
    there; llama.cpp loads it and holds the other cells."""
    toks = [68, 32, 130, 60, 253, 230, 241]
    pos = [0, 1, 2, 3, 3, 4, 5]
    with Replay(LFM2SWA, ctk="f16") as r:
        r.r.decode([(t, p, 0, i == len(toks) - 1) for i, (t, p) in enumerate(zip(toks, pos))])
        r.save(tmp_path / "s.ggsq", "seq_file", tokens=toks)
        with opened(tmp_path / "s.ggsq", model=LFM2SWA) as d:
            window = d.caches[1].streams[0].pos.tolist()
            assert d.caches[0].streams[0].pos.tolist() == pos and window.count(3) == 2
            first = window.index(3)
            row = d.values(0, "k", cache=1)[first]
            kvfast.write(d, tmp_path / "p.ggsq", keep=~((pl.col("cache") == 0) & (pl.col("cell") == 4)))
        r.clear()
        r.load(tmp_path / "p.ggsq")
        full, swa = held(r, tmp_path / "h", LFM2SWA)[:2]
        assert sorted(p for p, _ in full) == [0, 1, 2, 3, 4, 5]
        want = list(window)
        want.remove(3)
        assert sorted(p for p, _ in swa) == sorted(want)
        with opened(tmp_path / "h", model=LFM2SWA) as e:
            at = e.caches[1].streams[0].pos.tolist().index(3)
            np.testing.assert_array_equal(e.values(0, "k", cache=1)[at], row)


def test_states_without_attention_cells_load(tmp_path: Path) -> None:
    """What kvfast now reads back with model= is what llama.cpp loads: a 0-cell state of every
    container, and an LFM2 iSWA state whose sliding-window cache was emptied alone."""
    with kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.ggsq", model=QWEN3) as d:
        for c in ("seq", "ggsq", "ggsn", "state"):
            kvfast.write(d, tmp_path / f"e.{c}", container=c, keep=pl.col("pos") < 0)
    with Replay(QWEN3, ctk="f16") as r:
        for c in ("seq", "ggsq", "ggsn", "state"):
            r.clear()
            r.load(tmp_path / f"e.{c}")
            assert r.seq_pos_max() == -1
    with opened(DATA / "lfm2swatiny-f16-fa/seq-0.ggsq", model=LFM2SWA) as d:
        kvfast.write(d, tmp_path / "w.ggsq", keep=pl.col("cache") != 1, sync=False)
    with Replay(LFM2SWA, ctk="f16") as r:
        r.load(tmp_path / "w.ggsq")
        full, swa = held(r, tmp_path / "h", LFM2SWA)[:2]
        assert [p for p, _ in full] == list(range(7)) and swa == []
