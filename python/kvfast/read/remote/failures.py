"""Remote failures as kvfast's errors: a client's exception as a :class:`kvfast.RemoteError` that
names the URL, the endpoint and what was expected; a request past its deadline; an object that
changed (:class:`kvfast.FileChangedError`)."""

from __future__ import annotations

import errno
from dataclasses import dataclass

from kvfast.errors import FileChangedError, RemoteError
from kvfast.read.remote.limits import KEY
from kvfast.read.remote.storage import Store


@dataclass
class Progress:
    """What a request got so far: an answer (its status and headers), and bytes of its body."""

    answered: bool = False
    got: int = 0


def failed(url: str, e: BaseException, doing: str, endpoint: str) -> RemoteError:
    """A client's exception as a RemoteError that names the URL, the endpoint and what was expected."""
    if isinstance(e, RemoteError):
        return e
    name = type(e).__name__
    text = str(e) or name
    if isinstance(e, FileNotFoundError):
        why = "no such object (expected an existing object: check the bucket and the key)"
    elif "Credential" in name or "credential" in text.lower():
        why = (
            "no credentials (expected AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, or "
            "storage_options={'key': ..., 'secret': ...}; storage_options={'anon': True} for a public bucket)"
        )
    elif isinstance(e, PermissionError):
        why = "access refused (expected credentials allowed to read the object)"
    elif isinstance(e, TimeoutError) or any(
        w in (name + " " + text).lower() for w in ("connect", "timeout", "timed out")
    ):
        why = f"the endpoint did not answer ({endpoint}; expected a server there that answers in time)"
    else:
        why = f"{name}: {text}"
    return RemoteError(
        errno.ENOENT if isinstance(e, FileNotFoundError) else errno.EIO, f"{url}: {doing} failed: {why}", url
    )


def late(s: Store, doing: str, nbytes: int, progress: Progress) -> RemoteError:
    """A request of ``nbytes`` past one of its deadlines (``progress``: how far it got)."""
    lim = s.limits
    if not progress.answered:
        what = f"{s.endpoint} did not answer in time"
    else:
        what = f"{s.endpoint} sent {progress.got} of {nbytes} bytes, then no more in time"
    return RemoteError(
        errno.ETIMEDOUT,
        f"{s.url}: {doing} failed: {what} (deadlines: {lim.says()}, {lim.deadline(nbytes):g} s in all "
        f"for {nbytes} bytes; storage_options={{{KEY!r}: {{'read_timeout': ..., 'min_rate': ...}}}} sets them)",
        s.url,
    )


def changed(url: str, what: str) -> FileChangedError:
    """The object at ``url`` is no longer the version opened (``what`` moved)."""
    err = FileChangedError(f"{url} changed since it was opened: {what}; open it again")
    err.filename = url  # type: ignore[attr-defined]  # set by the binding too
    return err
