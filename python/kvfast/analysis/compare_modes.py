"""How :func:`kvfast.compare` matches the cells of two states, and the check of their tokens.

- ``"sequence"``: by (sequence, position), as a state of one run against another of the same run;
- ``"position"``: by position alone, sequences ignored (two prompts of one probe batch: sequences 0
  and 1); where B holds several cells at a position (several sequences), the last one;
- ``"tokens"``: by position, over the aligned common token prefix only: the positions 0, 1, ... up
  to the first where the two states' tokens differ or are not known. Needs the tokens of both
  (a GGSQ / GGSN file's token list, a probe manifest beside the state, a cell extension).

Where the tokens of both states are known, ``"sequence"`` and ``"position"`` comparisons of
positions whose tokens differ warn (:class:`TokenMismatchWarning`): their errors compare different
inputs, not one input stored two ways.
"""

from __future__ import annotations

from typing import Literal

import polars as pl

from kvfast.read.opened import OpenState
from kvfast.read.tokens import cell_tokens

Match = Literal["sequence", "position", "tokens"]
MATCHES = ("sequence", "position", "tokens")


def position_tokens(dump: OpenState) -> dict[int, int]:
    """The token of each position where it is known and one (a whole state of several sequences
    that hold different tokens at a position leaves that position out)."""
    df = cell_tokens(dump).drop_nulls("token").group_by("pos").agg(pl.col("token").unique())
    return {p: t[0] for p, t in df.iter_rows() if len(t) == 1}


def common_prefix(a: dict[int, int], b: dict[int, int]) -> int:
    """The length of the aligned common token prefix: the first position where the tokens differ or
    either is unknown."""
    n = 0
    while n in a and n in b and a[n] == b[n]:
        n += 1
    return n


def differing(a: dict[int, int], b: dict[int, int]) -> list[int]:
    """The positions, known on both sides, whose tokens differ, in order."""
    return sorted(p for p in a.keys() & b.keys() if a[p] != b[p])


def tokens_unknown(a: OpenState, b: OpenState, ta: dict[int, int], tb: dict[int, int]) -> str:
    """Why match='tokens' cannot compare A and B (for a MatchError)."""
    which = " and ".join(f"{name} ({d.path})" for name, d, t in (("A", a, ta), ("B", b, tb)) if not t)
    return (
        f"match='tokens' needs the tokens of both states, and {which} stores none: compare a GGSQ /"
        " GGSN file or a state with its probe manifest, or use match='position'"
    )
