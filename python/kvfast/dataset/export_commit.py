"""How an export commits a state: staged out of sight, published by one rename, never seen partial.

A state's export is one directory, ``OUT/<state>-<hash>/``, holding its Parquet files (one per
partition, ``layer-3.parquet``, or under ``layer=3/`` folders) and its marker ``_kvfast.json``. It is written in full in a
staging directory first, then published with a single ``rename(2)``, so a reader of ``OUT`` sees all
of a state (files and marker) or none of it, whenever the export is stopped, even by SIGKILL.

- Staging lives beside ``OUT`` (``.<OUT name>.kvfast-staging/``, same file system, so the rename is
  atomic and a ``OUT/**/*.parquet`` glob never sees a file being written). When ``OUT`` is a mount
  point, or its parent cannot be written, staging falls back to ``OUT/_kvfast/staging/``: pyarrow
  datasets skip it (a leading ``_``), but a raw glob then also matches files being written there.
- A state exported before is replaced by an exchange of the two directories (``renameat2`` with
  ``RENAME_EXCHANGE``, Linux); where that is not available the old directory is first moved out of
  ``OUT``, then the new one moved in, so for a moment the state is absent, never partial or doubled.
  A state whose export fails is moved out of ``OUT`` the same way.
- Each run stages under its own directory, locked with ``flock`` while the run lives; a run sweeps
  the staging directories whose lock is free (their process is gone: a crash, a kill) before it
  starts, so leftovers are removed by the next run. Renames into and out of ``OUT``, and the sweep,
  happen under one lock, ``flock`` on the ``OUT`` directory itself, so several processes may export into the same
  ``OUT`` at once, over overlapping states; the last to publish a state wins, and each state is
  whole. Locks are ``flock`` (POSIX systems; network file systems may not honour it), taken with
  :func:`kvfast.writing.output.lock`, as a single file kvfast writes locks its temporary file.
- ``OUT`` is checked first (:func:`kvfast.writing.output.folder`): a path that names a file, a
  device or a FIFO is refused with :class:`kvfast.OutputError`, before any state is read.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

from kvfast.writing.output import folder, lock

META = "_kvfast"
MARKER = "_kvfast.json"


@functools.cache
def _renameat2() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing directories in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False when
    the system or the file system cannot, and then nothing was done."""
    if not sys.platform.startswith("linux"):
        return False
    fn = _renameat2()
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _staging_root(out: Path) -> Path:
    """Beside `out` when a rename from there into `out` is atomic, else inside `out/_kvfast`."""
    parent = out.parent
    if parent != out and not os.path.ismount(out):
        with contextlib.suppress(OSError):
            if os.stat(parent).st_dev == os.stat(out).st_dev:
                root = parent / f".{out.name}.kvfast-staging"
                root.mkdir(exist_ok=True)
                return root
    root = out / META / "staging"
    root.mkdir(parents=True, exist_ok=True)
    return root


class Commit:
    """The staging area of one export run into `out` (see the module's doc). A context manager:
    leaving it removes what the run staged."""

    def __init__(self, out: Path) -> None:
        self.out = Path(os.path.realpath(folder(out)))
        self._threads = threading.Lock()
        self.root = _staging_root(self.out)
        with self.locked():
            self._sweep()
            self.root.mkdir(parents=True, exist_ok=True)
            self.run = Path(tempfile.mkdtemp(prefix="run-", dir=self.root))
            self._run_lock = lock(self.run)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the lock on `out` (against this process's other threads and other processes)."""
        with self._threads:
            fd = lock(self.out)  # the lock is on OUT itself: no lock file
            try:
                yield
            finally:
                if fd is not None:
                    os.close(fd)

    def _sweep(self) -> None:
        """Remove the staging directories of runs that are gone (their lock is free)."""
        if not self.root.is_dir():
            return
        for d in self.root.iterdir():
            if not d.is_dir() or d.is_symlink():
                continue
            try:
                fd = lock(d, blocking=False)
            except OSError:
                continue
            if fd is not None:  # its run is gone
                shutil.rmtree(d, ignore_errors=True)
                os.close(fd)

    def close(self) -> None:
        shutil.rmtree(self.run, ignore_errors=True)
        with self.locked():
            if self._run_lock is not None:
                os.close(self._run_lock)
            if self.root.parent != self.out / META:  # the one beside OUT goes when the last run ends
                with contextlib.suppress(OSError):
                    self.root.rmdir()

    def stage(self, key: str) -> Path:
        """A new empty directory to write one state's export into (made with the umask's mode, as
        it is published as it is)."""
        staged = self.run / f"{key}.{uuid.uuid4().hex}"
        staged.mkdir()
        return staged

    def published(self, key: str) -> Path:
        return self.out / key

    def publish(self, staged: Path, key: str) -> None:
        """Make `staged` the state's export in one step, replacing any earlier one."""
        final = self.published(key)
        old: Path | None = None
        with self.locked():
            if not final.exists():
                os.rename(staged, final)
            elif exchange(staged, final):
                old = staged
            else:
                old = self.run / f"old-{uuid.uuid4().hex}"
                os.rename(final, old)
                os.rename(staged, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def retire(self, key: str) -> None:
        """Take the state's export, if any, out of `out` in one step, then delete it."""
        final = self.published(key)
        old = self.run / f"old-{uuid.uuid4().hex}"
        with self.locked():
            if not final.exists():
                return
            os.rename(final, old)
        shutil.rmtree(old, ignore_errors=True)
