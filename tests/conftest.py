import json
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
FOLDERS = sorted(p for p in DATA.iterdir() if (p / "probe.json").exists())
STATE_FILES = sorted(f for d in FOLDERS for f in d.iterdir() if f.suffix in (".bin", ".ggsq", ".ggsn"))


def probe(folder: Path) -> dict:
    return json.loads((folder / "probe.json").read_text())


@pytest.fixture(params=STATE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def state_file(request: pytest.FixtureRequest) -> Path:
    return request.param
