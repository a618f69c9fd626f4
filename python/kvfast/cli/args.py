"""Argument types and exit codes of the command line.

Exit codes: 0 success; 1 an error with the files (a state or model kvfast cannot read, or that
does not fit; a path given that does not exist); 2 a usage error (an option argparse refuses, a value out of range, or a selection
the state does not have: :class:`kvfast.SelectionError`), reported as argparse reports its own;
141 (128 + SIGPIPE) when the reader of the output went away (``kvfast ... | head``), quietly.
``kvfast probe`` whose llama.cpp died of a signal: 128 + the signal (132 for SIGILL), with a message.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

USAGE = 2
BROKEN_PIPE = 141


def _int(text: str, lo: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < lo:
        raise argparse.ArgumentTypeError(f"{v} is not {what}")
    return v


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _int(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0 (an index)."""
    return _int(text, 0, "an index (0 or more)")


def unit_interval(text: str) -> float:
    """An argparse type: a number from 0 to 1 (a share, such as ``kvfast prune --ratio``)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a share from 0 to 1")
    return v


def require_paths(items: Iterable[str]) -> None:
    """FileNotFoundError (exit 1) for the first of `items` that names no file or folder: a path
    that does not exist, not a glob pattern (which may match nothing here and fails later) or a URL
    (listed remotely)."""
    from kvfast.read import remote

    for item in items:
        if remote.is_url(item) or any(c in item for c in "*?["):
            continue
        if not os.path.exists(remote.local_path(item)):
            raise FileNotFoundError(f"{item}: no such file or directory")
