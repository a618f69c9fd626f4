"""An independent reading of the make_memories.py fixtures with struct and NumPy, written from
llama.cpp's writers (llama_kv_cache::state_write, llama_memory_recurrent::state_write, the hybrids'
state_write: attention caches, then the recurrent part), told what the model says: how many KV
caches, whether they hold V, whether cells carry the M-RoPE extension, and how many layers have
recurrent records. It shares nothing with kvfast but the quants decoder of the tests."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from quants import decode

TYPES = {0: "f32", 1: "f16", 8: "q8_0", 30: "bf16"}
IO_MAGIC, GGSQ, GGSN = 0xAF143CD8, 0x67677371, 0x6767736E


@dataclass(frozen=True)
class Spec:
    """What the model says about its memory."""

    kv_caches: int  # attention caches (2 for iSWA)
    v_less: bool
    ext: int  # cell extension bytes of the attention caches
    recurrent_layers: int  # layers with R and S records (0: no recurrent part)
    model_layers: tuple[tuple[int, ...], ...]  # model layer of each attention cache's layers
    recurrent_model_layers: tuple[int, ...]


SPECS = {
    "tiny-deepseek2-mla.gguf": Spec(1, True, 0, 0, ((0, 1),), ()),
    "tiny-mamba2.gguf": Spec(0, False, 0, 2, (), (0, 1)),
    "tiny-qwen35.gguf": Spec(1, False, 12, 3, ((3,),), (0, 1, 2)),
    "tiny-lfm2.gguf": Spec(1, False, 0, 3, ((2, 4),), (0, 1, 3)),
    "tiny-lfm2-swa.gguf": Spec(2, False, 0, 3, ((), (2, 4)), (0, 1, 3)),
    "tiny-gemma3.gguf": Spec(2, False, 0, 0, ((1, 3), (0, 2)), ()),  # make_partial.py
    "tiny-qwen3.gguf": Spec(1, False, 0, 0, ((0, 1),), ()),
}


def partial(spec: Spec) -> Spec:
    """What LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY writes of a memory: llama_kv_cache_iswa::state_write
    skips the full-attention cache, llama_memory_hybrid::state_write the attention cache (a hybrid
    iSWA memory passes the flag to its iSWA pair); a plain cache and a recurrent memory ignore it."""
    if spec.kv_caches == 2:
        return replace(spec, kv_caches=1, model_layers=spec.model_layers[1:])
    if spec.kv_caches == 1 and spec.recurrent_layers:
        return replace(spec, kv_caches=0, model_layers=())
    return spec


@dataclass
class Rec:
    kind: str  # k, v, r, s
    layer: int  # index within its cache (K/V) or its recurrent records (R/S)
    type: str
    n: int  # values per row
    offset: int  # of the rows
    values: np.ndarray  # [cells, n] float32


@dataclass
class Part:
    """One attention cache's first filled stream, or the recurrent part."""

    kind: str  # "kv" or "recurrent"
    cells: int = 0
    pos: list[int] = field(default_factory=list)
    seqs: list[list[int]] = field(default_factory=list)
    v_trans: bool = False
    n_layer: int = 0  # the n_layer field
    recs: list[Rec] = field(default_factory=list)

    def rec(self, kind: str, layer: int) -> Rec:
        return next(r for r in self.recs if r.kind == kind and r.layer == layer)


class Bytes:
    def __init__(self, raw: bytes, device: bool = False) -> None:
        self.raw, self.o, self.device = raw, 0, device

    def u32(self) -> int:
        (v,) = struct.unpack_from("<I", self.raw, self.o)
        self.o += 4
        return int(v)

    def i32(self) -> int:
        (v,) = struct.unpack_from("<i", self.raw, self.o)
        self.o += 4
        return int(v)

    def u64(self) -> int:
        (v,) = struct.unpack_from("<Q", self.raw, self.o)
        self.o += 8
        return int(v)

    def take(self, n: int) -> bytes:
        b = self.raw[self.o : self.o + n]
        assert len(b) == n, "truncated"
        self.o += n
        return b


def _cells(b: Bytes, part: Part, n: int, ext: int) -> None:
    for _ in range(n):
        part.pos.append(b.i32())
        k = b.u32()
        b.take(ext)
        part.seqs.append([b.i32() for _ in range(k)])


def _rows(b: Bytes, kind: str, layer: int, cells: int) -> Rec:
    """A record; with ``b.device`` (LLAMA_STATE_SEQ_FLAGS_ON_DEVICE) its header alone."""
    ty = TYPES[b.i32()]
    row = b.u64()
    off = b.o
    if b.device:
        return Rec(kind, layer, ty, row // (4 if ty == "f32" else 2), off, np.zeros((cells, 0), np.float32))
    vals = decode(ty, b.take(row * cells))
    n = vals.size // cells if cells else 0
    return Rec(kind, layer, ty, n, off, vals.reshape(cells, n))


def _kv(b: Bytes, spec: Spec) -> Part:
    part = Part("kv")
    for _ in range(b.u32()):  # streams
        cells = b.u32()
        if not cells:
            continue
        assert not part.cells, "one filled stream in these fixtures"
        part.cells = cells
        _cells(b, part, cells, spec.ext)
        part.v_trans = bool(b.u32())
        part.n_layer = n_layer = b.u32()
        part.recs = [_rows(b, "k", il, cells) for il in range(n_layer)]
        if spec.v_less:
            continue
        for il in range(n_layer):
            if not part.v_trans:
                part.recs.append(_rows(b, "v", il, cells))
                continue
            ty = TYPES[b.i32()]
            el, n = b.u32(), b.u32()
            off = b.o
            if b.device:
                part.recs.append(Rec("v", il, ty, n, off, np.zeros((cells, 0), np.float32)))
                continue
            vals = decode(ty, b.take(el * n * cells)).reshape(n, cells).T
            part.recs.append(Rec("v", il, ty, n, off, vals))
    return part


def _recurrent(b: Bytes, spec: Spec) -> Part:
    part = Part("recurrent")
    part.cells = b.u32()
    _cells(b, part, part.cells, 0)
    assert b.u32() == 0  # s_trans
    part.n_layer = b.u32()
    for kind in "rs":
        part.recs += [_rows(b, kind, i, part.cells) for i in range(spec.recurrent_layers)]
    return part


def read(path: Path) -> tuple[Spec, list[Part]]:
    """The parts of a fixture's memory, in file order; the reading must end at the last byte. A
    make_partial.py file named ``*.partial*`` holds what PARTIAL_ONLY writes, one named
    ``*device*`` no row (ON_DEVICE)."""
    model = json.loads((path.parent / "probe.json").read_text())["model"]
    spec = SPECS[model]
    if ".partial" in path.name:
        spec = partial(spec)
    b = Bytes(path.read_bytes(), device="device" in path.name)
    magic = b.u32()
    if magic == IO_MAGIC:
        b.u32()  # seq_id
    elif magic in (GGSQ, GGSN):
        b.u32()  # version
        b.take(4 * b.u32())  # tokens
        if magic == GGSN:
            b.take(b.u32())  # arch
    else:
        b.o = 4 + magic  # raw whole state: the arch name
    parts = [_kv(b, spec) for _ in range(spec.kv_caches)]
    if spec.recurrent_layers:
        parts.append(_recurrent(b, spec))
    assert b.o == len(b.raw), f"{path}: {len(b.raw) - b.o} bytes left"
    return spec, parts
