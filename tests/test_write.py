"""kvfast.write: the identity (every fixture written back byte for byte) and the edits, checked by
reading the written bytes back (llama.cpp's own load is in test_write_llama.py)."""

import json
import warnings
from pathlib import Path

import pytest
from conftest import DATA

import kvfast

ALL_STATES = sorted(
    f
    for d in DATA.iterdir()
    if d.is_dir() and d.name != "models"
    for f in d.iterdir()
    if f.suffix in (".bin", ".ggsq", ".ggsn")
)
QWEN3 = DATA / "models/tiny-qwen3.gguf"
HD128 = DATA / "models/tiny-qwen3-hd128.gguf"


def open_state(path: Path, **kw: object) -> kvfast.Dump:
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
