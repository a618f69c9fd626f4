"""Text views of a state: rows as hex next to their decoded numbers, and where a value lives."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvfast.read import select
from kvfast.read.address import FLOAT_BYTES, QUANT_BLOCKS, file_offset, record_ref, tensor_offset, value_byte
from kvfast.read.state import State

BLOCK_VALUES = 32


def rows(
    d: State, layer: int, kind: str = "k", cells: int = 3, head: int | None = None, cache: int = 0
) -> list[dict[str, Any]]:
    """The first `cells` rows of a record (or one head of them): file offset, bytes, values."""
    rec = record_ref(d.caches, cache, layer, kind)
    kind = rec.kind
    s, ty, off, n, rb = rec.stream, rec.type, rec.offset, rec.n_embd, rec.row_bytes
    hd = (d.head_dim_k if kind == "k" else d.head_dim_v) or n
    cells = select.non_negative("cells", cells)
    if head is not None:
        head = select.index("head", head, n // hd, f"{n // hd} heads of {hd} values")
    lo, hi = (0, n) if head is None else (head * hd, (head + 1) * hd)
    values = d.values(layer, kind, cache=cache, stream=s.index, dtype="float32")
    stored = d.values(layer, kind, cache=cache, stream=s.index, dtype="float32", stored=True)
    group = next((r.group for r in d.rotation if r.cache == cache and r.kind == kind and r.undone), None)
    toks = d.cell_tokens().filter(cache=cache, stream=s.index)
    token, piece = toks["token"].to_list(), toks["piece"].to_list()
    with open(d.path, "rb") as f:
        out = []
        for c in range(min(cells, s.cell_count)):
            transposed = rec.transposed
            if transposed:
                el = FLOAT_BYTES[ty]
                addrs = [off + (j * s.cell_count + c) * el for j in range(lo, hi)]
                chunks = []
                for a in addrs:
                    f.seek(a)
                    chunks.append(f.read(el))
                data, start = b"".join(chunks), addrs[0]
            else:
                if ty in QUANT_BLOCKS:  # whole blocks covering the head
                    bb = QUANT_BLOCKS[ty][0]
                    b0, b1 = lo // BLOCK_VALUES, -(-hi // BLOCK_VALUES)
                    start, length = off + c * rb + b0 * bb, (b1 - b0) * bb
                else:
                    start = off + c * rb + value_byte(ty, lo)
                    length = value_byte(ty, hi) - value_byte(ty, lo)
                f.seek(start)
                data = f.read(length)
            out.append(
                {
                    "cell": c,
                    "pos": int(s.pos[c]),
                    "seq_ids": s.cell_seq_ids(c),
                    "token": token[c],
                    "piece": piece[c],
                    "offset": start,
                    "type": ty,
                    "transposed": transposed,
                    "hex": data.hex(),
                    "values": [float(v) for v in values[c, lo:hi]],
                    # the numbers the bytes hold, where they differ from the model's (rotated caches)
                    "stored": None if group is None else [float(v) for v in stored[c, lo:hi]],
                    "rotation": group,
                }
            )
    return out


def format_rows(rows_: list[dict[str, Any]], per_line: int = 16) -> str:
    """Hex lines of `per_line` bytes with the file offset, then the numbers they hold."""
    lines = []
    for r in rows_:
        data = bytes.fromhex(r["hex"])
        how = ", V transposed: one element every cell apart" if r["transposed"] else ""
        tok = "" if r.get("token") is None else f"  token {r['token']}"
        tok += "" if r.get("piece") is None else f" {r['piece']!r}"
        lines.append(
            f"cell {r['cell']}  pos {r['pos']}{tok}  seq {r['seq_ids']}  {r['type']} at byte {r['offset']:,}{how}"
        )
        ty: str = r["type"]
        rotated = r.get("stored") is not None
        vals = np.array(r["stored"] if rotated else r["values"], np.float32)
        if ty in FLOAT_BYTES and not r["transposed"]:
            per_value = FLOAT_BYTES[ty]
            for i in range(0, len(data), per_line):
                chunk = data[i : i + per_line]
                nums = " ".join(f"{v:+.4g}" for v in vals[i // per_value : (i + len(chunk)) // per_value])
                lines.append(f"  {r['offset'] + i:>12,}  {chunk.hex(' '):<{per_line * 3}} {nums}")
        elif ty in QUANT_BLOCKS:
            bb = QUANT_BLOCKS[ty][0]
            for b in range(len(data) // bb):
                block = data[b * bb : (b + 1) * bb]
                lines.append(f"  {r['offset'] + b * bb:>12,}  block {b}: {block.hex(' ')}")
                block_vals = vals[b * BLOCK_VALUES : (b + 1) * BLOCK_VALUES]
                lines.append("  " + " " * 14 + " ".join(f"{v:+.4g}" for v in block_vals))
        else:
            per_value = FLOAT_BYTES[ty]
            for i, v in enumerate(vals):
                lines.append(f"  element {i}: {data[i * per_value : (i + 1) * per_value].hex(' ')}  {v:+.6g}")
        if rotated:
            lines.append(
                f"  in the model's basis (llama.cpp's rotation undone in groups of {r['rotation']}):"
            )
            model = r["values"]
            for i in range(0, len(model), BLOCK_VALUES):
                lines.append("  " + " " * 14 + " ".join(f"{v:+.4g}" for v in model[i : i + BLOCK_VALUES]))
    return "\n".join(lines)


def address(
    d: State,
    layer: int,
    cell: int,
    head: int,
    elem: int,
    kind: str = "k",
    n_ctx: int | None = None,
    n_stream: int = 1,
    cache: int = 0,
) -> dict[str, Any]:
    """Where one value lives in the file and in the live tensor, with the arithmetic spelled out."""
    w = d._where(layer, cell, head, elem, kind, cache, None)
    rec = w.rec
    s, ty, off, n, rb = rec.stream, rec.type, rec.offset, rec.n_embd, rec.row_bytes
    hd = (d.head_dim_k if kind == "k" else d.head_dim_v) or n
    j = w.index
    file_at = file_offset(w)
    idx = f"(head {head} x {hd} + elem {elem}) = value {j}"
    if rec.transposed:
        el = FLOAT_BYTES[ty]
        file_how = (
            f"{off:,} (V record rows) + ({j} x {s.cell_count} cells + cell {cell}) x {el} bytes = {file_at:,}"
        )
    elif ty in QUANT_BLOCKS:
        bb, q = QUANT_BLOCKS[ty]
        file_how = (
            f"{off:,} (rows) + cell {cell} x {rb:,} bytes/row + block {j // 32} x {bb} bytes"
            f" + {q} (scale) + {j % 32 if ty == 'q8_0' else j % 16} = {file_at:,}"
        )
    else:
        file_how = (
            f"{off:,} (rows) + cell {cell} x {rb:,} bytes/row + {j} x {FLOAT_BYTES[ty]} bytes = {file_at:,}"
        )
    out: dict[str, Any] = {
        "layer": layer,
        "kind": kind,
        "cell": cell,
        "pos": int(s.pos[cell]),
        "head": head,
        "elem": elem,
        "index": j,
        "index_how": idx,
        "type": ty,
        "value": float(d.values(layer, kind, cache=cache, stream=s.index, dtype="float32")[cell, j]),
        "file_offset": file_at,
        "file_how": file_how,
    }
    if n_ctx is not None:
        t = tensor_offset(w, n_ctx, n_stream)
        kv = n_ctx // n_stream
        if rec.transposed:
            el = FLOAT_BYTES[ty]
            how = f"stream {s.index} x {kv} cells x {n} x {el} + ({j} x {kv} + cell {cell}) x {el} = {t:,}"
            shape = f"[{kv}, {n}, {n_stream}] (V transposed)"
        else:
            how = (
                f"stream {s.index} x {kv} cells x {rb:,} + cell {cell} x {rb:,} + {value_byte(ty, j)} = {t:,}"
            )
            shape = f"[{n}, {kv}, {n_stream}]"
        out.update(tensor_offset=t, tensor_how=how, tensor_shape=shape)
    return out
