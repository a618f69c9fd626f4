"""``kvfast.write``: states llama.cpp loads back, from opened states plus edits.

The bytes are written by kvfast-core (``write.rs``: every field of the state as owned parts, written
in any container and version kvfast reads; ``write_edit.rs``: the edits). This module plans the
edits from the Python arguments: which cells to keep, the rotation groups of a requantization, the
sequence to keep or rename, the token array.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt
import polars as pl

from kvfast import _kvfast
from kvfast.errors import WriteError, WriteWarning, warn
from kvfast.read import remote, select
from kvfast.read.ggml import TYPES
from kvfast.writing import output
from kvfast.writing import tokens as wt
from kvfast.writing.cells import keep_mask, kept_positions, prunable

if TYPE_CHECKING:
    from kvfast.read.state import State

Container = Literal["seq", "ggsq", "ggsn", "state"]
SEQUENCE = ("seq", "ggsq")


def _sequences(d: State) -> list[int]:
    seqs: set[int] = set()
    for c in d.caches:
        for s in c.streams:
            seqs.update(s.sequences)
    if d.recurrent is not None:
        seqs.update(d.recurrent.stream.sequences)
    return sorted(seqs)


def _own_seq(d: State) -> int | None:
    if d.seq_id is not None:
        return d.seq_id
    seqs = _sequences(d)
    return seqs[0] if len(seqs) == 1 else None


def _stored_group(d: State, cache: int, kind: str) -> int:
    """The group the rows of ``kind`` of ``cache`` are stored rotated in, as the dump reads them."""
    for r in d.rotation:
        if r.cache == cache and r.kind == kind:
            return (r.group or 0) if r.undone else 0
    return 0


def _target_group(d: State, cache: int, kind: str, ty: str, rotate: bool) -> int:
    """The group llama.cpp stores ``kind`` rows of type ``ty`` rotated in (0: not rotated), by its
    rule for this cache (kvfast-core's: a V-less MLA cache's K, read through K-only attention, never)."""
    if not rotate:
        return 0
    group = d._live().rule_group(cache, kind, ty)
    if group is None:
        raise WriteError(
            f"cache_type_{kind}",
            f"llama.cpp stores a {ty} cache rotated when its head size is a multiple of 64, and "
            "the state does not say its head size: open it with model= (or head_dim=; --model on the "
            "command line), or pass rotate=False (--no-rotate) for a llama.cpp run with "
            "LLAMA_ATTN_ROT_DISABLE=1",
        )
    return int(group)


def _retype(
    d: State, types: dict[str, str | None], rotate: bool, v_trans: bool | None
) -> tuple[list[Any], list[list[int]]]:
    """The retypings of every attention cache, and the group each (cache, kind) ends stored in."""
    out: list[Any] = []
    final = [[_stored_group(d, ci, k) for k in ("k", "v")] for ci in range(len(d.caches))]
    for kind, ty in types.items():
        if ty is None:
            continue
        if ty not in TYPES:
            raise WriteError(f"cache_type_{kind}", f"one of {', '.join(TYPES)}, not {ty!r}")
        for ci, c in enumerate(d.caches):
            have = {getattr(layer, f"{kind}_type") for s in c.streams for layer in s.layers} - {None}
            if not have:
                continue
            frm = _stored_group(d, ci, kind)
            # a V stored transposed is not requantized (kvfast-core refuses it, saying why): no group
            transposed = any(s.v_trans for s in c.streams) if v_trans is None else v_trans
            to = 0 if kind == "v" and transposed else _target_group(d, ci, kind, ty, rotate)
            if have != {ty} or frm != to:
                out.append((ci, kind, ty, frm, to))
            final[ci][kind == "v"] = to
    return out, final


def _as_rows(arr: Any) -> npt.NDArray[np.float32]:
    """A NumPy array, a Polars Series of arrays or an Arrow array of lists as [rows, values]."""
    if isinstance(arr, pl.Series):
        arr = arr.to_arrow()
    if not isinstance(arr, np.ndarray) and (
        hasattr(arr, "__arrow_c_array__") or hasattr(arr, "__arrow_c_stream__")
    ):
        import pyarrow as pa

        a = arr if isinstance(arr, (pa.Array, pa.ChunkedArray)) else pa.array(arr)
        if isinstance(a, pa.ChunkedArray):
            a = a.combine_chunks()
        if pa.types.is_fixed_size_list(a.type) or pa.types.is_list(a.type):
            flat = np.asarray(a.flatten().to_numpy(zero_copy_only=False), np.float32)
            return flat.reshape(len(a), -1) if len(a) else flat.reshape(0, 0)
    return np.asarray(arr, dtype=np.float32)


def _refuse(field: str) -> select.Refuse:
    """How select's checks refuse an argument of write: a WriteError naming it."""
    return lambda message: WriteError(field, message)


def _seq_arg(seq_id: Any) -> int | list[int] | None:
    """``seq_id=`` checked: one sequence id, a list of them (one per source), or None."""
    if seq_id is None:
        return None
    if isinstance(seq_id, Sequence) or (isinstance(seq_id, np.ndarray) and seq_id.ndim == 1):
        return [select.seq_id("each sequence id", q, _refuse("seq_id")) for q in seq_id]
    return select.seq_id("a sequence id", seq_id, _refuse("seq_id"))


def _seq_map_arg(seq_map: Any) -> dict[int, int] | None:
    """``seq_map=`` checked: sequence ids to sequence ids."""
    if seq_map is None:
        return None
    if not isinstance(seq_map, Mapping):
        raise WriteError("seq_map", f"a mapping of sequence ids to sequence ids, not {seq_map!r}")
    refuse = _refuse("seq_id")  # the ids' rule is seq_id's
    return {
        select.seq_id("a sequence id", a, refuse): select.seq_id("a sequence id", b, refuse)
        for a, b in seq_map.items()
    }


def _values(
    d: State, values: Mapping[tuple[Any, ...], npt.ArrayLike], final: list[list[int]]
) -> list[tuple[int, int, int, str, bytes, int]]:
    out = []
    refuse = _refuse("values")
    for key, arr in values.items():
        if not isinstance(key, tuple) or len(key) not in (2, 3, 4):
            raise WriteError(
                "values",
                f"keys (layer, kind), (cache, layer, kind) or (cache, stream, layer, kind), not {key!r}",
            )
        if len(key) == 2:
            cache, stream, (layer, kind) = 0, None, key
        elif len(key) == 3:
            (cache, layer, kind), stream = key, None
        else:
            cache, stream, layer, kind = key
        cache, layer = (
            select.integer(f"key {key!r}: {n}", v, error=refuse)
            for n, v in (("cache", cache), ("layer", layer))
        )
        if stream is not None:
            stream = select.integer(f"key {key!r}: stream", stream, error=refuse)
        kind = select.kind(kind, refuse)
        if kind not in ("k", "v") or not 0 <= cache < len(d.caches):
            raise WriteError("values", f"{key!r}: K or V of an attention cache (0 to {len(d.caches) - 1})")
        streams = d.caches[cache].streams
        if stream is None:
            stream = next((s.index for s in streams if s.cell_count), 0)
        if not 0 <= stream < len(streams) or not 0 <= layer < len(streams[stream].layers):
            raise WriteError("values", f"{key!r}: no such stream or layer")
        st = streams[stream]
        n = getattr(st.layers[layer], f"n_embd_{kind}")
        a = _as_rows(arr)
        if n is None or a.shape != (st.cell_count, n):
            raise WriteError("values", f"{key!r}: an array of shape ({st.cell_count}, {n}), not {a.shape}")
        out.append((cache, stream, layer, kind, a.astype("<f4").tobytes(), final[cache][kind == "v"]))
    return out


def _warn_numbering(sources: Sequence[State], held: list[int]) -> None:
    """Warn when sequence states become a whole state whose sequences are not 0, 1, ...: llama.cpp
    loads a whole state only into a context of more sequences than its largest id."""
    ids = sorted(set(held))
    if all(d.container in ("ggsn", "state") for d in sources) or ids == list(range(len(ids))):
        return
    if len(sources) == 1:
        how = "seq_id=0 (--seq 0 on the command line) renumbers it"
    elif all(d.container in SEQUENCE for d in sources):
        how = f"seq_id={list(range(len(sources)))} renumbers them"
    else:
        how = "seq_map= renumbers them"
    warn(
        f"the whole state holds sequences {ids}: llama.cpp loads it only into a context of at least"
        f" {ids[-1] + 1} sequences (n_seq_max) and refuses it otherwise ('invalid seq_id'); {how}",
        WriteWarning,
    )


def write(
    source: State | Sequence[State],
    path: str | os.PathLike[str],
    *,
    container: Container | None = None,
    version: int | None = None,
    keep: npt.ArrayLike | pl.Expr | None = None,
    sync: bool = True,
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
    rotate: bool = True,
    v_trans: bool | None = None,
    values: Mapping[tuple[Any, ...], npt.ArrayLike] | None = None,
    seq_id: int | Sequence[int] | None = None,
    seq_map: Mapping[int, int] | None = None,
    tokens: Sequence[int] | None = None,
    arch: str | None = None,
    share: bool = False,
    replace: bool = False,
) -> int:
    """Write ``source`` (an opened state, or several to join) to ``path``, edited; returns the bytes
    written. With no edit the bytes are the source's, byte for byte.

    - ``container``: ``"seq"`` (``llama_state_seq_get_data`` bytes, with the io magic), ``"ggsq"``
      (``llama_state_seq_save_file``), ``"ggsn"`` (``llama_state_save_file``) or ``"state"``
      (``llama_state_get_data``), in the version llama-cpp-python 0.3.36's llama.cpp reads (GGSQ 3,
      GGSN 10) unless ``version`` says (GGSQ 2, GGSN 9); None: the source's, as it is. A whole state
      needs the model's arch (the source's, its ``model=``, or ``arch=``).
    - ``keep``: which cells stay, a boolean per row of :func:`kvfast.writing.cells.cells` (every cell
      of every attention cache) or a Polars expression over its columns (pos, seq_ids, token,
      k_l2, ...). ``sync`` (default): a token dropped from one attention cache is dropped from every
      cache holding it (both caches of an iSWA pair), and no other cell of its position. The token
      list stays indexed by position, as llama.cpp's callers read it (token i at position i: a
      dropped position inside it keeps its token, those dropped at its end are cut off, so that it
      ends with the sequence's last cell); llama-server's packed blob stays packed.
    - ``cache_type_k`` / ``cache_type_v``: requantize every attention cache with ggml's reference
      quantizers, values read in the model's basis and stored rotated as llama.cpp stores that type
      (``rotate=False``: never rotated, as with LLAMA_ATTN_ROT_DISABLE=1).
    - ``v_trans``: store V transposed (``True``: as llama.cpp without flash attention keeps it,
      f32 / f16 / bf16 only) or a row per cell (``False``: with flash attention); llama.cpp loads a
      state only into a context of the same choice. None: as the source.
    - ``values``: new values for records, ``{(layer, kind) | (cache, layer, kind) | (cache, stream,
      layer, kind): array [cells, values per row]}`` in the model's basis (as :meth:`State.values`):
      a NumPy array, or an Arrow array / Polars Series of one list of values per cell.
    - ``seq_id``: the sequence the written state holds: taken alone from a whole state, or the new
      name of a sequence state's sequence (a list: one per joined source). ``seq_map``: renames.
    - ``tokens``: the token list of a GGSQ / GGSN target.

    Several sources are joined into one whole state (their cells one after the other, per cache
    and stream); their sequences must differ (rename them with ``seq_id=[...]``; the cells of a
    sequence state that list none, its recurrent part's or a 2025 build's, are its sequence's).
    A sequence container holds one sequence: llama.cpp loads every cell of it into the sequence it
    is loaded as, so states of several sequences are refused there. A whole state made of sequence
    states whose ids are not 0, 1, ... loads only into a context of more sequences than its
    largest id: :class:`~kvfast.WriteWarning` says so unless ``seq_id`` or ``seq_map`` was given. ``share=True``: a cell
    of a later source alike in position, extension and every row to one already written (a prompt
    prefix decoded once and copied, as llama.cpp's ``seq_cp`` shares it) becomes that cell, listing
    both sequences.

    ``path`` is written whole or not at all (a temporary file beside it, renamed into place; see
    :mod:`kvfast.writing.output`): a new file, or a regular file replaced, never a folder, a device
    or a FIFO (:class:`kvfast.OutputError`). A source's own file is replaced only with
    ``replace=True``; a state a probe manifest beside it describes, never. The rows are read from
    the sources as they are written: memory for the cells and a few rows, not the state (an
    allocation that fails is a ``MemoryError``).
    """
    sources = [source] if not isinstance(source, Sequence) else list(source)
    if not sources:
        raise WriteError("source", "at least one opened state")
    inputs = [remote.local_path(d.path) for d in sources if not remote.is_url(d.path)]
    output.target(path, inputs=inputs, replace=replace)  # the path first: nothing is planned for a bad one
    if container is None and len(sources) > 1:
        container = "state"
    if container is None and version is not None:
        container = sources[0].container  # type: ignore[assignment]
    target = container or sources[0].container
    seq_id, seq_map = _seq_arg(seq_id), _seq_map_arg(seq_map)
    if isinstance(seq_id, list) and len(seq_id) != len(sources):
        raise WriteError("seq_id", f"one sequence per source ({len(sources)}), not {len(seq_id)}")
    edited = (
        keep,
        cache_type_k,
        cache_type_v,
        v_trans,
        values or None,
        seq_id,
        seq_map or None,
        tokens,
        arch,
        version,
    )
    for d in sources:
        if d.rows_on_device and (
            len(sources) > 1 or target != d.container or share or any(e is not None for e in edited)
        ):
            raise WriteError(
                "source",
                f"{d.path} was written with LLAMA_STATE_SEQ_FLAGS_ON_DEVICE: its rows are in llama.cpp's "
                "own buffers, keyed by its sequence and the size of every row run, not in the bytes; "
                "it can only be written as it is (llama.cpp aborts on any other)",
            )
        if d.partial is not None and target != "seq":
            raise WriteError(
                "container",
                f"{d.path} is a partial state (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the {d.partial.absent} is "
                "absent), which llama.cpp loads only through llama_state_seq_set_data_ext with the flag: "
                f"container 'seq', not {target!r}",
            )
    edits = []
    token_words: list[int] | None = None
    joined: list[int] = []
    extracted_many = False
    held: list[int] = []  # the sequences written, as the sources name them
    for i, d in enumerate(sources):
        d._live()
        q = seq_id if isinstance(seq_id, int) or seq_id is None else seq_id[i]
        retype, final = _retype(d, {"k": cache_type_k, "v": cache_type_v}, rotate, v_trans)
        mask = None if keep is None else keep_mask(d, keep, sync)
        if mask is not None:
            prunable(d, mask)
        seqs = _sequences(d)
        whole = d.container in ("ggsn", "state")
        extract = None
        renames = dict(seq_map or {})
        if whole and (q is not None or (target in SEQUENCE and len(seqs) > 1)):
            if q is None:
                raise WriteError("seq_id", f"the state holds sequences {seqs}: choose the one to write")
            extract, extracted_many = q, len(seqs) > 1
        elif whole and target in SEQUENCE and seqs:
            extract = seqs[0]
        elif not whole and q is not None:
            own = _own_seq(d)
            if own is None or own != q:
                renames[own if own is not None else 0] = q
        held += seqs if whole else [_own_seq(d) or 0]
        if mask is not None and (not whole or len(seqs) == 1):
            _, dropped = kept_positions(d, mask)
            token_words = wt.pruned(d, dropped)
        joined += [] if d.tokens is None else d.tokens.tolist()
        edits.append(
            {
                "retype": retype,
                "values": _values(d, values or {}, final),
                "keep": mask,
                "extract": extract,
                "seq_map": sorted(renames.items()),
                "v_trans": v_trans,
            }
        )
    first = sources[0]
    for name, ty in (("cache_type_k", cache_type_k), ("cache_type_v", cache_type_v)):
        if ty is not None:
            select.cache_type(name, ty, _refuse(name))
    if tokens is not None:
        token_words = wt.given(first, tokens)
    elif len(sources) > 1:
        token_words = joined
    elif extracted_many:
        token_words = []  # a whole state's token list is every sequence's: give tokens=
    whole_arch = arch
    if target not in SEQUENCE:
        whole_arch = arch or first.arch or (first.model.arch if first.model is not None else None)
    ext_tokens = first.tokens.tolist() if first.tokens is not None and len(sources) == 1 else None
    with output.replacing(path, inputs=inputs, replace=replace) as tmp:
        n = int(
            _kvfast.write_state(
                [d._reading() for d in sources],
                edits,
                os.fspath(tmp),
                {
                    "container": container,
                    "version": version if container is not None else None,
                    # the io header's sequence (else the sequence's own: renamed, taken alone, or the cells')
                    "seq_id": seq_id if isinstance(seq_id, int) and target == "seq" else None,
                    "arch": whole_arch,
                    "token_words": token_words,
                    "ext_tokens": ext_tokens,
                    "share": share,
                },
            )
        )
    if target not in SEQUENCE and seq_id is None and not seq_map:
        _warn_numbering(sources, held)
    return n
