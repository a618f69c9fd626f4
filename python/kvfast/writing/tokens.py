"""The token array of a written GGSQ / GGSN state: a plain token list, or llama-server's packed blob
(``-1``, version 1, the tokens, media starts and bytes, zero-padded; see kvfast-core's
server_tokens.rs), kept packed when the source's was."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvfast.errors import WriteError
from kvfast.read import select

if TYPE_CHECKING:
    from kvfast.read.state import State


def blob(tokens: Sequence[int], media: Sequence[tuple[int, bytes]] = ()) -> list[int]:
    """llama-server's packed token blob (version 1) as int32 words."""
    b = bytearray(struct.pack("<iII", -1, 1, len(tokens)))
    b += struct.pack(f"<{len(tokens)}i", *tokens)
    b += struct.pack("<I", len(media))
    b += b"".join(struct.pack("<I", start) for start, _ in media)
    for _, data in media:
        b += struct.pack("<I", len(data)) + data
    b += b"\0" * (-len(b) % 4)
    return [int(w) for w in np.frombuffer(bytes(b), dtype="<i4")]


def media_of(dump: State) -> list[tuple[int, bytes]]:
    """The media chunks of the source's packed blob: (first token index, bytes)."""
    st = dump.server_tokens
    if st is None or not st["media"]:
        return []
    out = []
    with open(dump.path, "rb") as f:
        for m in st["media"]:
            f.seek(m["offset"])
            out.append((int(m["start"]), f.read(m["nbytes"])))
    return out


def pruned(dump: State, dropped_pos: set[int]) -> list[int] | None:
    """The source's token words once the cells at ``dropped_pos`` are gone; None when nothing
    changes.

    Token i is the token at position i: llama.cpp's callers read a state's token list so
    (llama-server's ``server_tokens::pos_next`` is the token count, the next prompt is matched
    against it token for token, and decoding goes on at that position), and so does kvfast's
    reader. A dropped position inside the list keeps its token: the sequence holds no cell there,
    and a prompt that matches it goes on without it, which is what dropping it means. The dropped
    positions at the end are cut off, so that the list ends where the sequence's last cell is
    (the next token is decoded right after it, and a list left longer would name tokens no cell
    holds). A llama-server blob with media (whose token indices are not positions) keeps its
    media while its last position stays."""
    toks = dump.tokens
    if toks is None:
        return None
    tokens = toks.tolist()
    media = media_of(dump)
    if media:
        if dropped_pos and max(dropped_pos) >= max(_positions(dump), default=-1):
            raise WriteError(
                "keep",
                "this llama-server slot holds media chunks (images, audio), whose token indices are not"
                " positions: its last position can only be dropped with tokens= (a token list of your"
                " own)",
            )
        return None
    n = len(tokens)
    while n and n - 1 in dropped_pos:
        n -= 1
    if n == len(tokens):
        return None
    return tokens[:n] if dump.server_tokens is None else blob(tokens[:n])


def _positions(dump: State) -> set[int]:
    return {int(p) for c in dump.caches for s in c.streams for p in s.pos.tolist()}


def _refuse(message: str) -> WriteError:
    return WriteError("tokens", message)


def given(dump: State, tokens: Sequence[int]) -> list[int]:
    """The words of ``tokens=``: packed as the source's were (a llama-server slot file), else plain."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, (Sequence, np.ndarray)):
        raise WriteError("tokens", f"a list of token ids, not {tokens!r}")
    ts = [select.integer("a token id", t, 0, select.INT32_MAX, _refuse) for t in tokens]
    return blob(ts) if dump.server_tokens is not None else ts
