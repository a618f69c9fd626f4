"""kvfast: read, query and measure llama.cpp KV-cache states.

>>> import kvfast
>>> with kvfast.open(kvfast.sample_path()) as dump:
...     df = dump.to_polars()
"""

from importlib.resources import files

from kvfast._kvfast import __version__
from kvfast.analysis import MatchError, compare
from kvfast.compare_modes import TokenMismatchWarning
from kvfast.compare_scan import compare_scan
from kvfast.dataset import dump_id, manifest, scan, scan_stats
from kvfast.errors import (
    AmbiguousError,
    ClosedError,
    FileChangedError,
    FormatError,
    KvfastError,
    ModelMismatchError,
    NotFetchedError,
    PreRopeError,
    RemoteError,
    SelectionError,
    TruncatedError,
    UnsupportedVersionError,
    WriteError,
)
from kvfast.export import ExportError, export
from kvfast.export_read import export_schema, scan_export
from kvfast.floats import upcast
from kvfast.model import ModelGeometry
from kvfast.rotation import Rotation, RotationError, RotationWarning
from kvfast.state import State, open
from kvfast.structure import Cache, Layer, Stream
from kvfast.write import write

#: The former name of :class:`State`, kept so code written against it runs.
Dump = State


def sample_path() -> str:
    """Path of the sample state bundled with kvfast (Gemma 3 270M, 'The cat sat on the mat.', GGSQ 3)."""
    return str(files("kvfast") / "data" / "sample.ggsq")


__all__ = [
    "AmbiguousError",
    "Cache",
    "ClosedError",
    "Dump",
    "ExportError",
    "FileChangedError",
    "FormatError",
    "KvfastError",
    "Layer",
    "MatchError",
    "ModelGeometry",
    "ModelMismatchError",
    "NotFetchedError",
    "PreRopeError",
    "RemoteError",
    "Rotation",
    "RotationError",
    "RotationWarning",
    "SelectionError",
    "State",
    "Stream",
    "TokenMismatchWarning",
    "TruncatedError",
    "UnsupportedVersionError",
    "WriteError",
    "__version__",
    "compare",
    "compare_scan",
    "dump_id",
    "export",
    "export_schema",
    "manifest",
    "open",
    "sample_path",
    "scan",
    "scan_export",
    "scan_stats",
    "upcast",
    "write",
]
