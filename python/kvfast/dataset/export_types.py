"""The values' type of an export with ``dtype=None``: one type for the whole output folder.

Every file of OUT then has the same schema, so every engine reads it alike: float16 when every state
of the run and every state already in OUT is f16, else float32. The states already there are known
from their markers (``values``: the types of their files; older markers, from their options).
"""

from __future__ import annotations

import json
from pathlib import Path

from kvfast.dataset.export_commit import MARKER
from kvfast.dataset.states import dump_id, value_types
from kvfast.errors import KvfastError, warn
from kvfast.read.opening import Opening
from kvfast.read.state import State


def _types_in(out: Path, skip: set[str]) -> set[str]:
    """The value types of the states already exported into `out` (but those in `skip`)."""
    found: set[str] = set()
    if not out.is_dir():
        return found
    for marker in out.glob(f"*/{MARKER}"):
        if marker.parent.name in skip:
            continue
        try:
            saved = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        opts = saved.get("options", {})
        if opts.get("what") != "values":
            continue
        found |= set(saved.get("values") or ["float16" if opts.get("dtype") is None else "float32"])
    return found


def one_type(files: dict[str, str], out: Path, opening: Opening) -> str | None:
    """The values type of a whole export (``dtype=None``): float16 (None) when every state of
    this run and every other state already in `out` is f16, else ``"float32"``."""
    dumps = [d for d in (_try_open(f, opening) for f in files) if d is not None]
    dtype = None if not dumps or value_types(dumps)[0] else "float32"
    for dd in dumps:
        dd.close()
    others = _types_in(out, {dump_id(real) for real in files.values()})
    if dtype is None and "float32" in others:
        return "float32"  # join the float32 states already there: one type in OUT
    if dtype == "float32" and "float16" in others:
        warn(
            "it already holds float16 states and these need float32: its files now mix the two,"
            " which some engines read wrongly (pyarrow casts every file to the first one's type). Read"
            " it with kvfast.scan_export, or export every state again with dtype='float32'.",
            about=str(out),
        )
    return dtype


def _try_open(path: str, opening: Opening) -> State | None:
    """The dump, or None when it fails to open (the export reports it)."""
    try:
        return opening.open(path)
    except (KvfastError, OSError, ValueError):
        return None
