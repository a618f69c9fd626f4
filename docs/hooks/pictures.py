"""A mkdocs hook: before each build, draw the pictures the guide shows (``draw.py``, in a fresh
interpreter so that a served site redraws with the current kvfast) into ``docs/pictures/``
(gitignored). A picture is replaced only when its bytes changed, so ``mkdocs serve`` does not see
its own output as an edit and rebuild forever."""

from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent
ROOT = DOCS.parent
PICTURES = DOCS / "pictures"


def on_pre_build(config: Any, **kwargs: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(
            [sys.executable, str(HERE / "draw.py"), tmp],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            raise RuntimeError(f"drawing the documentation's pictures failed:\n{r.stdout}{r.stderr}")
        PICTURES.mkdir(exist_ok=True)
        for new in sorted(Path(tmp).iterdir()):
            old = PICTURES / new.name
            if not old.exists() or not filecmp.cmp(new, old, shallow=False):
                shutil.copyfile(new, old)
