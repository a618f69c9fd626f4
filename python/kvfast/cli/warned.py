"""Warnings on the command line: gathered while a command runs, then said once each.

A command that opens forty states would otherwise print forty Python warnings, each with kvfast's
own source line. Here every distinct warning (its class and text) is one line on stderr with the
count and the first states it is about, after the command's own output. With ``-W`` options or
``PYTHONWARNINGS`` set, Python's own handling is left alone.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from kvfast.errors import KvfastWarning

#: How many of the states a warning is about are named.
NAMED = 3


@contextmanager
def gathered(out: TextIO | None = None) -> Iterator[None]:
    """Gather the warnings raised inside, and say them on `out` (stderr) when it ends, also when
    it ends with an error."""
    if sys.warnoptions:
        yield
        return
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for line in summary(seen):
                print(line, file=out or sys.stderr)


def summary(seen: list[warnings.WarningMessage]) -> list[str]:
    """One line per distinct warning: ``kvfast: warning: TEXT (N states: A, B, C and 2 more)``."""
    about: dict[tuple[str, str], list[str | None]] = {}
    for w in seen:
        msg = w.message
        if isinstance(msg, KvfastWarning):
            key, who = (type(msg).__name__, msg.text), msg.about
        else:
            key, who = (w.category.__name__, str(msg)), None
        about.setdefault(key, []).append(who)
    lines = []
    for (name, text), whos in about.items():
        named = list(dict.fromkeys(w for w in whos if w is not None))
        if named:
            more = f" and {len(named) - NAMED} more" if len(named) > NAMED else ""
            which = ", ".join(named[:NAMED])
            where = f" ({len(named)} state{'s' if len(named) > 1 else ''}: {which}{more})"
            if any(isinstance(w.message, KvfastWarning) and w.message.detail for w in seen):
                where += "; `kvfast info STATE` says why for each" if name == "RotationWarning" else ""
        else:
            where = f" ({len(whos)} times)" if len(whos) > 1 else ""
        lines.append(f"kvfast: {name}: {text}{where}")
    return lines
