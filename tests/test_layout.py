"""The package's layout: the module paths before the subpackages still work (deprecated aliases that
warn naming the new path), the package's functions keep their names over those old modules, every
exception class lives in kvfast.errors, and ``import kvfast`` leaves Parquet out."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import kvfast
from kvfast import _aliases, errors

PACKAGE = Path(kvfast.__file__).parent


def run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_import_kvfast_leaves_parquet_out() -> None:
    out = run(
        "import sys, kvfast\nprint(sorted(m for m in sys.modules if m in ('pyarrow.parquet', 'pyarrow.dataset')))"
    )
    assert out.strip() == "[]"


@pytest.mark.parametrize("old", sorted(_aliases.MOVED))
def test_an_old_module_path_is_the_new_module_and_warns(old: str) -> None:
    new = _aliases.MOVED[old]
    code = f"""
import importlib, sys, warnings
import kvfast
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m = importlib.import_module("kvfast.{old}")
assert m is sys.modules["kvfast.{new}"], m
assert m.__name__ == m.__spec__.name == "kvfast.{new}", (m.__name__, m.__spec__.name)
assert [w.category for w in caught] == [DeprecationWarning], caught
assert "kvfast.{new}" in str(caught[0].message), caught[0].message
"""
    run(code)


def test_the_old_paths_in_every_form() -> None:
    code = """
import warnings
warnings.simplefilter("ignore", DeprecationWarning)
import kvfast
import kvfast.write_cells
from kvfast.replay import Replay
import kvfast.probe_guard as g
from kvfast.probe.replay import Replay as R
from kvfast.probe import guard
assert Replay is R and g is guard
assert kvfast.write_cells.cells is kvfast.writing.cells.cells
assert kvfast.rotation.RotationError is kvfast.errors.RotationError
from kvfast import write_tokens
assert write_tokens is kvfast.writing.tokens
# the package's functions keep their names over the old modules of the same name
import kvfast.write
import kvfast.export
import kvfast.compare_scan
from kvfast.write import write
from kvfast.export import ExportError
assert kvfast.write is write and callable(kvfast.write) and write.__module__ == "kvfast.writing.write"
assert callable(kvfast.export) and kvfast.export.__module__ == "kvfast.dataset.export"
assert callable(kvfast.compare_scan) and ExportError is kvfast.ExportError
print("ok")
"""
    assert run(code).strip() == "ok"


def test_the_new_paths_do_not_warn() -> None:
    code = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import kvfast, kvfast.model, kvfast.plot, kvfast.probe, kvfast.dataset, kvfast.analysis, kvfast.cli
    import kvfast.writing.cells, kvfast.probe.guard, kvfast.read.remote, kvfast.dataset.export_parquet
assert not [w for w in caught if "is deprecated: use kvfast." in str(w.message)], caught
assert kvfast.model.ModelGeometry is kvfast.ModelGeometry
assert callable(kvfast.plot.layout) and callable(kvfast.probe.run) and callable(kvfast.cli.main)
assert kvfast.dataset.READS is kvfast.dataset.states.READS
assert kvfast.analysis.compare is kvfast.compare
"""
    run(code)


def test_every_exception_and_warning_class_is_defined_in_errors() -> None:
    defined = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "errors.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases]
                if any(b.endswith(("Error", "Warning", "Exception")) for b in bases):
                    defined.append(f"{path.relative_to(PACKAGE)}: {node.name}")
    assert defined == []
    public = {
        n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Warning | Exception)
    }
    assert public == set(errors.__all__)


def test_load_error_is_a_kvfast_error_and_still_a_runtime_error() -> None:
    from kvfast.probe.replay import LoadError

    assert LoadError is errors.LoadError
    assert issubclass(LoadError, kvfast.KvfastError) and issubclass(LoadError, RuntimeError)
    e = LoadError("refused")
    assert (e.kind, e.offset, e.field) == ("load", None, None)
