"""Memories other than one plain KV cache, written by llama.cpp (make_memories.py): a V-less MLA cache
(deepseek2), a recurrent memory (mamba2), hybrids (qwen35, lfm2) and a hybrid iSWA (lfm2 with a
sliding window); each against an independent reading of the same bytes (memory_bytes.py)."""

from pathlib import Path

import gguf
import pytest
from conftest import DATA, MEMORY_FOLDERS, probe
from memory_bytes import read

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
