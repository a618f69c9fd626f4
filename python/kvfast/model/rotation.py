"""Values in the model's basis: deciding whether llama.cpp's attention rotation is to be undone.

Since April 2026 (llama.cpp 744c0c731) a quantized cache stores K and V multiplied by an orthonormal
Walsh-Hadamard matrix, a group of values at a time (the rule is in kvfast-core's ``rotation.rs``).
Nothing in the bytes records it. ``kvfast.open(path, rotation=...)`` decides, per cache and kind:

- ``"none"``: the values as stored (bit-exact with ggml's dequantization);
- ``"hadamard"``: undo the rotation wherever llama.cpp's rule applies (never in a V-less MLA cache's
  K, which llama.cpp's K-only attention stores as computed);
- ``"auto"`` (default): undo it where the evidence says llama.cpp rotated, in this order: the rule
  (an f16 cache, a head size that is not a multiple of 64, or a V-less MLA cache's K is never
  rotated), a probe manifest that recorded the build (read even when ``model=`` is given), the
  container's era, and last the values themselves (rotated rows look Gaussian, kurtosis about 3;
  real keys have outlier channels; one build rotates K and V alike, so what one cache and kind's
  values show decides the others). Without the head size, K's group is told by RoPE's pairs (real
  keys have a mean, which NEOX RoPE turns from cell to cell in llama.cpp's heads only,
  ``rope_pairs.rs``); where they cannot tell, K is left as stored. When none of these can tell, the
  values are left as stored and a :class:`RotationWarning` says so, naming the option.

kvfast-core decides at open (``rotation_decide.rs``), reading at most 32 cells of six records per
cache and kind, never a whole record. The decisions are in :attr:`kvfast.State.rotation`; the Rust
decoder applies them (a fast
Walsh-Hadamard transform fused with decoding) in every pass: values, tables, scans, exports,
statistics, comparisons and pictures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvfast.errors import RotationError, RotationWarning

Mode = Literal["auto", "hadamard", "none"]


@dataclass(frozen=True)
class Rotation:
    """What was decided for one kind (``'k'`` or ``'v'``) of one cache, and on what evidence."""

    cache: int
    kind: str
    type: str
    #: Whether values are read in the model's basis (the rotation undone).
    undone: bool
    #: The group size the Hadamard matrix is applied in (None when not undone).
    group: int | None
    evidence: str
    #: False when the decision is a default taken for want of evidence.
    certain: bool = True


__all__ = ["Mode", "Rotation", "RotationError", "RotationWarning"]
