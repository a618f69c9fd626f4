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


__all__ = [
    "AmbiguousError",
    "ClosedError",
    "FormatError",
    "KvfastError",
    "TruncatedError",
    "UnsupportedVersionError",
]
