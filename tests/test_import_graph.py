"""No import circles: among kvfast's Python modules, every subpackage's included (counting imports
made only for type checking or inside functions), and among the modules of each Rust crate
(``crate::`` paths). Python modules also take no private name of another module, import private
modules only from inside their package, and no folder holds more than 15 modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "kvfast"
CRATES = sorted(p.parent for p in (ROOT / "rust").glob("*/src"))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary circle's members, one list per strongly connected component of 2+ nodes
    (or a node importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def python_modules() -> dict[str, Path]:
    """Every Python module of kvfast by its dotted path relative to the package: ``read.state``,
    ``read`` for ``read/__init__.py``, ``__init__`` for kvfast's own ``__init__.py``."""
    out: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        out[".".join(parts)] = path
    return out


def package_of(name: str, path: Path) -> str:
    """The package a module's relative imports start from ("" for kvfast itself)."""
    if path.name == "__init__.py":
        return "" if name == "__init__" else name
    return name.rpartition(".")[0]


def imported(name: str, path: Path, source: str, modules: set[str]) -> list[tuple[str, str | None]]:
    """What a module imports from kvfast: (module imported, name taken from it or None), the
    module a dotted path relative to kvfast ("__init__" for kvfast itself), relative imports
    resolved. ``from kvfast.a import b`` imports module ``a.b`` when there is one, else the name
    ``b`` of ``a``."""
    here = package_of(name, path)
    out: list[tuple[str, str | None]] = []

    def node(dotted: str) -> str:
        return dotted or "__init__"

    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.name == "kvfast" or a.name.startswith("kvfast."):
                    out.append((node(a.name.removeprefix("kvfast").lstrip(".")), None))
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = here.split(".") if here else []
                base = base[: len(base) - (n.level - 1)] if n.level > 1 else base
                target = ".".join([*base, *([n.module] if n.module else [])])
            elif n.module == "kvfast" or (n.module or "").startswith("kvfast."):
                target = (n.module or "").removeprefix("kvfast").lstrip(".")
            else:
                continue
            for a in n.names:
                child = f"{target}.{a.name}" if target else a.name
                if child in modules or a.name == "_kvfast":
                    out.append((child, None))
                else:
                    out.append((node(target), a.name))
    return out


def python_graph() -> dict[str, set[str]]:
    """Module -> the kvfast modules it imports (counting imports made only for type checking or
    inside functions).

    The rule for packages: an edge goes to the module an import names and to nothing above it.
    Importing ``kvfast.read.state`` runs ``kvfast/read/__init__.py`` first, but that is no edge, so
    a package ``__init__`` that re-exports its children (``model`` -> ``model.geometry``) makes no
    circle with them. A child that takes a name from its own package's ``__init__`` (``from
    kvfast.model import X`` inside ``model/``) is an edge to ``model`` and so a circle: it is one
    at import time too (the ``__init__`` may not have bound the name yet).
    """
    modules = python_modules()
    names = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, set())
        edges.update(m for m, _ in imported(name, path, path.read_text(), names))
        edges &= names
    return graph


def rust_module(src: Path, path: Path) -> str:
    """A source file's module path in its crate: ``format/cache.rs`` is ``format::cache``, a
    folder's ``format/mod.rs`` (or ``format.rs`` beside it) is ``format``, the crate root ""."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "mod" or parts == ["lib"] or parts == ["main"]:
        parts.pop()
    return "::".join(parts)


_TOKEN = re.compile(r"\s*(\w+|\*|\{)")
_SEP = re.compile(r"\s*([,}])")
_CLOSE = re.compile(r"\s*\}")
_COLONS = re.compile(r"\s*::")
_LITERAL = re.compile(r'r(#*)".*?"\1|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\\\'])\'', re.DOTALL)


def use_paths(text: str, start: int) -> list[list[str]]:
    """The paths a ``crate::``/``super::`` path at ``text[start:]`` names, groups expanded:
    ``crate::a::{b::X, c::{self, Y}}`` is [crate a b X], [crate a c], [crate a c Y]."""
    pos = start

    def tree(prefix: list[str]) -> list[list[str]]:
        nonlocal pos
        path = list(prefix)
        while True:
            m = _TOKEN.match(text, pos)
            if not m:
                return [path]
            pos = m.end()
            if m[1] == "{":
                out: list[list[str]] = []
                while True:
                    if close := _CLOSE.match(text, pos):
                        pos = close.end()
                        return out
                    out += tree(path)
                    m = _SEP.match(text, pos)
                    if not m:
                        return out
                    pos = m.end()
                    if m[1] == "}":
                        return out
            if m[1] not in ("self", "*"):
                path.append(m[1])
            m = _COLONS.match(text, pos)
            if not m:
                return [path]
            pos = m.end()

    return tree([])


def inline_modules(text: str) -> list[tuple[int, int, str]]:
    """The (start, end, name) of each inline ``mod name { ... }`` of a file (string and char
    literals blanked first, so that their braces do not count)."""
    text = _LITERAL.sub(lambda m: " " * len(m[0]), text)
    out = []
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append((m.start(), i, m[1]))
    return out


def private_imports() -> list[str]:
    """Each import of a private name of another module (``from kvfast.x import _y``, ``from .x
    import _y``) and of a private module (``_x``) from outside the package holding it."""
    modules = python_modules()
    names = set(modules)
    bad: list[str] = []
    for name, path in modules.items():
        for target, taken in imported(name, path, path.read_text(), names):
            private = taken is not None and taken.startswith("_") and not taken.startswith("__")
            if private and target != name:
                bad.append(f"{name} imports {taken} of {target}")
            parts = target.split(".")
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:i])  # the package holding the private module
                    if owner and name != owner and not name.startswith(owner + "."):
                        bad.append(f"{name} imports the private module {target}")
    return bad


def rust_graph(crate: Path) -> dict[str, set[str]]:
    """The modules of a crate (``format::cache``) and the modules each one's ``crate::`` and
    ``super::`` paths name: a path's module is its longest prefix that is a module, so
    ``crate::format::cache::walk`` names ``format::cache`` and ``crate::format::X`` (an item of
    the folder module) ``format``. The crate root (lib.rs) is no node: its re-exports are read,
    so ``crate::State`` names the module ``State`` comes from.

    A folder module's own children are not counted among its uses: its ``mod.rs`` declares them
    and may re-export their items (that is the folder's table of contents, not a use), so a child
    that uses its folder's items is no circle with it. Every other path counts."""
    src = crate / "src"
    files = {rust_module(src, p): p for p in src.rglob("*.rs")}
    root = files.pop("", None)
    modules = set(files)
    reexports: dict[str, str] = {}
    if root is not None:
        text = re.sub(r"//.*", "", root.read_text())
        for m in re.finditer(r"\bpub use\s+", text):
            for path in use_paths(text, m.end()):
                for k in range(len(path), 0, -1):
                    if "::".join(path[:k]) in modules:
                        reexports[path[-1]] = "::".join(path[:k])
                        break
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        text = re.sub(r"//.*", "", path.read_text())
        # a unit test module may use what its module serves (the walker, to build its input)
        text = text.split("#[cfg(test)]\nmod tests")[0]
        inline = inline_modules(text)
        edges = graph.setdefault(name, set())
        for m in re.finditer(r"\b(crate|super)::", text):
            if text[m.start() - 1 : m.start()] == "$":
                continue
            here = name.split("::") + [n for s, e, n in inline if s < m.start() < e]
            for p in use_paths(text, m.start()):
                if p[0] == "crate":
                    full = p[1:]
                else:
                    base = list(here)
                    while p and p[0] == "super":
                        base.pop()
                        p = p[1:]
                    full = base + p
                    if full[: len(name.split("::"))] == name.split("::"):
                        continue  # its own inline module's path
                if len(full) == 1 and full[0] in reexports:
                    edges.add(reexports[full[0]])
                    continue
                for k in range(len(full), 0, -1):
                    target = "::".join(full[:k])
                    if target in modules:
                        if target != name and not target.startswith(name + "::"):
                            edges.add(target)
                        break
    return graph


def test_the_graphs_are_read() -> None:
    py = python_graph()
    assert "read.state" in py["dataset.states"] and "_kvfast" not in py["read.structure"]
    assert "model.geometry" in py["model"] and "read.state" in py["__init__"]
    mods = {"read", "read.state", "read.select", "model", "model.geometry"}
    src = "from . import select\nfrom .select import _x\nfrom ..model import ModelGeometry\nimport kvfast\n"
    assert imported("read.state", PACKAGE / "read" / "state.py", src, mods) == [
        ("read.select", None),
        ("read.select", "_x"),
        ("model", "ModelGeometry"),
        ("__init__", None),
    ]
    assert imported("read", PACKAGE / "read" / "__init__.py", "from .state import X", mods) == [
        ("read.state", "X")
    ]
    text = "crate::a::{b::X, c::{self, Y}, *}; super::d"
    assert use_paths(text, 0) == [
        ["crate", "a", "b", "X"],
        ["crate", "a", "c"],
        ["crate", "a", "c", "Y"],
        ["crate", "a"],
    ]
    assert use_paths(text, text.index("super")) == [["super", "d"]]
    core = rust_graph(ROOT / "rust" / "kvfast-core")
    assert {"format::cursor", "format::layout"} <= core["format::cache"]
    # a path through a crate-root re-export (crate::Error) names its module
    assert "error" in core["stats::tables"] and "format::container" in core["source::state"]
    # kernels' inline x86 module uses super::ChannelSums: kernels itself, no edge
    assert "stats::moments" in core["stats::kernels"] and "stats" not in core["stats::kernels"]
    assert "write::parts" in core["write::edit"] and "values::quantize" in core["write::rows"]
    # a folder module is a node; its children are not its uses (write/mod.rs's own items use others)
    assert "write" in core and not {"write::parts", "write::edit"} & core["write"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]


def test_python_modules_import_no_circle() -> None:
    assert cycles(python_graph()) == []


def test_no_module_imports_a_private_name() -> None:
    assert private_imports() == []


def test_no_folder_holds_more_than_15_modules() -> None:
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    counts = {
        str(f.relative_to(PACKAGE)): len([p for p in f.glob("*.py") if p.name != "__init__.py"])
        for f in folders
    }
    assert {f: n for f, n in counts.items() if n > 15} == {}


@pytest.mark.parametrize("crate", CRATES, ids=lambda p: p.name)
def test_rust_modules_use_no_circle(crate: Path) -> None:
    assert cycles(rust_graph(crate)) == []
