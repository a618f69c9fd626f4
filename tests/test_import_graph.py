"""No import circles: among kvfast's Python modules (counting imports made only for type checking
or inside functions), and among the modules of each Rust crate (``crate::`` paths)."""

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


def python_graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        edges = graph.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    if parts[0] == "kvfast":
                        edges.add(parts[1] if len(parts) > 1 else "__init__")
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                parts = node.module.split(".")
                if parts[0] != "kvfast":
                    continue
                if len(parts) > 1:
                    edges.add(parts[1])
                else:
                    edges.update(a.name for a in node.names if a.name in modules)
        edges &= modules
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
    assert "state" in py["dataset"] and "_kvfast" not in py["structure"]
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
    assert {"write::parts", "values::quantize"} <= core["write::edit"]
    # a folder module is a node; its children are not its uses
    assert core["write"] == set()
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]


def test_python_modules_import_no_circle() -> None:
    assert cycles(python_graph()) == []


@pytest.mark.parametrize("crate", CRATES, ids=lambda p: p.name)
def test_rust_modules_use_no_circle(crate: Path) -> None:
    assert cycles(rust_graph(crate)) == []
