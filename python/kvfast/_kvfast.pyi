"""Stubs of the Rust extension (checked against the built module by `make lint`)."""

from collections.abc import Callable
from os import PathLike
from typing import Any, final

__version__: str
INDEX_COLUMNS: dict[str, str]
KINDS: list[str]
LOSS_COLUMNS: list[str]
MAX_LAYERS: int
MAX_SEQ: int
MAX_VALUES: int
WRITE_VERSIONS: dict[str, list[int]]
__all__ = [
    "INDEX_COLUMNS",
    "KINDS",
    "LOSS_COLUMNS",
    "MAX_LAYERS",
    "MAX_SEQ",
    "MAX_VALUES",
    "WRITE_VERSIONS",
    "AmbiguousError",
    "ArrowStream",
    "ByteView",
    "FileChangedError",
    "FormatError",
    "KvfastError",
    "NotFetchedError",
    "State",
    "TruncatedError",
    "UnsupportedVersionError",
    "__version__",
    "aggregate_stats",
    "attention",
    "attention_dense",
    "attention_layers",
    "attention_map",
    "cell_stats",
    "compare",
    "compare_positions",
    "ggml_types",
    "gguf_metadata",
    "gguf_vocab",
    "model_rope",
    "open",
    "quant_error",
    "quantize",
    "read_model",
    "rotation_group",
    "walk_hints",
    "write_parquet",
    "write_state",
]

class KvfastError(Exception):
    offset: int | None
    field: str | None
    kind: str

class FormatError(KvfastError): ...
class TruncatedError(FormatError): ...
class AmbiguousError(FormatError): ...
class UnsupportedVersionError(KvfastError): ...
class FileChangedError(KvfastError): ...
class NotFetchedError(KvfastError): ...

@final
class ByteView:
    def __len__(self) -> int: ...
    @property
    def address(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

@final
class ArrowStream:
    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object: ...
    @property
    def num_rows(self) -> int: ...
    @property
    def num_batches(self) -> int: ...

@final
class State:
    def __new__(
        cls,
        path: str | PathLike[str],
        cell_ext: bool | None = None,
        mmap: bool = True,
        v_less: bool | None = None,
        recurrent: tuple[int, int] | None = None,
    ) -> State: ...
    @property
    def fetched(self) -> tuple[int, int, int]: ...
    def prefetch(
        self,
        caches: list[int] | None = None,
        layers: list[int] | None = None,
        kinds: list[str] | None = None,
    ) -> None: ...
    @staticmethod
    def from_bytes(
        data: bytes,
        cell_ext: bool | None = None,
        v_less: bool | None = None,
        recurrent: tuple[int, int] | None = None,
    ) -> State: ...
    @property
    def head_dims(self) -> tuple[int | None, int | None]: ...
    @property
    def model_layers(self) -> list[list[int] | None]: ...
    def records(self) -> ArrowStream: ...
    def value_plan(self) -> tuple[str, list[int]] | None: ...
    @property
    def rotation(self) -> list[list[int]]: ...
    def rule_group(self, cache: int, kind: str, type_name: str) -> int | None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def map_address(self) -> int: ...
    def info(self) -> dict[str, Any]: ...
    def floats_at(self, offset: int, n: int) -> ByteView: ...
    def caches(self) -> list[dict[str, Any]]: ...
    def regions(self) -> dict[str, list[Any]]: ...
    def rows(
        self, cache: int, stream: int, layer: int, kind: str, dtype: str | None = None, stored: bool = False
    ) -> tuple[ByteView, str, int, int, bool]: ...
    def table(
        self,
        caches: list[int] | None = None,
        layers: list[int] | None = None,
        kinds: list[str] | None = None,
        heads: list[int] | None = None,
        dtype: str | None = None,
        with_values: bool = True,
    ) -> ArrowStream: ...

def open(
    path: str | PathLike[str],
    *,
    size: int | None = None,
    fetch: Callable[[list[tuple[int, int]]], list[bytes]] | None = None,
    cell_ext: bool | None = None,
    mmap: bool = True,
    head_dim: int | None = None,
    model: Any = None,
    rotation: str = "auto",
    hint: tuple[bool, str] | None = None,
    pre_rope: bool = False,
    rope: Callable[[int], dict[str, Any]] | None = None,
    metadata_limit: int | None = None,
) -> tuple[State, dict[str, Any]]: ...
def gguf_metadata(path: str | PathLike[str]) -> dict[str, Any]: ...
def ggml_types() -> dict[str, tuple[int, int, int, int]]: ...
def attention_map(model: Any, cache_layers: list[int]) -> list[list[int]]: ...
def walk_hints(model: Any) -> tuple[bool | None, tuple[int, int] | None]: ...
def gguf_vocab(path: str | PathLike[str]) -> list[str] | None: ...
def read_model(path: str | PathLike[str]) -> dict[str, Any]: ...
def model_rope(path: str | PathLike[str], head_dim_k: int) -> dict[str, dict[str, Any]]: ...
def cell_stats(state: State, sel: dict[str, Any], skip_first: int) -> ArrowStream: ...
def aggregate_stats(
    state: State, sel: dict[str, Any], skip_first: int
) -> tuple[ArrowStream, ArrowStream, ArrowStream]: ...
def quant_error(
    state: State, type_name: str, sel: dict[str, Any], skip_first: int, rotate: tuple[int, int]
) -> tuple[ArrowStream, ArrowStream]: ...
def rotation_group(kind: str, type_name: str, head_dim: int | None) -> int | None: ...
def write_state(
    sources: list[State], edits: list[dict[str, Any]], path: str | PathLike[str], target: dict[str, Any]
) -> int: ...
def quantize(type_name: str, values: list[float] | Any) -> bytes: ...
def compare(a: State, b: State, sel: dict[str, Any]) -> tuple[ArrowStream, ArrowStream]: ...
def compare_positions(
    a: State, b: State, sel: dict[str, Any], below: int | None = None
) -> tuple[ArrowStream, ArrowStream]: ...
def attention_layers(model: str | PathLike[str]) -> list[dict[str, Any]]: ...
def attention(
    state: State,
    model: str | PathLike[str],
    values: Any,
    row_len: int,
    pos: Any,
    seq: Any,
    blocks: list[tuple[int, int, int, int]],
    what: list[str],
    k: int = 0,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    scale: dict[int, float] | None = None,
    sinks: dict[int, list[float]] | None = None,
    incomplete: str = "error",
    chunk: int = 64,
) -> list[ArrowStream]: ...
def attention_dense(
    state: State,
    model: str | PathLike[str],
    values: Any,
    row_len: int,
    pos: Any,
    seq: Any,
    blocks: list[tuple[int, int, int, int]],
    layer: int,
    heads: list[int] | None = None,
    scale: dict[int, float] | None = None,
    sinks: dict[int, list[float]] | None = None,
    incomplete: str = "error",
    chunk: int = 64,
    cells: tuple[int | None, int | None] | None = None,
) -> tuple[Any, dict[str, Any]]: ...
def write_parquet(
    state: State,
    parts: list[tuple[str, list[tuple[int, int, str]], str | None]],
    dump: str,
    path: str,
    index_schema: bytes,
    tokens: list[tuple[int, int, list[int], list[int]]],
    pieces: list[str],
    advance: Callable[[int], object],
    zstd: int | None = None,
    split: bool = False,
    page_bytes: int = 1048576,
    row_group_bytes: int = 67108864,
) -> list[tuple[int, str | None]]: ...
