"""What the modules beneath :class:`kvfast.State` read of an open state.

``dump.py`` imports the modules that compute over a state (statistics and comparisons, token text, the
notebook summary); they take the state as an :class:`OpenState`, which ``State`` is, instead of
importing ``State`` back: no import circle, and mypy checks at every call that ``State`` still fits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np
    import numpy.typing as npt

    from kvfast import _kvfast
    from kvfast.model.rotation import Rotation
    from kvfast.read.structure import Cache, Recurrent


class OpenState(Protocol):
    """An open state, as :class:`kvfast.State` presents it."""

    @property
    def path(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def size(self) -> int: ...
    @property
    def container(self) -> str: ...
    @property
    def version(self) -> int | None: ...
    @property
    def arch(self) -> str | None: ...
    @property
    def tokens(self) -> npt.NDArray[np.int32] | None: ...
    @property
    def pieces(self) -> list[str] | None: ...
    @property
    def vocabulary(self) -> list[str] | None: ...
    @property
    def row_bytes(self) -> int: ...
    @property
    def output_bytes(self) -> int: ...
    @property
    def meta_bytes(self) -> int: ...
    @property
    def caches(self) -> list[Cache]: ...
    @property
    def recurrent(self) -> Recurrent | None: ...
    @property
    def rotation(self) -> list[Rotation]: ...
    @property
    def head_dim_k(self) -> int | None: ...
    @property
    def head_dim_v(self) -> int | None: ...
    @property
    def _model_layers(self) -> list[list[int] | None]: ...
    def _live(self) -> _kvfast.State: ...

    def _reading(
        self,
        caches: Sequence[int] | None = None,
        kinds: Sequence[str] | None = None,
        stored: bool = False,
    ) -> _kvfast.State: ...
