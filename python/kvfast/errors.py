"""kvfast's exceptions.

Every error about the bytes of a state is a :class:`KvfastError` with ``offset`` (the byte offset it
names), ``field`` (the field being read) and ``kind`` (a stable machine-readable name). OS errors
(a missing file, no permission, a path that is not a regular file) stay ``OSError`` and its
subclasses, with ``filename`` set to the path.

Every exception and warning class kvfast defines in Python is defined here; the modules that raise
them import them from here (so ``kvfast.model.rotation.RotationError`` and the like still name them).
Every warning is a :class:`KvfastWarning` raised through :func:`warn`, at the user's call.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kvfast._kvfast import (
    AmbiguousError,
    FileChangedError,
    FormatError,
    KvfastError,
    NotFetchedError,
    TruncatedError,
    UnsupportedVersionError,
)

if TYPE_CHECKING:
    import polars as pl


class ClosedError(KvfastError, ValueError):
    """The dump was closed; open it again to use it."""

    kind = "closed"
    offset = None
    field = None


class ModelMismatchError(KvfastError, ValueError):
    """The model given does not fit the state (head sizes, layer counts), or its metadata is not
    what a model's is (a key of the wrong type or out of range: ``field`` names the key)."""

    kind = "model_mismatch"
    offset = None
    field: str | None = None


class PreRopeError(KvfastError, ValueError):
    """Keys before RoPE were asked for and cannot be given: no model, or a model whose RoPE kvfast
    does not undo (``field`` names the GGUF key or argument)."""

    kind = "pre_rope"
    offset = None
    field: str | None = None

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SelectionError(KvfastError, ValueError):
    """A selection or geometry argument the state does not have or that makes no sense: a layer,
    head, cell, cache or stream out of range or not an integer (a bool or a float is none), a head
    repeated, a kind other than 'k'/'v' ('r'/'s' of the recurrent part), a head_dim that is not a
    positive integer dividing every row, a dtype or cache type that is no name of one (see
    :mod:`kvfast.read.select`)."""

    kind = "selection"
    offset = None
    field = None


class RotationError(KvfastError, ValueError):
    """``rotation='hadamard'`` where the group llama.cpp rotated in cannot be known (no head size)."""

    kind = "rotation"
    offset = None
    field = None


class KvfastWarning(UserWarning):
    """Base of kvfast's warnings. ``about`` names what a warning is about (a state's path; None:
    the call as a whole), ``text`` says what, without it, and ``detail`` what differs from one
    state to the next (the evidence); the message is ``"ABOUT: TEXT DETAIL"``."""

    def __init__(self, text: str, about: str | None = None, detail: str | None = None) -> None:
        said = text if detail is None else f"{text} {detail}"
        super().__init__(said if about is None else f"{about}: {said}")
        self.text = text
        self.about = about
        self.detail = detail


class RotationWarning(KvfastWarning):
    """kvfast could not be sure whether, or in which group, a quantized cache is stored rotated."""


class WriteError(KvfastError, ValueError):
    """An edit :func:`kvfast.write` cannot make: ``field`` names the argument (or the state's
    field) and what was expected."""

    kind = "write"
    offset: int | None = None
    field: str | None = None

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class WriteWarning(KvfastWarning):
    """A state :func:`kvfast.write` wrote loads into llama.cpp only on a condition worth knowing
    (a whole state of sequence 3 only into a context of at least 4 sequences)."""


class RemoteError(KvfastError, OSError):
    """Object storage could not give a state's bytes: no such object or bucket, no credentials,
    access refused, an endpoint that does not answer (see :mod:`kvfast.read.remote`). An ``OSError``
    with ``filename`` the URL; the message says what was expected."""

    kind = "remote"
    offset = None
    field = None

    def __str__(self) -> str:
        return str(self.strerror)


class OutputError(KvfastError, OSError):
    """kvfast does not write a file at this path (see :mod:`kvfast.writing.output`): it names no
    regular file and no new one (a folder, a device, a FIFO, a socket, an empty path, a folder that
    does not exist), it is an input of the write (unless ``replace=True``), or a probe manifest
    beside it describes it. An ``OSError`` with ``filename`` the path; the message says why and
    what to do instead."""

    kind = "output"
    offset = None
    field = "path"

    def __str__(self) -> str:
        return f"{self.filename or repr(self.filename)}: {self.strerror}"


class MatchError(KvfastError, ValueError):
    """Two states cannot be compared: different caches, layers, row sizes or positions."""

    kind = "match"
    offset = None
    field = None


class ForkWarning(KvfastWarning, RuntimeWarning):
    """This process was forked while Polars' threads ran: kvfast's own passes work in it, Polars
    operations may never return (see :mod:`kvfast.fork`)."""


class ManifestWarning(KvfastWarning):
    """A probe manifest beside a state names it but does not describe it (its recorded size or
    tokens are not the file's: another run's manifest): what it recorded is not used."""


class TokenMismatchWarning(KvfastWarning):
    """Two states compared position for position hold different tokens at some positions."""


class ExportError(KvfastError):
    """A state failed and ``on_error='fail'`` (``.report`` holds what was done before the batch
    stopped), or the output folder is not a kvfast export (``.report`` is empty)."""

    kind = "export"
    offset = None
    field = None

    def __init__(self, message: str, report: pl.DataFrame) -> None:
        super().__init__(message)
        self.report = report


class LoadError(KvfastError, RuntimeError):
    """llama.cpp refused a state (its log says why)."""

    kind = "load"
    offset = None
    field = None


class ProbeCrashError(KvfastError):
    """llama.cpp (or the Python running it) died of a signal during a probe; ``.signal`` is its
    number (``signal.SIGILL`` when llama-cpp-python was compiled for another CPU)."""

    kind = "probe_crash"
    offset = None
    field = None

    def __init__(self, message: str, signal: int) -> None:
        super().__init__(message)
        self.signal = signal


class ProbeError(KvfastError, ValueError):
    """A probe run kvfast does not start: a prompt it cannot decode as given (``field`` names the
    prompt and its entry: a JSONL line that is not an object, a token id that is not a whole number
    of the model's vocabulary, an id that names no visible file) or an option out of range
    (``field`` names the option: ``n_ctx``, ``parallel``, ...), before llama.cpp sees any."""

    kind = "probe"
    offset = None

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class QueriesError(KvfastError, ValueError):
    """A queries sidecar (``<id>.queries.json`` and its ``.npy``) that is truncated, corrupt or says
    nonsense: ``field`` names the entry, ``offset`` the character of the JSON where it stopped
    parsing (None otherwise)."""

    kind = "queries"

    def __init__(self, message: str, field: str | None = None, offset: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.offset = offset


class ClusterError(KvfastError, RuntimeError):
    """The local cluster did not come up (the message ends with the nodes' logs)."""

    kind = "ray_cluster"
    offset = None
    field = None


__all__ = [
    "AmbiguousError",
    "ClosedError",
    "ClusterError",
    "ExportError",
    "FileChangedError",
    "ForkWarning",
    "FormatError",
    "KvfastError",
    "KvfastWarning",
    "LoadError",
    "ManifestWarning",
    "MatchError",
    "ModelMismatchError",
    "NotFetchedError",
    "OutputError",
    "PreRopeError",
    "ProbeCrashError",
    "ProbeError",
    "QueriesError",
    "RemoteError",
    "RotationError",
    "RotationWarning",
    "SelectionError",
    "TokenMismatchWarning",
    "TruncatedError",
    "UnsupportedVersionError",
    "WriteError",
    "WriteWarning",
]


_PACKAGE = str(Path(__file__).resolve().parent) + "/"
_HELD = threading.local()  # .kept: this thread's warnings, held for another thread to say
T = TypeVar("T")


def warn(
    text: str,
    category: type[KvfastWarning] = KvfastWarning,
    about: str | None = None,
    detail: str | None = None,
) -> None:
    """Warn where the user's call is: the warning names the first frame outside kvfast's package,
    however deep inside kvfast it was raised (Python's default filter then shows it once per
    message and call site)."""
    said = category(text, about, detail)
    kept: list[KvfastWarning] | None = getattr(_HELD, "kept", None)
    if kept is not None:
        kept.append(said)
        return
    level, frame = 1, sys._getframe(0)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    warnings.warn(said, stacklevel=level)


def holding(fn: Callable[..., T], *args: Any) -> tuple[T, list[KvfastWarning]]:
    """``fn(*args)`` in a worker thread, its kvfast warnings held rather than raised there (a
    warning raised in a worker names the thread pool's line): the thread that waits for it says
    them with :func:`say`, at the user's call."""
    kept: list[KvfastWarning] = []
    _HELD.kept = kept
    try:
        return fn(*args), kept
    finally:
        _HELD.kept = None


def say(held: KvfastWarning) -> None:
    """Raise a warning :func:`holding` held, at the user's call."""
    warn(held.text, type(held), held.about, held.detail)
