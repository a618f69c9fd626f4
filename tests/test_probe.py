"""The probe runner end to end on a tiny model (random weights, token-id prompts), on the CPU.

CI installs llama-cpp-python from source and sets KVFAST_REQUIRE_PROBE=1, so there a missing
llama_cpp fails instead of skipping.
"""

import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import DATA

import kvfast
from kvfast.cli import main

if not os.environ.get("KVFAST_REQUIRE_PROBE"):
    pytest.importorskip("llama_cpp")
from kvfast import probe

MODEL = str(DATA / "models/tiny-qwen3.gguf")
PREFIX = [68, 32, 130, 60]
PROMPTS = [
    {"id": "a", "tokens": [253, 230, 241, 194, 107]},
    {"id": "b", "tokens": [48, 249, 14, 199, 221, 1, 228, 136]},
    {"id": "c", "tokens": [117, 52, 162]},
    {"id": "long", "tokens": list(range(1, 200))},
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("probe")
    prompts = base / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in PROMPTS))
    out = {}
    for ty in ("f16", "q8_0"):
        out[ty] = base / ty
        probe.run(
            MODEL,
            prompts,
            out[ty],
            ctk=ty,
            ctv=ty,
            parallel=3,
            n_ctx=128,
            shared_prefix=PREFIX,
            whole_state=True,
            generate=2,
            progress=False,
        )
    out["prompts"] = prompts
    return out


def test_states_and_manifest(runs: dict[str, Path]) -> None:
    man = pl.read_parquet(runs["f16"] / probe.MANIFEST)
    ok = man.filter(status="ok").sort("prompt_id")
    assert ok["prompt_id"].to_list() == ["a", "b", "c"]
    row = ok.row(0, named=True)
    assert (row["arch"], row["n_layer"], row["head_dim_k"], row["n_head_kv"]) == ("qwen3", 2, 32, [2, 2])
    assert (row["ctk"], row["ctv"], row["parallel"], row["fa"]) == ("f16", "f16", 3, True)
    assert "llama-cpp-python" in row["llama_build"]
    # llama-cpp-python 0.3.36 carries llama.cpp of October 2026, which rotates quantized caches
    assert row["attn_rot"] is (os.environ.get("LLAMA_ATTN_ROT_DISABLE", "0") in ("", "0"))
    for r in ok.iter_rows(named=True):
        with kvfast.open(runs["f16"] / r["state"]) as d:
            assert d.container == "ggsq" and d.size == r["size"]
            want = PREFIX + next(p["tokens"] for p in PROMPTS if p["id"] == r["prompt_id"]) + r["generated"]
            assert d.tokens.tolist() == want and len(r["generated"]) == 2
            s = d.caches[0].streams[0]
            assert s.cell_count == len(want) and s.pos.tolist() == list(range(len(want)))
            assert d.head_dim_k == 32  # taken from the manifest beside the state
            assert d.to_polars()["head"].n_unique() == 2


def test_too_long_prompt_is_reported_not_truncated(runs: dict[str, Path]) -> None:
    man = pl.read_parquet(runs["f16"] / probe.MANIFEST)
    long = man.filter(prompt_id="long").row(0, named=True)
    assert long["status"] == "too_long" and long["state"] is None and "> 128" in long["error"]
    assert not (runs["f16"] / "long.ggsq").exists()


def test_shared_prefix_is_shared_in_the_whole_state(runs: dict[str, Path]) -> None:
    man = pl.read_parquet(runs["f16"] / probe.MANIFEST).filter(status="ok")
    [whole] = man["whole_state"].unique().to_list()
    with kvfast.open(runs["f16"] / whole) as d:
        assert d.container == "state" and d.arch == "qwen3"
        s = d.caches[0].streams[0]
        shared = [pos for pos, ids in zip(s.pos.tolist(), s.seq_ids) if len(ids) == 3]
        assert shared == list(range(len(PREFIX)))
        assert s.cell_count == len(PREFIX) + sum(len(p["tokens"]) + 2 for p in PROMPTS[:3])


def test_q8_0_agrees_with_f16(runs: dict[str, Path]) -> None:
    for pid in ("a", "b", "c"):
        a = kvfast.open(runs["f16"] / f"{pid}.ggsq")
        b = kvfast.open(runs["q8_0"] / f"{pid}.ggsq")
        assert b.caches[0].streams[0].layers[0].k_type == "q8_0"
        x, y = a.values(0, "k").astype(np.float32), b.values(0, "k")
        amax = np.abs(x).reshape(len(x), -1, 32).max(axis=2).max(axis=1)
        assert (np.abs(x - y).max(axis=1) <= amax / 254 * 1.05 + 1e-3).all()
        assert kvfast.compare(a, b, by="layer")["cosine_min"].min() > 0.999


def test_resume_does_not_redo_states(runs: dict[str, Path]) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in runs["f16"].glob("*.ggsq")}
    man = probe.run(
        MODEL,
        runs["prompts"],
        runs["f16"],
        parallel=3,
        n_ctx=128,
        shared_prefix=PREFIX,
        whole_state=True,
        generate=2,
        progress=False,
    )  # the settings of the first run: nothing is made again
    after = {p.name: p.stat().st_mtime_ns for p in runs["f16"].glob("*.ggsq")}
    assert before == after
    assert sorted(man.filter(status="ok")["prompt_id"].to_list()) == ["a", "b", "c"]
    assert set(man["rerun"]) == {"kept"}


def test_cli_probe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "x", "tokens": [5, 6, 7, 8]}) + "\n")
    out = tmp_path / "run"
    assert (
        main(["probe", MODEL, str(prompts), "-o", str(out), "--ctk", "q4_0", "--ctv", "q4_0", "--ctx", "64"])
        == 0
    )
    assert "1 ok" in capsys.readouterr().out
    with kvfast.open(out / "x.ggsq") as d:
        assert d.caches[0].streams[0].layers[1].k_type == "q4_0"
    assert (
        main(
            ["probe", MODEL, str(prompts), "-o", str(out), "--fa", "off", "--non-unified", "--parallel", "2"]
        )
        == 0
    )


def test_rotated_probe_states_are_undone_with_no_hint(tmp_path: Path) -> None:
    """A q8_0 probe of a head-128 model: opened with no argument, every state is read in the model's
    basis, the head size and the build's rotation taken from the manifest beside it."""
    model = str(DATA / "models/tiny-qwen3-hd128.gguf")
    prompts = [{"id": "x", "tokens": [5, 17, 99, 3, 42, 7, 11]}]
    for ty in ("f16", "q8_0"):
        probe.run(model, prompts, tmp_path / ty, ctk=ty, ctv=ty, n_ctx=64, progress=False)
    with kvfast.open(tmp_path / "q8_0/x.ggsq") as q, kvfast.open(tmp_path / "f16/x.ggsq") as f:
        got = {r.kind: (r.undone, r.group, r.certain) for r in q.rotation}
        assert got == {"k": (True, 128, True), "v": (True, 64, True)}
        assert all("probe manifest" in r.evidence for r in q.rotation)
        rel = kvfast.compare(f, q, by="layer")["rel_max"].max()
        assert rel < 0.02


def test_probe_whole_states_decided_with_a_model(tmp_path: Path) -> None:
    """Issue 25: a raw whole state (--whole-state) of a q8_0 probe, opened with model=: the
    container does not date it, so the manifest beside it must say the build rotates, for V as for
    K (before, V was left as stored, undecided, while K was undone)."""
    model = DATA / "models/tiny-qwen3-hd128.gguf"
    prompts = [{"id": "x", "tokens": [5, 17, 99, 3, 42, 7, 11]}]
    for ty in ("f16", "q8_0"):
        probe.run(
            str(model), prompts, tmp_path / ty, ctk=ty, ctv=ty, n_ctx=64, whole_state=True, progress=False
        )
    whole = next((tmp_path / "q8_0").glob("*.state"))
    for kw in ({"model": model}, {"head_dim": 128}, {}):
        with kvfast.open(whole, **kw) as d:  # type: ignore[arg-type]
            got = {r.kind: (r.undone, r.group, r.certain) for r in d.rotation}
            assert got == {"k": (True, 128, True), "v": (True, 64, True)}, kw
            assert all("probe manifest" in r.evidence for r in d.rotation), kw
    with kvfast.open(whole, model=model) as q, kvfast.open(next((tmp_path / "f16").glob("*.state"))) as f:
        assert kvfast.compare(f, q, by="layer")["rel_max"].max() < 0.02
