"""Keys before RoPE: the rope parameters of a model's layers, read from its GGUF header, for
kvfast-core's per-cell undoing of llama.cpp's RoPE (``kvfast.open(path, model=GGUF, pre_rope=True)``).

What is read (as llama.cpp's loader and llama_context read it):
- ``<arch>.rope.dimension_count`` (the roped values of each head; default: the K head size),
  ``<arch>.rope.freq_base`` (default 10000);
- sliding-window layers (Gemma 3's local layers): ``rope.freq_base_swa``, else llama.cpp's default
  for the arch (the global base for the archs that copy it, 10000 otherwise), scale 1;
- ``rope.scaling.type`` (none, linear, yarn) and ``rope.scaling.factor`` (or ``rope.scale_linear``):
  linear scales every angle by 1 / factor; YaRN (ggml's rope_yarn) mixes interpolated and
  extrapolated angles between the correction dimensions from ``yarn_beta_fast`` /
  ``yarn_beta_slow`` (32 / 1) and ``original_context_length``, with ``yarn_ext_factor`` (1),
  ``yarn_attn_factor`` (1; with ``yarn_log_multiplier`` as llama_context computes it) and the
  magnitude 1 + 0.1 ln(factor);
- NORM (neighbouring values paired) or NEOX (halves paired) per arch, as llama_model_rope_type.

M-RoPE (Qwen2-VL: sections in a row; Qwen3-VL, Qwen3.5: interleaved): ``rope.dimension_sections``,
NEOX pairing, each section's pairs turned by the cell's time (its position), height (the cell
extension's y) or width (x) position, the extra section by the position (as llama.cpp's batch gives
text tokens; image cells' extra position is not stored, and their sections 4 are 0 in the models
known).

Not supported (a clear :class:`PreRopeError`): K rows whose roped
part comes last (DeepSeek-2's MLA and its kin: a separately roped k_pe), archs without RoPE,
longrope, and per-dimension frequency factors (a ``rope_freqs`` tensor: Llama 3.1+; they are not in
the header kvfast reads, so such a model's keys come out wrong at the low frequencies). Layers a
model leaves unroped (Llama 4's NoPE layers) are not known either.
"""

from __future__ import annotations

import os
from typing import Any

from kvfast import _kvfast
from kvfast.errors import PreRopeError


def model_rope(path: str | os.PathLike[str], head_dim_k: int) -> dict[str, Any]:
    """The model's rope parameters: ``global`` and ``swa`` (kvfast-core's Rope fields), read by
    kvfast-core from the GGUF header; a RoPE kvfast does not undo raises :class:`PreRopeError`
    naming the key (``.field``)."""
    return _kvfast.model_rope(os.fspath(path), head_dim_k)


__all__ = ["PreRopeError", "model_rope"]
