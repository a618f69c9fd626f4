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
    """The source's token words with the tokens at `dropped_pos` removed (token i sits at position
    i); None when nothing changes. A blob with media keeps its media only when no token is dropped."""
    toks = dump.tokens
    if toks is None:
        return None
    tokens = toks.tolist()
    kept = [t for i, t in enumerate(tokens) if i not in dropped_pos]
    if len(kept) == len(tokens):
        return None
    if dump.server_tokens is None:
        return kept
    if media_of(dump):
        raise WriteError(
            "keep",
            "this llama-server slot holds media chunks (images, audio): dropping cells would move "
            "their token indices; give tokens= to write a token list of your own",
        )
    return blob(kept)


def _refuse(message: str) -> WriteError:
    return WriteError("tokens", message)


def given(dump: State, tokens: Sequence[int]) -> list[int]:
    """The words of ``tokens=``: packed as the source's were (a llama-server slot file), else plain."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, (Sequence, np.ndarray)):
        raise WriteError("tokens", f"a list of token ids, not {tokens!r}")
    ts = [select.integer("a token id", t, 0, select.INT32_MAX, _refuse) for t in tokens]
    return blob(ts) if dump.server_tokens is not None else ts
