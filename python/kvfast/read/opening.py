"""``Opening``: how states are opened, one value for every state of a scan, an export or a Ray read.

The options of :func:`kvfast.open` that many states share, frozen together; :meth:`Opening.open`
opens one state with them, so every check of the options is the one ``kvfast.open`` does (in the
core: ``pre_rope=True`` without the model's GGUF raises :class:`kvfast.PreRopeError` at open).
It is picklable (plain fields) for Ray's workers: a model given as a path stays a path (made
absolute), and each open reads its GGUF in Rust where it runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvfast.model.geometry import ModelGeometry
from kvfast.model.rotation import Mode
from kvfast.read.state import State, open


@dataclass(frozen=True)
class Opening:
    """The options every state of a read or an export is opened with (see :func:`kvfast.open`)."""

    head_dim: int | None = None
    #: The model: its GGUF file (a path, kept as an absolute path string) or its geometry.
    model: str | os.PathLike[str] | ModelGeometry | None = None
    rotation: Mode = "auto"
    #: Keys before RoPE (``model`` must then be the GGUF file: ``kvfast.open`` says so otherwise).
    pre_rope: bool = False
    #: fsspec's options for URLs (those the states were listed with), see :mod:`kvfast.read.remote`.
    storage_options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.model is not None and not isinstance(self.model, ModelGeometry):
            # absolute: Ray's workers do not share the driver's working directory
            object.__setattr__(self, "model", os.path.abspath(os.fspath(self.model)))
        if self.storage_options is not None:
            object.__setattr__(self, "storage_options", dict(self.storage_options))

    def open(self, path: str | os.PathLike[str]) -> State:
        """The state at ``path``, opened with these options."""
        return open(
            path,
            head_dim=self.head_dim,
            model=self.model,
            rotation=self.rotation,
            pre_rope=self.pre_rope,
            storage_options=self.storage_options,
        )

    def geometry(self) -> ModelGeometry | None:
        """The model's geometry: as given, or read from its GGUF's header (None: no model)."""
        if self.model is None or isinstance(self.model, ModelGeometry):
            return self.model
        return ModelGeometry.from_gguf(self.model)
