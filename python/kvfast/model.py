"""Head geometry and layer order of a model, from its GGUF header (tensors are never read)."""

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
        name_h, n_head = key("attention.head_count")
        name_kv, n_head_kv = key("attention.head_count_kv")
        if n_head_kv is None:
            name_kv, n_head_kv = name_h, n_head
        heads_kv = _per_layer(where, name_kv, n_head_kv, n_layer)
        n_head0 = _per_layer(where, name_h, n_head, n_layer)[0] if n_head is not None else 0
        name, v = key("embedding_length")
        emb = 0 if v is None else _count(where, name, v, 0, MAX_VALUES)
        name_k, v = key("attention.key_length")
        if v is None:
            if not n_head0 or not emb:
                raise _bad(where, name_k, v, "the head size (or embedding_length and head_count)")
            v = emb // n_head0
        head_dim_k = _count(where, name_k, v, 1, MAX_VALUES)
        name, v = key("attention.value_length")
        head_dim_v = head_dim_k if v is None else _count(where, name, v, 1, MAX_VALUES)
        name, pattern = key("attention.sliding_window_pattern")
        if isinstance(pattern, list):
            if len(pattern) != n_layer:
                raise _length(where, name, pattern, n_layer)
            swa = tuple(_flag(where, f"{name}[{il}]", x) for il, x in enumerate(pattern))
        else:
            n = _SWA_PATTERN.get(arch, 0) if pattern is None else _count(where, name, pattern, 0, MAX_LAYERS)
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
