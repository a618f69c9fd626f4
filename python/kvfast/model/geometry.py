"""Head geometry, layer order and memory of a model, from its GGUF header (tensors are never read).

Which layers llama.cpp keeps in its attention caches and which in its recurrent part follows
llama.cpp's loader (src/models/<arch>.cpp, ``llama_model::create_memory``): recurrent models
(Mamba, RWKV) keep every layer in the recurrent part; hybrids split them by architecture (a layer of
no KV head is recurrent in LFM2, Granite 4, Jamba, Kimi Linear; Qwen3-Next / Qwen3.5 mark every
``full_attention_interval``-th layer as attention unless ``attention.recurrent_layers`` lists them;
Falcon-H1 keeps every layer in both; Nemotron-H keeps its MLP layers in neither). An MLA model
(``attention.key_length_mla`` and ``value_length_mla``) keeps K records only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kvfast import _kvfast
from kvfast.errors import ModelMismatchError

#: More layers than any model has (kvfast-core's bound on a cache's n_layer): bounds block_count.
MAX_LAYERS = 4096
#: More values per row than any model has (kvfast-core's bound): bounds head sizes and counts.
MAX_VALUES = 1 << 24

# llm_arch_is_recurrent: the memory is the recurrent part alone, every layer in it
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# hybrids whose recurrent layers are those of no KV head (their is_recr rule)
_NO_KV_HEAD_IS_RECURRENT = frozenset(
    {
        "jamba",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "plamo2",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
    }
)
# hybrids whose recurrent layers are listed, or all but every full_attention_interval-th one
_INTERVAL = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"})
HYBRID_ARCHS = (
    _NO_KV_HEAD_IS_RECURRENT | _INTERVAL | {"falcon-h1", "nemotron_h", "nemotron_h_moe", "deepseek4"}
)
# GGUF keys (after "<arch>.") of a recurrent layer's hyperparameters: a model with none keeps no
# recurrent part, whatever its arch
_RECURRENT_KEYS = ("ssm.", "shortconv.", "wkv.", "token_shift_count", "kda.", "linear_attention")

# llama.cpp's hard-coded sliding-window patterns (llama_hparams::set_swa_pattern(n)): layer il uses
# the sliding window when il % n < n - 1, i.e. every n-th layer is full attention.
_SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "gpt-oss": 2, "exaone4": 4}


@dataclass(frozen=True)
class ModelGeometry:
    """What splits a state's rows into heads and its caches' layers into the model's layers."""

    arch: str
    n_layer: int
    head_dim_k: int
    head_dim_v: int
    n_head_kv: tuple[int, ...]
    swa: tuple[bool, ...]
    #: Per layer, whether it has R and S records in the recurrent part; None where kvfast cannot
    #: tell (an arch it does not know with recurrent hyperparameters, a probe manifest).
    recurrent: tuple[bool, ...] | None = None
    #: Per layer, whether it is in the attention caches; None: every layer.
    attention: tuple[bool, ...] | None = None
    #: Whether the attention caches hold K records only (MLA); None: not known.
    v_less: bool | None = None
    #: The recurrent part's n_layer field (block_count less the NextN / MTP layers).
    n_layer_trunk: int | None = None

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> ModelGeometry:
        """Read the geometry from a GGUF header. Metadata of the wrong type or out of range raises
        :class:`kvfast.ModelMismatchError` naming the key (``.field``); the GGUF reader bounds every
        count by the bytes present, and ``block_count`` is bounded by :data:`MAX_LAYERS`."""
        meta = _kvfast.gguf_metadata(os.fspath(path))
        where = os.fspath(path)
        arch = meta.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise _bad(where, "general.architecture", arch, "an architecture name (a model GGUF)")

        def key(name: str) -> tuple[str, Any]:
            return f"{arch}.{name}", meta.get(f"{arch}.{name}")

        name, v = key("block_count")
        n_layer = _count(where, name, v, 1, MAX_LAYERS)
        name, v = key("nextn_predict_layers")
        nextn = 0 if v is None else _count(where, name, v, 0, n_layer)
        name_h, n_head = key("attention.head_count")
        name_kv, n_head_kv = key("attention.head_count_kv")
        if n_head_kv is None:
            name_kv, n_head_kv = name_h, n_head
        if n_head_kv is None and arch in RECURRENT_ARCHS:
            n_head_kv = 0  # no attention head at all
        heads_kv = _per_layer(where, name_kv, n_head_kv, n_layer)
        n_head0 = _per_layer(where, name_h, n_head, n_layer)[0] if n_head is not None else 0
        name, v = key("embedding_length")
        emb = 0 if v is None else _count(where, name, v, 0, MAX_VALUES)
        recurrent = _recurrent(where, arch, meta, n_layer, nextn, heads_kv)
        attention = _attention(where, arch, meta, n_layer, nextn, heads_kv, recurrent)
        name_k, v = key("attention.key_length")
        if v is None and attention is not None and not any(attention):
            head_dim_k = head_dim_v = 0  # no attention layer, no head
        else:
            if v is None:
                if not n_head0 or not emb:
                    raise _bad(where, name_k, v, "the head size (or embedding_length and head_count)")
                v = emb // n_head0
            head_dim_k = _count(where, name_k, v, 1, MAX_VALUES)
            name, v = key("attention.value_length")
            head_dim_v = head_dim_k if v is None else _count(where, name, v, 1, MAX_VALUES)
        mla = [key(f"attention.{k}_length_mla")[1] for k in ("key", "value")]
        v_less = all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in mla)
        name, pattern = key("attention.sliding_window_pattern")
        if isinstance(pattern, list):
            if len(pattern) != n_layer:
                raise _length(where, name, pattern, n_layer)
            swa = tuple(_flag(where, f"{name}[{il}]", x) for il, x in enumerate(pattern))
        else:
            n = _SWA_PATTERN.get(arch, 0) if pattern is None else _count(where, name, pattern, 0, MAX_LAYERS)
            swa = tuple(n > 1 and il % n < n - 1 for il in range(n_layer))
        name, window = key("attention.sliding_window")
        if arch in ("lfm2", "lfm2moe") and window and attention is not None:
            # LFM2 with a window: every attention layer slides (its is_swa rule)
            _count(where, name, window, 0, 1 << 31)
            swa = attention
        return cls(
            arch,
            n_layer,
            head_dim_k,
            head_dim_v,
            tuple(heads_kv),
            swa,
            recurrent=recurrent,
            attention=attention,
            v_less=v_less,
            n_layer_trunk=n_layer - nextn,
        )

    def attention_layers(self) -> list[int]:
        """The model's layers the attention caches hold, in order."""
        return [il for il in range(self.n_layer) if self.attention is None or self.attention[il]]

    def recurrent_layers(self) -> list[int] | None:
        """The model's layers with R and S records, in order (None: not known)."""
        if self.recurrent is None:
            return None
        return [il for il, r in enumerate(self.recurrent) if r]

    def walk_hints(self) -> dict[str, Any]:
        """What the reader cannot tell from the bytes, as the model says it: whether the caches
        hold V, and the recurrent part's layers ((n_layer field, layers with records))."""
        rec = self.recurrent_layers()
        n_trunk = self.n_layer if self.n_layer_trunk is None else self.n_layer_trunk
        return {"v_less": self.v_less, "recurrent": None if rec is None else (n_trunk, len(rec))}

    def layers(self) -> dict[str, Any]:
        """What the model says about its layers, as kvfast-core's layer map takes it."""
        return {
            "arch": self.arch,
            "n_layer": self.n_layer,
            "attention": None if self.attention is None else list(self.attention),
            "swa": list(self.swa),
            "recurrent": None if self.recurrent is None else list(self.recurrent),
        }

    def model_layers(self, cache_layers: list[int]) -> list[list[int]]:
        """The model's layer index of every layer of each attention cache, given each cache's layer
        count (the recurrent part's layers are :meth:`recurrent_layers`); kvfast-core's map.

        One cache holds every attention layer; iSWA states hold the full-attention layers' cache,
        then the sliding-window layers' cache (or that one alone when written with PARTIAL_ONLY).
        """
        try:
            return _kvfast.attention_map(self.layers(), cache_layers)
        except ValueError as e:
            raise ModelMismatchError(str(e)) from None


def _recurrent(
    where: str, arch: str, meta: dict[str, Any], n_layer: int, nextn: int, heads_kv: list[int]
) -> tuple[bool, ...] | None:
    """Per layer, whether llama.cpp keeps it in the recurrent part (its is_recr rule and the
    recurrent memory's layer filter, create_memory)."""
    trunk = n_layer - nextn
    if arch in RECURRENT_ARCHS or arch == "falcon-h1":
        return tuple(il < trunk for il in range(n_layer))
    if arch in _NO_KV_HEAD_IS_RECURRENT:
        return tuple(il < trunk and heads_kv[il] == 0 for il in range(n_layer))
    if arch in ("nemotron_h", "nemotron_h_moe"):
        name = f"{arch}.feed_forward_length"
        ff = _per_layer(where, name, meta.get(name, 0), n_layer)
        return tuple(il < trunk and heads_kv[il] == 0 and ff[il] == 0 for il in range(n_layer))
    if arch in _INTERVAL:
        name = f"{arch}.attention.recurrent_layers"
        listed = meta.get(name)
        if listed is not None:
            flags = (
                [_flag(where, f"{name}[{il}]", x) for il, x in enumerate(listed)]
                if isinstance(listed, list)
                else [_flag(where, name, listed)] * n_layer
            )
            if len(flags) != n_layer:
                raise _length(where, name, listed, n_layer)
            return tuple(il < trunk and f for il, f in enumerate(flags))
        name = f"{arch}.full_attention_interval"
        v = meta.get(name)
        n = 4 if v is None else _count(where, name, v, 1, MAX_LAYERS)
        return tuple(il < trunk and (il + 1) % n != 0 for il in range(n_layer))
    if any(k.startswith(f"{arch}.{r}") for k in meta for r in _RECURRENT_KEYS):
        return None  # a recurrent model of an arch kvfast does not know: the bytes tell
    return tuple(False for _ in range(n_layer))


def _attention(
    where: str,
    arch: str,
    meta: dict[str, Any],
    n_layer: int,
    nextn: int,
    heads_kv: list[int],
    recurrent: tuple[bool, ...] | None,
) -> tuple[bool, ...] | None:
    """Per layer, whether llama.cpp keeps it in the attention caches (create_memory's filters)."""
    trunk = n_layer - nextn
    if arch in RECURRENT_ARCHS:
        return tuple(False for _ in range(n_layer))
    if arch == "falcon-h1":
        return tuple(True for _ in range(n_layer))
    if recurrent is None:
        return None
    if arch in ("nemotron_h", "nemotron_h_moe"):
        name = f"{arch}.feed_forward_length"
        ff = _per_layer(where, name, meta.get(name, 0), n_layer)
        return tuple(not recurrent[il] and ff[il] == 0 for il in range(n_layer))
    if arch in _INTERVAL:
        return tuple(il < trunk and not recurrent[il] for il in range(n_layer))
    if arch in _NO_KV_HEAD_IS_RECURRENT:
        return tuple(not r for r in recurrent)
    # attention models: a NextN / MTP block is kept out of the main context's cache
    return tuple(il < trunk for il in range(n_layer))


def _err(path: str, key: str, message: str) -> ModelMismatchError:
    err = ModelMismatchError(f"{path}: {key} {message}")
    err.field = key
    return err


def _bad(path: str, key: str, value: Any, what: str) -> ModelMismatchError:
    return _err(path, key, f"must be {what}, found {value!r} ({type(value).__name__})")


def _length(path: str, key: str, value: list[Any], n_layer: int) -> ModelMismatchError:
    return _err(path, key, f"has {len(value)} entries for {n_layer} layers")


def _count(path: str, key: str, value: Any, lo: int, hi: int) -> int:
    """An integer of the GGUF header in ``lo..hi`` (a bool, a float or a string is refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(path, key, value, f"an integer from {lo} to {hi:,}")
    if not lo <= value <= hi:
        raise _bad(path, key, value, f"an integer from {lo} to {hi:,}")
    return value


def _flag(path: str, key: str, value: Any) -> bool:
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise _bad(path, key, value, "a bool (or 0 / 1)")


def _per_layer(path: str, key: str, value: Any, n_layer: int, hi: int = MAX_VALUES) -> list[int]:
    """A per-layer count: one integer for every layer, or a list of n_layer of them."""
    if isinstance(value, list):
        if len(value) != n_layer:
            raise _length(path, key, value, n_layer)
        return [_count(path, f"{key}[{il}]", x, 0, hi) for il, x in enumerate(value)]
    return [_count(path, key, value, 0, hi)] * n_layer
