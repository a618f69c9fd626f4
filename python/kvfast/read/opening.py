"""``Opening``: how states are opened, one value for every state of a scan, an export or a Ray read.

The options of :func:`kvfast.open` that many states share, frozen together; :meth:`Opening.open`
opens one state with them, so every check of the options is the one ``kvfast.open`` does (in the
core: ``pre_rope=True`` without the model's GGUF raises :class:`kvfast.PreRopeError` at open).
It is picklable (plain fields) for Ray's workers: a model given as a path stays a path (made
absolute), and each open reads its GGUF in Rust where it runs.

``model`` may map states to models, for a collection of states of several models: each key is a
folder (the states in it and below it) or a glob pattern (``"runs/gemma*/**"``), each value a
GGUF path or a :class:`~kvfast.ModelGeometry`. A state takes the model of the longest key it
falls under; a state no key covers opens as with no model (a probe manifest beside it, if any,
gives its geometry, see :mod:`kvfast.probe.manifest`).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

from kvfast.model.geometry import ModelGeometry
from kvfast.model.rotation import Mode
from kvfast.read.state import State, open

#: One model: a GGUF file or its geometry.
Model: TypeAlias = "str | os.PathLike[str] | ModelGeometry"
#: The ``model`` option of a collection: one model for every state, or a model per folder or glob.
Models: TypeAlias = "Model | Mapping[str, Model] | None"


def _one(model: Model) -> str | ModelGeometry:
    # absolute: Ray's workers do not share the driver's working directory
    return model if isinstance(model, ModelGeometry) else os.path.abspath(os.fspath(model))


def _covers(key: str, path: str) -> bool:
    """Whether the folder or glob `key` covers the state at `path` (both absolute)."""
    if any(c in key for c in "*?["):
        return fnmatch.fnmatch(path, key) or fnmatch.fnmatch(path, os.path.join(key, "*"))
    return path == key or path.startswith(key.rstrip("/") + "/")


@dataclass(frozen=True)
class Opening:
    """The options every state of a read or an export is opened with (see :func:`kvfast.open`)."""

    head_dim: int | None = None
    #: The model: its GGUF file (a path, kept as an absolute path string) or its geometry, or a
    #: mapping of folders and glob patterns to models (see the module's doc).
    model: Models = None
    rotation: Mode = "auto"
    #: Keys before RoPE (``model`` must then be the GGUF file: ``kvfast.open`` says so otherwise).
    pre_rope: bool = False
    #: fsspec's options for URLs (those the states were listed with), see :mod:`kvfast.read.remote`.
    storage_options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.model, Mapping):
            if not self.model:
                raise ValueError("model: an empty mapping (give None for no model)")
            models = {os.path.abspath(os.fspath(k)): _one(v) for k, v in self.model.items()}
            object.__setattr__(self, "model", models)
        elif self.model is not None:
            object.__setattr__(self, "model", _one(self.model))
        if self.storage_options is not None:
            object.__setattr__(self, "storage_options", dict(self.storage_options))

    def model_for(self, path: str | os.PathLike[str]) -> str | ModelGeometry | None:
        """The model the state at `path` opens with: the one model, or the mapping's value of the
        longest key covering it (None: no key does)."""
        if not isinstance(self.model, Mapping):
            return self.model  # type: ignore[return-value]  # made a str by __post_init__
        models = cast("dict[str, str | ModelGeometry]", self.model)  # absolute by __post_init__
        where = os.fspath(path)
        if "://" in where:
            keys = [k for k in models if fnmatch.fnmatch(where, k) or where.startswith(k)]
        else:
            where = os.path.abspath(where)
            real = os.path.realpath(where)
            keys = [k for k in models if _covers(k, where) or _covers(k, real)]
        return models[max(keys, key=len)] if keys else None

    def open(self, path: str | os.PathLike[str]) -> State:
        """The state at ``path``, opened with these options."""
        return open(
            path,
            head_dim=self.head_dim,
            model=self.model_for(path),
            rotation=self.rotation,
            pre_rope=self.pre_rope,
            storage_options=self.storage_options,
        )

    def geometry(self, path: str | os.PathLike[str] | None = None) -> ModelGeometry | None:
        """The geometry of the model the state at `path` opens with (of the one model when
        `path` is None): as given, or read from its GGUF's header (None: no model)."""
        if path is None and isinstance(self.model, Mapping):
            raise ValueError("model is a mapping: say which state's model")
        model = self.model_for(path or "")
        if model is None or isinstance(model, ModelGeometry):
            return model
        return ModelGeometry.from_gguf(model)
