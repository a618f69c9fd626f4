"""Each cache's part of its model's memory, as kvfast-core decides it from the model's GGUF header
by llama.cpp's own rules: its role (``attention``, ``sliding-window``, ``indexer``, ``recurrent``),
the model layers it holds, its K and V head sizes and the basis its K rows are stored in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MemoryPart:
    """One cache of a state as a part of its model's memory.

    ``role``: ``"attention"`` (the full-attention cache), ``"sliding-window"`` (an iSWA model's
    window cache), ``"indexer"`` (a sparse attention's indexer cache: DSA's lightning indexer, one
    K head; MSA's block indexer) or ``"recurrent"``. ``model_layers``: the model layer of each of
    its layers. ``head_dim_k`` / ``head_dim_v``: its head sizes (``head_dim_v`` None: K only).
    ``k_basis``: ``"rule"`` (llama.cpp's rule for quantized caches, see :attr:`State.rotation`),
    ``"rotated N"`` (stored multiplied by the Hadamard matrix in groups of N at every type: a DSA
    indexer; undone by default) or ``"as computed"``."""

    role: str
    model_layers: list[int]
    head_dim_k: int | None
    head_dim_v: int | None
    k_basis: str

    def describe(self) -> str:
        """One line: role, model layers, head sizes."""
        heads = f"K head {self.head_dim_k}" if self.head_dim_k else "heads of the row"
        if self.head_dim_v:
            heads += f", V head {self.head_dim_v}"
        elif self.role != "recurrent":
            heads += ", no V"
        if self.k_basis.startswith("rotated"):
            heads += f", K stored Hadamard-{self.k_basis}"
        return f"{self.role}: model layers {self.model_layers} ({heads})"


def parts_of(raw: list[dict[str, Any] | None]) -> list[MemoryPart | None]:
    """The parts kvfast-core returned (None where the model is not known)."""
    return [
        None
        if p is None
        else MemoryPart(
            p["role"], list(p["model_layers"]), p["head_dims"][0], p["head_dims"][1], p["k_basis"]
        )
        for p in raw
    ]


def short(parts: list[MemoryPart | None]) -> str:
    """The parts in a few words, for ``repr``: ``attention[0, 1] + indexer[0, 1]`` ('' unknown)."""
    if not parts or any(p is None for p in parts):
        return ""
    return " + ".join(f"{p.role}{p.model_layers}" for p in parts if p is not None)
