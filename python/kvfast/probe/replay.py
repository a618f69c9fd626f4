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


#: The context of a Replay given no ``n_ctx`` until a state needs more, and the room for decoding
#: after a loaded state that one sized for it leaves.
ROOM = 256


class Replay:
    """One model and one context (cache types ``ctk`` / ``ctv``, flash attention ``fa``) to load
    states into and decode from; the logits of every decoded token are kept. ``swa_full``: the
    sliding-window cache sized for every cell (llama.cpp's ``swa_full``), as in the probe runner's
    context when it captures queries.

    ``n_ctx``: the context's size; None (the default) sizes it from the states loaded: :data:`ROOM`
    cells until a state needs more, then, while the cache is empty, a context made again for the
    state's cells (and positions) and :data:`ROOM` more. When llama.cpp refuses a state,
    :class:`~kvfast.errors.LoadError` says why where kvfast can tell (the context too small for its
    cells, another model, other cache types, a sliding-window cache that needs ``swa_full``)."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        ctk: str = "f16",
        ctv: str | None = None,
        fa: bool = True,
        n_ctx: int | None = None,
        n_seq: int = 1,
        swa_full: bool = False,
        verbose: bool = False,
    ) -> None:
        self.model = os.fspath(model)
        self.ctk, self.ctv, self.swa_full, self.n_seq = ctk, ctv or ctk, swa_full, n_seq
        #: Whether the context is sized from the states loaded (no ``n_ctx`` given).
        self.sized = n_ctx is None
        self.fa, self.verbose = fa, verbose
        self.r = self._make(ROOM if n_ctx is None else n_ctx)
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
        how = how or how_for(path)
        if self.sized:
            self._fit(path)
        L, ctx = self.L, self.r.ctx
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
            raise LoadError(f"llama.cpp refused {path} ({how}): {self._why(path)}")
        self.tokens = list(toks[: n_tok.value])
        return int(n)

    def _make(self, n_ctx: int) -> Runner:
        return Runner(
            self.model,
            ctk=self.ctk,
            ctv=self.ctv,
            fa=self.fa,
            parallel=self.n_seq,
            n_ctx=n_ctx,
            gpu_layers=0,
            unified=True,
            verbose=self.verbose,
            swa_full=self.swa_full,
        )

    def _empty(self) -> bool:
        return all(self.seq_pos_max(s) < 0 for s in range(self.n_seq))

    def _fit(self, path: str | os.PathLike[str]) -> None:
        """Make the context again, sized for the state at `path`, when it needs more cells than
        this one holds and the cache is empty."""
        need = _needs(path, self.model)
        if need is None or need <= self.r.n_ctx or not self._empty():
            return
        self.r.close()
        self.r = self._make(need + ROOM)
        self.L = self.r.L

    def _why(self, path: str | os.PathLike[str]) -> str:
        """Why llama.cpp may have refused the state at `path` in this context, as far as kvfast can
        tell from the state and the model."""
        import kvfast
        from kvfast.errors import KvfastError

        try:
            with kvfast.open(path, model=self.model) as st:
                caches = [(c.index, sum(s.cell_count for s in c.streams), c) for c in st.caches]
                types = {(x.k_type, x.v_type) for c in st.caches for s in c.streams for x in s.layers}
        except (KvfastError, OSError) as e:
            return f"it does not fit the model {self.model}: {e}"
        for index, cells, _ in caches:
            if cells > self.r.n_ctx:
                return (
                    f"its cache {index} holds {cells} cells, the context {self.r.n_ctx}: "
                    f"Replay(n_ctx={cells + ROOM}) or more, or no n_ctx to size it from the state"
                )
        want = (self.ctk, self.ctv)
        other = sorted(t for t in types if t[0] != want[0] or (t[1] is not None and t[1] != want[1]))
        if other:
            return f"its cache types are K {other[0][0]}, V {other[0][1]}; the context's K {want[0]}, V {want[1]}"
        if len(caches) > 1 and not self.swa_full:
            return (
                f"its sliding-window cache holds {caches[1][1]} cells, which a context without "
                "swa_full may not keep (a state saved with swa_full): Replay(swa_full=True)"
            )
        if not self._empty():
            return "the cache already holds cells where the state goes: clear() first"
        return "kvfast sees no cause in the state: Replay(verbose=True) shows llama.cpp's log"


def _needs(path: str | os.PathLike[str], model: str) -> int | None:
    """The context a state needs: its most cells in one cache, or its last position + 1 if more
    (None: kvfast cannot read it with the model; llama.cpp will say)."""
    import kvfast
    from kvfast.errors import KvfastError

    try:
        with kvfast.open(path, model=model) as st:
            cells = [sum(s.cell_count for s in c.streams) for c in st.caches]
            last = [int(s.pos.max()) + 1 for c in st.caches for s in c.streams if s.cell_count]
    except (KvfastError, OSError):
        return None
    return max([*cells, *last, 0])
