"""Reading llama.cpp's compute graph from its evaluation callback (``cb_eval`` of
``llama_context_params``): ggml's tensor struct, the libggml-base functions that read a tensor
(``ggml_get_name``, ``ggml_nbytes``, ``ggml_op_name``, ``ggml_backend_tensor_get``) and what the
attention of a layer is made of in the graph.

``ggml_backend_tensor_get`` copies a tensor's bytes from whichever backend holds them: on the CPU a
plain copy, on CUDA a copy from device memory, so the same reading works on both.

The struct is ggml's ``struct ggml_tensor`` (ggml/include/ggml.h of llama-cpp-python 0.3.36's
llama.cpp: 4 dimensions, 10 sources, 64 bytes of op parameters, names of 64 bytes); :class:`Ggml`
checks it against the library on the first tensor it reads (the name the library gives, the byte
count) and refuses a library it does not match.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_TYPE_F32 = 0
GGML_TYPE_I32 = 26


class Tensor(ctypes.Structure):
    """ggml's ``struct ggml_tensor``."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


#: A layer's K cache tensor (src/llama-kv-cache.cpp: ``cache_%sk_l%d``).
CACHE_K = re.compile(rb"^cache_[a-z_]*?k_l(\d+)$")
#: The Hadamard matrix of a rotated quantized K cache (``llama_kv_cache::build_input_k_rot``).
K_ROT = b"attn_inp_k_rot"
#: Ops a query passes through unchanged on its way to the attention (views and copies).
_SHAPING = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT", "CPY"}


def _library() -> ctypes.CDLL:
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    found = sorted(lib.glob("libggml-base.*")) + sorted(lib.glob("ggml-base.*"))
    if not found:
        raise RuntimeError(f"no libggml-base in {lib}: the query capture needs llama-cpp-python's ggml")
    g = ctypes.CDLL(str(found[0]))
    g.ggml_get_name.restype = ctypes.c_char_p
    g.ggml_get_name.argtypes = [ctypes.c_void_p]
    g.ggml_nbytes.restype = ctypes.c_size_t
    g.ggml_nbytes.argtypes = [ctypes.c_void_p]
    g.ggml_op_name.restype = ctypes.c_char_p
    g.ggml_op_name.argtypes = [ctypes.c_int]
    g.ggml_backend_tensor_get.restype = None
    g.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    return g


@dataclass
class Node:
    """A graph tensor read through the struct: its address and fields."""

    ptr: int
    t: Tensor

    @property
    def name(self) -> bytes:
        return bytes(self.t.name)

    def src(self, i: int) -> Node | None:
        p = self.t.src[i]
        return None if not p else Node(p, Tensor.from_address(p))

    def root(self) -> Node:
        """The tensor whose memory a view reads (ggml keeps ``view_src`` pointing at it)."""
        p = self.t.view_src
        return self if not p else Node(p, Tensor.from_address(p))

    def param_f32(self, i: int) -> float:
        return float(ctypes.c_float.from_buffer_copy(ctypes.c_int32(self.t.op_params[i])).value)


class Ggml:
    """libggml-base's functions, and what the callback reads with them."""

    def __init__(self) -> None:
        self.lib = _library()
        self._ops: dict[int, str] = {}
        self._checked = False

    def node(self, ptr: int) -> Node:
        n = Node(ptr, Tensor.from_address(ptr))
        if not self._checked:
            name = self.lib.ggml_get_name(ptr) or b""
            if name != n.name:
                raise RuntimeError(
                    f"this ggml's tensor struct is not the one kvfast reads (name {name!r} read as "
                    f"{n.name!r}): the query capture needs llama-cpp-python 0.3.36's ggml"
                )
            self._checked = True
        return n

    def op(self, n: Node) -> str:
        o = int(n.t.op)
        if o not in self._ops:
            self._ops[o] = (self.lib.ggml_op_name(o) or b"").decode()
        return self._ops[o]

    def read(self, n: Node) -> bytes:
        """Every byte of a tensor that is not a view (from any backend)."""
        size = int(self.lib.ggml_nbytes(n.ptr))
        buf = ctypes.create_string_buffer(size)
        self.lib.ggml_backend_tensor_get(n.ptr, buf, 0, size)
        return buf.raw

    def floats(self, view: Node) -> npt.NDArray[np.float32]:
        """An f32 tensor (or a view of one) as a NumPy array of its shape, the last dimension first
        (ggml's ne[3], ne[2], ne[1], ne[0]): a copy."""
        root = view.root()
        if view.t.type != GGML_TYPE_F32 or root.t.type != GGML_TYPE_F32:
            raise RuntimeError(f"tensor {view.name!r} is not f32 (ggml type {view.t.type})")
        raw = np.frombuffer(self.read(root), dtype=np.uint8)
        offs = int(view.t.view_offs) if view.t.view_src else 0
        shape = tuple(int(view.t.ne[i]) for i in reversed(range(GGML_MAX_DIMS)))
        strides = tuple(int(view.t.nb[i]) for i in reversed(range(GGML_MAX_DIMS)))
        last = offs + sum((s - 1) * st for s, st in zip(shape, strides, strict=True)) + 4
        if min(shape) <= 0 or last > raw.size:
            raise RuntimeError(f"tensor {view.name!r}: its view lies outside its source's bytes")
        arr: Any = np.lib.stride_tricks.as_strided(raw[offs:].view(np.float32), shape=shape, strides=strides)
        return np.array(arr, dtype=np.float32)

    def ints(self, n: Node) -> npt.NDArray[np.int32]:
        if n.t.type != GGML_TYPE_I32 or n.t.view_src:
            raise RuntimeError(f"tensor {n.name!r} is not a plain i32 tensor")
        return np.frombuffer(self.read(n), dtype="<i4").astype(np.int32)

    def producer(self, n: Node) -> Node:
        """The op that computed a tensor, past views and copies."""
        for _ in range(16):
            n = n.root()
            if self.op(n) not in _SHAPING:
                return n
            s = n.src(0)
            if s is None:
                return n
            n = s
        return n

    def find(self, n: Node, op: str, depth: int = 8) -> Node | None:
        """The nearest op named `op` among a tensor's sources, at most `depth` ops up."""
        seen: set[int] = set()
        level = [n]
        for _ in range(depth):
            nxt: list[Node] = []
            for x in level:
                x = x.root()
                if x.ptr in seen:
                    continue
                seen.add(x.ptr)
                if self.op(x) == op:
                    return x
                nxt.extend(s for i in range(GGML_MAX_SRC) if (s := x.src(i)) is not None)
            level = nxt
        return None
