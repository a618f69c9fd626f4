"""Load a state into a fresh llama.cpp context and go on decoding from it (llama-cpp-python's C API,
as :mod:`kvfast.probe` drives it): the proof that a written state is one llama.cpp accepts, and
the measuring stick of an edit (the logits after it against those after the unedited state).

>>> with Replay("tiny-qwen3.gguf", ctk="f16") as r:      # doctest: +SKIP
...     full = r.prompt([5, 6, 7])                         # decode; the last token's logits
...     r.save("full.ggsq", "seq_file", tokens=[5, 6, 7])  # save the sequence as llama.cpp does
...     r.clear(); r.load("pruned.ggsq")                   # a fresh cache, then the edited state
...     logits = r.step(8, pos=3)                          # the next token's logits
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import numpy as np
import numpy.typing as npt

from kvfast.errors import LoadError
from kvfast.probe.runner import Runner
from kvfast.writing import output

How = Literal["seq_data", "seq_file", "state_file", "state_data"]


def how_for(path: str | os.PathLike[str]) -> How:
    """The C API call that loads a file of this container: raw sequence bytes
    (``llama_state_seq_set_data``), GGSQ (``llama_state_seq_load_file``), GGSN
    (``llama_state_load_file``) or raw whole-state bytes (``llama_state_set_data``)."""
    with open(path, "rb") as f:
        magic = int.from_bytes(f.read(4), "little")
    by_magic: dict[int, How] = {0x67677371: "seq_file", 0x6767736E: "state_file", 0xAF143CD8: "seq_data"}
    return by_magic.get(magic, "state_data")


class Replay:
    """One model and one context (cache types ``ctk`` / ``ctv``, flash attention ``fa``) to load
    states into and decode from; the logits of every decoded token are kept. ``swa_full``: the
    sliding-window cache sized for every cell (llama.cpp's ``swa_full``), as in the probe runner's
    context when it captures queries."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        ctk: str = "f16",
        ctv: str | None = None,
        fa: bool = True,
        n_ctx: int = 256,
        n_seq: int = 1,
        swa_full: bool = False,
        verbose: bool = False,
    ) -> None:
        self.r = Runner(
            os.fspath(model),
            ctk=ctk,
            ctv=ctv or ctk,
            fa=fa,
            parallel=n_seq,
            n_ctx=n_ctx,
            gpu_layers=0,
            unified=True,
            verbose=verbose,
            swa_full=swa_full,
        )
        self.L = self.r.L

    def close(self) -> None:
        self.r.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def clear(self) -> None:
        """Empty the cache (a fresh context's)."""
        self.r.clear()

    def logits(self, i: int = -1) -> npt.NDArray[np.float32]:
        """A copy of the logits of output ``i`` of the last decode."""
        ptr = self.L.llama_get_logits_ith(self.r.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.r.n_vocab,)).astype(np.float32, copy=True)

    def prompt(self, tokens: Sequence[int], seq: int = 0, pos: int = 0) -> npt.NDArray[np.float32]:
        """Decode ``tokens`` for ``seq`` from position ``pos``; the logits of the last one."""
        n = len(tokens)
        self.r.decode([(int(t), pos + i, seq, i == n - 1) for i, t in enumerate(tokens)])
        return self.logits(-1)

    def step(self, token: int, pos: int, seq: int = 0) -> npt.NDArray[np.float32]:
        """Decode one token; its logits."""
        return self.prompt([token], seq, pos)

    def generate(self, n: int, first: int, pos: int, seq: int = 0) -> list[int]:
        """Greedy tokens after ``first`` at ``pos`` (``first`` included)."""
        out = [int(first)]
        for i in range(n - 1):
            out.append(int(self.step(out[-1], pos + i, seq).argmax()))
        return out

    def seq_pos_max(self, seq: int = 0) -> int:
        return int(self.L.llama_memory_seq_pos_max(self.r.mem, seq))

    def save(self, path: str | os.PathLike[str], how: How, seq: int = 0, tokens: Sequence[int] = ()) -> None:
        """Save the sequence or the whole context the way ``how`` loads it back."""
        L, ctx = self.L, self.r.ctx
        p = Path(path)
        if how == "seq_file":
            self.r.save_seq(p, seq, list(tokens), guard_manifest=True)
        elif how == "state_file":
            arr = (L.llama_token * len(tokens))(*tokens)
            with output.replacing(p) as tmp:
                if not L.llama_state_save_file(ctx, os.fsencode(tmp), arr, len(tokens)):
                    raise LoadError("llama_state_save_file failed")
        elif how == "seq_data":
            n = L.llama_state_seq_get_size(ctx, seq)
            buf = (ctypes.c_uint8 * n)()
            with output.replacing(p) as tmp:
                tmp.write_bytes(memoryview(buf)[: L.llama_state_seq_get_data(ctx, buf, n, seq)])
        else:
            self.r.save_whole(p, guard_manifest=True)

    def load(self, path: str | os.PathLike[str], seq: int = 0, how: How | None = None) -> int:
        """Load a state file into the cache (a sequence state into ``seq``) with the C API call of
        its container; returns what llama.cpp returns (bytes read, or 1 for a whole-state file);
        :class:`LoadError` if it refuses the state."""
        L, ctx = self.L, self.r.ctx
        how = how or how_for(path)
        cap = self.r.n_ctx
        toks = (L.llama_token * cap)()
        n_tok = ctypes.c_size_t(0)
        if how == "seq_file":
            n = L.llama_state_seq_load_file(ctx, os.fsencode(path), seq, toks, cap, ctypes.byref(n_tok))
        elif how == "state_file":
            n = int(L.llama_state_load_file(ctx, os.fsencode(path), toks, cap, ctypes.byref(n_tok)))
        else:
            data = Path(path).read_bytes()
            buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            if how == "seq_data":
                n = L.llama_state_seq_set_data(ctx, buf, len(data), seq)
            else:
                n = L.llama_state_set_data(ctx, buf, len(data))
        if not n:
            raise LoadError(f"llama.cpp refused {path} ({how})")
        self.tokens = list(toks[: n_tok.value])
        return int(n)
