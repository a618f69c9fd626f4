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

#: More layers than any model has (kvfast-core's bound on a cache's n_layer): bounds block_count.
MAX_LAYERS: int = _kvfast.MAX_LAYERS
#: More values per row than any model has (kvfast-core's bound): bounds head sizes and counts.
MAX_VALUES: int = _kvfast.MAX_VALUES


@dataclass(frozen=True)
class IndexerGeometry:
    """A sparse attention's indexer cache: per model layer whether it holds it, its one K head (and
    V head: None, K only), and ``k_rotation``: the group its K is stored Hadamard-rotated in at
    every type (0: as computed)."""

    layers: tuple[bool, ...]
    head_dim_k: int
    head_dim_v: int | None
    k_rotation: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))


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
    #: The (K, V) head sizes of the sliding-window layers where they are not the model's (Gemma 4).
    head_dims_swa: tuple[int, int] | None = None
    #: The sparse attention's indexer cache (DSA, MSA), written after the attention caches.
    indexer: IndexerGeometry | None = None

    def __post_init__(self) -> None:
        # from kvfast-core's dict (State.model, a GGUF read) or a manifest's JSON: as the types say
        if isinstance(self.indexer, dict):
            object.__setattr__(self, "indexer", IndexerGeometry(**self.indexer))
        if self.head_dims_swa is not None:
            object.__setattr__(self, "head_dims_swa", tuple(self.head_dims_swa))

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> ModelGeometry:
        """Read the geometry from a GGUF header. Metadata of the wrong type or out of range raises
        :class:`kvfast.ModelMismatchError` naming the key (``.field``); the GGUF reader bounds every
        count by the bytes present, and ``block_count`` is bounded by :data:`MAX_LAYERS`. kvfast-core
        reads the header and applies llama.cpp's rules (its arch tables, ``kvfast_core::arch``)."""
        return cls(**_kvfast.read_model(os.fspath(path)))

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
        hold V, and the recurrent part's layers ((n_layer field, layers with records));
        kvfast-core's rule."""
        v_less, recurrent = _kvfast.walk_hints(self)
        return {"v_less": v_less, "recurrent": recurrent}

    def model_layers(self, cache_layers: list[int]) -> list[list[int]]:
        """The model's layer index of every layer of each attention cache, given each cache's layer
        count (the recurrent part's layers are :meth:`recurrent_layers`); kvfast-core's map.

        One cache holds every attention layer; iSWA states hold the full-attention layers' cache,
        then the sliding-window layers' cache (or that one alone when written with PARTIAL_ONLY).
        """
        return _kvfast.attention_map(self, cache_layers)
