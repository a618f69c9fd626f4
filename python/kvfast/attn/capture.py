"""Capturing each layer's queries from llama.cpp while it decodes, through its graph evaluation
callback (``cb_eval``), written to disk as they come (see :mod:`kvfast.attn.queries`).

Which tensor: the query operand of the layer's attention op, the one llama.cpp multiplies with
its K cache (``src[1]`` of the ``kq-<il>`` matrix product with flash attention off, ``src[0]`` of
``FLASH_ATTN_EXT`` with it on: src/llama-graph.cpp ``build_attn_mha``), found from its K operand,
a view of the cache tensor ``cache_k_l<il>``. That tensor is the same in every architecture
(the models name their own tensors differently: ``Qcur`` in most, ``q`` / ``q_pe`` in MLA ones),
is what the attention really used, and is in the basis of the keys kvfast gives once two things
llama.cpp does between the model's query and its attention are undone, both read from the graph:

- a quantized cache's Hadamard rotation (``build_attn``: the query is multiplied by the
  ``attn_inp_k_rot`` matrix like the keys it meets): the rotation is undone with that matrix (it is
  orthogonal), so the query pairs with kvfast's keys in the model's basis;
- a model's own query scaling before the attention (Gemma 2 / 3 scale the query, then pass a scale
  of 1): divided out, so the query is the model's query after RoPE and the scale is the model's
  (``kvfast.attention`` applies it). What llama.cpp applied is recorded beside the queries.

Rows: each layer's op holds the ubatch's tokens in order; the capture decodes one sequence per
``llama_decode`` (its ubatches keep the batch's order whatever the memory's split), gives each
layer's rows to the batch's tokens in turn, and checks them against the positions the query's RoPE
read where the graph has one. The callback runs on the thread that called ``llama_decode``; an
error inside it is kept and raised once the decode returns (the callback itself tells llama.cpp to
go on, never to stop mid-graph).
"""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvfast.attn.graph import CACHE_K, GGML_TYPE_I32, K_ROT, Ggml, Node
from kvfast.attn.queries import BASIS, FORMAT, VERSION, sidecar_name, values_name


@dataclass
class LayerSeen:
    """What the graph showed of one layer's attention."""

    kq_scale: float | None = None
    q_prescale: float = 1.0
    softcap: float | None = None
    rotation: int = 0
    sinks: list[float] | None = None
    flash: bool | None = None
    positions_checked: bool = False


@dataclass
class Writer:
    """One sequence's queries, written into a file of known shape as the rows come."""

    path: Path
    rows: int
    row_len: int
    values: np.memmap[Any, np.dtype[np.float32]] = field(init=False)
    pos: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    token: list[int] = field(default_factory=list)
    generated: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tmp = self.path.with_name(f".{self.path.name}.tmp")
        self.values = np.lib.format.open_memmap(
            self.tmp, mode="w+", dtype=np.float32, shape=(self.rows, self.row_len)
        )

    def close(self) -> None:
        self.values.flush()
        del self.values
        os.replace(self.tmp, self.path)

    def abandon(self) -> None:
        del self.values
        self.tmp.unlink(missing_ok=True)


class Capture:
    """The evaluation callback, and the files it fills: give :attr:`callback` to the context, then
    :meth:`begin` before each ``llama_decode`` whose queries are wanted and :meth:`end` after."""

    def __init__(self, layers: list[dict[str, Any]]) -> None:
        self.ggml = Ggml()
        #: The model's attention layers as kvfast computes them (``_kvfast.attention_layers``).
        self.layers = {int(a["model_layer"]): a for a in layers}
        self.blocks: dict[int, int] = {}
        off = 0
        for il in sorted(self.layers):
            self.blocks[il] = off
            off += int(self.layers[il]["n_head"]) * int(self.layers[il]["head_dim"])
        self.row_len = off
        self.seen: dict[int, LayerSeen] = {il: LayerSeen() for il in self.layers}
        self._want: dict[int, int] = {}  # attention op -> its model layer
        self._rows: list[tuple[int, int]] = []  # the decode's (pos, seq)
        self._keep: list[int | None] = []  # per row: its row in the writer's file
        self._writer: Writer | None = None
        self._cursor: dict[int, int] = {}
        # the positions each RoPE's input held when it last ran (tensor address -> values)
        self._positions: dict[int, list[int]] = {}
        self._error: BaseException | None = None
        self.extra: Callable[[int, bool], bool] | None = None  # a second callback (tests)
        self.callback = _callback_type()(self._call)

    # -- driving --------------------------------------------------------------------------------
    def open(self, path: Path, rows: int) -> Writer:
        return Writer(path, rows, self.row_len)

    def begin(self, rows: list[tuple[int, int]], keep: list[int | None], writer: Writer | None) -> None:
        self._rows, self._keep, self._writer = rows, keep, writer
        self._cursor = dict.fromkeys(self.layers, 0)
        self._positions = {}
        self._error = None

    def end(self) -> None:
        """After the decode: raise what the callback met; check every layer had every row."""
        err, self._error = self._error, None
        rows, self._rows = self._rows, []
        self._writer = None
        if err is not None:
            raise RuntimeError(f"query capture failed: {err}") from err
        short = {il: c for il, c in self._cursor.items() if c != len(rows)}
        if rows and short:
            raise RuntimeError(
                f"query capture: the attention of model layers {sorted(short)} took "
                f"{sorted(set(short.values()))} of the decode's {len(rows)} tokens"
            )

    # -- the callback ---------------------------------------------------------------------------
    def _call(self, ptr: int, ask: bool, _user: Any) -> bool:
        want = False
        try:
            if self._rows and self._error is None:
                want = self._on(ptr, ask)
        except BaseException as e:  # noqa: BLE001 (kept for end(): never into llama.cpp's C frames)
            self._error = e
        if self.extra is not None:
            try:
                want = self.extra(ptr, ask) or want
            except BaseException as e:  # noqa: BLE001 (as above)
                self._error = self._error or e
        return True if not ask else want

    def _on(self, ptr: int, ask: bool) -> bool:
        if not ask:
            il = self._want.pop(ptr, None)
            if il is not None:
                self._take(self.ggml.node(ptr), il)
            return True
        g = self.ggml
        n = g.node(ptr)
        op = g.op(n)
        name = n.name
        if op == "MUL_MAT" and name.startswith(b"kq-"):
            k = n.src(0)
            il = self._layer(k)
            if il is not None:
                self.seen[il].flash = False
                self._want[ptr] = il
                return True
        elif op == "FLASH_ATTN_EXT":
            il = self._layer(n.src(1))
            if il is not None:
                s = self.seen[il]
                cap = n.param_f32(2)
                s.flash, s.softcap = True, cap if cap != 0.0 else None
                s.kq_scale = n.param_f32(0) * (cap if cap != 0.0 else 1.0)
                self._bias(n.param_f32(1), il)
                s.sinks = self._sinks(n.src(4))
                self._want[ptr] = il
                return True
        elif op == "ROPE":
            # read now, before the op runs: by the time the attention op has run, the graph
            # allocator may have given the buffer of the positions (their last reader was the
            # last layer's RoPE) to a later tensor (real Gemma 3 270M's layer 17). Read at every
            # RoPE, never kept from an earlier one: each micro-batch (n_ubatch tokens) of a decode
            # is a graph of its own whose positions may lie at the same address
            pos = n.src(1)
            if pos is not None and pos.t.type == GGML_TYPE_I32 and not pos.t.view_src:
                self._positions[pos.ptr] = g.ints(pos).tolist()
        elif op == "SOFT_MAX" and name.startswith(b"kq_soft_max-"):
            il = int(name.rsplit(b"-", 1)[1])
            if il in self.seen:
                self.seen[il].kq_scale = n.param_f32(0)
                self._bias(n.param_f32(1), il)
                self.seen[il].sinks = self._sinks(n.src(2))
        elif op == "SCALE" and name.startswith(b"kq_scaled_1-"):
            il = int(name.rsplit(b"-", 1)[1])
            if il in self.seen:
                self.seen[il].softcap = 1.0 / n.param_f32(0)
        return False

    def _layer(self, k: Node | None) -> int | None:
        if k is None:
            return None
        m = CACHE_K.match(k.root().name)
        if m is None:
            return None
        il = int(m.group(1))
        return il if il in self.layers else None

    def _bias(self, max_bias: float, il: int) -> None:
        if max_bias != 0.0:
            raise RuntimeError(
                f"model layer {il} uses ALiBi (max_bias {max_bias}): kvfast does not compute it"
            )

    def _sinks(self, s: Node | None) -> list[float] | None:
        if s is None:
            return None
        return [float(x) for x in self.ggml.floats(s).reshape(-1)]

    def _take(self, att: Node, il: int) -> None:
        """The query operand of layer `il`'s attention op, after it ran: its rows to the file."""
        g = self.ggml
        flash = g.op(att) == "FLASH_ATTN_EXT"
        qv = att.src(0 if flash else 1)
        assert qv is not None
        q = g.floats(qv)  # [stream, head, token, dim]
        ns, nh, nt, d = q.shape
        q = q.transpose(0, 2, 1, 3).reshape(ns * nt, nh, d)
        a = self.layers[il]
        if (nh, d) != (int(a["n_head"]), int(a["head_dim"])):
            raise RuntimeError(
                f"model layer {il}: llama.cpp's queries are {nh} heads of {d}, the model's header says "
                f"{a['n_head']} of {a['head_dim']}"
            )
        seen = self.seen[il]
        p = g.producer(qv)
        if g.op(p) == "MUL_MAT" and (r := p.src(0)) is not None and r.name == K_ROT:
            rot = g.floats(r)[0, 0]  # [n, n]: y = rot @ x per group of n values
            n = rot.shape[0]
            q = (q.reshape(ns * nt, nh, d // n, n) @ rot).reshape(ns * nt, nh, d)
            seen.rotation = n
            src = p.src(1)
            assert src is not None
            p = g.producer(src)
        if g.op(p) == "SCALE":
            s, b = p.param_f32(0), p.param_f32(1)
            if b != 0.0 or s == 0.0:
                raise RuntimeError(f"model layer {il}: the query is scaled by {s} plus {b}")
            q = q / np.float32(s)
            seen.q_prescale = s
        start = self._cursor[il]
        rows = self._rows[start : start + ns * nt]
        if len(rows) != ns * nt:
            raise RuntimeError(
                f"model layer {il}: {ns * nt} queries past the decode's {len(self._rows)} tokens"
            )
        self._cursor[il] = start + ns * nt
        rope = g.find(p, "ROPE")
        pos = None if rope is None else rope.src(1)
        read = None if pos is None else self._positions.get(pos.ptr)
        if read is not None:
            got = read[: ns * nt]
            if got != [r[0] for r in rows]:
                raise RuntimeError(f"model layer {il}: the queries' positions {got[:8]} are not the batch's")
            seen.positions_checked = True
        w = self._writer
        if w is None:
            return
        off = self.blocks[il]
        keep = self._keep[start : start + ns * nt]
        taken = [i for i, at in enumerate(keep) if at is not None]
        if not taken:
            return
        into = [at for at in keep if at is not None]
        block = q.reshape(ns * nt, nh * d)
        if into[-1] - into[0] == len(into) - 1 and taken[-1] - taken[0] == len(taken) - 1:  # one run
            w.values[into[0] : into[-1] + 1, off : off + nh * d] = block[taken[0] : taken[-1] + 1]
        else:
            w.values[into, off : off + nh * d] = block[taken]


def _callback_type() -> Any:
    import llama_cpp

    return llama_cpp.ggml_backend_sched_eval_callback


def write_sidecar(
    w: Writer, cap: Capture, meta: dict[str, Any], rows: tuple[list[int], list[int], list[int], list[bool]]
) -> str:
    """Close a writer and write its sidecar; returns the sidecar's file name."""
    w.close()
    pos, seq, token, generated = rows
    layers = []
    for il in sorted(cap.layers):
        a, s = cap.layers[il], cap.seen[il]
        llama = None if s.kq_scale is None else s.kq_scale * s.q_prescale
        layers.append(
            {
                "model_layer": il,
                "offset": cap.blocks[il],
                "n_head": int(a["n_head"]),
                "head_dim": int(a["head_dim"]),
                "window": a["window"],
                "window_size": int(a["window_size"]),
                "llama_scale": llama,
                "op_scale": s.kq_scale,
                "q_prescale": s.q_prescale,
                "softcap": s.softcap,
                "rotation": s.rotation,
                "sinks": s.sinks,
                "flash_attn": s.flash,
                "positions_checked": s.positions_checked,
            }
        )
    side = {
        "format": FORMAT,
        "version": VERSION,
        "values": w.path.name,
        "dtype": "float32",
        "shape": [w.rows, w.row_len],
        "basis": BASIS,
        **meta,
        "rows": {"pos": pos, "seq": seq, "token": token, "generated": generated},
        "layers": layers,
    }
    name = sidecar_name(w.path)
    tmp = w.path.with_name(f".{name}.tmp")
    tmp.write_text(json.dumps(side, indent=1) + "\n")
    os.replace(tmp, w.path.with_name(name))
    return name


def decode_group(
    r: Any,
    group: list[Any],
    prefix: list[int],
    generate: int,
    cap: Capture,
    window: int | None,
    out: Path,
) -> tuple[list[list[int]], list[Writer], list[tuple[list[int], list[int], list[int], list[bool]]]]:
    """Decode a batch's prompts one sequence at a time, capturing the queries of the last
    `window` positions of each prompt (None: all) and of its generated tokens. `r`: a probe
    ``Runner``, `group`: its prompts. Returns the generated tokens, the open writers and each
    sequence's rows (pos, seq, token, generated)."""
    writers: list[Writer] = []
    rows_of: list[tuple[list[int], list[int], list[int], list[bool]]] = []
    nxt: list[int] = []
    try:
        for s, p in enumerate(group):
            n = len(p.ids)
            first = 0 if window is None else max(0, n - window)
            w = cap.open(out / values_name(p.id), n - first + generate)
            writers.append(w)
            kept = [len(prefix) + i for i in range(first, n)]
            rows_of.append((kept, [s] * len(kept), list(p.ids[first:]), [False] * len(kept)))
            entries = [(t, len(prefix) + i, s, i == n - 1 and generate > 0) for i, t in enumerate(p.ids)]
            keep = [i - first if i >= first else None for i in range(n)]
            cap.begin([(e[1], s) for e in entries], keep, w)
            r.decode(entries)
            cap.end()
            nxt.append(r.argmax(n - 1) if generate > 0 else 0)
        generated: list[list[int]] = [[] for _ in group]
        for step in range(generate):
            for s, p in enumerate(group):
                t, pos = nxt[s], len(prefix) + len(p.ids) + step
                generated[s].append(t)
                row = len(rows_of[s][0])
                rows_of[s][0].append(pos)
                rows_of[s][1].append(s)
                rows_of[s][2].append(t)
                rows_of[s][3].append(True)
                cap.begin([(pos, s)], [row], writers[s])
                r.decode([(t, pos, s, True)])
                cap.end()
                nxt[s] = r.argmax(0)
    except BaseException:
        for w in writers:
            w.abandon()
        raise
    return generated, writers, rows_of


def install(params: Any, cap: Capture) -> None:
    """Set the capture as a context's evaluation callback (before the context is made)."""
    params.cb_eval = cap.callback
    params.cb_eval_user_data = ctypes.c_void_p(0)
