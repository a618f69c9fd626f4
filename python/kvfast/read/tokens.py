"""Token text: the token each cell holds and the piece of text it stands for.

A cell's token is known where the state stores tokens (a GGSQ file's token list, a GGSN file's when
the state holds one sequence: token ``tokens[pos]``; a cell extension that carries the token) or a
probe manifest beside the state recorded them. Its piece comes from the model's vocabulary
(``tokenizer.ggml.tokens`` in the GGUF header, read alone) or from the probe manifest.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import polars as pl

from kvfast import _kvfast
from kvfast.read.opened import OpenState
from kvfast.read.schema import INDEX

#: Columns of :func:`cell_tokens`, in order.
SCHEMA: dict[str, pl.DataType] = {
    "cache": INDEX["cache"],
    "stream": INDEX["stream"],
    "cell": INDEX["cell"],
    "pos": INDEX["pos"],
    "token": pl.Int32(),
    "piece": pl.String(),
}


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode map, inverted (BPE vocabularies spell bytes with these characters)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _text(piece: str, bpe: bool) -> str:
    """The text a vocabulary entry stands for, as llama.cpp's token_to_piece gives it."""
    if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:  # SentencePiece byte tokens
        return bytes([int(piece[3:5], 16)]).decode("utf-8", errors="replace")
    if bpe:
        dec = _byte_decoder()
        if all(ch in dec for ch in piece):
            return bytes(dec[ch] for ch in piece).decode("utf-8", errors="replace")
        return piece
    return piece.replace("\u2581", " ")


@functools.lru_cache(maxsize=8)
def _vocab(path: str, mtime: float) -> tuple[list[str], bool] | None:
    words = _kvfast.gguf_vocab(path)
    if words is None:
        return None
    kind = _kvfast.gguf_metadata(path).get("tokenizer.ggml.model")
    return words, kind == "gpt2"


def vocabulary(path: str | os.PathLike[str]) -> list[str] | None:
    """The text of every token id of a GGUF model, or None when it has no vocabulary."""
    p = os.fspath(path)
    found = _vocab(p, os.stat(p).st_mtime)
    if found is None:
        return None
    words, bpe = found
    return [_text(w, bpe) for w in words]


def cell_tokens(dump: OpenState) -> pl.DataFrame:
    """One row per cell of every stream: cache, stream, cell, pos, token and piece (null where not
    known). Join it to :meth:`State.to_polars` or ``stats(by="cell")`` on (cache, stream, cell)."""
    tokens = dump.tokens
    per_sequence = dump.container in ("seq", "ggsq")
    seqs = {q for c in dump.caches for s in c.streams for q in s.sequences}
    by_pos = tokens is not None and (per_sequence or len(seqs) <= 1)
    pieces = dump.vocabulary
    recorded = dict(enumerate(dump.pieces or [])) if pieces is None and by_pos else {}
    frames = []
    for c in dump.caches:
        for s in c.streams:
            n = s.cell_count
            pos = s.pos.astype(np.int64)
            tok = np.full(n, -1, np.int64)
            if s.ext is not None and s.ext.shape[1] == 3:
                tok = s.ext[:, 2].astype(np.int64)
            elif by_pos and tokens is not None:
                ok = pos < len(tokens)
                tok[ok] = tokens[pos[ok]]
            known = tok >= 0
            if pieces is not None:
                piece = [pieces[t] if 0 <= t < len(pieces) else None for t in tok.tolist()]
            else:
                piece = [
                    recorded.get(int(p)) if k else None
                    for p, k in zip(pos.tolist(), known.tolist(), strict=True)
                ]
            frames.append(
                pl.DataFrame(
                    {
                        "cache": np.full(n, c.index, np.uint8),
                        "stream": np.full(n, s.index, np.uint8),
                        "cell": np.arange(n, dtype=np.uint32),
                        "pos": s.pos,
                        "token": pl.Series(np.where(known, tok, 0).astype(np.int32)).scatter(
                            np.flatnonzero(~known), None
                        ),
                        "piece": pl.Series(piece, dtype=pl.String),
                    },
                    schema=SCHEMA,
                )
            )
    return pl.concat(frames) if frames else pl.DataFrame(schema=SCHEMA)
