import json
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
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
