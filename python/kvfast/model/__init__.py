"""The model behind a state and the basis its cache is stored in: the geometry read from a GGUF
(:mod:`.geometry`, re-exported here so ``kvfast.model.ModelGeometry`` names it), the Hadamard
rotation llama.cpp may store quantized caches in (:mod:`.rotation`) and keys before RoPE
(:mod:`.pre_rope`)."""

from kvfast.model.geometry import MAX_LAYERS, MAX_VALUES, ModelGeometry

__all__ = ["MAX_LAYERS", "MAX_VALUES", "ModelGeometry"]
