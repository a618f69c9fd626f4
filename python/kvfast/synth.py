"""Write valid llama.cpp KV-cache state bytes of any size and cache type (for tests and benchmarks).

The bytes follow llama.cpp's writer (see docs of the format); the rows hold random values: normal
floats for f32/f16/bf16, random quants with finite, small scales for quantized types.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import BinaryIO

import numpy as np

from kvfast.read.ggml import TYPES
from kvfast.writing import output

GGSQ_MAGIC = 0x67677371
GGSN_MAGIC = 0x6767736E
IO_MAGIC = 0xAF143CD8


def row_bytes(type_name: str, n: int) -> int:
    bl, bb = TYPES[type_name].block_len, TYPES[type_name].block_bytes
    if n % bl:
        raise ValueError(f"{n} values are not whole {type_name} blocks of {bl}")
    return n // bl * bb


def random_rows(type_name: str, cells: int, n: int, rng: np.random.Generator) -> bytes:
    """`cells` rows of `n` values of `type_name`, as stored bytes."""
    if type_name == "f32":
        return rng.standard_normal(cells * n, dtype=np.float32).tobytes()
    if type_name == "f16":
        return rng.standard_normal(cells * n, dtype=np.float32).astype("<f2").tobytes()
    if type_name == "bf16":
        f = rng.standard_normal(cells * n, dtype=np.float32)
        return (f.view("<u4") >> 16).astype("<u2").tobytes()
    bl, bb = TYPES[type_name].block_len, TYPES[type_name].block_bytes
    blocks = rng.integers(0, 256, size=(cells * n // bl, bb), dtype=np.uint8)
    scales = (rng.random(blocks.shape[0], dtype=np.float32) * np.float32(0.05) + np.float32(0.001)).astype(
        "<f2"
    )
    blocks[:, 0:2] = scales.view(np.uint8).reshape(-1, 2)
    if type_name in ("q4_1", "q5_1"):
        mins = (rng.standard_normal(blocks.shape[0], dtype=np.float32) * np.float32(0.1)).astype("<f2")
        blocks[:, 2:4] = mins.view(np.uint8).reshape(-1, 2)
    return blocks.tobytes()


def _write_rows(f: BinaryIO, type_name: str, cells: int, n: int, rng: np.random.Generator) -> None:
    # Chunked so that multi-GB states are written in bounded memory.
    per = max(1, (64 << 20) // max(1, row_bytes(type_name, n)))
    f.writelines(random_rows(type_name, min(per, cells - start), n, rng) for start in range(0, cells, per))


def write_cache(
    f: BinaryIO,
    *,
    n_layer: int,
    n_embd_k: int,
    n_embd_v: int,
    k_type: str = "f16",
    v_type: str = "f16",
    v_trans: bool = False,
    pos: Sequence[int],
    seq_ids: Sequence[Sequence[int]],
    ext: Sequence[Sequence[int]] | None = None,
    n_stream_field: bool = True,
    rng: np.random.Generator,
) -> None:
    """One KV CACHE with one stream holding `len(pos)` cells."""
    cells = len(pos)
    if n_stream_field:
        f.write(struct.pack("<I", 1))
    f.write(struct.pack("<I", cells))
    if cells == 0:
        return
    for i in range(cells):
        f.write(struct.pack("<iI", pos[i], len(seq_ids[i])))
        if ext is not None:
            f.write(struct.pack(f"<{len(ext[i])}i", *ext[i]))
        f.write(struct.pack(f"<{len(seq_ids[i])}i", *seq_ids[i]))
    f.write(struct.pack("<II", int(v_trans), n_layer))
    for _ in range(n_layer):
        f.write(struct.pack("<iQ", TYPES[k_type].id, row_bytes(k_type, n_embd_k)))
        _write_rows(f, k_type, cells, n_embd_k, rng)
    for _ in range(n_layer):
        if v_trans:
            if TYPES[v_type].block_len != 1:
                raise ValueError("only f32, f16 and bf16 V can be transposed")
            f.write(struct.pack("<iII", TYPES[v_type].id, TYPES[v_type].block_bytes, n_embd_v))
        else:
            f.write(struct.pack("<iQ", TYPES[v_type].id, row_bytes(v_type, n_embd_v)))
        _write_rows(f, v_type, cells, n_embd_v, rng)


def write_state(
    path: str | os.PathLike[str],
    *,
    container: str = "seq",
    cells: int = 7,
    n_layer: int = 2,
    n_embd_k: int = 64,
    n_embd_v: int | None = None,
    k_type: str = "f16",
    v_type: str | None = None,
    v_trans: bool = False,
    seq_id: int = 0,
    arch: str = "qwen3",
    seed: int = 0,
) -> int:
    """Write a one-sequence state; returns its size in bytes.

    container: 'seq' (raw sequence bytes with the io magic), 'ggsq' (version 3), 'ggsn' (version 10)
    or 'state' (raw whole-context bytes).
    """
    rng = np.random.default_rng(seed)
    pos = list(range(cells))
    tokens = [int(t) for t in rng.integers(0, 1000, size=cells)]
    with output.replacing(path) as tmp, open(tmp, "wb") as f:
        if container == "seq":
            f.write(struct.pack("<Ii", IO_MAGIC, seq_id))
        elif container == "ggsq":
            f.write(struct.pack(f"<III{cells}i", GGSQ_MAGIC, 3, cells, *tokens))
        elif container in ("ggsn", "state"):
            if container == "ggsn":
                f.write(struct.pack(f"<III{cells}i", GGSN_MAGIC, 10, cells, *tokens))
            name = arch.encode()
            f.write(struct.pack("<I", len(name)) + name)
        else:
            raise ValueError(f"unknown container {container!r}")
        write_cache(
            f,
            n_layer=n_layer,
            n_embd_k=n_embd_k,
            n_embd_v=n_embd_v or n_embd_k,
            k_type=k_type,
            v_type=v_type or k_type,
            v_trans=v_trans,
            pos=pos,
            seq_ids=[[seq_id]] * cells,
            rng=rng,
        )
        return f.tell()
