"""kvfast: read, query and measure llama.cpp KV-cache states.

>>> import kvfast
>>> with kvfast.open(kvfast.sample_path()) as dump:
...     df = dump.to_polars()
"""

import sys
from importlib.resources import files
from typing import TYPE_CHECKING

from kvfast import _aliases
from kvfast import fork as fork  # its fork hooks, registered at import
from kvfast._kvfast import __version__
from kvfast.analysis.compare_scan import compare_scan
from kvfast.analysis.measure import compare
from kvfast.attn import attention
from kvfast.dataset.export import export
from kvfast.dataset.export_read import export_schema, scan_export
from kvfast.dataset.states import dump_id, manifest, scan, scan_stats
from kvfast.errors import (
    AmbiguousError,
    ClosedError,
    ExportError,
    FileChangedError,
    ForkWarning,
    FormatError,
    KvfastError,
    KvfastWarning,
    ManifestWarning,
    MatchError,
    ModelMismatchError,
    NotFetchedError,
    OutputError,
    PreRopeError,
    ProbeError,
    QueriesError,
    RemoteError,
    RotationError,
    RotationWarning,
    SelectionError,
    TokenMismatchWarning,
    TruncatedError,
    UnsupportedVersionError,
    WriteError,
    WriteWarning,
)
from kvfast.model.geometry import ModelGeometry
from kvfast.model.rotation import Rotation
from kvfast.read.floats import upcast
from kvfast.read.state import State, open
from kvfast.read.structure import Cache, Layer, Stream
from kvfast.writing.write import write

#: The former name of :class:`State`, kept so code written against it runs.
Dump = State


def sample_path() -> str:
    """Path of the sample state bundled with kvfast (Gemma 3 270M, 'The cat sat on the mat.', GGSQ 3)."""
    return str(files("kvfast") / "data" / "sample.ggsq")


# The module paths before the subpackages (kvfast.write_cells, kvfast.replay, ...): deprecated
# aliases of the modules at their new paths, all listed in kvfast._aliases.
_aliases.install(sys.modules[__name__])
if not TYPE_CHECKING:
    __getattr__ = _aliases.module_getattr

__all__ = [
    "AmbiguousError",
    "Cache",
    "ClosedError",
    "Dump",
    "ExportError",
    "FileChangedError",
    "ForkWarning",
    "FormatError",
    "KvfastError",
    "KvfastWarning",
    "Layer",
    "ManifestWarning",
    "MatchError",
    "ModelGeometry",
    "ModelMismatchError",
    "NotFetchedError",
    "OutputError",
    "PreRopeError",
    "ProbeError",
    "QueriesError",
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
    "WriteWarning",
    "__version__",
    "attention",
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
