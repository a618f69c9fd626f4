"""kvfast.write in bounded memory: the rows are read from the source as they are written, never
copied whole, and an allocation that fails is a MemoryError, never an abort. Each write runs in a
child process whose address space is limited (RLIMIT_AS) to what it has plus 32 MiB, less than the
64 MB state written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvfast
from kvfast import synth

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")

PYTHON = Path(kvfast.__file__).resolve().parent.parent
HEADROOM = 32 << 20

CHILD = r"""
import resource, sys
import numpy as np
import kvfast

src, out, case, headroom = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def vm_size():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

with kvfast.open(src) as d:
    n = d.caches[0].streams[0].cell_count
    kw = {
        "none": {},
        "keep": {"keep": np.arange(n) % 2 == 0},
        "q8_0": {"cache_type_k": "q8_0", "rotate": False},
        "v f32": {"cache_type_v": "f32"},
    }[case]
    kvfast.write(d, out, **kw)  # once unlimited: the pools and arenas a write makes are made
    limit = vm_size() + headroom
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        kvfast.write(d, out, **kw)
    except MemoryError as e:
        print(e)
        sys.exit(3)
"""


@pytest.fixture(scope="module")
def states(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """64 MB states: 2000 cells of 8 layers of 1024 f16 values; 4000 cells of one layer of 4096,
    V transposed (a 32 MB record, 64 MB as f32)."""
    d = tmp_path_factory.mktemp("big")
    out = {"rows": d / "rows.ggsq", "transposed": d / "transposed.ggsq"}
    synth.write_state(out["rows"], container="ggsq", cells=2000, n_layer=8, n_embd_k=1024)
    synth.write_state(out["transposed"], container="ggsq", cells=4000, n_layer=1, n_embd_k=4096, v_trans=True)
    return out


@pytest.mark.parametrize(
    "state,case,completes",
    [
        ("rows", "none", True),
        ("rows", "keep", True),
        ("rows", "q8_0", True),
        ("transposed", "none", True),
        # a transposed V requantized is gathered whole (one record): 64 MB, past the limit
        ("transposed", "v f32", False),
    ],
)
def test_a_write_under_a_memory_limit_completes_or_raises_memory_error(
    states: dict[str, Path], state: str, case: str, completes: bool, tmp_path: Path
) -> None:
    src, out = states[state], tmp_path / "out.ggsq"
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(src), str(out), case, str(HEADROOM)],
        env={**os.environ, "PYTHONPATH": str(PYTHON)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode in (0, 3), (
        f"the child ended with {r.returncode} (a signal when < 0): {r.stderr[-2000:]}"
    )
    if completes:
        assert r.returncode == 0, r.stdout
        if case == "none":
            assert out.read_bytes() == src.read_bytes()
        else:
            with kvfast.open(out, rotation="none") as e:  # written unrotated
                assert e.caches[0].streams[0].cell_count == (1000 if case == "keep" else 2000)
    else:
        assert r.returncode == 3 and "out of memory" in r.stdout and "transposed v record" in r.stdout
    assert [p.name for p in tmp_path.iterdir()] == (["out.ggsq"] if out.exists() else [])
