"""Every README snippet runs as written: the Python blocks in order in one namespace, and the shell
blocks of kvfast commands, from a folder that has the repository's tests/data (the paths they name)."""

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from s3_server import moto_s3

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PY_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
# set-up (make) and installation (pip, llama.cpp's CUDA build, a GGUF of your own) blocks are
# exercised by make itself and by the probe tests
SH_BLOCKS = [b for b in re.findall(r"```sh\n(.*?)```", README, re.DOTALL) if b.lstrip().startswith("S=")]


@pytest.fixture()
def in_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "data").symlink_to(ROOT / "tests" / "data")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_there_are_snippets() -> None:
    assert len(PY_BLOCKS) >= 4 and len(SH_BLOCKS) == 1


def test_python_snippets_run(in_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    ns: dict[str, object] = {}
    exec("import kvfast\nimport polars as pl\n", ns)  # noqa: S102 (the README is the code under test)
    with contextlib.ExitStack() as stack:
        if any("s3://" in b for b in PY_BLOCKS):
            # the bucket the object-storage snippet reads: moto's S3 server, the states of a folder
            import fsspec

            for k, v in stack.enter_context(moto_s3()).items():
                monkeypatch.setenv(k, v)
            fs = fsspec.filesystem("s3", skip_instance_cache=True)
            fs.mkdir("kvfast-readme")
            for p in sorted((ROOT / "tests/data/qwen3tiny-f16-fa").iterdir()):
                if p.suffix in (".bin", ".ggsq", ".ggsn"):
                    fs.put(str(p), f"kvfast-readme/runs/{p.name}")
        for block in PY_BLOCKS:
            exec(compile(block, "README.md", "exec"), ns)  # noqa: S102
    assert list(in_copy.glob("parquet/*/layer-1.parquet"))


def test_shell_snippets_run(in_copy: Path) -> None:
    pytest.importorskip("matplotlib")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for block in SH_BLOCKS:
        r = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block], capture_output=True, text=True, env=env, check=False
        )
        assert r.returncode == 0, r.stderr
    for png in ("layout.png", "k.png", "stats.png", "diff.png"):
        assert (in_copy / png).stat().st_size > 1000
