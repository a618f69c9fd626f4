"""Reading a queries sidecar (``<id>.queries.json`` beside its ``.npy``) as untrusted input: every
entry is checked against what the format says before a vector is used, and what does not fit is a
:class:`~kvfast.errors.QueriesError` naming the file, the entry and what was expected."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvfast.errors import QueriesError
from kvfast.read import regular


class Sidecar:
    """A sidecar's checked contents: the values (memory-mapped), the rows' positions and sequences,
    and per layer its entry (``model_layer``, ``offset``, ``n_head``, ``head_dim``, optional
    ``llama_scale`` and ``sinks``)."""

    def __init__(self, path: Path, fmt: str, version: int) -> None:
        self.path = path
        try:
            text = regular.read_text(path)
        except UnicodeDecodeError as e:
            raise self.error("not UTF-8 text", None, e.start) from None
        try:
            side = json.loads(text)
        except json.JSONDecodeError as e:
            raise self.error(f"not JSON ({e.msg} at line {e.lineno} column {e.colno})", None, e.pos) from None
        if not isinstance(side, dict) or side.get("format") != fmt or side.get("version") != version:
            raise self.error(f"not a kvfast queries sidecar of version {version}", "format")
        self.side: dict[str, Any] = side
        rows, width = self.shape()
        self.values = self.load_values(rows, width)
        self.pos = self.ints("rows.pos", self.entry("rows", dict).get("pos"), rows)
        self.seq = self.ints("rows.seq", self.side["rows"].get("seq"), rows)
        token = self.side["rows"].get("token")
        self.token = None if token is None else self.ints("rows.token", token, rows)
        self.layers = self.check_layers(width)
        model = side.get("model")
        self.model = model if isinstance(model, str) else None

    def error(self, what: str, field: str | None, offset: int | None = None) -> QueriesError:
        where = f" ({field})" if field else ""
        return QueriesError(f"{self.path}{where}: {what}", field, offset)

    def entry(self, name: str, kind: type) -> Any:
        v = self.side.get(name)
        if not isinstance(v, kind):
            raise self.error(f"expected a {kind.__name__}, found {type(v).__name__}", name)
        return v

    def shape(self) -> tuple[int, int]:
        s = self.side.get("shape")
        if not (isinstance(s, list) and len(s) == 2 and all(_whole(x) and x >= 0 for x in s)):
            raise self.error(f"expected [rows, width] of whole numbers, found {s!r}", "shape")
        return int(s[0]), int(s[1])

    def load_values(self, rows: int, width: int) -> npt.NDArray[np.float32]:
        name = self.entry("values", str)
        if Path(name).name != name or name in ("", ".", ".."):
            raise self.error(f"expected a file name beside the sidecar, found {name!r}", "values")
        npy = self.path.with_name(name)
        try:
            fd, st = regular.open_regular(npy)  # a FIFO would block np.load: refused at once
            os.close(fd)
            values = np.load(npy, mmap_mode="r", allow_pickle=False)
            # the mapped file as it was: a pass checks it first (truncated, a read would be SIGBUS)
            self.stamp = regular.Stamp.of(npy, st)
        except FileNotFoundError:
            raise self.error(f"{npy} is missing", "values") from None
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.EISDIR, errno.EACCES, errno.EPERM):
                raise  # not a regular file, not readable: the OS error, as for a state
            raise self.error(f"{npy} is not a whole .npy array ({e})", "values") from None
        except (ValueError, EOFError) as e:
            raise self.error(f"{npy} is not a whole .npy array ({e})", "values") from None
        if not isinstance(values, np.ndarray) or values.dtype != np.float32 or values.ndim != 2:
            raise self.error(
                f"{npy} holds {values.dtype} {values.shape}: expected float32 [rows, width]", "values"
            )
        if values.shape != (rows, width):
            raise self.error(f"{npy} holds {values.shape}, the sidecar says {[rows, width]}", "shape")
        return values

    def ints(self, field: str, v: Any, n: int) -> npt.NDArray[np.int32]:
        if not (isinstance(v, list) and len(v) == n and all(_whole(x) and -(2**31) <= x < 2**31 for x in v)):
            found = f"{len(v)} entries" if isinstance(v, list) else type(v).__name__
            raise self.error(f"expected {n} whole numbers of int32 (one per row), found {found}", field)
        return np.asarray(v, dtype=np.int32)

    def check_layers(self, width: int) -> list[dict[str, Any]]:
        layers: list[dict[str, Any]] = self.entry("layers", list)
        seen: set[int] = set()
        for i, x in enumerate(layers):
            here = f"layers[{i}]"
            if not isinstance(x, dict):
                raise self.error(f"expected an object, found {type(x).__name__}", here)
            for key, least in (("model_layer", 0), ("offset", 0), ("n_head", 1), ("head_dim", 1)):
                if not (_whole(x.get(key)) and least <= x[key] < 2**31):
                    raise self.error(
                        f"expected a whole number of at least {least} (and below 2**31), found {x.get(key)!r}",
                        f"{here}.{key}",
                    )
            rotation = x.get("rotation")
            if rotation is not None and not (_whole(rotation) and 0 <= rotation < 2**31):
                raise self.error(
                    f"expected the Hadamard group undone (a whole number, 0: none) or null, found {rotation!r}",
                    f"{here}.rotation",
                )
            softcap = x.get("softcap")
            if softcap is not None and not (_number(softcap) and math.isfinite(softcap) and softcap > 0):
                raise self.error(
                    f"expected a positive soft-cap or null, found {softcap!r}", f"{here}.softcap"
                )
            if x["model_layer"] in seen:
                raise self.error(f"model layer {x['model_layer']} is listed twice", f"{here}.model_layer")
            seen.add(x["model_layer"])
            end = x["offset"] + x["n_head"] * x["head_dim"]
            if end > width:
                raise self.error(f"columns {x['offset']}..{end} lie outside rows of {width}", here)
            scale = x.get("llama_scale")
            if scale is not None and not (_number(scale) and math.isfinite(scale) and scale > 0):
                raise self.error(f"expected a positive scale or null, found {scale!r}", f"{here}.llama_scale")
            sinks = x.get("sinks")
            if sinks is not None and not (
                isinstance(sinks, list) and len(sinks) == x["n_head"] and all(_number(s) for s in sinks)
            ):
                raise self.error(
                    f"expected {x['n_head']} sink logits (one per head) or null", f"{here}.sinks"
                )
        return layers


def _whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)
