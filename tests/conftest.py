import json
import os
from pathlib import Path

import polars as pl
import pytest

import kvfast
from kvfast.dataset import INDEX_SCHEMA
from kvfast.model import ModelGeometry
from kvfast.read.schema import GGML_TYPE

DATA = Path(__file__).parent / "data"
#: Gemma 3 270M's geometry, for its llama-server saves in data/gemma3-270m-server (no GGUF here): 18
#: layers of one 256-wide KV head, every 6th global (cache 0), the others sliding-window (cache 1)
GEMMA_270M = ModelGeometry(
    arch="gemma3",
    n_layer=18,
    head_dim_k=256,
    head_dim_v=256,
    n_head_kv=(1,) * 18,
    swa=tuple(i % 6 < 5 for i in range(18)),
)
# Folders written through the C API (probe.json lists their sequences); llama-server's slot saves
# (gemma3-270m-server) have tests of their own.
_PROBED_ALL = sorted(
    p
    for p in DATA.iterdir()
    if (p / "probe.json").exists() and "seqs" in json.loads((p / "probe.json").read_text())
)
# States of llama_state_seq_get_data_ext's flags (PARTIAL_ONLY, ON_DEVICE) and of an empty
# sequence (make_partial.py; probe.json lists the flags): tested by test_partial.py.
FLAGGED_FOLDERS = [p for p in _PROBED_ALL if "flags" in json.loads((p / "probe.json").read_text())]
_PROBED = [p for p in _PROBED_ALL if p not in FLAGGED_FOLDERS]
# States of memories other than one plain KV cache (V-less MLA, recurrent, hybrid; probe.json names
# the memory): written by make_memories.py and tested by test_memories.py.
MEMORY_FOLDERS = [p for p in _PROBED if "memory" in json.loads((p / "probe.json").read_text())]
FOLDERS = [p for p in _PROBED if p not in MEMORY_FOLDERS]
STATE_FILES = sorted(f for d in FOLDERS for f in d.iterdir() if f.suffix in (".bin", ".ggsq", ".ggsn"))


def probe(folder: Path) -> dict:
    return json.loads((folder / "probe.json").read_text())


@pytest.fixture(params=STATE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def state_file(request: pytest.FixtureRequest) -> Path:
    return request.param


def proc_status_kb(key: str) -> int:
    """A field of /proc/self/status in KiB (RssAnon: the process's own memory; RssFile: mapped pages)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def dataset_table(d: kvfast.State, **kw) -> pl.DataFrame:
    """What a scan or an export holds of the open state `d`: its value table (``to_polars(**kw)``)
    with dump and path, each row's token and piece as ``to_polars(tokens=True)`` joins them, and
    its layer's K and V types from the state's layout (``layer.k_type``, ``layer.v_type``), in
    the columns' order of scans and exports."""
    df = d.to_polars(tokens=True, **kw)
    types = pl.DataFrame(
        [(c.index, ly.index, ly.k_type, ly.v_type) for c in d.caches for s in c.streams for ly in s.layers],
        schema={"cache": pl.UInt8, "layer": pl.UInt16, "k_type": GGML_TYPE, "v_type": GGML_TYPE},
        orient="row",
    ).unique(["cache", "layer"])
    df = df.join(types, on=["cache", "layer"], how="left", maintain_order="left")
    real = os.path.realpath(d.path)
    df = df.with_columns(dump=pl.lit(kvfast.dump_id(real)), path=pl.lit(real))
    return df.select([*INDEX_SCHEMA, *(["values"] if "values" in df.columns else [])])


def model_with_vocab(path: Path, pieces: list[str], tokenizer: str = "llama") -> None:
    """tiny-qwen3's geometry with a vocabulary (``tokenizer.ggml.tokens``) of `pieces`."""
    import gguf

    src = gguf.GGUFReader(DATA / "models/tiny-qwen3.gguf")
    w = gguf.GGUFWriter(str(path), "qwen3")
    for field in src.fields.values():
        if field.name.startswith("qwen3."):
            v = field.contents()
            if isinstance(v, int):
                w.add_uint32(field.name, v)
            elif isinstance(v, float):
                w.add_float32(field.name, v)
    w.add_tokenizer_model(tokenizer)
    w.add_token_list(pieces)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
