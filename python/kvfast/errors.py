"""kvfast's exceptions.

Every error about the bytes of a state is a :class:`KvfastError` with ``offset`` (the byte offset it
names), ``field`` (the field being read) and ``kind`` (a stable machine-readable name). OS errors
(a missing file, no permission) stay ``OSError`` and its subclasses.
"""

from kvfast._kvfast import (
    AmbiguousError,
    FormatError,
    KvfastError,
    TruncatedError,
    UnsupportedVersionError,
)


class ClosedError(KvfastError, ValueError):
    """The dump was closed; open it again to use it."""

    kind = "closed"
    offset = None
    field = None


class ModelMismatchError(KvfastError, ValueError):
    """The model given does not fit the state (head sizes, layer counts)."""

    kind = "model_mismatch"
    offset = None
    field = None


__all__ = [
    "AmbiguousError",
    "ClosedError",
    "FormatError",
    "KvfastError",
    "ModelMismatchError",
    "TruncatedError",
    "UnsupportedVersionError",
]
