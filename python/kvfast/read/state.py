"""``State``: a memory-mapped llama.cpp KV-cache state and what it holds."""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

import numpy as np
import numpy.typing as npt
import polars as pl

from kvfast import _kvfast
from kvfast.analysis import measure as analysis
from kvfast.analysis.measure import By
from kvfast.errors import ClosedError, RotationWarning, SelectionError, warn
from kvfast.model.geometry import ModelGeometry
from kvfast.model.rotation import Mode, Rotation
from kvfast.probe import manifest as probe_manifest
from kvfast.read import remote, select
from kvfast.read import tokens as token_text
from kvfast.read.address import Where, file_offset, locate, record_ref, tensor_offset
from kvfast.read.parts import MemoryPart, parts_of, short
from kvfast.read.schema import INDEX
from kvfast.read.structure import Cache, Partial, Recurrent, build_caches, build_recurrent, i32

if TYPE_CHECKING:
    import pyarrow as pa


class State:
    """A llama.cpp KV-cache state, memory-mapped; rows are read only when asked for.

    Use :func:`kvfast.open`. A context manager: after :meth:`close` every use raises
    :class:`kvfast.ClosedError` (arrays already handed out stay valid).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        head_dim: int | None = None,
        model: str | os.PathLike[str] | ModelGeometry | None = None,
        cell_ext: bool | None = None,
        mmap: bool = True,
        rotation: Mode = "auto",
        pre_rope: bool = False,
        storage_options: remote.StorageOptions = None,
    ) -> None:
        self.path = os.fspath(path)
        is_url = remote.is_url(self.path)
        head_dim = select.head_dim(head_dim)
        #: Token pieces of the state's tokens, when a probe manifest beside it records them.
        self.pieces: list[str] | None = None
        hint: tuple[bool, str] | None = None
        # a probe manifest beside the state: its build's rotation always (whole states and sequence
        # states alike), its geometry and token pieces where no model or head size is given
        found = None if is_url else probe_manifest.recorded_for(self.path)
        if found is not None:
            if model is None and head_dim is None:
                model, self.pieces = found.geometry, found.pieces
            if found.attn_rot is not None:
                says = "rotates" if found.attn_rot else "does not rotate (or LLAMA_ATTN_ROT_DISABLE was set)"
                hint = (found.attn_rot, f"probe manifest: the llama.cpp build {says}")
        #: The GGUF file given as ``model`` (its vocabulary gives token pieces).
        self.model_path: str | None = None
        if model is not None and not isinstance(model, ModelGeometry):
            self.model_path = model = os.fspath(model)
        size, fetch = remote.source(self.path, storage_options) if is_url else (None, None)
        # one call: kvfast-core reads the model's GGUF, walks the bytes and decides the geometry,
        # the model-layer map, the model's fit, the rotation (a sample of rows) and the RoPE to undo
        opened, info = _kvfast.open(
            self.path if is_url else remote.local_path(self.path),
            size=size,
            fetch=fetch,
            cell_ext=cell_ext,
            mmap=mmap,
            head_dim=head_dim,
            model=model,
            rotation=rotation,
            hint=hint,
            pre_rope=pre_rope,
            metadata_limit=None if fetch is None else fetch.limits.metadata_limit,
        )
        #: The model's geometry (given, read from ``model``'s GGUF, or from a probe manifest).
        given = model if isinstance(model, ModelGeometry) else None
        self.model: ModelGeometry | None = given if info["model"] is None else ModelGeometry(**info["model"])
        self._state: _kvfast.State | None = opened
        self._info = info
        self.head_dim_k, self.head_dim_v = info["head_dims"]
        #: Per cache (the recurrent part last), the model layer of each cache layer (None: not known).
        self._model_layers: list[list[int] | None] = info["model_layers"]
        # the walk's caches, each layer with its model layer (the recurrent part, if any, is last)
        every = info["caches"]
        raw = [c for c in every if c["memory"] == "kv"]
        rec_raw = next((c for c in every if c["memory"] == "recurrent"), None)
        self._caches = build_caches(raw)
        self._recurrent = None if rec_raw is None else build_recurrent([*raw, rec_raw])
        partial = info["partial"]
        self._partial = None if partial is None else Partial(partial[0], list(partial[1]))
        self._rotation = [Rotation(**r) for r in info["rotation"]]
        self._parts = parts_of(info["parts"])
        # said once, when values are first read (opening, info and layout read none)
        #: what is undecided and the advice, and this state's evidence (None: all is certain)
        self._rotation_warning: tuple[str, str] | None = info["rotation_warning"]
        #: Whether K values are read before RoPE (``pre_rope=True``; see :mod:`kvfast.model.pre_rope`).
        self.pre_rope = pre_rope
        if found is not None and found.tokens is not None and self.pieces is not None:
            own = self.tokens
            if own is not None and own.tolist() != found.tokens:
                probe_manifest.stray(self.path, "its row records other tokens than the file holds")
                self.pieces = None

    @property
    def parts(self) -> list[MemoryPart | None]:
        """Per cache (the recurrent part last), what part of its model's memory it is: its role
        (``attention``, ``sliding-window``, ``indexer``, ``recurrent``), model layers, head sizes
        and K basis (see :class:`kvfast.read.parts.MemoryPart`); None per cache without ``model=``
        where the bytes alone do not tell."""
        self._live()
        return self._parts

    @property
    def recurrent(self) -> Recurrent | None:
        """The recurrent part of a recurrent or hybrid model's state (None: the state has none):
        one cell per sequence, R and S records of the layers that have them. Its values are kinds
        ``"r"`` and ``"s"`` of :meth:`values`, :meth:`to_polars` and :meth:`stats`."""
        self._live()
        return self._recurrent

    # -- lifecycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Release the memory map (views handed out keep their pages until they are freed)."""
        if self._state is not None:
            self._state.close()
        self._state = None

    @property
    def closed(self) -> bool:
        return self._state is None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _live(self) -> _kvfast.State:
        if self._state is None:
            raise ClosedError(f"{self.path}: the dump is closed")
        return self._state

    def _reading(
        self,
        caches: Sequence[int] | None = None,
        kinds: Sequence[str] | None = None,
        stored: bool = False,
    ) -> _kvfast.State:
        """The open state, for a pass that reads the values of `caches` and `kinds` (None: all):
        the first such pass that reads a cache kvfast could not be sure how llama.cpp stored warns
        (RotationWarning), once per state."""
        state = self._live()
        if self._rotation_warning is not None and not stored:
            unsure = [
                r
                for r in self._rotation
                if not r.certain
                and (caches is None or r.cache in caches)
                and (kinds is None or r.kind in kinds)
            ]
            if unsure:
                (said, evidence), self._rotation_warning = self._rotation_warning, None
                warn(said, RotationWarning, about=self.path, detail=evidence)
        return state

    def _get(self, key: str) -> Any:
        self._live()
        return self._info[key]

    def __repr__(self) -> str:
        if getattr(self, "_state", None) is None:
            return f"<kvfast.State {self.path!r} (closed)>"
        rec = "" if self._recurrent is None else f" recurrent={len(self._recurrent.layers)}"
        memory = short(self._parts) if len(self._parts) > 1 else ""
        parts = f" parts={memory}" if memory else ""
        return (
            f"<kvfast.State {self.path!r} {self.container} v{self.version} arch={self.arch} "
            f"caches={len(self._caches)}{rec}{parts} size={self.size}>"
        )

    def _repr_html_(self) -> str:
        """A short HTML summary for notebooks (see :mod:`kvfast.read.display`)."""
        from kvfast.read.display import dump_html

        return dump_html(self)

    # -- scalars -------------------------------------------------------------------------------
    @property
    def remote(self) -> bool:
        """Whether the state is an object in storage, read by ranged requests (see :mod:`kvfast.read.remote`)."""
        return remote.is_url(self.path)

    @property
    def fetched_bytes(self) -> int:
        """Bytes of a remote state fetched so far: its metadata at open, then the rows of the records
        each pass read (each page once); 0 for a local state."""
        return int(self._live().fetched[0])

    @property
    def fetch_rounds(self) -> int:
        """Rounds of parallel ranged requests made for a remote state so far (0 for a local one)."""
        return int(self._live().fetched[1])

    @property
    def size(self) -> int:
        """File size in bytes."""
        return int(self._get("size"))

    @property
    def container(self) -> str:
        """'seq' (llama_state_seq_get_data), 'ggsq', 'ggsn' or 'state' (llama_state_get_data)."""
        return str(self._get("container"))

    @property
    def version(self) -> int | None:
        """The container's version field (GGSQ 2/3, GGSN 9/10); None for raw bytes, which have none."""
        v = self._get("version")
        return None if v is None else int(v)

    @property
    def partial(self) -> Partial | None:
        """What of its model's memory the state lacks, when it was written with
        ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`` (a hybrid's recurrent part alone, an iSWA model's
        sliding-window cache alone); None for the whole memory, and without ``model=`` (the bytes
        do not say which memory they are part of)."""
        self._live()
        return self._partial

    @property
    def rows_on_device(self) -> bool:
        """Whether the state was written with ``LLAMA_STATE_SEQ_FLAGS_ON_DEVICE``: every header and
        cell, and no row (llama.cpp kept the rows in its own buffers, for
        ``llama_state_seq_set_data_ext`` with the flag in the same context). Positions, sequences,
        types and widths read as usual; asking for values raises :class:`kvfast.SelectionError`."""
        return bool(self._get("rows_on_device"))

    @property
    def features(self) -> list[str]:
        """What this reading of the bytes relied on: 'io magic', 'n_stream', 'outputs', 'cell ext 12', ..."""
        return list(self._get("features"))

    @property
    def arch(self) -> str | None:
        """Architecture name written in whole-context states (None in sequence states)."""
        a = self._get("arch")
        return None if a is None else str(a)

    @property
    def seq_id(self) -> int | None:
        """Sequence id written in raw sequence bytes with the io magic."""
        s = self._get("seq_id")
        return None if s is None else int(s)

    @property
    def tokens(self) -> npt.NDArray[np.int32] | None:
        """Token ids stored by GGSQ and GGSN files."""
        t = self._get("tokens")
        return None if t is None else i32(t)

    @property
    def vocabulary(self) -> list[str] | None:
        """The text of every token id, from the GGUF given as ``model`` (None without one)."""
        return None if self.model_path is None else token_text.vocabulary(self.model_path)

    def cell_tokens(self) -> pl.DataFrame:
        """The token and piece of every cell: cache, stream, cell, pos, token, piece (null where not
        known); join on (cache, stream, cell). See :mod:`kvfast.read.tokens`."""
        self._live()
        return token_text.cell_tokens(self)

    @property
    def token_words(self) -> npt.NDArray[np.int32] | None:
        """The GGSQ / GGSN token array exactly as stored: for a llama-server slot file, the words of
        its packed blob (marker -1, version, count, tokens, media); :attr:`tokens` are the tokens."""
        state = self._live()
        if self._info.get("tokens") is None:
            return None
        regions = state.regions()
        i = regions["what"].index("tokens")
        buf = state.floats_at(regions["offset"][i], regions["nbytes"][i] // 4)
        return np.frombuffer(memoryview(buf), dtype="<i4").astype(np.int32)

    @property
    def server_tokens(self) -> dict[str, Any] | None:
        """What a llama-server packed token blob held: its version, token count and media chunks
        (``start``: index of the chunk's first token, ``offset`` / ``nbytes``: its bytes in the file);
        None for a plain token list."""
        self._live()
        if "server_tokens_version" not in self._info:
            return None
        return {
            "version": int(self._info["server_tokens_version"]),
            "n_tokens": len(self._info["tokens"]) // 4,
            "media": [{"start": s, "offset": o, "nbytes": n} for s, o, n in self._info["media"]],
        }

    @property
    def logits(self) -> npt.NDArray[np.float32] | None:
        """Logits of GGSN version 9 (and 2025 raw) states: [n_outputs, n_vocab], or flat if uneven."""
        state = self._live()
        if "n_logits" not in self._info:
            return None
        n = int(self._info["n_logits"])
        buf = state.floats_at(self._info["logits_offset"], n)
        flat = np.frombuffer(memoryview(buf), dtype="<f4").astype(np.float32)
        n_out = len(self._info["output_pos"]) // 4
        if n_out and n % n_out == 0:
            return flat.reshape(n_out, n // n_out)
        return flat

    @property
    def output_pos(self) -> npt.NDArray[np.int32] | None:
        """Which batch positions the stored logits belong to (GGSN 9)."""
        self._live()
        p = self._info.get("output_pos")
        return None if p is None else i32(p)

    @property
    def cell_ext(self) -> bool:
        """Whether cells carry the extension of M-RoPE models (x, y[, tok])."""
        return int(self._get("ext_bytes")) > 0

    @property
    def rotation(self) -> list[Rotation]:
        """Per cache and kind: whether llama.cpp's Hadamard rotation of quantized caches is undone
        (values in the model's basis), in which group size, and on what evidence."""
        self._live()
        return list(self._rotation)

    @property
    def caches(self) -> list[Cache]:
        self._live()
        return self._caches

    @property
    def row_bytes(self) -> int:
        """Bytes of K and V rows."""
        return int(self._get("row_bytes"))

    @property
    def meta_bytes(self) -> int:
        """Bytes that are not rows nor logits/embeddings: headers, tokens, cell metadata."""
        return int(self._get("meta_bytes"))

    @property
    def output_bytes(self) -> int:
        """Bytes of logits and embeddings (GGSN 9)."""
        return int(self._get("output_bytes"))

    # -- addresses -------------------------------------------------------------------------------
    def _where(
        self, layer: int, cell: int, head: int, elem: int, kind: str, cache: int | None, stream: int | None
    ) -> Where:
        rec = record_ref(self.caches, cache, layer, kind, stream, self._recurrent)
        return locate(rec, cell, head, elem, self.head_dim_k if kind == "k" else self.head_dim_v)

    def address(
        self,
        layer: int,
        cell: int,
        head: int = 0,
        elem: int = 0,
        kind: str = "k",
        cache: int | None = None,
        stream: int | None = None,
    ) -> int:
        """Byte offset in the file of one value (for 4- and 5-bit types: the byte of its low bits);
        ``cache=None``: the first cache for K and V, the recurrent part for R and S."""
        return file_offset(self._where(layer, cell, head, elem, kind, cache, stream))

    def tensor_address(
        self,
        layer: int,
        cell: int,
        head: int = 0,
        elem: int = 0,
        kind: str = "k",
        *,
        n_ctx: int,
        n_stream: int = 1,
        cache: int | None = None,
        stream: int | None = None,
    ) -> int:
        """Byte offset of the same value from the start of llama.cpp's live K (or V) tensor of that
        layer, shaped [values per row, n_ctx / n_stream cells, n_stream]; the i-th cell written is
        taken to be cell i of the live cache (true after decoding into a fresh context). Attention
        caches only: the recurrent part's tensors are laid out per sequence, not per context cell."""
        if select.kind(kind) in select.RECURRENT_KINDS:
            raise SelectionError("tensor_address is for K and V: the recurrent part has no context cells")
        return tensor_offset(self._where(layer, cell, head, elem, kind, cache, stream), n_ctx, n_stream)

    # -- tables --------------------------------------------------------------------------------
    def layout(self) -> pl.DataFrame:
        """One row per region of the file, in file order; the regions tile the file exactly.

        Columns: offset, nbytes, what, role ('rows' | 'outputs' | 'meta'), cache, stream, kind, layer, type.
        """

        cols = self._live().regions()
        return pl.DataFrame(
            cols,
            schema={
                "offset": pl.UInt64,
                "nbytes": pl.UInt64,
                "what": pl.String,
                "role": pl.String,
                "cache": INDEX["cache"],
                "stream": INDEX["stream"],
                "kind": INDEX["kind"],
                "layer": INDEX["layer"],
                "type": pl.String,
            },
        )

    def values(
        self,
        layer: int,
        kind: str = "k",
        cache: int | None = None,
        stream: int | None = None,
        dtype: str | None = None,
        *,
        stored: bool = False,
    ) -> npt.NDArray[Any]:
        """Rows of one record as a NumPy array [cells, values per row].

        ``kind``: ``"k"`` or ``"v"`` of an attention cache (``cache=None``: the first), ``"r"`` or
        ``"s"`` of the recurrent part (one row per sequence's cell; ``layer`` counts the part's
        layers, see :attr:`recurrent`). A V-less (MLA) cache has no V: ``kind="v"`` raises
        :class:`kvfast.SelectionError` (its K rows hold the latent).

        f16 and f32 rows that are not transposed come back as read-only views of the memory map where
        the file offset is aligned for the type (a copy otherwise); bf16 and quantized rows are decoded
        to float32 in Rust, in parallel, with the GIL released. ``dtype='float32'`` decodes everything.
        Values are in the model's basis (see :attr:`rotation`), K before RoPE when opened with
        ``pre_rope=True`` (float32); ``stored=True`` gives them as stored.
        ``stream=None`` takes the first stream that holds cells.
        """
        self._live()
        rec = record_ref(self._caches, cache, layer, kind, stream, self._recurrent)
        if rec.kind in select.RECURRENT_KINDS and self._recurrent is not None:
            ci = self._recurrent.index
        else:
            ci = 0 if cache is None else select.integer("cache", cache)
        dtype = select.dtype(dtype)
        state = self._reading([ci], [rec.kind], stored)
        buf, name, n_embd, cells, _ = state.rows(ci, rec.stream.index, layer, rec.kind, dtype, stored)
        arr: npt.NDArray[Any] = np.frombuffer(memoryview(buf), dtype=np.dtype(name).newbyteorder("<"))
        return arr.reshape(cells, n_embd)

    def _table(
        self,
        layers: Sequence[int] | None,
        kinds: Sequence[str] | None,
        heads: Sequence[int] | None,
        dtype: str | None,
        caches: Sequence[int] | None = None,
    ) -> _kvfast.ArrowStream:
        sel = select.selection(
            self.caches,
            layers=layers,
            kinds=kinds,
            heads=heads,
            caches=caches,
            recurrent=self._recurrent,
        )
        return self._reading(sel.caches, sel.kinds).table(
            caches=sel.caches,
            layers=sel.layers,
            kinds=sel.kinds,
            heads=sel.heads,
            dtype=select.dtype(dtype),
        )

    def to_arrow(
        self,
        layers: Sequence[int] | None = None,
        kinds: Sequence[str] | None = None,
        heads: Sequence[int] | None = None,
        dtype: str | None = None,
        model_layers: Sequence[int] | None = None,
    ) -> pa.Table:
        """The long value table: one row per (cache, stream, layer, kind, cell, seq_id, head).

        Columns cache, stream, layer, kind, cell, pos, seq_id, head, values (fixed-size list of
        head_dim numbers). A cell shared by several sequences appears once per sequence.
        ``kinds=None`` reads K and V; the recurrent part's rows are ``kinds=["r"]`` and ``["s"]``
        (cache: the part's index, one row per sequence's cell, head 0: the row is not split, each
        kind its own width, so select one at a time). An MLA cache's K rows are one head.
        ``model_layers``: the model's layers instead of ``layers`` (an iSWA state's caches each
        number their own layers from 0; the model's map is needed, see ``model=``).
        """
        import pyarrow as pa

        parts = analysis.parts(self, layers, None, model_layers)
        return pa.concat_tables([pa.table(self._table(ls, kinds, heads, dtype, cs)) for cs, ls in parts])

    def to_polars(
        self,
        layers: Sequence[int] | None = None,
        kinds: Sequence[str] | None = None,
        heads: Sequence[int] | None = None,
        dtype: str | None = None,
        tokens: bool = False,
        model_layers: Sequence[int] | None = None,
    ) -> pl.DataFrame:
        """:meth:`to_arrow` as a Polars DataFrame (values: ``Array(Float16 | Float32, head_dim)``);
        ``tokens=True`` adds each cell's ``token`` and ``piece`` (see :meth:`cell_tokens`)."""
        parts = analysis.parts(self, layers, None, model_layers)
        df = pl.concat([pl.DataFrame(self._table(ls, kinds, heads, dtype, cs)) for cs, ls in parts])
        return self._with_tokens(df) if tokens else df

    def _with_tokens(self, df: pl.DataFrame) -> pl.DataFrame:
        toks = self.cell_tokens().drop("pos")
        return df.join(toks, on=["cache", "stream", "cell"], how="left", maintain_order="left")

    def stats(
        self,
        by: By = "cell",
        layers: Sequence[int] | None = None,
        kinds: Sequence[str] | str | None = None,
        skip_first: int = 0,
        tokens: bool = False,
        model_layers: Sequence[int] | None = None,
        caches: Sequence[int] | None = None,
    ) -> pl.DataFrame:
        """Statistics computed in Rust, streamed over the map with the GIL released.

        - ``by="cell"``: one row per (cache, stream, layer, kind, cell, sequence, head) with pos,
          seq_id, l2, mean, std, min, max, absmax, argmax (the channel of the absmax) and nan;
        - ``by="channel"``: one row per (cache, layer, kind, head, channel) over every cell: count,
          mean, std, min, max, absmax, and outlier_ratio (that absmax over the median channel absmax
          of the same head);
        - ``by="head"`` / ``by="layer"``: the same moments over every value of a head / layer, with
          l2_mean and l2_max, the mean and largest L2 norm of its (cell, head) rows.

        In the last three, ``count`` is the number of values summarized and ``cells`` the number of
        cells (each once, however many sequences share it): ``count + nan == cells`` by channel,
        ``cells * head_dim`` by head, ``cells * values per row`` by layer.

        NaN values are left out of every statistic and counted in ``nan`` (each table has it); a
        row with no other value has NaN statistics (``argmax`` null), never an infinity or 0.

        ``tokens=True`` (with ``by="cell"``) adds each cell's ``token`` and ``piece``.
        ``skip_first=N`` leaves out cells at positions < N (attention sinks). std is ddof = 0.
        ``model_layers``: the model's layers instead of ``layers`` (see :meth:`to_arrow`);
        ``caches``: only these caches (an iSWA state has two).
        """
        df = analysis.stats(self, by, layers, kinds, skip_first, caches, model_layers)
        return self._with_tokens(df) if tokens and by == "cell" else df

    def quant_error(
        self,
        type: str,
        by: Literal["head", "layer"] = "head",
        layers: Sequence[int] | None = None,
        kinds: Sequence[str] | str | None = None,
        skip_first: int = 0,
        rotate: bool = True,
        model_layers: Sequence[int] | None = None,
    ) -> pl.DataFrame:
        """What a cache of ``type`` (q8_0, q4_0, ...) would lose: each row is quantized and
        dequantized with ggml's reference quantizer (bit-exact) in Rust; per (cache, layer, kind,
        head) or per layer: mse, max_abs, pooled rel (||x - q(x)|| / ||x||) and cosine, and their
        per-cell means and extremes (rel_mean, rel_max, cosine_mean, cosine_min): the columns of
        ``kvfast.compare(by="layer")`` (:data:`kvfast.analysis.measure.LOSS_COLUMNS`).
        ``model_layers``: the model's layers instead of ``layers`` (see :meth:`to_arrow`)."""
        return analysis.quant_error(
            self, type, by, layers, kinds, skip_first, rotate, model_layers=model_layers
        )

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """The value table through the Arrow PyCapsule interface (pyarrow, Polars, DuckDB)."""
        return self._table(None, None, None, None).__arrow_c_stream__(requested_schema)


def open(
    path: str | os.PathLike[str],
    *,
    head_dim: int | None = None,
    model: str | os.PathLike[str] | ModelGeometry | None = None,
    cell_ext: bool | None = None,
    mmap: bool = True,
    rotation: Mode = "auto",
    pre_rope: bool = False,
    storage_options: remote.StorageOptions = None,
) -> State:
    """Map a llama.cpp KV-cache state and walk its layout (metadata only; rows stay on disk).

    Reads raw ``llama_state_seq_get_data`` bytes, GGSQ sequence files (llama-server slot saves), GGSN
    session files and raw ``llama_state_get_data`` bytes, of the versions llama.cpp has written since
    2025. ``head_dim`` splits rows into heads; ``model`` (a GGUF file) gives the head sizes and the
    model's own layer index of each cache layer (iSWA caches interleave); ``cell_ext`` overrides the detection of M-RoPE cell
    extensions (needed only when the bytes parse both ways).

    ``mmap=False`` reads the file into memory instead of mapping it: no array is then a view of the
    file, and a file truncated or rewritten after open changes nothing. A mapped state checks before
    each pass that the file is unchanged and raises :class:`kvfast.FileChangedError` if not.
    ``head_dim`` must be a positive integer dividing every row, else :class:`kvfast.SelectionError`.

    ``rotation`` (``"auto"``, ``"hadamard"`` or ``"none"``): llama.cpp stores quantized caches
    Hadamard-rotated since April 2026; by default kvfast gives values in the model's basis wherever
    the evidence says they were rotated (see :attr:`State.rotation` and :mod:`kvfast.model.rotation`);
    ``"none"`` gives the values as stored.

    ``pre_rope=True`` (with ``model``, a GGUF file) gives keys before RoPE: every pass (values,
    tables, stats, compare, scans, exports, pictures) undoes llama.cpp's RoPE of each K cell from
    its position and the model's rope parameters, after any rotation (see :mod:`kvfast.model.pre_rope`);
    without a model it raises :class:`kvfast.errors.PreRopeError`.

    ``path`` may be a URL (``s3://bucket/key``, or any protocol fsspec reads): the state is read by
    ranged requests, its metadata at open and then only the rows each pass reads (see
    :mod:`kvfast.read.remote`; credentials and endpoint from the AWS variables or ``storage_options``;
    deadlines and the metadata bound from ``storage_options={"kvfast": {"connect_timeout": ...,
    "read_timeout": ..., "min_rate": ..., "metadata_limit": ...}}``, see
    :mod:`kvfast.read.remote.limits`); :attr:`State.fetched_bytes` counts what was fetched.
    Errors of the storage, and requests past their deadlines, are :class:`kvfast.RemoteError`. A ``file://`` URL or a path is memory-mapped.
    """
    return State(
        path,
        head_dim=head_dim,
        model=model,
        cell_ext=cell_ext,
        mmap=mmap,
        rotation=rotation,
        pre_rope=pre_rope,
        storage_options=storage_options,
    )
