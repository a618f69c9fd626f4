"""Head geometry and layer order of a model, from its GGUF header (tensors are never read)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kvfast import _kvfast
from kvfast.errors import ModelMismatchError

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

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> ModelGeometry:
        meta = _kvfast.gguf_metadata(os.fspath(path))
        arch = str(meta.get("general.architecture", ""))

        def key(name: str, default: Any = None) -> Any:
            return meta.get(f"{arch}.{name}", default)

        n_layer = int(key("block_count", 0))
        if not arch or n_layer <= 0:
            raise ValueError(f"{path}: not a model GGUF (no general.architecture / block_count)")
        n_head = key("attention.head_count")
        n_head_kv = key("attention.head_count_kv", n_head)
        heads_kv = _per_layer(n_head_kv, n_layer, f"{arch}.attention.head_count_kv")
        n_head0 = _per_layer(n_head, n_layer, f"{arch}.attention.head_count")[0] if n_head else 0
        emb = int(key("embedding_length", 0))
        head_dim_k = int(key("attention.key_length", emb // n_head0 if n_head0 else 0))
        head_dim_v = int(key("attention.value_length", head_dim_k))
        if head_dim_k <= 0 or head_dim_v <= 0:
            raise ValueError(f"{path}: no head size ({arch}.attention.key_length)")
        pattern = key("attention.sliding_window_pattern")
        if isinstance(pattern, list):
            swa = tuple(bool(x) for x in _per_layer(pattern, n_layer, "sliding_window_pattern"))
        else:
            n = int(pattern) if isinstance(pattern, int) else _SWA_PATTERN.get(arch, 0)
            swa = tuple(n > 1 and il % n < n - 1 for il in range(n_layer))
        return cls(arch, n_layer, head_dim_k, head_dim_v, tuple(heads_kv), swa)

    def model_layers(self, cache_layers: list[int]) -> list[list[int]]:
        """The model's layer index of every layer of each cache, given each cache's layer count.

        One cache holds every layer; iSWA states hold the full-attention layers' cache, then the
        sliding-window layers' cache (or that one alone when written with PARTIAL_ONLY).
        """
        full = [il for il in range(self.n_layer) if not self.swa[il]]
        window = [il for il in range(self.n_layer) if self.swa[il]]
        if cache_layers == [self.n_layer]:
            return [list(range(self.n_layer))]
        if window and cache_layers == [len(full), len(window)]:
            return [full, window]
        if window and cache_layers == [len(window)]:
            return [window]
        raise ModelMismatchError(
            f"the model ({self.arch}) has {self.n_layer} layers ({len(window)} sliding-window), "
            f"the state's caches have {cache_layers} layers"
        )


def _per_layer(v: Any, n_layer: int, name: str) -> list[int]:
    if isinstance(v, list):
        if len(v) != n_layer:
            raise ValueError(f"{name} has {len(v)} entries for {n_layer} layers")
        return [int(x) for x in v]
    return [int(v)] * n_layer
