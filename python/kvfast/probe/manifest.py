"""What a probe manifest beside a state recorded about it: the model's geometry, the token pieces and
whether the llama.cpp build rotated quantized caches.

The probe runner (:mod:`kvfast.probe`) writes ``manifest.parquet`` next to the states it saves;
:func:`kvfast.open` takes the build's rotation from it always (a whole state's container does not date
it), the geometry and token pieces only when it is given neither a model nor a head size. A manifest is
parsed once per directory and kept while its file is unchanged (same modification time, size and
inode), so opening 200 states beside one manifest reads it once. A file of that name that is not a
probe manifest (another tool's: columns missing or of other types) gives no hint, never an error.
A row that names the state but does not describe it (its recorded size, or tokens, are not the
file's: another run's manifest beside a state renamed or copied there) is not used, with a
:class:`~kvfast.errors.ManifestWarning`.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from kvfast.errors import ManifestWarning, warn
from kvfast.model.geometry import IndexerGeometry, ModelGeometry

#: The manifest's file name, beside the states.
NAME = "manifest.parquet"
#: Directories whose parsed manifest is kept.
_KEEP = 16

_GEOMETRY = ("arch", "n_layer", "head_dim_k", "head_dim_v", "n_head_kv", "swa")


@dataclass(frozen=True)
class Recorded:
    """What a probe manifest recorded about one state."""

    geometry: ModelGeometry
    #: The text of each of its tokens (None for a batch's whole state).
    pieces: list[str] | None
    #: Whether the llama.cpp that wrote it rotated quantized caches (None: the manifest predates it).
    attn_rot: bool | None
    build: str | None
    #: The tokens the run saved in the state (prefix, prompt, generated; None: not recorded, or a
    #: batch's whole state): a state whose own tokens differ is not the one the row describes.
    tokens: list[int] | None = None


@dataclass(frozen=True)
class _Parsed:
    """One manifest: its rows, and the first row naming each state (as ``state`` or ``whole_state``)."""

    frame: pl.DataFrame
    rows: dict[str, int]


_lock = threading.Lock()
_parsed: OrderedDict[str, tuple[tuple[int, int, int], _Parsed | None]] = OrderedDict()


def _read(path: str) -> pl.DataFrame:
    """Read a manifest (the one place that does)."""
    return pl.read_parquet(path)


def _parse(path: str) -> _Parsed | None:
    try:
        df = _read(path)
    except (OSError, pl.exceptions.PolarsError):
        return None
    names = [c for c in ("state", "whole_state") if c in df.columns and df.schema[c] == pl.String]
    if "state" not in names or any(c not in df.columns for c in _GEOMETRY):
        return None
    rows: dict[str, int] = {}
    for column in names:
        for i, name in enumerate(df.get_column(column).to_list()):
            if name is not None and i < rows.get(name, len(df)):
                rows[name] = i
    return _Parsed(df, rows)


def _manifest(directory: Path) -> _Parsed | None:
    """The parsed manifest of `directory`, read again only when its file changed."""
    path = directory / NAME
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):  # a FIFO of that name would block the reader
        return None
    key = (st.st_mtime_ns, st.st_size, st.st_ino)
    where = os.fspath(directory.absolute())
    with _lock:
        hit = _parsed.get(where)
        if hit is not None and hit[0] == key:
            _parsed.move_to_end(where)
            return hit[1]
    parsed = _parse(os.fspath(path))
    with _lock:
        _parsed[where] = (key, parsed)
        _parsed.move_to_end(where)
        while len(_parsed) > _KEEP:
            _parsed.popitem(last=False)
    return parsed


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _geometry(row: dict[str, Any]) -> ModelGeometry | None:
    arch, heads, swa = row["arch"], row["n_head_kv"], row["swa"]
    if not isinstance(arch, str) or not all(_int(row[k]) for k in ("n_layer", "head_dim_k", "head_dim_v")):
        return None
    if not isinstance(heads, list) or not all(_int(h) or h == 0 for h in heads):
        return None
    if not isinstance(swa, list) or not all(isinstance(s, bool) for s in swa):
        return None
    n = row["n_layer"]

    def flags(name: str) -> tuple[bool, ...] | None:  # a memory column of newer manifests
        v = row.get(name)
        if isinstance(v, list) and len(v) == n and all(isinstance(x, bool) for x in v):
            return tuple(v)
        return None

    v_less, trunk = row.get("v_less"), row.get("n_layer_trunk")
    dims = row.get("head_dims_swa")
    swa_dims = (
        (dims[0], dims[1]) if isinstance(dims, list) and len(dims) == 2 and all(map(_int, dims)) else None
    )
    return ModelGeometry(
        arch=arch,
        n_layer=n,
        head_dim_k=row["head_dim_k"],
        head_dim_v=row["head_dim_v"],
        n_head_kv=tuple(heads),
        swa=tuple(swa),
        recurrent=flags("recurrent"),
        attention=flags("attention"),
        v_less=v_less if isinstance(v_less, bool) else None,
        n_layer_trunk=trunk if _int(trunk) else None,
        head_dims_swa=swa_dims,
        indexer=_indexer(row.get("indexer"), n),
    )


def _indexer(v: Any, n: int) -> IndexerGeometry | None:
    """A manifest's indexer column (newer manifests), where it is what the runner writes."""
    if not isinstance(v, dict):
        return None
    layers, k, dv, rot = v.get("layers"), v.get("head_dim_k"), v.get("head_dim_v"), v.get("k_rotation")
    if not (isinstance(layers, list) and len(layers) == n and all(isinstance(x, bool) for x in layers)):
        return None
    if not isinstance(k, int) or not _int(k) or not (dv is None or _int(dv)):
        return None
    if not (isinstance(rot, int) and rot >= 0):
        return None
    return IndexerGeometry(tuple(layers), k, dv, rot)


def describing(path: str | os.PathLike[str]) -> Path | None:
    """The probe manifest beside `path` when it names that file (as a state or a batch's whole
    state), else None: a file another tool writes there would contradict what it records."""
    p = Path(path)
    parsed = _manifest(p.parent)
    if parsed is None or p.name not in parsed.rows:
        return None
    return p.parent / NAME


def _tokens(row: dict[str, Any]) -> list[int] | None:
    parts = [row.get(k) for k in ("prefix_tokens", "tokens", "generated")]
    if not all(isinstance(x, list) and all(isinstance(t, int) for t in x) for x in parts):
        return None
    return [t for x in parts for t in x]  # type: ignore[union-attr]


def recorded_for(path: str | os.PathLike[str]) -> Recorded | None:
    """What the probe manifest beside the state at `path` recorded about it; None when there is no
    manifest, it is not a probe manifest, or it does not name the state, or the row does not
    describe the file (its recorded size differs: another run's manifest beside a state renamed or
    copied there; said with a :class:`~kvfast.errors.ManifestWarning`)."""
    p = Path(path)
    parsed = _manifest(p.parent)
    if parsed is None or p.name not in parsed.rows:
        return None
    row = parsed.frame.row(parsed.rows[p.name], named=True)
    geometry = _geometry(row)
    if geometry is None:
        return None
    own = row["state"] == p.name
    size = row.get("size")
    if own and isinstance(size, int) and not isinstance(size, bool):
        try:
            actual = os.stat(p).st_size
        except OSError:
            actual = size
        if actual != size:
            stray(p, f"its row records a state of {size} bytes, the file has {actual}")
            return None
    pieces = row.get("pieces") if own else None
    attn_rot, build = row.get("attn_rot"), row.get("llama_build")
    return Recorded(
        geometry,
        pieces if isinstance(pieces, list) else None,
        attn_rot if isinstance(attn_rot, bool) else None,
        build if isinstance(build, str) else None,
        _tokens(row) if own else None,
    )


def stray(path: str | os.PathLike[str], why: str) -> None:
    """Say that the manifest beside `path` names it but does not describe it, so it is not used."""
    warn(
        f"{path}: the probe manifest beside it names it but does not describe it ({why}): another run's "
        "manifest? its geometry, token pieces and build are not used",
        ManifestWarning,
        about=os.fspath(path),
    )
