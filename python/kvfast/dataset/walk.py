"""Glob patterns over local folders, as ``glob.glob`` with ``recursive=True`` matches them, with
two differences that keep a scan or an export of a folder tree bounded and complete:

- ``**`` descends into real folders only, never through a symbolic link to one (two links to a
  parent folder would make ``glob.glob`` walk forever, its memory growing); a pattern's other
  components follow links as glob does (they are as deep as the pattern);
- a folder the pattern must list but cannot (no permission) is an error naming it
  (``PermissionError``, ``filename`` set), not a folder silently left out with its states.

Names starting with ``.`` are matched only by a pattern component that starts with ``.``, as glob
does, and ``**`` does not descend into hidden folders.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator

MAGIC = "*?["


def _magic(part: str) -> bool:
    return any(c in part for c in MAGIC)


def refuse(e: OSError) -> None:
    """``os.walk``'s ``onerror``: a folder it cannot list is an error, not a folder left out."""
    raise e


def _listed(folder: str) -> list[os.DirEntry[str]]:
    with os.scandir(folder or ".") as it:
        return list(it)


def _below(folder: str) -> Iterator[str]:
    """`folder` and every real, visible folder below it (symbolic links not followed)."""
    for here, dirs, _ in os.walk(folder or ".", onerror=refuse):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        yield here if folder else os.path.relpath(here).removeprefix(".")


def _match(folder: str, parts: list[str]) -> Iterator[str]:
    if not parts:
        yield folder
        return
    part, rest = parts[0], parts[1:]
    if part == "**":
        for here in _below(folder):
            if rest:
                yield from _match(here, rest)
            else:
                if here:
                    yield here
                for e in _listed(here):
                    if not e.name.startswith(".") and not e.is_dir(follow_symlinks=False):
                        yield os.path.join(here, e.name)
        return
    if not _magic(part):
        path = os.path.join(folder, part)
        if rest:
            if os.path.isdir(path):
                yield from _match(path, rest)
        elif os.path.lexists(path):
            yield path
        return
    hidden = part.startswith(".")
    for e in _listed(folder):
        if (hidden or not e.name.startswith(".")) and fnmatch.fnmatchcase(e.name, part):
            path = os.path.join(folder, e.name)
            if not rest:
                yield path
            elif e.is_dir():
                yield from _match(path, rest)


def glob(pattern: str) -> list[str]:
    """The paths `pattern` matches, sorted, each once (see the module's docstring)."""
    absolute = pattern.startswith(os.sep)
    parts = [p for p in pattern.split(os.sep) if p not in ("", ".")]
    # a run of ** is one **
    squeezed = [p for i, p in enumerate(parts) if not (p == "**" and i > 0 and parts[i - 1] == "**")]
    found = _match(os.sep if absolute else "", squeezed)
    return sorted(set(found))
