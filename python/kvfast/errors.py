"""kvfast's exceptions.

Every error about the bytes of a state is a :class:`KvfastError` with ``offset`` (the byte offset it
names), ``field`` (the field being read) and ``kind`` (a stable machine-readable name). OS errors
(a missing file, no permission, a path that is not a regular file) stay ``OSError`` and its
subclasses, with ``filename`` set to the path.
"""

from kvfast._kvfast import (
    AmbiguousError,
    FileChangedError,
    FormatError,
    KvfastError,
    NotFetchedError,
    TruncatedError,
    UnsupportedVersionError,
)


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
    head, cell, cache or stream out of range or not an integer, a head repeated, a kind other than
    'k'/'v', a head_dim that is not a positive integer dividing every row."""

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
    access refused, an endpoint that does not answer (see :mod:`kvfast.remote`). An ``OSError``
    with ``filename`` the URL; the message says what was expected."""

    kind = "remote"
    offset = None
    field = None

    def __str__(self) -> str:
        return str(self.strerror)


__all__ = [
    "AmbiguousError",
    "ClosedError",
    "FileChangedError",
    "FormatError",
    "KvfastError",
    "ModelMismatchError",
    "NotFetchedError",
    "PreRopeError",
    "RemoteError",
    "RotationError",
    "RotationWarning",
    "SelectionError",
    "TruncatedError",
    "UnsupportedVersionError",
    "WriteError",
]
