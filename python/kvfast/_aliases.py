"""The module paths of kvfast before its subpackages, kept working for a release as deprecated
aliases: ``import kvfast.write_cells``, ``from kvfast.replay import Replay`` and
``import kvfast.probe_guard as g`` give the module at its new path (the same module object, not a
copy) and warn with a :class:`DeprecationWarning` naming that path.

Every alias is listed in :data:`MOVED`, here and nowhere else. :func:`install` puts the finder at
the front of ``sys.meta_path`` and lets ``kvfast.<old name>`` be read as an attribute too.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence

#: old module name (under kvfast) -> its path now (under kvfast)
MOVED: dict[str, str] = {
    "address": "read.address",
    "display": "read.display",
    "floats": "read.floats",
    "ggml": "read.ggml",
    "hexview": "read.hexview",
    "memory": "read.memory",
    "opened": "read.opened",
    "remote": "read.remote",
    "schema": "read.schema",
    "select": "read.select",
    "state": "read.state",
    "structure": "read.structure",
    "tokens": "read.tokens",
    "pre_rope": "model.pre_rope",
    "rotation": "model.rotation",
    "compare_modes": "analysis.compare_modes",
    "compare_scan": "analysis.compare_scan",
    "prune": "analysis.prune",
    "plot_scale": "plot.scale",
    "write": "writing.write",
    "write_cells": "writing.cells",
    "write_tokens": "writing.tokens",
    "export": "dataset.export",
    "export_commit": "dataset.export_commit",
    "export_parquet": "dataset.export_parquet",
    "export_progress": "dataset.export_progress",
    "export_read": "dataset.export_read",
    "export_recurrent": "dataset.export_recurrent",
    "export_types": "dataset.export_types",
    "probe_guard": "probe.guard",
    "probe_manifest": "probe.manifest",
    "replay": "probe.replay",
    "cli_args": "cli.args",
    "cli_views": "cli.views",
    "cli_write": "cli.write",
}

PACKAGE = "kvfast"


def _warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(
        f"{PACKAGE}.{old} is deprecated: use {PACKAGE}.{new} (the old path goes in the next release)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class _Loader(importlib.abc.Loader):
    """Hands out the module at its new path, then gives it back its own spec (the import system
    sets the alias's spec on whatever ``create_module`` returns)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, old = fullname.rpartition(".")
        if package != PACKAGE or old not in MOVED:
            return None
        new = MOVED[old]
        # above: _warn, this, then importlib's frames (which the warnings module skips), then the
        # import statement, which the warning names
        _warn(old, new, stacklevel=3)
        return importlib.machinery.ModuleSpec(fullname, _Loader(f"{PACKAGE}.{new}"))


class _Package(types.ModuleType):
    """kvfast's own module type: a function or class of the package (``kvfast.write``,
    ``kvfast.export``, ``kvfast.compare_scan``) stays what the name means when the deprecated module
    of the same old name is imported (the import system would set the module over it)."""

    def __setattr__(self, name: str, value: object) -> None:
        current = self.__dict__.get(name)
        if (
            name in MOVED
            and isinstance(value, types.ModuleType)
            and current is not None
            and not isinstance(current, types.ModuleType)
        ):
            return
        super().__setattr__(name, value)


def module_getattr(name: str) -> types.ModuleType:
    """``kvfast.<old name>`` read as an attribute (``kvfast.write_cells.cells``): the module at its
    new path, with the deprecation warning."""
    if name not in MOVED:
        raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
    _warn(name, MOVED[name], stacklevel=3)
    module = importlib.import_module(f"{PACKAGE}.{MOVED[name]}")
    setattr(sys.modules[PACKAGE], name, module)  # read once: ``from kvfast import x`` reads it twice
    return module


def install(package: types.ModuleType) -> None:
    """Register the finder (once) and give ``package`` the module type that keeps its functions."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    package.__class__ = _Package
