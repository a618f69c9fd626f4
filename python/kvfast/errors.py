"""kvfast's exceptions.

Every error about the bytes of a state is a :class:`KvfastError` with ``offset`` (the byte offset it
names), ``field`` (the field being read) and ``kind`` (a stable machine-readable name). OS errors
(a missing file, no permission, a path that is not a regular file) stay ``OSError`` and its
subclasses, with ``filename`` set to the path.

Every exception and warning class kvfast defines in Python is defined here; the modules that raise
them import them from here (so ``kvfast.model.rotation.RotationError`` and the like still name them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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


class RotationWarning(UserWarning):
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


class RemoteError(KvfastError, OSError):
    """Object storage could not give a state's bytes: no such object or bucket, no credentials,
    access refused, an endpoint that does not answer (see :mod:`kvfast.read.remote`). An ``OSError``
    with ``filename`` the URL; the message says what was expected."""

    kind = "remote"
    offset = None
    field = None

    def __str__(self) -> str:
        return str(self.strerror)


class MatchError(KvfastError, ValueError):
    """Two states cannot be compared: different caches, layers, row sizes or positions."""

    kind = "match"
    offset = None
    field = None


class ForkWarning(RuntimeWarning):
    """This process was forked while Polars' threads ran: kvfast's own passes work in it, Polars
    operations may never return (see :mod:`kvfast.fork`)."""


class TokenMismatchWarning(UserWarning):
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
    "LoadError",
    "MatchError",
    "ModelMismatchError",
    "NotFetchedError",
    "PreRopeError",
    "ProbeCrashError",
    "RemoteError",
    "RotationError",
    "RotationWarning",
    "SelectionError",
    "TokenMismatchWarning",
    "TruncatedError",
    "UnsupportedVersionError",
    "WriteError",
]
