"""States in object storage: ``kvfast.open("s3://bucket/key")`` without downloading them whole.

A URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, anything `fsspec <https://filesystem-spec.readthedocs.io>`_
has a file system for) is read by ranged requests into a sparse copy of the object (an anonymous
map of its size: pages never fetched cost no memory; an object too large to map is a
:class:`kvfast.RemoteError` naming its size). The walk fetches the object's head, then the cell
metadata and record headers it reads, in a few rounds (kvfast-core's ``sparse``), 256 MiB at
most (``metadata_limit``: a header claiming more cells than that holds is refused before they
are fetched); every later pass (values, tables, statistics, comparisons, scans, exports) first
checks that the object is unchanged (size, ETag, modification time: else
:class:`kvfast.FileChangedError`) and fetches the rows of the records it reads, the pages not
fetched yet, in parallel ranged GETs pinned to the version opened (``If-Match``, S3's
``VersionId``: :mod:`kvfast.read.remote.fetching`). A pass never reads a byte that was not
fetched: that is checked in Rust (:class:`kvfast.NotFetchedError`), never zeros in its place.
``file://`` URLs and plain paths stay memory-mapped.

Credentials and the endpoint come from the standard AWS variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``), or from ``storage_options``
(fsspec's / s3fs's options: ``key``, ``secret``, ``endpoint_url``, ``client_kwargs``, ...), as
Polars and pyarrow take them. Every request has deadlines (connect 10 s, first byte and every
pause 30 s, at least 64 KiB/s in all: :mod:`kvfast.read.remote.limits`), set with
``storage_options={"kvfast": {"connect_timeout": ..., "read_timeout": ..., "min_rate": ...,
"metadata_limit": ...}}``, so an endpoint that does not answer, or trickles, is a
:class:`kvfast.RemoteError`, not a hang.
"""

from __future__ import annotations

from kvfast.read.remote.fetching import PARALLEL, Pin
from kvfast.read.remote.limits import DEFAULT, KEY, Limits
from kvfast.read.remote.names import dump_id_of_url, is_url, local_path, real
from kvfast.read.remote.objects import Fetcher, expand, info, source
from kvfast.read.remote.storage import StorageOptions, Store, filesystem, store

__all__ = [
    "DEFAULT",
    "KEY",
    "PARALLEL",
    "Fetcher",
    "Limits",
    "Pin",
    "StorageOptions",
    "Store",
    "dump_id_of_url",
    "expand",
    "filesystem",
    "info",
    "is_url",
    "local_path",
    "real",
    "source",
    "store",
]
