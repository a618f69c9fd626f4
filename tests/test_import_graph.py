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


def rust_graph(crate: Path) -> dict[str, set[str]]:
    files = {p.stem: p for p in (crate / "src").glob("*.rs") if p.stem not in ("lib", "main")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        text = re.sub(r"//.*", "", path.read_text())
        # a unit test module may use what its module serves (the walker, to build its input)
        text = text.split("#[cfg(test)]\nmod tests")[0]
        used = set(re.findall(r"\bcrate::(\w+)", text))
        for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
            used.update(re.findall(r"\b(\w+)\b", group))
        graph[name] = used & set(files)
    return graph


def test_the_graphs_are_read() -> None:
    py = python_graph()
    assert "state" in py["dataset"] and "_kvfast" not in py["structure"]
    core = rust_graph(ROOT / "rust" / "kvfast-core")
    assert {"cursor", "layout"} <= core["cache"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]


def test_python_modules_import_no_circle() -> None:
    assert cycles(python_graph()) == []


@pytest.mark.parametrize("crate", CRATES, ids=lambda p: p.name)
def test_rust_modules_use_no_circle(crate: Path) -> None:
    assert cycles(rust_graph(crate)) == []
