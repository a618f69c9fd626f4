"""Keys before RoPE of an iSWA model (Gemma 3 270M's real state: global layers 5, 11, 17 in cache 0,
the sliding-window layers in cache 1): each cache layer is un-roped with its model layer's base
(rope.freq_base for global layers; for sliding-window layers rope.freq_base_swa, else llama.cpp's
10000), checked against an independent NumPy undoing of NEOX RoPE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvfast

gguf = pytest.importorskip("gguf")
STATE = Path(__file__).parent / "data" / "gemma3-270m-f16-fa" / "state.bin"
HEAD = 256


def header_only_gemma3(path: Path, swa_base: float | None) -> None:
    """A GGUF with gemma-3-270m's header and no tensors: what kvfast reads of a model."""
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(18)
    w.add_context_length(32768)
    w.add_embedding_length(640)
    w.add_feed_forward_length(2048)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_key_length(HEAD)
    w.add_value_length(HEAD)
    w.add_sliding_window(512)
    w.add_rope_freq_base(1_000_000.0)
    if swa_base is not None:
        w.add_float32("gemma3.rope.freq_base_swa", swa_base)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def unrope_neox(x: Any, pos: int, base: float) -> Any:
    half = HEAD // 2
    theta = pos * base ** (-2.0 * np.arange(half) / HEAD)
    c, s = np.cos(theta), np.sin(theta)
    y0, y1 = x[:half].astype(np.float64), x[half:].astype(np.float64)
    return np.concatenate([y0 * c + y1 * s, y1 * c - y0 * s])


@pytest.mark.parametrize("swa_base", [None, 5000.0])
def test_each_layer_is_unroped_with_its_base(tmp_path: Path, swa_base: float | None) -> None:
    model = tmp_path / "gemma3.gguf"
    header_only_gemma3(model, swa_base)
    roped = kvfast.open(STATE, model=model)
    pre = kvfast.open(STATE, model=model, pre_rope=True)
    assert [c.index for c in roped.caches] == [0, 1]
    pos = 5
    for cache, base in ((0, 1_000_000.0), (1, swa_base or 10000.0)):
        cell = int(np.flatnonzero(np.asarray(roped.caches[cache].streams[0].pos) == pos)[0])
        x = roped.values(layer=0, kind="k", cache=cache)[cell].astype(np.float32)
        got = pre.values(layer=0, kind="k", cache=cache)[cell]
        want = unrope_neox(x, pos, base)
        assert np.abs(got - want).max() < 1e-3 * max(1.0, float(np.abs(want).max())), cache
        other = unrope_neox(x, pos, 10000.0 if cache == 0 else 1_000_000.0)
        assert np.abs(got - other).max() > 0.01
