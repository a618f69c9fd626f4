"""Memories other than one plain KV cache, written by llama.cpp (make_memories.py): a V-less MLA cache
(deepseek2), a recurrent memory (mamba2), hybrids (qwen35, lfm2) and a hybrid iSWA (lfm2 with a
sliding window); each against an independent reading of the same bytes (memory_bytes.py)."""

import json
from pathlib import Path

import gguf
import numpy as np
import polars as pl
import pytest
from conftest import DATA, MEMORY_FOLDERS, probe
from memory_bytes import read

import kvfast
from kvfast._kvfast import State
from kvfast.cli import main
from kvfast.dataset import export_read
from kvfast.model import ModelGeometry

MEMORY_FILES = sorted(
    f for d in MEMORY_FOLDERS for f in d.iterdir() if f.suffix in (".bin", ".ggsq", ".ggsn")
)


@pytest.fixture(params=MEMORY_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def memory_file(request: pytest.FixtureRequest) -> Path:
    return request.param


def test_the_fixtures_are_what_the_generator_says(memory_file: Path) -> None:
    spec, parts = read(memory_file)
    seqs = probe(memory_file.parent)["seqs"]
    per_seq = memory_file.name.startswith("seq-")
    for part in parts:
        if part.kind == "recurrent":
            # one cell per sequence, at its last position
            want = [len(seqs[int(memory_file.stem[4:])]) - 1] if per_seq else [len(s) - 1 for s in seqs]
            assert part.pos == want
            assert part.seqs == ([[]] if per_seq else [[i] for i in range(len(seqs))])
            assert {r.type for r in part.recs} == {"f32"}
        elif part.n_layer:
            assert part.n_layer == len(spec.model_layers[parts.index(part)])
            assert [r.kind for r in part.recs].count("v") == (0 if spec.v_less else part.n_layer)


def test_there_is_a_fixture_of_every_memory() -> None:
    assert {probe(d)["memory"] for d in MEMORY_FOLDERS} == {
        "kv (V-less MLA)",
        "recurrent",
        "hybrid",
        "hybrid iswa",
    }


MODELS = DATA / "models"


def test_the_layer_map_of_each_fixture_model() -> None:
    g = ModelGeometry.from_gguf(MODELS / "tiny-deepseek2-mla.gguf")
    assert (g.v_less, g.recurrent_layers(), g.attention_layers()) == (True, [], [0, 1])
    assert (g.head_dim_k, g.walk_hints()) == (192, {"v_less": True, "recurrent": (2, 0)})
    g = ModelGeometry.from_gguf(MODELS / "tiny-mamba2.gguf")
    assert (g.recurrent_layers(), g.attention_layers(), g.head_dim_k) == ([0, 1], [], 0)
    assert g.walk_hints() == {"v_less": False, "recurrent": (2, 2)}
    assert g.model_layers([]) == []
    g = ModelGeometry.from_gguf(MODELS / "tiny-qwen35.gguf")
    assert (g.recurrent_layers(), g.attention_layers()) == ([0, 1, 2], [3])
    assert g.model_layers([1]) == [[3]]
    for name in ("tiny-lfm2.gguf", "tiny-lfm2-swa.gguf"):
        g = ModelGeometry.from_gguf(MODELS / name)
        assert (g.recurrent_layers(), g.attention_layers()) == ([0, 1, 3], [2, 4])
        assert g.walk_hints() == {"v_less": False, "recurrent": (5, 3)}
    assert ModelGeometry.from_gguf(MODELS / "tiny-lfm2-swa.gguf").model_layers([0, 2]) == [[], [2, 4]]
    assert ModelGeometry.from_gguf(MODELS / "tiny-lfm2.gguf").model_layers([2]) == [[2, 4]]
    g = ModelGeometry.from_gguf(MODELS / "tiny-qwen3.gguf")
    assert (g.v_less, g.recurrent_layers(), g.walk_hints()["recurrent"]) == (False, [], (2, 0))


def _header(path: Path, arch: str, n_layer: int, **kv: object) -> Path:
    """A GGUF of metadata alone (the reader never reads tensors)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_embedding_length(64)
    for k, v in kv.items():
        key = f"{arch}.{k.replace('__', '.')}"
        if isinstance(v, list):
            w.add_array(key, v)
        else:
            w.add_uint32(key, int(v))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    "arch, n_layer, kv, recurrent, attention",
    [
        # Qwen3-Next: every 4th layer attends (full_attention_interval, default 4)
        ("qwen3next", 8, {}, [0, 1, 2, 4, 5, 6], [3, 7]),
        ("qwen35moe", 6, {"full_attention_interval": 3}, [0, 1, 3, 4], [2, 5]),
        # an explicit list wins over the interval
        ("qwen35", 4, {"attention__recurrent_layers": [True, False, True, False]}, [0, 2], [1, 3]),
        # the NextN block of a Qwen3.5 is attention only, and kept out of the main cache
        ("qwen35", 5, {"nextn_predict_layers": 1}, [0, 1, 2], [3]),
        # a layer of no KV head is recurrent: Granite 4, Jamba
        ("granitehybrid", 4, {"attention__head_count_kv": [0, 0, 0, 8]}, [0, 1, 2], [3]),
        ("jamba", 4, {"attention__head_count_kv": [0, 8, 0, 0]}, [0, 2, 3], [1]),
        # Falcon-H1: every layer in both
        ("falcon-h1", 3, {}, [0, 1, 2], [0, 1, 2]),
        # Nemotron-H: MLP layers (n_ff > 0) in neither
        (
            "nemotron_h",
            4,
            {"attention__head_count_kv": [0, 0, 8, 0], "feed_forward_length": [0, 64, 0, 0]},
            [0, 3],
            [2],
        ),
        ("rwkv7", 3, {}, [0, 1, 2], []),
    ],
)
def test_layer_maps_per_architecture(
    tmp_path: Path, arch: str, n_layer: int, kv: dict[str, object], recurrent: list[int], attention: list[int]
) -> None:
    kv = {"attention__head_count": 8, "attention__key_length": 64, **kv}
    g = ModelGeometry.from_gguf(_header(tmp_path / "m.gguf", arch, n_layer, **kv))
    assert (g.recurrent_layers(), g.attention_layers()) == (recurrent, attention)


def test_an_unknown_recurrent_arch_leaves_the_layer_map_to_the_bytes(tmp_path: Path) -> None:
    g = ModelGeometry.from_gguf(
        _header(tmp_path / "m.gguf", "futurenet", 2, attention__head_count=4, ssm__state_size=16)
    )
    assert g.recurrent is None and g.walk_hints()["recurrent"] is None
    g = ModelGeometry.from_gguf(_header(tmp_path / "n.gguf", "futurenet", 2, attention__head_count=4))
    assert g.walk_hints()["recurrent"] == (2, 0)


def _model(path: Path) -> Path:
    return MODELS / probe(path.parent)["model"]


def _open(path: Path, model: bool = True) -> kvfast.State:
    # the stored numbers: no quantized cache of these fixtures is rotated (see test_mla_q8_0_...)
    return kvfast.open(path, model=_model(path) if model else None, rotation="none")


def _own_seq(path: Path, attention: bool) -> int | None:
    """A sequence state's sequence: its io header's, or (GGSQ) the one its attention cells list; a
    GGSQ of a recurrent model names none (its one cell lists none)."""
    if not path.name.startswith("seq-") or (path.suffix == ".ggsq" and not attention):
        return None
    return int(path.stem.split("-")[1])


def test_every_fixture_reads_like_numpy(memory_file: Path) -> None:
    spec, parts = read(memory_file)
    attention = [p for p in parts if p.kind == "kv"]
    with _open(memory_file) as d:
        assert len(d.caches) == spec.kv_caches
        for c, part, model_layers in zip(d.caches, attention, spec.model_layers, strict=True):
            s = next((x for x in c.streams if x.cell_count), c.streams[0])
            assert [ly.model_layer for ly in s.layers] == list(model_layers)
            assert list(s.pos) == part.pos and s.seq_ids == part.seqs
            for r in part.recs:
                got = d.values(r.layer, r.kind, cache=c.index, dtype="float32")
                np.testing.assert_array_equal(got, r.values)
                if r.type in ("f16", "f32"):  # (a q8_0 value's byte follows its block's scale)
                    assert d.address(r.layer, 0, kind=r.kind, cache=c.index) == r.offset
            if spec.v_less and c.n_layer:
                assert all(ly.v_type is None for ly in s.layers)
                with pytest.raises(kvfast.SelectionError, match="V-less"):
                    d.values(0, "v", cache=c.index)
        rec = d.recurrent
        if not spec.recurrent_layers:
            assert rec is None
            with pytest.raises(kvfast.SelectionError, match="recurrent part"):
                d.values(0, "r")
            return
        part = parts[-1]
        assert rec is not None and rec.index == len(d.caches)
        assert (rec.cell_count, rec.n_layer) == (part.cells, part.n_layer)
        assert list(rec.stream.pos) == part.pos and rec.stream.seq_ids == part.seqs
        assert [ly.model_layer for ly in rec.layers] == list(spec.recurrent_model_layers)
        for r in part.recs:
            got = d.values(r.layer, r.kind)
            assert got.dtype == np.float32 and got.shape == (part.cells, r.n)
            np.testing.assert_array_equal(got, r.values)
            if r.n:
                assert d.address(r.layer, 0, kind=r.kind) == r.offset
            else:
                with pytest.raises(kvfast.SelectionError, match="0 values"):
                    d.address(r.layer, 0, kind=r.kind)
        # K and V of the recurrent part, R and S of an attention cache: none
        with pytest.raises(kvfast.SelectionError, match="recurrent part"):
            d.values(0, "k", cache=rec.index)
        if d.caches:
            with pytest.raises(kvfast.SelectionError, match="attention cache"):
                d.values(0, "r", cache=0)


def test_the_tables_hold_the_recurrent_rows_once_per_sequence(memory_file: Path) -> None:
    spec, parts = read(memory_file)
    with _open(memory_file) as d:
        if d.recurrent is None:
            return
        part = parts[-1]
        own = _own_seq(memory_file, bool(d.caches))
        for kind in "rs":
            df = d.to_polars(kinds=[kind])
            recs = [r for r in part.recs if r.kind == kind]
            width = recs[0].n
            if width == 0:  # LFM2 keeps no S: no values, no rows
                assert df.height == 0
                continue
            assert df.schema["values"] == pl.Array(pl.Float32, width)
            assert set(df["cache"]) == {d.recurrent.index} and set(df["head"]) == {0}
            # one row per (cell, sequence): a sequence state's cell lists none, and is its own
            pairs = [(c, q) for c in range(part.cells) for q in (part.seqs[c] or [own])]
            for r in recs:
                rows = df.filter(layer=r.layer)
                assert rows["seq_id"].to_list() == [q for _, q in pairs]
                assert rows["pos"].to_list() == [part.pos[c] for c, _ in pairs]
                assert set(rows["model_layer"]) == {spec.recurrent_model_layers[r.layer]}
                got = np.stack(rows["values"].to_numpy())
                np.testing.assert_array_equal(got, r.values[[c for c, _ in pairs]])
            # statistics over the same rows
            by_layer = d.stats(by="layer", kinds=[kind])
            assert by_layer["count"].to_list() == [part.cells * width] * len(recs)
            assert by_layer["cells"].to_list() == [part.cells] * len(recs)
        # K and V only by default
        assert set(d.to_polars()["kind"]) <= {"k", "v"}
        with pytest.raises(kvfast.SelectionError):
            d.to_polars(kinds=["r"], heads=[1])


def test_layout_names_the_recurrent_records(memory_file: Path) -> None:
    _, parts = read(memory_file)
    with _open(memory_file) as d:
        lay = d.layout()
        assert lay["offset"][0] == 0 and (lay["offset"] + lay["nbytes"]).to_list()[-1] == d.size
        assert (lay["offset"][1:] == (lay["offset"] + lay["nbytes"])[:-1]).all()
        rows = lay.filter(pl.col("what").str.ends_with("rows"))
        want = sorted((r.kind, r.layer, r.offset) for p in parts for r in p.recs)
        got = sorted(zip(rows["kind"], rows["layer"], rows["offset"], strict=True))
        assert got == want
        if d.recurrent is not None:
            assert set(lay.filter(kind="s")["cache"]) == {d.recurrent.index}
            assert "recurrent header" in lay["what"].to_list()


def test_without_the_model(memory_file: Path) -> None:
    spec, _ = read(memory_file)
    if spec.v_less:
        # K records and no V: a V-less cache, or a state cut before its V records
        with pytest.raises(kvfast.AmbiguousError, match="model="):
            _open(memory_file, model=False)
        return
    with _open(memory_file, model=False) as d:
        rec = d.recurrent
        assert rec is not None
        hybrid = bool(d.caches)
        # a hybrid's layer map is the model's to give; a recurrent model's holds every layer
        want = [None] * len(rec.layers) if hybrid else list(range(len(rec.layers)))
        assert [ly.model_layer for ly in rec.layers] == want
        for c in d.caches:
            assert all(ly.model_layer is None for s in c.streams for ly in s.layers)
        with _open(memory_file) as m:
            for kind in "rs":
                for layer in range(len(rec.layers)):
                    np.testing.assert_array_equal(d.values(layer, kind), m.values(layer, kind))


def test_mla_q8_0_k_is_stored_as_computed() -> None:
    # llama.cpp's K-only attention (deepseek2) has no Hadamard rotation: the q8_0 K as stored is
    # the f16 K within q8_0's loss, and kvfast leaves it so
    f16 = DATA / "deepseek2mla-f16-fa/seq-0.bin"
    q8 = DATA / "deepseek2mla-q8_0-fa/seq-0.bin"
    with kvfast.open(f16, model=_model(f16)) as a, kvfast.open(q8, model=_model(q8)) as b:
        (r,) = b.rotation
        assert (r.kind, r.undone) == ("k", False) and r.certain and "V-less" in r.evidence
        for layer in range(2):
            x, y = a.values(layer, "k", dtype="float32"), b.values(layer, "k")
            assert np.linalg.norm(y - x) / np.linalg.norm(x) < 0.02
        # one head: the latent and the RoPE part
        assert set(b.to_polars()["head"]) == {0}
    # the row has no heads to split
    with pytest.raises(kvfast.ModelMismatchError, match="key_length is 192"):
        kvfast.open(q8, model=_model(q8), head_dim=64)


def test_kvfast_info_shows_the_recurrent_part_and_the_layer_map(capsys: pytest.CaptureFixture[str]) -> None:
    hybrid = DATA / "qwen35tiny-f16-fa/seq-0.bin"
    assert main(["info", str(hybrid)]) == 0
    out = capsys.readouterr().out
    assert "recurrent  cache 1 at byte 2,008: 1 cell(s) (one per sequence), pos [6]" in out
    assert "R and S records of 3 of the model's 4 layers" in out
    assert "layer map  not in the bytes" in out and "give --model" in out
    assert main(["info", str(hybrid), "--model", str(_model(hybrid))]) == 0
    out = capsys.readouterr().out
    assert "layer map  hybrid; model layer 0: RS (cache 1 layer 0)" in out
    assert "3: KV (cache 0 layer 0)" in out
    # a recurrent model's map is in the bytes
    assert main(["info", "--json", str(DATA / "mamba2tiny-2seq/state.ggsn")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["memory"] == "recurrent" and d["caches"] == []
    assert d["recurrent"]["sequences"] == [[0], [1]] and d["recurrent"]["pos"] == [6, 4]
    assert [e["model_layer"] for e in d["layer_map"]] == [0, 1]
    # V-less: the model says so; without it, the CLI says what to give
    mla = DATA / "deepseek2mla-f16-fa/state.ggsn"
    assert main(["info", str(mla), "--model", str(_model(mla))]) == 0
    assert "an MLA cache: K records only" in capsys.readouterr().out
    assert main(["info", str(mla)]) == 1
    err = capsys.readouterr().err
    assert "--model" in err and "V-less" in err and err.count("\n") == 1


def test_recurrent_rows_compare_across_containers() -> None:
    for folder in ("mamba2tiny-f32", "qwen35tiny-f16-fa", "lfm2tiny-f16-fa"):
        a_path, b_path = DATA / folder / "seq-0.bin", DATA / folder / "seq-0.ggsq"
        with _open(a_path) as a, _open(b_path) as b:
            for kind in "rs":
                df = kvfast.compare(a, b, kinds=[kind])
                assert df.height == (
                    0 if (folder.startswith("lfm2") and kind == "s") else len(a.recurrent.layers)
                )
                assert (df["mse"] == 0).all() and (df["pos"] == 6).all()


def test_export_writes_the_recurrent_part_beside_the_value_table(tmp_path: Path) -> None:
    paths = [DATA / f"{f}/state.bin" for f in ("qwen35tiny-f16-fa", "mamba2tiny-2seq", "lfm2tiny-f16-fa")]
    out = tmp_path / "values"
    for p in paths:
        report = kvfast.export([p], out, model=_model(p))
        assert report["status"].to_list() == ["written"]
    # the value table (K and V) keeps one schema; the recurrent rows have files of their own
    table = kvfast.scan_export(out).collect()
    assert set(table["kind"]) == {"k", "v"}
    for p in paths:
        with _open(p) as d:
            rec = d.recurrent
            assert rec is not None
            for kind in "rs":
                files = [f for f in out.glob(f"*/_recurrent/kind-{kind}.parq") if _from(f, d)]
                assert [str(f) for f in files] == [
                    f for f in export_read.recurrent_files(out, kind) if _from(Path(f), d)
                ]
                widths = [ly.n_embd_r if kind == "r" else ly.n_embd_s for ly in rec.layers]
                if not any(widths):
                    assert files == []
                    continue
                (f,) = files
                df = pl.read_parquet(f)
                assert df["layer"].to_list() == [ly.index for ly in rec.layers for _ in range(rec.cell_count)]
                for ly in rec.layers:
                    got = np.stack(df.filter(layer=ly.index)["values"].to_numpy())
                    np.testing.assert_array_equal(got, d.values(ly.index, kind))
    # statistics: the recurrent part's rows join the state's files
    out = tmp_path / "stats"
    p = paths[0]
    kvfast.export([p], out, model=_model(p), what="stats", by="layer")
    df = pl.read_parquet(out / "*" / "*.parquet")
    assert sorted(set(zip(df["cache"], df["kind"], strict=True))) == [(0, "k"), (0, "v"), (1, "r"), (1, "s")]


def _from(f: Path, d: kvfast.State) -> bool:
    """Whether an export's file holds `d`'s rows."""
    return bool(pl.read_parquet(f, columns=["path"])["path"][0] == str(Path(d.path).resolve()))


def test_scans_read_k_and_v_of_every_memory() -> None:
    for f in ("deepseek2mla-f16-fa", "qwen35tiny-f16-fa", "lfm2swatiny-f16-fa"):
        p = DATA / f / "seq-0.bin"
        df = kvfast.scan([p], model=_model(p)).collect()
        assert set(df["kind"]) == ({"k"} if f.startswith("deepseek2") else {"k", "v"})


@pytest.mark.parametrize(
    "folder", ["deepseek2mla-q8_0-fa", "lfm2tiny-q8_0-fa", "lfm2swatiny-f16-fa", "qwen35tiny-q8_0-fa"]
)
def test_every_truncation_is_an_error(folder: str) -> None:
    # with the model's hints and without: a KvfastError naming a byte offset, never a reading
    raw = (DATA / folder / "seq-0.bin").read_bytes()
    hints = ModelGeometry.from_gguf(_model(DATA / folder / "seq-0.bin")).walk_hints()
    # (without the model, a hybrid's sequence state cut right before its recurrent part is a
    # plain state: the README says so)
    plain = next(
        (c["offset"] for c in State.from_bytes(raw, **hints).caches() if c["memory"] == "recurrent"), -1
    )
    step = 1 if len(raw) < 6000 else 3
    for n in range(0, len(raw), step):
        for h in (hints, {}):
            if n == plain and not h:
                assert {c["memory"] for c in State.from_bytes(raw[:n]).caches()} == {"kv"}
                continue
            with pytest.raises(kvfast.KvfastError) as e:
                State.from_bytes(raw[:n], **h)
            assert e.value.offset is not None and 0 <= e.value.offset <= n


def test_keys_before_rope_refuse_an_mla_cache() -> None:
    # the RoPE part of an MLA K row is its last values (the latent comes first)
    p = DATA / "deepseek2mla-f16-fa/seq-0.bin"
    with pytest.raises(kvfast.KvfastError, match="V-less"):
        kvfast.open(p, model=_model(p), pre_rope=True)
