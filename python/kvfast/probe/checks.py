"""What a probe run checks before llama.cpp sees anything, and the output folder held for it.

- The numeric options, in range: ``n_ctx`` 1 or more (llama.cpp reads it as unsigned: ``-1`` would
  be 4294967295) and no larger than a cache the machine's memory can hold (K and V of every
  attention layer at the cache types, counted from the model's header), ``parallel`` 1 to 256
  (llama.cpp's LLAMA_MAX_SEQ), ``generate`` 0 or more, ``gpu_layers`` -1 (all) or more; each a
  whole number, never a bool. What is not is a :class:`kvfast.errors.ProbeError` naming the option.
- One run at a time in a folder: a run holds ``OUT/.kvfast-probe.lock`` (``flock``) while it
  lives; a second run into the same folder is refused at once with :class:`kvfast.OutputError`
  (``errno.EBUSY``) rather than interleaving its manifest and temporary files with the first's.
  The lock goes with the process, so a killed run leaves none behind.
- The temporary files a killed run left (a capture's ``.<id>.queries.npy.tmp`` and ``.json.tmp``,
  a state's or the manifest's ``.<name>.<pid>-<n>.kvfast-tmp``) are removed when the next run takes
  the folder, also where it keeps every state (a resumed run): no run of it is alive then.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from kvfast.errors import OutputError, ProbeError
from kvfast.model.geometry import ModelGeometry
from kvfast.read.ggml import TYPES
from kvfast.writing import output

if sys.platform != "win32":
    import fcntl

#: The lock file a run holds in its output folder.
LOCK = ".kvfast-probe.lock"
#: llama.cpp's LLAMA_MAX_SEQ: the most sequences one context decodes.
MAX_SEQ = 256
#: The temporary files of a capture (kvfast.attn.capture), left by a run killed while it wrote them.
_TEMPORARY = re.compile(r"^\..+\.queries\.(npy|json)\.tmp$")
#: The temporary file of a state or manifest written under its final name (kvfast.writing.output).
_WRITTEN = re.compile(r"^\.(.+)\.\d+-\d+" + re.escape(output.SUFFIX) + "$")

P = ParamSpec("P")
R = TypeVar("R")


def _whole(name: str, v: Any, least: int, most: int | None = None) -> int:
    ok = isinstance(v, int) and not isinstance(v, bool) and v >= least and (most is None or v <= most)
    if not ok:
        span = f"{least} or more" if most is None else f"{least} to {most}"
        raise ProbeError(f"{name}: expected a whole number of {span}, not {v!r}", name)
    return int(v)


def _memory() -> int | None:
    """The machine's physical memory in bytes (None: not known)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def cache_bytes(g: ModelGeometry, n_ctx: int, ctk: str, ctv: str) -> int:
    """The bytes of K and V of every attention layer for `n_ctx` cells at the cache types."""
    layers = [il for il in range(g.n_layer) if g.attention is None or g.attention[il]]
    per_cell = 0.0
    for il in layers:
        heads = g.n_head_kv[il] if il < len(g.n_head_kv) else 0
        for ty, dim in ((ctk, g.head_dim_k), (ctv, 0 if g.v_less else g.head_dim_v)):
            t = TYPES[ty]
            per_cell += heads * dim * t.block_bytes / t.block_len
    return int(per_cell * n_ctx)


def options(
    model: str, n_ctx: Any, parallel: Any, generate: Any, gpu_layers: Any, ctk: Any, ctv: Any
) -> None:
    """Refuse an option out of range (see the module's docstring) with a :class:`kvfast.errors.ProbeError`."""
    for name, t in (("ctk", ctk), ("ctv", ctv)):
        if t not in TYPES:
            raise ProbeError(f"{name}: unknown cache type {t!r}: one of {', '.join(TYPES)}", name)
    _whole("parallel", parallel, 1, MAX_SEQ)
    _whole("generate", generate, 0)
    _whole("gpu_layers", gpu_layers, -1)
    n = _whole("n_ctx", n_ctx, 1, 2**32 - 1)
    have = _memory()
    need = cache_bytes(ModelGeometry.from_gguf(model), n, ctk, ctv)
    if have is not None and need > have:
        raise ProbeError(
            f"n_ctx: a context of {n} cells needs {need / 2**30:.1f} GiB of K and V cache ({ctk} / {ctv}), "
            f"more than this machine's {have / 2**30:.1f} GiB of memory: give a smaller context",
            "n_ctx",
        )


@contextlib.contextmanager
def holding(out: Path) -> Iterator[None]:
    """Hold `out`'s probe lock while the block runs; :class:`kvfast.OutputError` (EBUSY) when
    another run holds it."""
    if sys.platform == "win32":
        yield
        return
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(
                errno.EBUSY,
                f"another kvfast probe is writing into this folder (it holds {LOCK}): wait for it to "
                "end, or write into another folder",
                os.fspath(out),
            ) from None
        yield
    finally:
        os.close(fd)


def sweep(out: Path) -> list[Path]:
    """Remove the temporary files a killed run left in `out` (call with its lock held): a capture's,
    and those of the states and manifest it was writing (:func:`kvfast.writing.output.sweep`: only
    those whose writer is gone)."""
    gone = []
    finals = set()
    for name in os.listdir(out):
        if _TEMPORARY.match(name):
            with contextlib.suppress(FileNotFoundError):
                (out / name).unlink()
                gone.append(out / name)
        elif m := _WRITTEN.match(name):
            finals.add(m.group(1))
    for final in sorted(finals):
        gone += output.sweep(out / final)
    return gone


def exclusive(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` (:func:`kvfast.probe.runner.run`) with its options checked first, its output folder
    held for it alone and swept of a killed run's temporary files."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        a = sig.bind(*args, **kwargs)
        a.apply_defaults()
        o = a.arguments
        options(
            os.fspath(o["model"]),
            o["n_ctx"],
            o["parallel"],
            o["generate"],
            o["gpu_layers"],
            o["ctk"],
            o["ctv"],
        )
        if o["shared_prefix"] is not None and not isinstance(o["shared_prefix"], str):
            token_ids("shared prefix", list(o["shared_prefix"]), "shared_prefix")
        out = output.folder(o["out_dir"])
        with holding(out):
            sweep(out)
            return fn(*args, **kwargs)

    return run


def _whole_token(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31


def token_ids(pid: str, tokens: Any, what: str = "tokens") -> list[int]:
    """A prompt's token ids as given: a list of whole numbers 0 to 2**31 - 1 (llama.cpp's
    ``llama_token`` is an int32; ``6.7``, ``"5"``, ``True`` or ``2**32 + 5`` are refused, never
    coerced or wrapped)."""
    if not isinstance(tokens, list | tuple):
        raise ProbeError(
            f"prompt {pid!r}: {what}: expected a list of token ids, found {type(tokens).__name__}", what
        )
    for j, t in enumerate(tokens):
        if not _whole_token(t):
            raise ProbeError(
                f"prompt {pid!r}: {what}[{j}] is {t!r}: expected a token id, a whole number from 0 to "
                f"{2**31 - 1}",
                what,
            )
    return [int(t) for t in tokens]


def prompt_id(pid: str) -> str:
    """A prompt id names the files a run saves (``OUT/<id>.ggsq``): no '/', NUL, '..', and no
    leading '.' (a hidden file that scans and exports skip)."""
    if pid in ("", ".", "..") or os.path.basename(pid) != pid or "/" in pid or "\0" in pid:
        raise ProbeError(
            f"prompt id {pid!r}: ids name the states saved (OUT/<id>.ggsq), so no '/' or '..'", "id"
        )
    if pid.startswith("."):
        raise ProbeError(
            f"prompt id {pid!r}: ids name the states saved (OUT/<id>.ggsq), and a name starting with '.' "
            "is a hidden file that scans and exports skip",
            "id",
        )
    return pid


def vocabulary(prompts: Any, prefix: list[int], n_vocab: int) -> None:
    """Every token id of the prompts (``.ids``) and the shared prefix is in the model's vocabulary
    of `n_vocab` tokens (llama.cpp refuses a batch with another)."""
    for pid, ids in [("shared prefix", prefix), *((p.id, p.ids) for p in prompts)]:
        bad = next((t for t in ids if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise ProbeError(
                f"prompt {pid!r}: token id {bad} is not in the model's vocabulary of {n_vocab} tokens "
                f"(0 to {n_vocab - 1})",
                "tokens",
            )
