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

import math
import os
from typing import Any

from kvfast import _kvfast
from kvfast.errors import PreRopeError
from kvfast.read.opened import OpenState

# llama_model_rope_type (src/llama-model.cpp), by GGUF arch name
NORM = frozenset(
    [
        "arcee",
        "arctic",
        "baichuan",
        "bailingmoe",
        "chameleon",
        "chatglm",
        "cohere2",
        "cohere2moe",
        "command-r",
        "deci",
        "deepseek",
        "deepseek2",
        "deepseek2-ocr",
        "deepseek32",
        "deepseek4",
        "dots3note",
        "eagle3",
        "ernie4_5",
        "ernie4_5-moe",
        "glm-dsa",
        "granite",
        "granite_swa",
        "granitehybrid",
        "granitemoe",
        "graniteswitch",
        "hy_v4",
        "internlm2",
        "llada",
        "llama",
        "llama-embed",
        "llama4",
        "maincoder",
        "minicpm",
        "mistral3",
        "mistral4",
        "muse-glimmer",
        "nanbeige",
        "neo-bert",
        "olmo",
        "plm",
        "pockettts",
        "smollm3",
        "starcoder",
        "xverse",
    ]
)
NEOX = frozenset(
    [
        "afmoe",
        "apertus",
        "bailingmoe2",
        "bert",
        "bitnet",
        "codeshell",
        "cogvlm",
        "dbrx",
        "dots1",
        "dream",
        "eurobert",
        "exaone",
        "exaone-moe",
        "exaone4",
        "falcon",
        "falcon-h1",
        "gemma",
        "gemma-embedding",
        "gemma2",
        "gemma3",
        "gemma3n",
        "gemma4",
        "gemma4-assistant",
        "gpt-oss",
        "gptneox",
        "grok",
        "grovemoe",
        "hrm_text",
        "hunyuan-dense",
        "hunyuan-moe",
        "hy_v3",
        "jais2",
        "jina-bert-v3",
        "laguna",
        "lfm2",
        "lfm2moe",
        "llada-moe",
        "maple",
        "mellum",
        "mimo2",
        "minicpm3",
        "minimax-01",
        "minimax-m2",
        "minimax-m3",
        "modern-bert",
        "nemotron",
        "nomic-bert",
        "nomic-bert-moe",
        "olmo2",
        "olmoe",
        "openelm",
        "orion",
        "pangu-embedded",
        "phi2",
        "phi3",
        "phimoe",
        "plamo",
        "plamo2",
        "plamo3",
        "qwen",
        "qwen2",
        "qwen2moe",
        "qwen3",
        "qwen3moe",
        "qwen3next",
        "rnd1",
        "seed_oss",
        "smallthinker",
        "spark2_5",
        "stablelm",
        "starcoder2",
        "step35",
        "talkie",
    ]
)
# NORM or NEOX unless the file carries M-RoPE sections
MAYBE_MROPE = {"bailingmoe3": False, "glm4": False, "glm4moe": True, "hunyuan_vl": True}
MROPE = frozenset(
    ["dflash", "paddleocr", "qwen2vl", "qwen35", "qwen35moe", "qwen3tts", "qwen3vl", "qwen3vlmoe", "qwen4exp"]
)
# interleaved M-RoPE (LLAMA_ROPE_TYPE_IMROPE); the rest of MROPE has its sections in a row
IMROPE = frozenset(["qwen35", "qwen35moe", "qwen3tts", "qwen3vl", "qwen3vlmoe", "qwen4exp"])
# archs whose K is [no-RoPE part, RoPE part] (a separately roped k_pe concatenated last: MLA and
# its kin, src/models/*.cpp): the roped dimensions are the last ones, not undone yet
ROPE_LAST = frozenset(
    [
        "bailingmoe3",
        "deepseek2",
        "deepseek2-ocr",
        "deepseek32",
        "deepseek4",
        "dots3note",
        "glm-dsa",
        "hy_v4",
        "kimi-k3",
        "kimi-linear",
        "minicpm3",
        "plm",
    ]
)
# archs whose loader sets the sliding-window base to the global one before reading freq_base_swa
SWA_BASE_IS_GLOBAL = frozenset(
    [
        "afmoe",
        "cohere2",
        "cohere2moe",
        "dflash",
        "exaone-moe",
        "exaone4",
        "gemma2",
        "laguna",
        "llama4",
        "maple",
        "mellum",
        "muse-glimmer",
        "olmo2",
        "gpt-oss",
        "smallthinker",
        "spark2_5",
    ]
)


def _number(meta: dict[str, Any], key: str, default: float) -> float:
    v = meta.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise PreRopeError(f"{key} is {v!r}: expected a finite number", field=key)
    return float(v)


def model_rope(path: str | os.PathLike[str], head_dim_k: int) -> dict[str, Any]:
    """The model's rope parameters: ``global`` and ``swa`` (kvfast-core's Rope fields)."""
    meta = _kvfast.gguf_metadata(os.fspath(path))
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise PreRopeError(f"{path}: no general.architecture", field="general.architecture")

    def k(name: str) -> str:
        return f"{arch}.{name}"

    mrope = meta.get(k("rope.dimension_sections"))
    sections = [0, 0, 0, 0]
    if arch in MROPE or (arch in MAYBE_MROPE and mrope):
        # M-RoPE: NEOX pairing, each section's pairs turned by the time, height or width position
        # (text cells: all the position; image cells: the cell extension's y and x)
        given: list[int] = [v for v in mrope if isinstance(v, int)] if isinstance(mrope, list) else []
        ok = isinstance(mrope, list) and len(given) == len(mrope) and 0 < len(given) <= 4
        if not ok or min(given) < 0 or not sum(given):
            raise PreRopeError(
                f"{k('rope.dimension_sections')} is {mrope!r}: expected up to 4 section sizes (M-RoPE)",
                field=k("rope.dimension_sections"),
            )
        sections = [*given, 0, 0, 0][:4]
    if arch in NORM or (arch in MAYBE_MROPE and not MAYBE_MROPE[arch]):
        neox = False
    elif arch in NEOX or arch in MAYBE_MROPE or arch in MROPE:
        neox = True
    else:
        raise PreRopeError(f"pre_rope: {arch} uses no RoPE kvfast knows of", field="general.architecture")
    neox = neox or any(sections)  # M-RoPE pairs halves
    n_dims = int(_number(meta, k("rope.dimension_count"), head_dim_k))
    if n_dims % 2 or not 0 < n_dims <= head_dim_k:
        raise PreRopeError(
            f"{k('rope.dimension_count')} is {n_dims}: expected an even count up to the head size {head_dim_k}",
            field=k("rope.dimension_count"),
        )
    if arch in ROPE_LAST and n_dims < head_dim_k:
        raise PreRopeError(
            f"pre_rope: {arch} ropes the last {n_dims} of {head_dim_k} K values (a k_pe part, MLA), which"
            " kvfast does not undo yet",
            field=k("rope.dimension_count"),
        )
    base = _number(meta, k("rope.freq_base"), 10000.0)
    scaling = meta.get(k("rope.scaling.type"), "linear")
    if scaling not in ("none", "linear", "yarn"):
        raise PreRopeError(
            f"pre_rope: rope scaling {scaling!r} is not supported", field=k("rope.scaling.type")
        )
    factor = _number(meta, k("rope.scaling.factor"), 0.0) or _number(meta, k("rope.scale_linear"), 0.0)
    freq_scale = 1.0 if scaling == "none" or factor == 0.0 else 1.0 / factor
    yarn = scaling == "yarn"
    ext = _number(meta, k("rope.scaling.yarn_ext_factor"), -1.0)
    ext = (1.0 if yarn else 0.0) if ext < 0 else ext
    attn = _number(meta, k("rope.scaling.yarn_attn_factor"), 1.0)
    log_mul = _number(meta, k("rope.scaling.yarn_log_multiplier"), 0.0)
    if ext != 0 and log_mul != 0:

        def mscale(scale: float, m: float) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1

        m = log_mul if arch == "deepseek2" and log_mul != 1 else 1.0
        attn = mscale(1 / freq_scale, m) / mscale(1 / freq_scale, log_mul)
    n_ctx = _number(meta, k("rope.scaling.original_context_length"), 0.0) or _number(
        meta, k("context_length"), 0.0
    )
    common = {
        "n_dims": n_dims,
        "head_dim": head_dim_k,
        "neox": neox,
        "beta_fast": _number(meta, k("rope.scaling.yarn_beta_fast"), 32.0),
        "beta_slow": _number(meta, k("rope.scaling.yarn_beta_slow"), 1.0),
        "n_ctx_orig": int(n_ctx),
        "sections": sections,
        "imrope": arch in IMROPE,
    }
    glob = {**common, "freq_base": base, "freq_scale": freq_scale, "ext_factor": ext, "attn_factor": attn}
    swa_base = _number(meta, k("rope.freq_base_swa"), base if arch in SWA_BASE_IS_GLOBAL else 10000.0)
    swa = {**glob, "freq_base": swa_base, "freq_scale": 1.0}
    return {"global": glob, "swa": swa}


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
