"""kvfast.model.cached: a model's header read once per file, again when the file changes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import DATA

from kvfast import _kvfast
from kvfast.model import cached


def test_a_header_is_read_once_and_again_when_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "m.gguf"
    shutil.copy(DATA / "models/tiny-qwen3.gguf", model)
    reads: list[str] = []
    real = _kvfast.attention_layers

    def counting(path: str) -> list[dict[str, object]]:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(_kvfast, "attention_layers", counting)
    first = cached.attention_layers(model)
    first[0]["scale"] = -1.0  # a caller's copy: the cache keeps its own
    assert cached.attention_layers(model)[0]["scale"] > 0 and len(reads) == 1
    shutil.copy(DATA / "models/tiny-qwen3-hd128.gguf", model)  # replaced in place
    assert cached.attention_layers(model)[0]["head_dim"] == 128 and len(reads) == 2
    assert cached.geometry(model).head_dim_k == 128
