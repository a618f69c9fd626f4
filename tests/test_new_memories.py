"""The memories of llama.cpp of October 2026 (llama-cpp-python 0.3.36; tests/data/nm-*, copied from the
shared fixtures): DSA (deepseek32: an MLA cache then the lightning indexer's cache, its K stored
Hadamard-rotated at every type), Gemma 4 (shared-KV layers with no cache, two head sizes) and MSA
(minimax-m3: a main cache then an indexer cache with V). Each cache is a part of its model's memory,
with its role, model layers and head sizes from the model's GGUF; DeepSeek V4's container is refused
in one line."""

from pathlib import Path

import gguf
import numpy as np
import polars as pl
import pytest
from conftest import DATA, probe

import kvfast
from kvfast.cli import main
from kvfast.model import ModelGeometry

MODELS = DATA / "models"
NEW = DATA / "memories2026"
DSA = NEW / "nm-deepseek32-f16-2seq"
DSA_Q8 = NEW / "nm-deepseek32-q8_0-2seq"
GEMMA4 = NEW / "nm-gemma4-f16-2seq"
GEMMA4_Q8 = NEW / "nm-gemma4-q8_0-2seq"
MSA = NEW / "nm-minimaxm3-f16-2seq-nonunified"
DSV4 = NEW / "nm-deepseek4-f16-2seq"
FILES = ("seq-0.bin", "seq-1.bin", "seq-0.ggsq", "seq-0.partial.bin", "state.bin", "state.ggsn")


def model_of(folder: Path) -> Path:
    return MODELS / probe(folder)["model"]


def roles(s: kvfast.State) -> list[tuple[str, list[int], int | None, int | None]]:
    return [(p.role, p.model_layers, p.head_dim_k, p.head_dim_v) for p in s.parts if p is not None]


@pytest.mark.parametrize("folder", [DSA, DSA_Q8], ids=lambda p: p.name)
@pytest.mark.parametrize("name", FILES)
def test_a_dsa_state_opens_with_its_model_as_an_mla_cache_and_its_indexer(folder: Path, name: str) -> None:
    s = kvfast.open(folder / name, model=model_of(folder))
    assert roles(s) == [("attention", [0, 1], 576, None), ("indexer", [0, 1], 128, None)]
    # the indexer K is undone from the Hadamard rotation llama.cpp's graph applies at every type;
    # the MLA K (written by the K-only attention) is stored as computed, q8_0 too
    k = {r.cache: (r.undone, r.group, r.certain) for r in s.rotation if r.kind == "k"}
    assert k == {0: (False, None, True), 1: (True, 128, True)}
    df = s.to_polars()
    # one table of both head sizes: a list per row, its length the row's head size
    assert df.schema["values"] == pl.List(pl.Float32)
    widths = df.group_by("cache").agg(pl.col("values").list.len().unique()).sort("cache")
    assert widths["values"].to_list() == [[576], [128]]
    cells = sum(len(q) for q in probe(folder)["seqs"]) if name.startswith("state") else None
    if cells is not None:
        assert df.filter(pl.col("cache") == 1).height == 2 * cells  # two indexer layers, one head


def _indexer_k_layer0(tokens: list[int]) -> np.ndarray:
    """deepseek32's lightning-indexer K of model layer 0, computed from the GGUF as llama.cpp's graph
    does (src/models/deepseek32.cpp): RMS norm, indexer.attn_k, LayerNorm, NEOX RoPE of 64 dims."""
    r = gguf.GGUFReader(MODELS / "nm-deepseek32.gguf")
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in r.tensors}
    x = t["token_embd.weight"][tokens]
    cur = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * t["blk.0.attn_norm.weight"]
    k = cur @ t["blk.0.indexer.attn_k.weight"].T
    k = (k - k.mean(-1, keepdims=True)) / np.sqrt(k.var(-1, keepdims=True) + 1e-6)
    k = k * t["blk.0.indexer.k_norm.weight"] + t["blk.0.indexer.k_norm.bias"]
    pos = np.arange(len(tokens))[:, None]
    theta = pos * 10000.0 ** (-np.arange(32) / 32.0)
    a, b = k[:, :32].copy(), k[:, 32:64].copy()
    k[:, :32] = a * np.cos(theta) - b * np.sin(theta)
    k[:, 32:64] = a * np.sin(theta) + b * np.cos(theta)
    return k


def test_the_indexer_k_is_read_in_the_models_basis() -> None:
    tokens = probe(DSA)["seqs"][0]
    want = _indexer_k_layer0(tokens)
    rel = lambda got: np.linalg.norm(got - want) / np.linalg.norm(want)
    undone = kvfast.open(DSA / "seq-0.bin", model=model_of(DSA)).values(0, "k", cache=1)
    assert rel(np.asarray(undone, dtype=np.float32)) < 1e-2
    # as stored, an f16 indexer K is the model's K times the Hadamard matrix: nothing like it
    stored = kvfast.open(DSA / "seq-0.bin", model=model_of(DSA), rotation="none").values(0, "k", cache=1)
    assert rel(np.asarray(stored, dtype=np.float32)) > 0.5


def test_values_as_stored_are_the_bytes() -> None:
    s = kvfast.open(DSA / "state.bin", model=model_of(DSA), rotation="none")
    raw = DSA.joinpath("state.bin").read_bytes()
    for ci, c in enumerate(s.caches):
        rec = c.streams[0].layers[1]
        got = s.values(1, "k", cache=ci, stored=True)
        want = np.frombuffer(raw, np.float16, count=got.size, offset=rec.k_offset).reshape(got.shape)
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.filterwarnings("ignore::kvfast.errors.RotationWarning")  # a raw whole q8_0 state: undecided
@pytest.mark.parametrize("folder", [GEMMA4, GEMMA4_Q8], ids=lambda p: p.name)
@pytest.mark.parametrize("name", ["seq-1.bin", "seq-0.ggsq", "state.bin", "state.ggsn"])
def test_gemma4_caches_hold_the_layers_with_their_own_kv_in_two_head_sizes(folder: Path, name: str) -> None:
    s = kvfast.open(folder / name, model=model_of(folder))
    # 5 layers, layer 4 reads layer 2's cache (shared KV): 2 full-attention + 2 sliding-window layers
    assert roles(s) == [("attention", [1, 3], 128, 128), ("sliding-window", [0, 2], 64, 64)]
    df = s.to_polars()
    assert isinstance(df.schema["values"], pl.List)
    sizes = df.group_by("cache", "kind").agg(pl.col("values").list.len().unique()).sort("cache", "kind")
    assert sizes["values"].to_list() == [[128], [128], [64], [64]]
    assert sorted(df["model_layer"].unique().to_list()) == [0, 1, 2, 3]


def test_gemma4_sliding_window_alone_under_partial_only() -> None:
    s = kvfast.open(GEMMA4 / "seq-0.partial.bin", model=model_of(GEMMA4))
    assert roles(s) == [("sliding-window", [0, 2], 64, 64)]
    assert s.partial is not None and s.partial.model_layers == [1, 3]
    assert s.to_polars().schema["values"] == pl.Array(pl.Float16, 64)  # one head size: fixed width


def test_msa_indexer_cache_has_one_k_head_and_a_v_never_written() -> None:
    s = kvfast.open(MSA / "state.bin", model=model_of(MSA))
    assert roles(s) == [("attention", [0, 1, 2], 64, 64), ("indexer", [1, 2], 128, 64)]
    assert [p.k_basis for p in s.parts if p is not None] == ["rule", "as computed"]
    v = s.values(0, "v", cache=1)
    k = s.values(0, "k", cache=1)
    assert v.shape[1] == 64 and not np.any(v)  # MSA's graph never writes the indexer's V
    assert k.shape[1] == 128 and np.any(k)  # non-unified: MSA ran, its K holds values
    df = s.to_polars()
    assert df.filter(pl.col("cache") == 1)["model_layer"].unique().sort().to_list() == [1, 2]


def test_the_model_layers_of_a_dsa_indexer_cache_are_the_layers_with_an_indexer() -> None:
    g = kvfast.open(DSA / "seq-1.bin", model=model_of(DSA))
    t = g.to_polars().filter(pl.col("cache") == 1)
    assert t["model_layer"].unique().sort().to_list() == [0, 1]


@pytest.mark.parametrize("name", ["seq-0.bin", "state.ggsn"])
def test_a_dsv4_state_is_refused_as_such(name: str) -> None:
    # the bytes are refused before any model is read against them
    for model in (None, model_of(DSA)):
        with pytest.raises(kvfast.errors.FormatError) as e:
            kvfast.open(DSV4 / name, model=model)
        msg = str(e.value)
        assert '"DSV4"' in msg and "DeepSeek V4" in msg and "n_stream" not in msg
        assert "\n" not in msg
    if name == "state.ggsn":
        assert "deepseek4" in msg


def test_print_and_info_show_each_parts_role_and_model_layers(capsys: pytest.CaptureFixture[str]) -> None:
    s = kvfast.open(DSA / "state.bin", model=model_of(DSA))
    assert "parts=attention[0, 1] + indexer[0, 1]" in repr(s)
    assert main(["info", str(DSA / "state.bin"), "--model", str(model_of(DSA))]) == 0
    out = capsys.readouterr().out
    assert "cache 0: attention: model layers [0, 1] (K head 576, no V)" in out
    assert "cache 1: indexer: model layers [0, 1] (K head 128, no V, K stored Hadamard-rotated 128)" in out


@pytest.mark.parametrize("folder", [DSA, DSA_Q8, GEMMA4, MSA], ids=lambda p: p.name)
def test_write_round_trips_byte_for_byte(folder: Path, tmp_path: Path) -> None:
    for name in ("seq-1.bin", "state.ggsn"):
        s = kvfast.open(folder / name, model=model_of(folder))
        kvfast.write(s, tmp_path / name)
        assert (tmp_path / name).read_bytes() == (folder / name).read_bytes()


def test_an_edited_indexer_k_is_stored_back_rotated(tmp_path: Path) -> None:
    s = kvfast.open(DSA / "seq-0.bin", model=model_of(DSA))
    k = np.asarray(s.values(0, "k", cache=1), dtype=np.float32)
    kvfast.write(s, tmp_path / "e.bin", values={(1, 0, "k"): k})
    again = kvfast.open(tmp_path / "e.bin", model=model_of(DSA))
    assert np.allclose(np.asarray(again.values(0, "k", cache=1), dtype=np.float32), k, atol=2e-3)
    # stored as llama.cpp stores it: the bytes of the unedited rows within f16 rounding
    a = kvfast.open(DSA / "seq-0.bin", model=model_of(DSA), rotation="none").values(0, "k", cache=1)
    b = kvfast.open(tmp_path / "e.bin", model=model_of(DSA), rotation="none").values(0, "k", cache=1)
    assert np.allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=2e-3)


def _header_only_gguf(path: Path, arch: str) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(32)
    w.add_value_length(32)
    w.add_embedding_length(64)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", ["dots3note", "qwen4exp", "glm5-next", "deepseek4"])
def test_a_memory_not_read_yet_is_refused_in_one_line(arch: str, tmp_path: Path) -> None:
    # with its model: the model's arch names the memory
    model = _header_only_gguf(tmp_path / f"{arch}.gguf", arch)
    with pytest.raises(kvfast.ModelMismatchError, match=f"the model .{arch}. keeps .*not read yet"):
        kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.bin", model=model)
    # a whole state names its arch: refused before its memory is read as another
    src = kvfast.open(DATA / "qwen3tiny-f16-fa/state.ggsn")
    kvfast.write(src, tmp_path / "s.ggsn", arch=arch)
    with pytest.raises(kvfast.errors.FormatError, match=f"of a {arch} state, which kvfast does not read yet"):
        kvfast.open(tmp_path / "s.ggsn")


def test_quant_error_simulates_each_parts_own_rotation() -> None:
    # Gemma 4: K heads of 128 (full) and 64 (sliding window) rotate in groups of 128 and 64
    s = kvfast.open(GEMMA4 / "state.bin", model=model_of(GEMMA4))
    q = s.quant_error("q8_0", by="layer").select("cache", "kind", "rotation").unique().sort("cache", "kind")
    assert q.rows() == [(0, "k", 128), (0, "v", 64), (1, "k", 64), (1, "v", 64)]
    # DSA: the MLA K never rotates, the indexer K always does
    d = kvfast.open(DSA / "state.bin", model=model_of(DSA))
    q = d.quant_error("q8_0", by="layer").select("cache", "rotation").unique().sort("cache")
    assert q.rows() == [(0, 0), (1, 128)]


@pytest.mark.parametrize("folder", [DSA, MSA, GEMMA4], ids=lambda p: p.name)
def test_export_keeps_each_parts_head_size_in_files_of_its_own(folder: Path, tmp_path: Path) -> None:
    report = kvfast.export([folder / "state.bin"], tmp_path / "out", model=model_of(folder), on_error="fail")
    assert report["status"].to_list() == ["written"]
    files = sorted((tmp_path / "out").glob("**/*.parquet"))
    got = pl.concat(
        [pl.read_parquet(f).with_columns(pl.col("values").cast(pl.List(pl.Float32))) for f in files]
    )
    want = kvfast.open(folder / "state.bin", model=model_of(folder)).to_polars(dtype="float32")
    key = ["cache", "layer", "kind", "cell", "seq_id", "head"]
    assert (
        got.select(*key, "values")
        .sort(key)
        .equals(want.select(*key, pl.col("values").cast(pl.List(pl.Float32))).sort(key))
    )


@pytest.mark.parametrize("folder", [DSA, DSA_Q8, MSA], ids=lambda p: p.name)
def test_containers_convert_to_llama_cpps_own_bytes(folder: Path, tmp_path: Path) -> None:
    """Each sequence file written as the other container, and the whole state as a session file, are
    the bytes llama.cpp wrote (both caches of the memory, in order)."""
    model = model_of(folder)
    seqs = probe(folder)["seqs"]
    for n, toks in enumerate(seqs):
        for src in (folder / f"seq-{n}.bin", folder / f"seq-{n}.ggsq"):
            d = kvfast.open(src, model=model)
            kvfast.write(d, tmp_path / "a", container="ggsq", tokens=toks)
            kvfast.write(d, tmp_path / "b", container="seq", seq_id=n)
            assert (tmp_path / "a").read_bytes() == (folder / f"seq-{n}.ggsq").read_bytes()
            assert (tmp_path / "b").read_bytes() == (folder / f"seq-{n}.bin").read_bytes()
    d = kvfast.open(folder / "state.bin", model=model)
    kvfast.write(d, tmp_path / "c", container="ggsn", tokens=[t for s in seqs for t in s])
    assert (tmp_path / "c").read_bytes() == (folder / "state.ggsn").read_bytes()
    for n in range(len(seqs)):
        # a per-sequence save of the whole state: llama.cpp's own seq-N.bin (no sliding window here)
        kvfast.write(d, tmp_path / "d", container="seq", seq_id=n)
        assert (tmp_path / "d").read_bytes() == (folder / f"seq-{n}.bin").read_bytes()


@pytest.mark.parametrize(
    "model,ctk",
    [
        ("nm-deepseek32.gguf", "f16"),
        ("nm-deepseek32.gguf", "q8_0"),
        ("nm-gemma4.gguf", "f16"),
        ("nm-minimaxm3.gguf", "f16"),
    ],
)
def test_pruned_cells_are_llama_cpps_own_state_of_fewer_tokens(model: str, ctk: str, tmp_path: Path) -> None:
    """keep= on every cache of the memory at once (the MLA cache and its indexer, Gemma 4's two
    caches, MSA's main and indexer caches): the bytes llama.cpp itself saves after the shorter prompt."""
    pytest.importorskip("llama_cpp")
    from kvfast.probe.replay import Replay

    toks = probe(DSA)["seqs"][0]
    with Replay(MODELS / model, ctk=ctk) as r:
        r.prompt(toks[:5])
        r.save(tmp_path / "five.bin", "seq_data")
        r.clear()
        r.prompt(toks)
        r.save(tmp_path / "six.bin", "seq_data")
    kvfast.write(
        kvfast.open(tmp_path / "six.bin", model=MODELS / model), tmp_path / "kept.bin", keep=pl.col("pos") < 5
    )
    assert (tmp_path / "kept.bin").read_bytes() == (tmp_path / "five.bin").read_bytes()


def test_the_layout_picture_names_each_parts_role_and_model_layers() -> None:
    pytest.importorskip("matplotlib")
    from kvfast import plot

    s = kvfast.open(MSA / "state.bin", model=model_of(MSA))
    lines = plot.per_token(s)
    assert lines[0].startswith("cache 0 (attention, model layers [0, 1, 2]): 3 layers")
    assert lines[1].startswith("cache 1 (indexer, model layers [1, 2]): 2 layers")
    fig = plot.layout(s)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert " cache 1 (indexer, model layers [1, 2])" in texts


def test_without_its_model_a_dsa_state_is_refused_in_one_line_asking_for_it() -> None:
    with pytest.raises(kvfast.errors.AmbiguousError) as e:
        kvfast.open(DSA / "state.ggsn")
    msg = str(e.value)
    assert "model=" in msg and "deepseek32: a DSA memory" in msg and "\n" not in msg
    # a sequence state names no arch: the model is still what it asks for
    with pytest.raises(kvfast.errors.AmbiguousError, match="model="):
        kvfast.open(DSA / "seq-0.bin")


@pytest.mark.parametrize("model", ["nm-deepseek32.gguf", "nm-gemma4.gguf", "nm-minimaxm3.gguf"])
def test_q8_0_caches_read_in_the_models_basis_agree_with_f16(model: str, tmp_path: Path) -> None:
    """The same prompt decoded by llama.cpp into f16 and q8_0 caches: every part read in the model's
    basis (a DSA indexer undone in groups of 128 at both types, its MLA K and MSA's indexer K as
    computed, Gemma 4's caches in groups of 128 and 64) agrees within q8_0's error; a basis read
    wrong would be uncorrelated (relative error about 1.4)."""
    pytest.importorskip("llama_cpp")
    from kvfast.probe.replay import Replay

    toks = probe(DSA)["seqs"][0]
    opened = {}
    for ctk in ("f16", "q8_0"):
        with Replay(MODELS / model, ctk=ctk) as r:
            r.prompt(toks)
            r.save(tmp_path / f"{ctk}.bin", "seq_data")
        opened[ctk] = kvfast.open(tmp_path / f"{ctk}.bin", model=MODELS / model)
    a, b = opened["f16"], opened["q8_0"]
    for c, cache in enumerate(a.caches):
        for kind in ("k", "v") if cache.layers[0].v_type is not None else ("k",):
            for layer in range(len(cache.layers)):
                x = np.asarray(a.values(layer, kind, cache=c), np.float32)
                y = np.asarray(b.values(layer, kind, cache=c), np.float32)
                assert np.linalg.norm(x - y) <= 0.02 * np.linalg.norm(x), (c, kind, layer)


def _as_arch(src: Path, dst: Path, arch: str, extra: dict[str, list[int]]) -> Path:
    """`src`'s tensors and metadata as a model of `arch` (its keys renamed), with `extra` arrays."""
    r = gguf.GGUFReader(src)
    old = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        key = k.replace(f"{old}.", f"{arch}.", 1)
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(key, f.contents())
        else:
            w.add_key_value(key, f.contents(), f.types[0])
    for k, v in extra.items():
        w.add_array(f"{arch}.{k}", v)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_a_glm_dsa_indexer_cache_holds_the_layers_its_gguf_lists(tmp_path: Path) -> None:
    """GLM-DSA (no fixture: the deepseek32 model as glm-dsa, `attention.indexer.types` [1, 0]):
    llama.cpp's indexer cache holds model layer 0 alone; its K rotated at f16 and q8_0 alike."""
    pytest.importorskip("llama_cpp")
    from kvfast.probe.replay import Replay

    model = _as_arch(
        MODELS / "nm-deepseek32.gguf", tmp_path / "glm.gguf", "glm-dsa", {"attention.indexer.types": [1, 0]}
    )
    toks = probe(DSA)["seqs"][0]
    opened = {}
    for ctk in ("f16", "q8_0"):
        with Replay(model, ctk=ctk) as r:
            r.prompt(toks)
            r.save(tmp_path / f"{ctk}.ggsn", "state_file", tokens=toks)
        opened[ctk] = kvfast.open(tmp_path / f"{ctk}.ggsn", model=model)
    a, b = opened["f16"], opened["q8_0"]
    assert roles(a) == [("attention", [0, 1], 576, None), ("indexer", [0], 128, None)]
    assert "parts=attention[0, 1] + indexer[0]" in repr(b)
    x, y = (np.asarray(s.values(0, "k", cache=1), np.float32) for s in (a, b))
    assert np.linalg.norm(x - y) <= 0.02 * np.linalg.norm(x)
    assert a.to_polars().filter(pl.col("cache") == 1)["model_layer"].unique().to_list() == [0]


@pytest.mark.parametrize("folder", [DSA, GEMMA4, MSA], ids=lambda p: p.name)
def test_a_model_geometry_holds_the_memorys_parts(folder: Path) -> None:
    """ModelGeometry.from_gguf keeps what the GGUF says of the memory (the indexer cache, the
    sliding-window head sizes): opened with it, a state reads as with the GGUF's path."""
    g = ModelGeometry.from_gguf(model_of(folder))
    by_path = kvfast.open(folder / "state.bin", model=model_of(folder))
    by_geometry = kvfast.open(folder / "state.bin", model=g)
    assert roles(by_geometry) == roles(by_path)
    assert by_geometry.model == g and by_path.model == g
    assert by_geometry.to_polars().equals(by_path.to_polars())


def test_the_geometry_of_each_memory() -> None:
    dsa = ModelGeometry.from_gguf(MODELS / "nm-deepseek32.gguf")
    assert dsa.indexer is not None and dsa.indexer.layers == (True, True)
    assert (dsa.indexer.head_dim_k, dsa.indexer.head_dim_v, dsa.indexer.k_rotation) == (128, None, 128)
    msa = ModelGeometry.from_gguf(MODELS / "nm-minimaxm3.gguf")
    assert msa.indexer is not None and msa.indexer.layers == (False, True, True)
    assert (msa.indexer.head_dim_k, msa.indexer.head_dim_v, msa.indexer.k_rotation) == (128, 64, 0)
    gemma = ModelGeometry.from_gguf(MODELS / "nm-gemma4.gguf")
    assert gemma.head_dims_swa == (64, 64) and gemma.indexer is None
    assert gemma.attention == (True, True, True, True, False)  # layer 4 reads layer 2's cache


def test_a_probe_runs_states_open_with_their_memory_from_the_manifest(tmp_path: Path) -> None:
    """The probe runner's manifest records the memory's parts (the indexer cache): its DSA states
    open without model=, as with it."""
    pytest.importorskip("llama_cpp")
    from kvfast import probe as probe_runner

    toks = probe(DSA)["seqs"][0]
    man = probe_runner.run(
        MODELS / "nm-deepseek32.gguf",
        [{"id": "a", "tokens": toks}],
        tmp_path / "run",
        n_ctx=64,
        progress=False,
    )
    assert man["indexer"].to_list()[0]["k_rotation"] == 128
    s = kvfast.open(tmp_path / "run" / "a.ggsq")
    assert roles(s) == [("attention", [0, 1], 576, None), ("indexer", [0, 1], 128, None)]
    want = kvfast.open(tmp_path / "run" / "a.ggsq", model=MODELS / "nm-deepseek32.gguf")
    assert s.to_polars().equals(want.to_polars())


@pytest.mark.parametrize(
    "model,why",
    [
        ("nm-deepseek32.gguf", "lightning indexer picks"),
        ("nm-minimaxm3.gguf", "blocks its indexer picks"),
        ("nm-gemma4.gguf", "sliding-window layers have K heads of 64"),
    ],
)
def test_query_capture_refuses_the_memories_it_cannot_compute(model: str, why: str, tmp_path: Path) -> None:
    """The probe runner's query capture says, before any decode, which attention kvfast does not
    compute (sparse attentions, two head sizes), as one error."""
    pytest.importorskip("llama_cpp")
    from kvfast import probe as probe_runner

    prompts = [{"id": "a", "tokens": probe(DSA)["seqs"][0]}]
    with pytest.raises(kvfast.errors.KvfastError, match=why):
        probe_runner.run(MODELS / model, prompts, tmp_path / "run", n_ctx=64, progress=False, queries=2)
