"""Probe manifests beside states: read only when open has neither a model nor a head size, parsed
once per directory while unchanged, and a manifest of another tool gives no hint and no error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import DATA

import kvfast
from kvfast.model import ModelGeometry
from kvfast.probe import manifest as probe_manifest

SEQ = DATA / "qwen3tiny-f16-fa" / "seq-0.ggsq"
GEOMETRY = ModelGeometry.from_gguf(DATA / "models" / "tiny-qwen3.gguf")


def manifest_row(
    state: str | None, whole: str | None = None, pieces: list[str] | None = None
) -> dict[str, object]:
    g = GEOMETRY
    return {
        "prompt_id": state or whole,
        "status": "ok",
        "state": state,
        "whole_state": whole,
        "pieces": pieces or [],
        "arch": g.arch,
        "n_layer": g.n_layer,
        "head_dim_k": g.head_dim_k,
        "head_dim_v": g.head_dim_v,
        "n_head_kv": list(g.n_head_kv),
        "swa": list(g.swa),
        "recurrent": None if g.recurrent is None else list(g.recurrent),
        "attention": None if g.attention is None else list(g.attention),
        "v_less": g.v_less,
        "n_layer_trunk": g.n_layer_trunk,
        "attn_rot": False,
        "llama_build": "test build",
    }


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every manifest read from now on (and nothing remembered from earlier tests)."""
    seen: list[str] = []
    real = probe_manifest._read

    def counting(path: str) -> pl.DataFrame:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(probe_manifest, "_read", counting)
    monkeypatch.setattr(probe_manifest, "_parsed", type(probe_manifest._parsed)())
    return seen


def test_200_states_beside_one_manifest_read_it_once(tmp_path: Path, reads: list[str]) -> None:
    names = [f"p{i:05d}.ggsq" for i in range(200)]
    for n in names:
        shutil.copy(SEQ, tmp_path / n)
    pl.DataFrame([manifest_row(n, pieces=[f"piece of {n}"]) for n in names]).write_parquet(
        tmp_path / probe_manifest.NAME
    )
    for n in names:
        with kvfast.open(tmp_path / n) as d:
            assert (d.head_dim_k, d.head_dim_v) == (GEOMETRY.head_dim_k, GEOMETRY.head_dim_v)
            assert d.pieces == [f"piece of {n}"]
    assert len(reads) == 1
    # a scan opens every state too
    assert kvfast.scan(tmp_path).select("dump").unique().collect().height == 200
    assert len(reads) == 1


def test_a_rewritten_manifest_is_read_again(tmp_path: Path, reads: list[str]) -> None:
    shutil.copy(SEQ, tmp_path / "a.ggsq")
    man = tmp_path / probe_manifest.NAME
    pl.DataFrame([manifest_row("other.ggsq")]).write_parquet(man)
    assert kvfast.open(tmp_path / "a.ggsq").head_dim_k is None
    pl.DataFrame([manifest_row("a.ggsq"), manifest_row("other.ggsq")]).write_parquet(man)
    os.utime(man, ns=(1, 1))  # whatever the clock's resolution: another modification time
    assert kvfast.open(tmp_path / "a.ggsq").head_dim_k == GEOMETRY.head_dim_k
    assert len(reads) == 2


def test_a_whole_state_gets_the_geometry_but_not_the_pieces(tmp_path: Path, reads: list[str]) -> None:
    shutil.copy(SEQ, tmp_path / "batch.state")
    pl.DataFrame([manifest_row("s.ggsq", whole="batch.state", pieces=["x"])]).write_parquet(
        tmp_path / probe_manifest.NAME
    )
    found = probe_manifest.recorded_for(tmp_path / "batch.state")
    assert found is not None
    assert found.geometry == GEOMETRY and found.pieces is None
    assert (found.attn_rot, found.build) == (False, "test build")


@pytest.mark.parametrize(
    "frame",
    [
        # another tool's, with state columns (open raised KeyError on it once)
        pl.DataFrame({"state": ["a.ggsq"], "whole_state": ["b.state"], "score": [0.5]}),
        pl.DataFrame({"state": [1], "whole_state": [2]}),  # a state column of numbers
        pl.DataFrame([{**manifest_row("a.ggsq"), "head_dim_k": "32"}]),  # every column, one of another type
        pl.DataFrame([{**manifest_row("a.ggsq"), "n_head_kv": None}]),
    ],
    ids=["no-geometry", "numbers", "string-head-dim", "null-heads"],
)
def test_a_foreign_manifest_gives_no_hint(tmp_path: Path, reads: list[str], frame: pl.DataFrame) -> None:
    shutil.copy(SEQ, tmp_path / "a.ggsq")
    frame.write_parquet(tmp_path / probe_manifest.NAME)
    for _ in range(3):
        with kvfast.open(tmp_path / "a.ggsq") as d:
            assert d.head_dim_k is None and d.pieces is None
    assert len(reads) == 1


def test_not_parquet_and_no_manifest(tmp_path: Path, reads: list[str]) -> None:
    shutil.copy(SEQ, tmp_path / "a.ggsq")
    assert probe_manifest.recorded_for(tmp_path / "a.ggsq") is None
    assert reads == []
    (tmp_path / probe_manifest.NAME).write_text("not parquet")
    assert kvfast.open(tmp_path / "a.ggsq").head_dim_k is None


def test_given_a_head_size_only_the_manifests_build_is_read(tmp_path: Path, reads: list[str]) -> None:
    """Issue 25: with head_dim= or model= the manifest's geometry is not used, but what it recorded
    of the build's rotation is (a whole state's container does not date it); read once."""
    shutil.copy(SEQ, tmp_path / "a.ggsq")
    pl.DataFrame([manifest_row("a.ggsq")]).write_parquet(tmp_path / probe_manifest.NAME)
    with kvfast.open(tmp_path / "a.ggsq", head_dim=16) as d:
        assert d.head_dim_k == 16 and d.pieces is None
    with kvfast.open(tmp_path / "a.ggsq", model=GEOMETRY) as d:
        assert d.head_dim_k == GEOMETRY.head_dim_k
    assert len(reads) == 1


def test_opening_does_not_import_the_probe_runner(tmp_path: Path) -> None:
    shutil.copy(SEQ, tmp_path / "a.ggsq")
    pl.DataFrame([manifest_row("a.ggsq")]).write_parquet(tmp_path / probe_manifest.NAME)
    code = (
        "import sys, kvfast\n"
        f"d = kvfast.open({str(tmp_path / 'a.ggsq')!r})\n"
        "assert d.head_dim_k is not None\n"
        "print(sorted(m for m in sys.modules if m in ('kvfast.probe.runner', 'llama_cpp')))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
