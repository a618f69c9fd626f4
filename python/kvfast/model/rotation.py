"""Values in the model's basis: deciding whether llama.cpp's attention rotation is to be undone.

Since April 2026 (llama.cpp 744c0c731) a quantized cache stores K and V multiplied by an orthonormal
Walsh-Hadamard matrix, a group of values at a time (the rule is in kvfast-core's ``rotation.rs``).
Nothing in the bytes records it. ``kvfast.open(path, rotation=...)`` decides, per cache and kind:

- ``"none"``: the values as stored (bit-exact with ggml's dequantization);
- ``"hadamard"``: undo the rotation wherever llama.cpp's rule applies;
- ``"auto"`` (default): undo it where the evidence says llama.cpp rotated, in this order: the rule
  (an f16 cache, or a head size that is not a multiple of 64, is never rotated), a probe manifest
  that recorded the build, the container's era, and last the values themselves (rotated rows look
  Gaussian, kurtosis about 3; real keys have outlier channels). When none of these can tell, the
  values are left as stored and a :class:`RotationWarning` says so, naming the option.

The decisions are in :attr:`kvfast.State.rotation`; the Rust decoder applies them (a fast
Walsh-Hadamard transform fused with decoding) in every pass: values, tables, scans, exports,
statistics, comparisons and pictures.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from kvfast import _kvfast
from kvfast.errors import RotationError, RotationWarning
from kvfast.read import ggml

if TYPE_CHECKING:
    from kvfast.read.structure import Cache, Layer

Mode = Literal["auto", "hadamard", "none"]
MODES = ("auto", "hadamard", "none")
#: Cells per layer, and layers per cache, that the values test reads.
_SAMPLE_CELLS = 512
_SAMPLE_LAYERS = 6
#: How much larger one basis's kurtosis must be than the other's to count as evidence: on its own,
#: and where the container already says the build rotated (the values then only confirm the group).
_MARGIN = 2.0
_MARGIN_CONFIRM = 1.4
_MIN_KURTOSIS = 5.0


#: Why a group chosen by the values is a guess: undoing in twice llama.cpp's group mixes each channel
#: with the same channel of the neighbouring head, which keeps (often raises) the outliers a real
#: cache has, so no statistic of the values tells the two apart without the head size.
_GUESS = (
    "chosen by the values (the largest kurtosis; without the head size a group twice llama.cpp's looks alike)"
)


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


@dataclass(frozen=True)
class BuildHint:
    """What a probe manifest recorded about the llama.cpp that wrote a state."""

    rotates: bool
    evidence: str


def hadamard(x: npt.NDArray[np.float32], n: int) -> npt.NDArray[np.float64]:
    """Multiply every group of ``n`` values of each row by the orthonormal Hadamard matrix (NumPy)."""
    rows = x.reshape(-1, n).astype(np.float64)
    h = 1
    while h < n:
        r = rows.reshape(-1, n // (2 * h), 2, h)
        a, b = r[:, :, 0, :].copy(), r[:, :, 1, :].copy()
        r[:, :, 0, :], r[:, :, 1, :] = a + b, a - b
        rows = r.reshape(-1, n)
        h *= 2
    out: npt.NDArray[np.float64] = (rows / np.sqrt(n)).reshape(x.shape)
    return out


def kurtosis(x: npt.NDArray[np.float64]) -> float:
    """Pearson kurtosis of all values (3 for a Gaussian)."""
    x = x.ravel() - x.mean()
    var = float((x * x).mean())
    return float((x**4).mean() / (var * var)) if var > 0 else 0.0


def _groups(n_embd: int) -> list[int]:
    out, n = [], 64
    while n_embd % n == 0:
        out.append(n)
        n *= 2
    return out


def plan(
    state: _kvfast.State,
    caches: list[Cache],
    info: dict[str, object],
    head_dims: tuple[int | None, int | None],
    mode: str,
    hint: BuildHint | None,
) -> list[Rotation]:
    """Decide, for every cache and kind, whether to undo the rotation (see the module's docs)."""
    if mode not in MODES:
        raise ValueError(f"rotation must be 'auto', 'hadamard' or 'none', not {mode!r}")
    out = []
    # A V-less (MLA) cache alone, not an iSWA pair: llama.cpp's K-only attention input
    # (llm_graph_input_attn_k, deepseek2 and the like) has no rotation, so K is stored as computed
    # even where attn_rot_k is set (its iSWA counterpart rotates).
    k_only = len(caches) == 1 and caches[0].n_layer > 0
    k_only = k_only and all(ly.v_type is None for s in caches[0].streams for ly in s.layers)
    for cache in caches:
        for ki, kind in enumerate(("k", "v")):
            d = _decide(state, cache, kind, head_dims[ki], info, mode, hint, k_only)
            if d is not None:
                out.append(d)
    undecided = [d for d in out if not d.certain]
    if undecided:
        which = ", ".join(
            f"cache {d.cache} {d.kind.upper()} ({d.type}: "
            + (f"undone in groups of {d.group}, a guess" if d.undone else "left as stored")
            + ")"
            for d in undecided
        )
        warnings.warn(
            f"kvfast cannot be sure how llama.cpp stored {which}: since April 2026 it stores quantized"
            f" caches Hadamard-rotated in groups set by the head size, which the state does not record."
            f" Evidence: {undecided[0].evidence}. Pass model= or head_dim= (or rotation='hadamard' /"
            " rotation='none') to decide.",
            RotationWarning,
            stacklevel=4,
        )
    return out


def _decide(
    state: _kvfast.State,
    cache: Cache,
    kind: str,
    head_dim: int | None,
    info: dict[str, object],
    mode: str,
    hint: BuildHint | None,
    k_only: bool = False,
) -> Rotation | None:
    layers = [(s.index, layer) for s in cache.streams for layer in s.layers]
    recs = [(si, ly) for si, ly in layers if (ly.k_type if kind == "k" else ly.v_type) is not None]
    if not recs:
        return None
    ly0 = recs[0][1]
    ty = str(ly0.k_type if kind == "k" else ly0.v_type)

    def rot(undone: bool, group: int | None, evidence: str, certain: bool = True) -> Rotation:
        return Rotation(cache.index, kind, ty, undone, group if undone else None, evidence, certain)

    if mode == "none":
        return rot(False, None, "rotation='none': values as stored")
    if ggml.is_float(ty):
        return rot(False, None, f"{ty} cache: llama.cpp rotates only quantized caches")
    if k_only and mode == "auto":
        return rot(
            False,
            None,
            "a V-less (MLA) cache of one attention cache: llama.cpp's K-only attention does not rotate K",
        )
    n_embd = {int(ly.n_embd_k if kind == "k" else (ly.n_embd_v or 0)) for _, ly in recs}
    if head_dim is not None:
        group = _kvfast.rotation_group(kind, ty, head_dim)
        if group is None:
            return rot(
                False, None, f"head size {head_dim} is not a multiple of 64: llama.cpp does not rotate"
            )
        candidates = [group]
        known = f"head size {head_dim}"
    else:
        common = set.intersection(*(set(_groups(n)) for n in n_embd))
        candidates = sorted(common) if kind == "k" else sorted(common & {64})
        if not candidates:
            return rot(False, None, f"rows of {sorted(n_embd)} values hold no group of 64: never rotated")
        known = ""
    if mode == "hadamard":
        if head_dim is not None:
            return rot(True, candidates[0], f"rotation='hadamard' ({known})")
        g, ev = _by_values(state, cache.index, recs, kind, candidates)
        if g:
            return rot(True, g, f"rotation='hadamard', group {_GUESS} ({ev})", certain=len(candidates) == 1)
        raise RotationError(
            f"cache {cache.index} {kind.upper()}: rotation='hadamard' needs the head size to know the group"
            f" (one of {candidates}): pass head_dim= or model="
        )
    # auto
    if hint is not None:
        believed: bool | None = hint.rotates
        why = hint.evidence
    else:
        era, era_evidence = str(info.get("era")), str(info.get("era_evidence"))
        believed = {"after": True, "before": False}.get(era)
        why = era_evidence
    if believed is False:
        return rot(False, None, why)
    if believed is True and head_dim is not None:
        return rot(True, candidates[0], f"{why}; {known}")
    margin = _MARGIN_CONFIRM if believed else _MARGIN
    g, ev = _by_values(state, cache.index, recs, kind, candidates, margin)
    if g and head_dim is None and len(candidates) > 1:
        return rot(True, g, f"{why}; group {_GUESS}: {ev}", certain=False)
    if g:
        return rot(True, g, f"{why}; values: {ev}")
    if g == 0:
        return rot(False, None, f"{why}; values: {ev}")
    return rot(False, None, f"{why}; values: {ev}", certain=False)


def _by_values(
    state: _kvfast.State,
    cache: int,
    recs: list[tuple[int, Layer]],
    kind: str,
    candidates: list[int],
    margin: float = _MARGIN,
) -> tuple[int | None, str]:
    """Measured on a sample of layers: the group whose undoing gives values with outlier channels
    (a group), values that already have them as stored (0), or no clear answer (None); with the
    kurtoses measured. The basis of largest median kurtosis wins if it is clearly non-Gaussian and
    clearly above the other reading (as stored, or undone)."""
    chosen = recs[:: max(1, len(recs) // _SAMPLE_LAYERS)][:_SAMPLE_LAYERS]
    per_layer: list[dict[int, float]] = []
    for si, ly in chosen:
        buf, _, n_embd, cells, _ = state.rows(cache, si, ly.index, kind, "float32", True)
        if cells:
            x = np.frombuffer(memoryview(buf), dtype="<f4").reshape(cells, n_embd)[:_SAMPLE_CELLS]
            ks = {0: kurtosis(x.astype(np.float64))}
            ks.update({g: kurtosis(hadamard(x, g)) for g in candidates})
            per_layer.append(ks)
    if not per_layer:
        return None, "no cells to measure"
    median = {g: float(np.median([k[g] for k in per_layer])) for g in [0, *candidates]}
    text = f"median kurtosis {median[0]:.1f} as stored, " + ", ".join(
        f"{median[g]:.1f} undone in groups of {g}" for g in candidates
    )
    winner = max(median, key=lambda g: median[g])
    if median[winner] < _MIN_KURTOSIS:
        return None, text
    if winner == 0:
        clear = median[0] >= margin * max(median[g] for g in candidates)
    else:
        clear = median[winner] >= margin * median[0]
    return (winner if clear else None), text
