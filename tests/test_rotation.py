"""Undoing llama.cpp's Hadamard rotation of quantized caches, on real states of every container.

Each expectation is computed here independently: the stored rows are decoded with gguf's
dequantizer, then every group of n values is multiplied by an explicit n x n Walsh-Hadamard matrix
(Sylvester's construction, as ``ggml_gen_hadamard`` builds it: orthonormal, symmetric, H @ H = I).
The rotated fixtures are qwen3hd128-* (head size 128: K in groups of 128, V in groups of 64) and
llama-server's slot saves of Gemma 3 270M (head size 256, two caches: K in 256, V in 64).
"""

import re
import warnings
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import polars as pl
import pytest
from conftest import DATA

import kvfast
from kvfast.model.rotation import RotationWarning

MODEL = DATA / "models/tiny-qwen3-hd128.gguf"
CONTAINERS = ["seq-0.bin", "seq-0.ggsq", "state.bin", "state.ggsn"]
ROTATED = [DATA / f"qwen3hd128-{t}-fa" / f for t in ("q8_0", "q4_0-q4_1") for f in CONTAINERS]
Q8 = [p for p in ROTATED if "q8_0" in p.parent.name]
SERVER = DATA / "gemma3-270m-server"
SLOTS = [0, 1]
# what q8_0 and q4_0/q4_1 may lose against f16 (largest per-row relative error; measured: 0.7% and 11%)
LOSS = {"qwen3hd128-q8_0-fa": 0.02, "qwen3hd128-q4_0-q4_1-fa": 0.2}


def ids(p: Path) -> str:
    return f"{p.parent.name}/{p.name}"


def slot(ty: str, n: int) -> Path:
    return SERVER / f"gemma3-270m-server-{ty}-slot{n}.bin"


def sylvester(n: int) -> np.ndarray:
    """The orthonormal n x n Walsh-Hadamard matrix: H_2m = [[H_m, H_m], [H_m, -H_m]] / sqrt(2)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    assert h.shape == (n, n)
    return h / np.sqrt(n)


def undo(stored: np.ndarray, n: int) -> np.ndarray:
    """Every group of n values of every row multiplied by H (H is its own inverse), in float64."""
    return (stored.astype(np.float64).reshape(-1, n) @ sylvester(n)).reshape(stored.shape)


def dequantized(path: Path, d: kvfast.State, cache: int, layer: int, kind: str) -> np.ndarray:
    """A record's bytes, read from the file at kvfast's offsets, decoded by gguf (ggml's decoder)."""
    s = next(x for x in d.caches[cache].streams if x.cell_count)
    assert not s.v_trans  # flash attention: V stored per cell
    ly = s.layers[layer]
    ty, off, nb = (
        (ly.k_type, ly.k_offset, ly.k_nbytes) if kind == "k" else (ly.v_type, ly.v_offset, ly.v_nbytes)
    )
    raw = np.frombuffer(path.read_bytes()[off : off + nb], np.uint8).reshape(s.cell_count, -1)
    out: np.ndarray = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, str(ty).upper()))
    return out.astype(np.float32)


def row_rel(a: np.ndarray, ref: np.ndarray) -> float:
    """The largest relative error of a row of `a` against the same row of `ref`."""
    a64, r64 = a.astype(np.float64), ref.astype(np.float64)
    return float((np.linalg.norm(a64 - r64, axis=1) / np.linalg.norm(r64, axis=1)).max())


def records(d: kvfast.State) -> list[tuple[int, int, str]]:
    return [(c.index, layer, kind) for c in d.caches for layer in range(c.n_layer) for kind in "kv"]


def open_quiet(path: Path, **kw: Any) -> kvfast.State:
    """kvfast.open, failing the test on any RotationWarning (every decision here must be certain)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RotationWarning)
        return kvfast.open(path, **kw)


def open_defaults(path: Path, **kw: Any) -> kvfast.State:
    """kvfast.open of a Gemma slot with no model: K's group (256) is told by RoPE's pairs (real
    keys have a mean), so every decision is certain, with no warning."""
    d = open_quiet(path, **kw)
    assert all(r.certain for r in d.rotation)
    assert all("groups of 256, heads of 256" in r.evidence for r in d.rotation if r.kind == "k")
    return d


def test_sylvester_is_orthonormal_and_its_own_inverse() -> None:
    for n in (64, 128, 256):
        h = sylvester(n)
        np.testing.assert_array_equal(h, h.T)
        np.testing.assert_allclose(h @ h, np.eye(n), atol=1e-12)
        assert set(np.unique(np.abs(h) * np.sqrt(n)).round(12)) == {1.0}


# --- head size 128: K and V in different groups, every container ------------------------------------


@pytest.mark.parametrize("path", ROTATED, ids=ids)
def test_hd128_decisions_with_model(path: Path) -> None:
    with open_quiet(path, model=MODEL) as d:
        got = {(r.cache, r.kind): (r.undone, r.group, r.certain) for r in d.rotation}
        assert got == {(0, "k"): (True, 128, True), (0, "v"): (True, 64, True)}
        assert {r.kind: r.type for r in d.rotation} == {
            "k": d.caches[0].streams[0].layers[0].k_type,
            "v": d.caches[0].streams[0].layers[0].v_type,
        }
        # the era of the container, and for a raw whole state (its era straddles April 2026) the values
        for r in d.rotation:
            assert "head size 128" in r.evidence or f"undone in groups of {r.group}" in r.evidence


@pytest.mark.parametrize("path", ROTATED, ids=ids)
def test_hd128_values_equal_numpy(path: Path) -> None:
    with open_quiet(path, model=MODEL) as d:
        group = {r.kind: r.group for r in d.rotation}
        for cache, layer, kind in records(d):
            stored = dequantized(path, d, cache, layer, kind)
            want = undo(stored, {"k": 128, "v": 64}[kind])
            assert group[kind] == {"k": 128, "v": 64}[kind]
            got = d.values(layer, kind, cache=cache)
            assert got.dtype == np.float32 and got.shape == stored.shape == (9, 256)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
            # the undoing does something: the stored numbers are far from the model's
            assert row_rel(stored, want) > 0.5


@pytest.mark.parametrize("path", ROTATED, ids=ids)
def test_hd128_stored_values_bit_exact_with_gguf(path: Path) -> None:
    with open_quiet(path, model=MODEL, rotation="none") as d:
        assert all(not r.undone and r.group is None and r.certain for r in d.rotation)
        for cache, layer, kind in records(d):
            np.testing.assert_array_equal(
                d.values(layer, kind, cache=cache), dequantized(path, d, cache, layer, kind)
            )


@pytest.mark.parametrize("path", ROTATED, ids=ids)
def test_hd128_undone_values_agree_with_f16(path: Path) -> None:
    """The same prompt through an f16 cache: the model's keys and values, up to the type's loss."""
    f16 = DATA / "qwen3hd128-f16-fa" / path.name
    with (
        kvfast.open(f16, model=MODEL) as ref,
        open_quiet(path, model=MODEL) as d,
        open_quiet(path, model=MODEL, rotation="none") as stored,
    ):
        assert [r.undone for r in ref.rotation] == [False, False]
        for cache, layer, kind in records(d):
            want = ref.values(layer, kind, cache=cache, dtype="float32")
            assert row_rel(d.values(layer, kind, cache=cache), want) < LOSS[path.parent.name]
            assert row_rel(stored.values(layer, kind, cache=cache), want) > 0.5


# Without a model the head size is unknown: a K row of 256 values may be 4 heads of 64, 2 of 128 or
# 1 of 256. Undoing in a group twice llama.cpp's (256 for 128) gives (H_2 kron I_128) x: each channel
# mixed with the same channel of the other head, which keeps (here raises) the kurtosis, so the
# kurtosis cannot tell the two apart. RoPE's pairs can where keys have a mean (rope_pairs.rs); these
# tiny keys have none (zero-mean outlier channels only), so kvfast must refuse to guess.


@pytest.mark.parametrize("path", ROTATED, ids=ids)
def test_hd128_auto_without_model_refuses_to_guess_k_group(path: Path) -> None:
    """Issue 25: a 2026 state of a quantized cache, head size 128, opened with no hint at all: V
    (one possible group) is undone for certain; K's group cannot be told, so K is left as stored
    (never undone on a guess), with a RotationWarning (when K's values are first read) and the
    reason in its rotation info."""
    d = kvfast.open(path)
    with d, kvfast.open(path, rotation="none") as stored:
        got = {r.kind: r for r in d.rotation}
        k = got["k"]
        assert (got["v"].undone, got["v"].group, got["v"].certain) == (True, 64, True)
        assert (k.undone, k.group, k.certain) == (False, None, False)
        assert "RoPE pairs advance" in k.evidence and "left as stored" in k.evidence
        with pytest.warns(RotationWarning, match="model= or head_dim=") as caught:
            values = d.values(0, "k")
        assert "cache 0 K (" in str(caught[0].message) and "left as stored" in str(caught[0].message)
        np.testing.assert_array_equal(values, stored.values(0, "k"))


@pytest.mark.parametrize("path", ROTATED, ids=ids)
def test_hd128_auto_never_undoes_in_a_wrong_group_silently(path: Path) -> None:
    """Without a model, K is undone in llama.cpp's group, or flagged uncertain with a warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RotationWarning)
        d = kvfast.open(path)
        d.values(0, "k")
    with d:
        k = next(r for r in d.rotation if r.kind == "k")
        if not (k.undone and k.group == 128 and k.certain):
            assert not k.certain and any(issubclass(w.category, RotationWarning) for w in caught)


MEAN_KEY = DATA / "meankey/qwen3meankey-q8_0-fa/seq-0.bin"


def test_keys_with_a_mean_tell_the_group_without_a_model() -> None:
    """Issue 25: 4 KV heads x 128 (K rows of 512), keys with a mean (a massive activation, as real
    models have): the kurtosis is largest undone in 512, four times llama.cpp's group, but RoPE's
    pairs advance only in heads of 128 undone in 128, so K is undone there, certain, and agrees
    with the f16 twin of the same prompt (and with head_dim=128) as q8_0 does."""
    with open_quiet(MEAN_KEY) as d, open_quiet(MEAN_KEY, head_dim=128) as m:
        got = {r.kind: (r.undone, r.group, r.certain) for r in d.rotation}
        assert got == {"k": (True, 128, True), "v": (True, 64, True)}
        k = next(r for r in d.rotation if r.kind == "k")
        assert "groups of 128, heads of 128" in k.evidence
        kurt = [float(v) for v in re.findall(r"([0-9.]+) undone in groups of (?:64|128|256|512)", k.evidence)]
        assert kurt[3] > kurt[1]  # the kurtosis alone would undo in 512
        with kvfast.open(DATA / "meankey/qwen3meankey-f16-fa/seq-0.bin", head_dim=128) as f16:
            for layer in range(2):
                np.testing.assert_array_equal(d.values(layer, "k"), m.values(layer, "k"))
                assert row_rel(d.values(layer, "k"), f16.values(layer, "k", dtype="float32")) < 0.02


def test_keys_without_a_mean_leave_k_as_stored() -> None:
    """The same layout without the mean: no reading's pairs advance, K is left as stored, flagged."""
    path = DATA / "meankey/qwen3nomean-q8_0-fa/seq-0.bin"
    d = kvfast.open(path)
    with d:
        with pytest.warns(RotationWarning, match="left as stored"):
            d.values(0, "k")  # said when K's values are first read
        k = next(r for r in d.rotation if r.kind == "k")
        assert (k.undone, k.group, k.certain) == (False, None, False)
        assert "without the head size the group cannot be told (one of [64, 128, 256, 512])" in k.evidence
    with open_quiet(path, head_dim=128) as d:
        assert [(r.undone, r.group) for r in d.rotation] == [(True, 128), (True, 64)]
    # rotation='hadamard' without the head size: an error naming the groups, never a guess
    with pytest.raises(kvfast.RotationError, match=r"one of \[64, 128, 256, 512\]"):
        kvfast.open(path, rotation="hadamard")


def test_hd128_rule_applies_to_k_and_v_separately(tmp_path: Path) -> None:
    """rotation='hadamard' with head_dim: K in the largest power of two dividing it, V always in 64."""
    path = DATA / "qwen3hd128-q8_0-fa/seq-0.ggsq"
    with kvfast.open(path, rotation="hadamard", head_dim=128) as d, kvfast.open(path, model=MODEL) as m:
        assert [(r.kind, r.undone, r.group) for r in d.rotation] == [("k", True, 128), ("v", True, 64)]
        for cache, layer, kind in records(d):
            np.testing.assert_array_equal(d.values(layer, kind), m.values(layer, kind))


# --- llama-server slot saves of Gemma 3 270M: real keys, two caches ---------------------------------


def _gemma3_header(path: Path) -> None:
    """Gemma 3 270M's geometry without weights: a GGUF header is all kvfast reads of a model."""
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(18)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_key_length(256)
    w.add_value_length(256)
    w.add_embedding_length(640)
    w.add_sliding_window(512)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("n", SLOTS)
def test_server_iswa_both_caches_undone(n: int) -> None:
    with open_defaults(slot("q8_0", n)) as d:
        assert len(d.caches) == 2
        got = {(r.cache, r.kind): (r.type, r.undone, r.group, r.certain) for r in d.rotation}
        assert got == {
            (c, kind): ("q8_0", True, 256 if kind == "k" else 64, True) for c in (0, 1) for kind in "kv"
        }


@pytest.mark.parametrize("n", SLOTS)
@pytest.mark.parametrize("with_model", [False, True], ids=["defaults", "model"])
def test_server_values_equal_numpy(tmp_path: Path, n: int, with_model: bool) -> None:
    path = slot("q8_0", n)
    model = tmp_path / "gemma3.gguf"
    _gemma3_header(model)
    with open_quiet(path, model=model) if with_model else open_defaults(path) as d:
        if with_model:
            assert all("head size 256" in r.evidence for r in d.rotation)
        for cache, layer, kind in records(d):
            stored = dequantized(path, d, cache, layer, kind)
            want = undo(stored, 256 if kind == "k" else 64)
            got = d.values(layer, kind, cache=cache)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("n", SLOTS)
def test_server_stored_values_bit_exact_with_gguf(n: int) -> None:
    path = slot("q8_0", n)
    with open_quiet(path, rotation="none") as d:
        for cache, layer, kind in records(d):
            np.testing.assert_array_equal(
                d.values(layer, kind, cache=cache), dequantized(path, d, cache, layer, kind)
            )


@pytest.mark.parametrize("n", SLOTS)
def test_server_compare_f16_and_q8_0(n: int) -> None:
    """Same prompt, greedy, same output: in the model's basis q8_0 loses a few percent at most."""
    with kvfast.open(slot("f16", n)) as f16, kvfast.open(slot("q8_0", n)) as q8:
        df = kvfast.compare(f16, q8, by="layer")
    assert df.height == 2 * (3 + 15)
    k = df.filter(kind="k")
    # layer 0 of each cache (model layers 5 and 0)
    assert k.filter(layer=0)["rel_mean"].max() < 0.05
    assert k.filter(cache=1, layer=0)["rel_max"].item() < 0.01
    assert df["rel_mean"].max() < 0.15
    assert df["cosine_min"].min() > 0.98


@pytest.mark.parametrize("n", SLOTS)
def test_server_compare_stored_is_far(n: int) -> None:
    with kvfast.open(slot("f16", n)) as f16, kvfast.open(slot("q8_0", n), rotation="none") as q8:
        df = kvfast.compare(f16, q8, by="layer")
    # orthogonal-looking: the norm of a difference of two unrelated vectors of equal norm, sqrt(2)
    assert df["rel_mean"].min() > 1.2
    assert df["cosine_mean"].abs().max() < 0.3


def _top_channels(d: kvfast.State, n: int = 4) -> dict[tuple[int, int], list[int]]:
    s = d.stats(by="channel", kinds="k")
    return {
        (c, layer): g.sort("absmax", descending=True)["channel"].head(n).to_list()
        for (c, layer), g in s.group_by(["cache", "layer"])
    }


def test_server_outlier_channels_survive_q8_0() -> None:
    with kvfast.open(slot("f16", 0)) as f16, kvfast.open(slot("q8_0", 0)) as q8:
        ref, got = _top_channels(f16), _top_channels(q8)
    with kvfast.open(slot("q8_0", 0), rotation="none") as stored:
        far = _top_channels(stored)
    assert len(ref) == 18 and set(got) == set(ref)
    same_top = sum(ref[k][0] == got[k][0] for k in ref)
    assert same_top >= 0.8 * len(ref)
    assert all(len(set(ref[k]) & set(got[k])) >= 3 for k in ref)
    # as stored, the outliers are spread over every channel of their group
    assert sum(len(set(ref[k]) & set(far[k])) for k in ref) <= 0.1 * 4 * len(ref)


# --- where nothing is to be undone ------------------------------------------------------------------


@pytest.mark.parametrize("path", [DATA / "qwen3hd128-f16-fa/state.bin", slot("f16", 0)], ids=ids)
def test_f16_state_not_undone(path: Path) -> None:
    model = MODEL if "qwen3" in path.parent.name else None
    with open_quiet(path, model=model) as d, open_quiet(path, rotation="none") as stored:
        assert d.rotation and all(not r.undone and r.group is None and r.certain for r in d.rotation)
        assert all(r.type == "f16" and "f16" in r.evidence for r in d.rotation)
        for cache, layer, kind in records(d):
            np.testing.assert_array_equal(
                d.values(layer, kind, cache=cache), stored.values(layer, kind, cache=cache)
            )


@pytest.mark.parametrize("name", CONTAINERS)
def test_head_32_q8_0_not_undone(name: str) -> None:
    path = DATA / "qwen3tiny-q8_0-fa" / name
    with (
        open_quiet(path, model=DATA / "models/tiny-qwen3.gguf") as d,
        open_quiet(path, rotation="none") as stored,
    ):
        assert [(r.kind, r.type, r.undone, r.certain) for r in d.rotation] == [
            ("k", "q8_0", False, True),
            ("v", "q8_0", False, True),
        ]
        assert all("head size 32" in r.evidence and "multiple of 64" in r.evidence for r in d.rotation)
        for cache, layer, kind in records(d):
            np.testing.assert_array_equal(
                d.values(layer, kind, cache=cache), stored.values(layer, kind, cache=cache)
            )


# --- every pass reads the model's basis ---------------------------------------------------------------

TABLE_STATES = [DATA / "qwen3hd128-q8_0-fa/state.ggsn", DATA / "qwen3hd128-q4_0-q4_1-fa/seq-0.bin"]


def _rows_from_table(df: pl.DataFrame, layer: int, kind: str) -> np.ndarray:
    """A record's rows put back together from the table's (cell, head) rows."""
    sel = df.filter(cache=0, layer=layer, kind=kind).sort("cell", "head")
    cells = sel["cell"].n_unique()
    return np.stack(sel["values"].to_numpy()).reshape(cells, -1)


@pytest.mark.parametrize("path", TABLE_STATES, ids=ids)
def test_tables_in_model_basis(path: Path) -> None:
    with open_quiet(path, model=MODEL) as d, open_quiet(path, model=MODEL, rotation="none") as stored:
        polars = d.to_polars()
        arrow = pl.from_arrow(d.to_arrow())
        assert isinstance(arrow, pl.DataFrame)
        assert polars.schema["values"] == pl.Array(pl.Float32, 128)
        assert sorted(polars["head"].unique()) == [0, 1]
        scanned = kvfast.scan([str(path)], model=MODEL).collect()
        far = stored.to_polars()
        for layer in range(2):
            for kind in "kv":
                want = d.values(layer, kind)
                for table in (polars, arrow, scanned):
                    np.testing.assert_array_equal(_rows_from_table(table, layer, kind), want)
                assert row_rel(_rows_from_table(far, layer, kind), want) > 0.5


@pytest.mark.parametrize("path", TABLE_STATES, ids=ids)
def test_cell_stats_in_model_basis(path: Path) -> None:
    with open_quiet(path, model=MODEL) as d:
        df = d.stats(by="cell")
        for layer in range(2):
            for kind in "kv":
                x = d.values(layer, kind).astype(np.float64).reshape(9, 2, 128)
                got = df.filter(cache=0, layer=layer, kind=kind).sort("cell", "head")
                assert got.height == 18
                np.testing.assert_allclose(got["l2"], np.linalg.norm(x, axis=2).ravel(), rtol=1e-9)
                np.testing.assert_allclose(got["mean"], x.mean(axis=2).ravel(), rtol=1e-9, atol=1e-12)
                np.testing.assert_array_equal(got["absmax"], np.abs(x).max(axis=2).ravel())
                np.testing.assert_array_equal(got["argmax"], np.abs(x).argmax(axis=2).ravel())


@pytest.mark.parametrize("path", TABLE_STATES, ids=ids)
def test_cell_stats_find_planted_outliers(path: Path) -> None:
    """The model puts K's outliers in channels 5, 61 and 125 of each head (attn_k_norm), which RoPE
    (NEOX: channel i turns with i + 64) spreads to 69: undone, nearly every (cell, head) of K has its
    largest value there; as stored, nearly none."""
    planted = [5, 61, 69, 125]
    with open_quiet(path, model=MODEL) as d, open_quiet(path, model=MODEL, rotation="none") as stored:
        undone = d.stats(by="cell", kinds="k")["argmax"].is_in(planted)
        as_stored = stored.stats(by="cell", kinds="k")["argmax"].is_in(planted)
    assert len(undone) == len(as_stored) == 2 * 9 * 2
    assert undone.mean() >= 0.9
    assert as_stored.mean() <= 0.1


def test_one_build_decides_v_where_its_values_cannot(tmp_path: Path) -> None:
    """Issue 25: a raw whole state (its era could be either) with the head size known: K's values
    show the rotation; V's, Gaussian either way (no outlier channels), cannot; one build wrote both
    and rotates K and V alike, so V is undone in 64, certain, as in the sequence state (whose
    container dates it)."""
    with open_quiet(MEAN_KEY, head_dim=128) as seq:
        kvfast.write(seq, tmp_path / "whole.bin", container="state", arch="qwen3")
        want = seq.values(1, "v")
        with open_quiet(tmp_path / "whole.bin", head_dim=128) as d:
            got = {r.kind: r for r in d.rotation}
            assert (got["k"].undone, got["k"].group, got["k"].certain) == (True, 128, True)
            assert (got["v"].undone, got["v"].group, got["v"].certain) == (True, 64, True)
            assert "the build rotates (cache 0 K's values show it" in got["v"].evidence
            np.testing.assert_array_equal(d.values(1, "v"), want)


# --- a V-less MLA cache: llama.cpp's K-only attention never rotates -----------------------------------

MLA = DATA / "models/tiny-deepseek2-mla.gguf"


@pytest.mark.parametrize("name", CONTAINERS)
@pytest.mark.parametrize("mode", ["auto", "hadamard"])
def test_mla_k_never_undone(name: str, mode: str) -> None:
    """Issue 25: rotation='hadamard' follows llama.cpp's rule per cache, not forces it: a V-less
    MLA cache's q8_0 K is stored as computed, and reads as its f16 twin within q8_0's error (undone
    in groups of 64, as 'hadamard' did, it was at relative error 1.41)."""
    path = DATA / "deepseek2mla-q8_0-fa" / name
    with (
        open_quiet(path, model=MLA, rotation=mode) as d,
        open_quiet(DATA / "deepseek2mla-f16-fa" / name, model=MLA) as f16,
    ):
        assert [(r.kind, r.undone, r.group, r.certain) for r in d.rotation] == [("k", False, None, True)]
        assert "K-only attention" in d.rotation[0].evidence
        for layer in range(2):
            assert row_rel(d.values(layer, "k"), f16.values(layer, "k", dtype="float32")) < 0.02
