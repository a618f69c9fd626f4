"""How long a remote read may take and how much an open may fetch: kvfast's own deadlines, the
same for every client (s3fs, fsspec's HTTP), given as ``storage_options={"kvfast": {...}}``.

Every request has three deadlines: ``connect_timeout`` to connect; ``read_timeout`` to the first
byte of the answer, then between any two bytes of it; and the whole request ``connect_timeout +
read_timeout + bytes / min_rate`` (an answer that trickles fails too). A lookup (the object's
size and version) is a request of no bytes; a listing, a request of 16 MiB. A request past a
deadline is abandoned (the client's retries count inside it) and the read fails with
:class:`kvfast.RemoteError`. ``metadata_limit`` bounds the bytes an open fetches to walk a state
(the head, the cells, the record headers). For S3, botocore's ``config_kwargs``
(``connect_timeout``, ``read_timeout``) give the timeouts ``"kvfast"`` does not; the clients'
own timeouts are set from these, and their retries count inside the deadlines."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

#: The key of ``storage_options`` kvfast reads its own options from (never given to fsspec).
KEY = "kvfast"

#: The bytes a listing counts as, for its deadline.
LISTING_BYTES = 16 << 20


@dataclass(frozen=True)
class Limits:
    """kvfast's deadlines and fetch bound for remote reads (see the module)."""

    #: seconds to connect (TCP, TLS)
    connect_timeout: float = 10.0
    #: seconds to the first byte of an answer, and between any two bytes after it
    read_timeout: float = 30.0
    #: bytes a second a request must average: it ends within connect + read + bytes / min_rate
    min_rate: float = 64 * 1024
    #: bytes an open may fetch to walk a state's metadata (the head included)
    metadata_limit: int = 256 << 20

    def deadline(self, nbytes: int) -> float:
        """Seconds a request of ``nbytes`` bytes may take in all."""
        return self.connect_timeout + self.read_timeout + nbytes / self.min_rate

    def says(self) -> str:
        """The deadlines, as an error message names them."""
        return (
            f"connect {self.connect_timeout:g} s, first byte and every pause {self.read_timeout:g} s, "
            f"at least {self.min_rate:g} bytes/s"
        )


DEFAULT = Limits()

_NUMBERS = {f.name for f in fields(Limits)}


def split(storage_options: Mapping[str, Any] | None) -> tuple[Limits, dict[str, Any]]:
    """kvfast's :class:`Limits` (``storage_options["kvfast"]``: a mapping of its fields, or a
    ``Limits``) and the options left for fsspec. Where ``"kvfast"`` does not give a timeout, an
    S3 client's ``config_kwargs`` (botocore's ``connect_timeout``, ``read_timeout``) does."""
    opts = dict(storage_options or {})
    given = opts.pop(KEY, None)
    if isinstance(given, Limits):
        return given, opts
    given = {} if given is None else given
    if not isinstance(given, Mapping):
        raise TypeError(
            f"storage_options[{KEY!r}] must be a dict of {sorted(_NUMBERS)}, not {type(given).__name__}"
        )
    unknown = sorted(set(given) - _NUMBERS)
    if unknown:
        raise ValueError(f"storage_options[{KEY!r}]: unknown {unknown}: expected some of {sorted(_NUMBERS)}")
    for k, v in given.items():
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        if not ok or (k == "metadata_limit" and v != int(v)):
            what = "a whole number of bytes > 0" if k == "metadata_limit" else "a number > 0"
            raise ValueError(f"storage_options[{KEY!r}][{k!r}] must be {what}, not {v!r}")
    values: dict[str, Any] = {k: (int(v) if k == "metadata_limit" else float(v)) for k, v in given.items()}
    config = opts.get("config_kwargs")
    if isinstance(config, Mapping):
        for k in ("connect_timeout", "read_timeout"):
            v = config.get(k)
            if k not in values and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                values[k] = float(v)
    return replace(DEFAULT, **values), opts
