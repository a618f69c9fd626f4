"""Files kvfast writes at a path the user names: the path checked before anything is written, the
file written beside it under a temporary name, published by one rename, never seen partial, never
left behind.

The one helper for every such file: :func:`kvfast.write` (and ``kvfast convert`` / ``prune``), the
Parquet ``-o`` of ``kvfast stats``, ``diff`` and ``manifest``, the probe's states and manifest,
:mod:`kvfast.probe.replay`'s saves; :func:`folder` checks the folder an export or a probe writes
into.

- The path names a regular file (replaced) or nothing yet (made), in a folder that exists. A
  symbolic link is followed: the file it names is replaced and the link stays. A folder (also
  ``""``, ``"."``, a path ending in ``/``), a character or block device, a FIFO or a socket is
  refused with :class:`kvfast.OutputError` saying what it is: kvfast replaces a file by a rename,
  which would turn a device or a FIFO into a regular file.
- The path is none of the write's inputs (the same device and inode, so also through a symbolic or
  a hard link) unless ``replace=True`` (``--replace``): the input is then replaced once the new file
  is whole (an input opened before keeps reading its own, unchanged bytes until it is closed).
- The path is not a state a probe manifest beside it describes (``manifest.parquet`` of
  :mod:`kvfast.probe`, which records how llama.cpp wrote the file: its cache types, tokens and
  rotation, read by :func:`kvfast.open` as the file's): kvfast does not write another file under
  that name, ``replace=True`` or not, nor rewrite a probe's manifest. Write it elsewhere.

The file is written as ``.NAME.PID-N.kvfast-tmp`` beside the path (the same folder, so the rename is
atomic), held under ``flock`` while its write lives, synced before the rename, removed on any
error. A run killed before the rename leaves it; the next write to the same path removes the
temporary files whose lock is free (their process is gone), as the export sweeps its staging
(:mod:`kvfast.dataset.export_commit`). The sweep and the making of a temporary file happen under
``flock`` on the folder, so a temporary file is never swept between its making and its lock.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from kvfast.errors import OutputError
from kvfast.probe import manifest as probe_manifest

if sys.platform != "win32":
    import fcntl

#: The end of a temporary file's name.
SUFFIX = ".kvfast-tmp"
_NEXT = itertools.count()
_NOT_REGULAR = (
    (stat.S_ISDIR, "a folder", errno.EISDIR),
    (stat.S_ISCHR, "a character device", errno.EINVAL),
    (stat.S_ISBLK, "a block device", errno.EINVAL),
    (stat.S_ISFIFO, "a FIFO", errno.EINVAL),
    (stat.S_ISSOCK, "a socket", errno.EINVAL),
)


def lock(path: str | os.PathLike[str], blocking: bool = True) -> int | None:
    """An open descriptor of `path` (a folder or a file) holding an exclusive ``flock`` on it
    (closing it releases the lock); None when `blocking` is off and another process or descriptor
    holds the lock."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    if sys.platform != "win32":
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
    return fd


def _refuse(path: str, code: int, message: str) -> OutputError:
    return OutputError(code, message, path)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def target(
    path: str | os.PathLike[str],
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    replace: bool = False,
    guard_manifest: bool = True,
) -> Path:
    """The file a write to `path` replaces or makes (symbolic links followed), checked by the rules
    of the module's doc; :class:`kvfast.OutputError` says why not. `inputs`: the paths the write
    reads (local ones; others are skipped). `guard_manifest`: False only for the probe runner,
    which writes the states its own manifest lists."""
    raw = os.fspath(path)
    if raw == "":
        raise _refuse(raw, errno.ENOENT, "an empty path: name the file to write")
    if raw.endswith(("/", os.sep)) or os.path.basename(raw) in (".", ".."):
        raise _refuse(raw, errno.EISDIR, "names a folder: name the file to write in it")
    final = Path(os.path.realpath(raw))
    try:
        st: os.stat_result | None = os.stat(final)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what, code = next(((w, c) for f, w, c in _NOT_REGULAR if f(st.st_mode)), ("not a file", errno.EINVAL))
        raise _refuse(
            raw,
            code,
            f"{what}, not a regular file: kvfast writes a new file or replaces a regular one (by a"
            " rename, which would put a regular file in its place); name a file",
        )
    if not final.parent.is_dir():
        code = errno.ENOTDIR if final.parent.exists() else errno.ENOENT
        raise _refuse(raw, code, f"its folder {final.parent} does not exist")
    if guard_manifest:
        m = probe_manifest.describing(final)
        if m is not None:
            raise _refuse(
                raw,
                errno.EEXIST,
                f"the probe manifest {m} describes this file (how llama.cpp wrote it: its cache"
                " types, tokens and rotation, which kvfast.open reads as this file's); kvfast"
                " does not write another file under its name, nor rewrite a probe's manifest:"
                " name a file elsewhere",
            )
    if st is not None and not replace:
        for given in inputs:
            try:
                theirs = os.stat(given)
            except (OSError, TypeError, ValueError):
                continue  # gone, or not a local path
            if _same(st, theirs):
                raise _refuse(
                    raw,
                    errno.EEXIST,
                    f"is the file this write reads ({os.fspath(given)}): writing it would replace"
                    " its input; name another file, or pass replace=True (--replace on the"
                    " command line) to replace it once the new file is whole",
                )
    return final


def folder(path: str | os.PathLike[str]) -> Path:
    """A folder an export or a probe writes into: made when missing; :class:`kvfast.OutputError`
    when the path is empty or names something that is not a folder."""
    raw = os.fspath(path)
    if raw == "":
        raise _refuse(raw, errno.ENOENT, "an empty path: name the folder to write into")
    p = Path(raw)
    try:
        mode: int | None = os.stat(p).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISDIR(mode):
        what = next((w for f, w, _ in _NOT_REGULAR[1:] if f(mode)), "a file")
        raise _refuse(raw, errno.ENOTDIR, f"{what}, not a folder: name the folder to write into")
    p.mkdir(parents=True, exist_ok=True)
    return p


def _stem(final: Path) -> str:
    """The name the temporary files of `final` start with (a digest of a name too long to add to)."""
    name = final.name
    if len(os.fsencode(name)) > 180:
        name = hashlib.sha256(os.fsencode(name)).hexdigest()[:32]
    return f".{name}."


def _pattern(final: Path) -> re.Pattern[str]:
    return re.compile(re.escape(_stem(final)) + r"\d+-\d+" + re.escape(SUFFIX) + "$")


def sweep(final: Path) -> list[Path]:
    """Remove the temporary files of writes to `final` whose process is gone (their lock is free);
    returns them. Writes alive hold their lock and are left alone."""
    if sys.platform == "win32":
        return []
    gone: list[Path] = []
    pattern = _pattern(final)
    try:
        names = [n for n in os.listdir(final.parent) if pattern.match(n)]
    except OSError:
        return gone
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    for n in names:
        p = final.parent / n
        try:
            fd = os.open(p, flags)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its write is alive
            # still the file of that name (a write that ended published it under the final name)
            with contextlib.suppress(OSError):
                if _same(st, os.stat(p, follow_symlinks=False)):
                    os.unlink(p)
                    gone.append(p)
        finally:
            os.close(fd)
    return gone


def _make_temp(final: Path) -> tuple[Path, int]:
    """A new temporary file beside `final`, made and locked under the folder's lock (after the
    sweep), and its descriptor (holding the lock)."""
    try:
        folder_fd: int | None = lock(final.parent)
    except OSError:
        folder_fd = None  # a folder that cannot be read: no lock, the sweep still checks each file's
    try:
        sweep(final)
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
        while True:
            tmp = final.with_name(f"{_stem(final)}{os.getpid()}-{next(_NEXT)}{SUFFIX}")
            try:
                fd = os.open(tmp, flags, 0o666)
            except FileExistsError:
                continue
            break
        if sys.platform != "win32":
            fcntl.flock(fd, fcntl.LOCK_EX)
        return tmp, fd
    finally:
        if folder_fd is not None:
            os.close(folder_fd)


def _sync_folder(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def replacing(
    path: str | os.PathLike[str],
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    replace: bool = False,
    guard_manifest: bool = True,
) -> Iterator[Path]:
    """Write the file at `path` through a temporary file: yields its path (an empty file to write,
    truncating); when the block ends without an error the file is synced and renamed to `path`
    (checked again first), on any error it is removed. The path is checked (:func:`target`) before
    the block runs."""
    inputs = [os.fspath(i) for i in inputs]

    def check() -> Path:
        return target(path, inputs=inputs, replace=replace, guard_manifest=guard_manifest)

    final = check()
    tmp, fd = _make_temp(final)
    try:
        yield tmp
        os.fsync(fd)
        if check() != final:
            raise _refuse(
                os.fspath(path), errno.EAGAIN, "changed while it was written: a link now names another file"
            )
        os.replace(tmp, final)
        _sync_folder(final.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
