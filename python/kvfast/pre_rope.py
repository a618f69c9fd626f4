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
from kvfast.opened import OpenState


def model_rope(path: str | os.PathLike[str], head_dim_k: int) -> dict[str, Any]:
    """The model's rope parameters: ``global`` and ``swa`` (kvfast-core's Rope fields), read by
    kvfast-core from the GGUF header; a RoPE kvfast does not undo raises :class:`PreRopeError`
    naming the key (``.field``)."""
    return _kvfast.model_rope(os.fspath(path), head_dim_k)


def apply(dump: OpenState, model_path: str | os.PathLike[str] | None, swa: tuple[bool, ...]) -> None:
    """Make every value pass of ``dump`` read K before RoPE: per cache layer, the rope of its model
    layer (the sliding-window base for sliding-window layers)."""
    if model_path is None or dump.head_dim_k is None:
        raise PreRopeError(
            "pre_rope=True needs the model's GGUF (model=PATH; --model on the command line): the rope parameters"
            " and head size are in its header",
            field="model",
        )
    every = [ly for c in dump.caches for s in c.streams for ly in s.layers]
    if every and all(ly.v_type is None for ly in every):
        # deepseek2's K row is the latent, then the roped part (k_pe) last: not a head roped from
        # its first values
        raise PreRopeError(
            "pre_rope: a V-less (MLA) cache's K row is the compressed latent, then the RoPE part;"
            " kvfast does not undo that rope yet",
            field="model",
        )
    rope = model_rope(model_path, dump.head_dim_k)
    spec: list[list[dict[str, Any] | None]] = []
    maps = dump._model_layers[: len(dump.caches)]  # the attention caches' (the recurrent part last)
    for layers in maps:
        if layers is None:
            break
        spec.append([rope["swa" if 0 <= ml < len(swa) and swa[ml] else "global"] for ml in layers])
    if len(spec) < len(maps):
        raise PreRopeError("pre_rope: the model's layer map of this state is not known", field="model")
    dump._live().set_rope(spec)
