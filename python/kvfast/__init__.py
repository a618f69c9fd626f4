"""kvfast: read, query and measure llama.cpp KV-cache states.

>>> import kvfast
>>> with kvfast.open(kvfast.sample_path()) as dump:
...     df = dump.to_polars()
"""

from importlib.resources import files

from kvfast._kvfast import __version__
from kvfast.dump import Cache, Dump, Layer, Stream, open
from kvfast.errors import (
    AmbiguousError,
    ClosedError,
    FormatError,
    KvfastError,
    TruncatedError,
    UnsupportedVersionError,
)


def sample_path() -> str:
    """Path of the sample state bundled with kvfast (Gemma 3 270M, 'The cat sat on the mat.', GGSQ 3)."""
    return str(files("kvfast") / "data" / "sample.ggsq")


__all__ = [
    "AmbiguousError",
    "Cache",
    "ClosedError",
    "Dump",
    "FormatError",
    "KvfastError",
    "Layer",
    "Stream",
    "TruncatedError",
    "UnsupportedVersionError",
    "__version__",
    "open",
    "sample_path",
]
