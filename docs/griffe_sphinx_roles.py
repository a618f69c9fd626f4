"""A griffe extension: kvfast's docstrings use Sphinx's cross-reference roles (:class:`State`,
:func:`kvfast.open`, :meth:`values`, :mod:`.write`, :data:`READS`, :attr:`rotation`); this turns each
into a mkdocs-autorefs cross-reference (``[`State`][kvfast.read.state.State]``), resolved as Sphinx
would resolve it: a dotted name as written, a leading ``.`` relative to the docstring's package, a
bare name in the scope of the object, then of its parents (their members and imports), then of
``kvfast``. A ``~`` shows the last part only. A name no scope knows is still written as a reference,
so that autorefs fails the strict build on it: a docstring naming a wrong target is caught.

Doctest lines (``>>>`` and their ``...`` continuations) become ``pycon`` code blocks, and a list
right under a paragraph gets the blank line Markdown needs to see a list.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")
#: Names outside kvfast that the docstrings cite (Python's own): shown as code, not linked.
EXTERNAL = frozenset({"faulthandler", "DeprecationWarning", "warnings", "multiprocessing"})


def _lookup(pkg: griffe.Module, path: str) -> str | None:
    """The documented path of ``path``: itself, or for a name merely imported where it is
    named (not exported there), the path of what it imports; None when the package lacks it."""
    for _ in range(8):
        head, _, rest = path.partition(".")
        if head != pkg.name:
            return None
        if not rest:
            return path
        try:
            found = pkg[rest]
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
        if not found.is_alias or found.is_public:
            return path
        path = found.target_path
    return None


def _module(obj: griffe.Object | griffe.Alias) -> griffe.Module:
    while not isinstance(obj, griffe.Module):
        assert obj.parent is not None
        obj = obj.parent
    return obj


def resolve(pkg: griffe.Module, obj: griffe.Object | griffe.Alias, name: str) -> str | None:
    """The path ``name`` means in the docstring of ``obj``, or None when no scope knows it."""
    if name.startswith("."):
        mod = _module(obj)
        base = mod.path if mod.is_init_module else (mod.parent.path if mod.parent else mod.path)
        dots = len(name) - len(name.lstrip("."))
        for _ in range(dots - 1):
            base = base.rpartition(".")[0]
        return _lookup(pkg, f"{base}.{name.lstrip('.')}")
    if (found_path := _lookup(pkg, name)) is not None:
        return found_path
    first, _, rest = name.partition(".")
    scope: griffe.Object | griffe.Alias | None = obj
    while scope is not None:
        if (found_path := _lookup(pkg, f"{scope.path}.{name}")) is not None:
            return found_path
        try:
            found = scope.resolve(first)
        except (griffe.NameResolutionError, AttributeError, KeyError):
            found = None
        if found is not None and (found_path := _lookup(pkg, f"{found}.{rest}" if rest else found)):
            return found_path
        scope = scope.parent
    return _lookup(pkg, f"{pkg.name}.{name}")


LIST_ITEM = re.compile(r"(?:[-*] |\d+\. )")


def _doctests(text: str) -> str:
    out: list[str] = []
    block = False
    for line in text.splitlines():
        code = line.lstrip().startswith((">>>", "..."))
        # Markdown starts a list only after a blank line: a docstring's list right under its
        # paragraph would run into the paragraph
        if not block and LIST_ITEM.match(line) and out and out[-1].strip():
            prev = out[-1]
            if not prev.startswith(" ") and not LIST_ITEM.match(prev):
                out.append("")
        if code and not block:
            out.append("```pycon")
            block = True
        elif not code and block:
            out.append("```")
            block = False
        out.append(line)
    if block:
        out.append("```")
    return "\n".join(out)


def convert(pkg: griffe.Module, obj: griffe.Object | griffe.Alias, text: str) -> str:
    """``text`` with its roles as autorefs references and its doctests as code blocks."""

    def one(m: re.Match[str]) -> str:
        tilde, name = m.group(1), m.group(2).strip()
        shown = name.rpartition(".")[2] if tilde else name.lstrip(".")
        if name in EXTERNAL:
            return f"`{shown}`"
        target = resolve(pkg, obj, name) or name
        return f"[`{shown}`][{target}]"

    return _doctests(ROLE.sub(one, text))


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring of the package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()

        def visit(obj: griffe.Object) -> None:
            if id(obj) in seen:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = convert(pkg, obj, obj.docstring.value)
            for member in obj.members.values():
                if not member.is_alias:
                    assert isinstance(member, griffe.Object)
                    visit(member)

        visit(pkg)
