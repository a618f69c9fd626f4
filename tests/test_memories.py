"""Memories other than one plain KV cache, written by llama.cpp (make_memories.py): a V-less MLA cache
(deepseek2), a recurrent memory (mamba2), hybrids (qwen35, lfm2) and a hybrid iSWA (lfm2 with a
sliding window); each against an independent reading of the same bytes (memory_bytes.py)."""

from pathlib import Path

import pytest
from conftest import MEMORY_FOLDERS, probe
from memory_bytes import read

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
