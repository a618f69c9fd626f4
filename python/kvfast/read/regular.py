"""Files kvfast reads from Python (a queries sidecar and its ``.npy``, a probe's prompts file) as
kvfast-core reads states and models: regular files only, opened without blocking (a FIFO, a socket
or a device is refused at once with an ``OSError``, ``errno.EINVAL``, never waited on), and a mapped
file's stamp, to tell before a pass reads it whether it changed (truncated under a map, its next
read would kill the process with SIGBUS: :class:`kvfast.FileChangedError` instead)."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from kvfast.errors import FileChangedError

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """An open descriptor of `path` and its status, if it is a regular file (symbolic links
    followed): a folder is an ``IsADirectoryError``, anything else not regular an ``OSError``
    (``EINVAL``), each with ``filename`` set."""
    fd = os.open(path, _FLAGS)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        return fd, st
    os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", os.fspath(path))
    what = next((w for f, w in _KINDS if f(st.st_mode)), "not a file")
    raise OSError(errno.EINVAL, f"{what}, not a regular file (kvfast reads regular files)", os.fspath(path))


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a regular file (see :func:`open_regular`)."""
    fd, _ = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def read_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of a regular file (``UnicodeDecodeError`` when it is not)."""
    return read_bytes(path).decode()


@dataclass(frozen=True)
class Stamp:
    """A file's identity, size and modification time when it was mapped."""

    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike[str], st: os.stat_result) -> Stamp:
        return cls(os.fspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def check(self) -> None:
        """:class:`kvfast.FileChangedError` when the path no longer names the file as it was."""
        try:
            st = os.stat(self.path)
        except OSError:
            raise self._changed("the path no longer names it") from None
        if (st.st_dev, st.st_ino) != (self.dev, self.ino):
            raise self._changed("the path now names another file")
        if st.st_size != self.size:
            raise self._changed(f"its size went from {self.size} to {st.st_size} bytes")
        if st.st_mtime_ns != self.mtime_ns:
            raise self._changed("it was written to (its modification time moved)")

    def _changed(self, what: str) -> FileChangedError:
        err = FileChangedError(f"{self.path} changed since it was opened: {what}; open it again")
        err.filename = self.path  # type: ignore[attr-defined]
        return err
