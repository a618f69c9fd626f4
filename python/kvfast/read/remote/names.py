"""What names a remote state: whether a path is a URL, a ``file://`` URL's path, the name that
identifies a state (for ids and deduplication) and a remote state's stable id."""

from __future__ import annotations

import hashlib
import os
import re


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an object in storage (a URL other than ``file://``)."""
    p = os.fspath(path)
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", p)
    return m is not None and m.group(1).lower() not in ("file", "local")


def local_path(path: str | os.PathLike[str]) -> str:
    """A plain path for a ``file://`` URL (and any path)."""
    p = os.fspath(path)
    return p[len("file://") :] if p.lower().startswith("file://") else p


def protocol(url: str) -> str:
    """A URL's protocol, lowercased (``s3``, ``https``, ...)."""
    return url.split("://", 1)[0].lower()


def real(path: str | os.PathLike[str]) -> str:
    """What names a state for ids and deduplication: a URL as given (its protocol lowercased),
    a path as its real path."""
    p = os.fspath(path)
    if is_url(p):
        scheme, rest = p.split("://", 1)
        return f"{scheme.lower()}://{rest}"
    return os.path.realpath(local_path(p))


def dump_id_of_url(url: str) -> str:
    """The stable id of a remote state: the object's stem and 10 hex digits of the URL's SHA-1."""
    u = real(url)
    name = u.rstrip("/").rsplit("/", 1)[-1]
    stem = name.rsplit(".", 1)[0] if "." in name else name
    stem = re.sub(r"[^A-Za-z0-9_.+-]", "_", stem).lstrip("._") or "state"
    return f"{stem}-{hashlib.sha1(u.encode()).hexdigest()[:10]}"
