"""A probe run into a folder that holds an earlier run keeps only the states made with its own
settings and tokens, makes the others again (their old files removed first), and says which
(the manifest's rerun and changed columns, kvfast probe's summary line)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import DATA

import kvfast
from kvfast.cli import main

if not os.environ.get("KVFAST_REQUIRE_PROBE"):
    pytest.importorskip("llama_cpp")
from kvfast import probe

MODEL = str(DATA / "models/tiny-qwen3.gguf")
PROMPTS = [{"id": "a", "tokens": [253, 230, 241, 194, 107]}, {"id": "b", "tokens": [48, 249, 14, 199]}]


def run(out: Path, prompts: list[dict[str, Any]] = PROMPTS, **kw: Any) -> pl.DataFrame:
    kw.setdefault("n_ctx", 64)
    return probe.run(MODEL, prompts, out, progress=False, **kw)


def outcome(man: pl.DataFrame) -> dict[str, tuple[str, list[str]]]:
    return {r["prompt_id"]: (r["rerun"], r["changed"]) for r in man.iter_rows(named=True)}


def stamps(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in out.glob("*.ggsq")}


def test_other_settings_make_the_states_again(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert outcome(run(out)) == {"a": ("new", []), "b": ("new", [])}
    first = stamps(out)
    assert outcome(run(out)) == {"a": ("kept", []), "b": ("kept", [])}
    assert stamps(out) == first  # the same settings: nothing made again
    # the case: other cache types into the same folder
    man = run(out, ctk="q4_0", ctv="q4_0")
    assert outcome(man) == {"a": ("redone", ["ctk", "ctv"]), "b": ("redone", ["ctk", "ctv"])}
    for pid in ("a", "b"):
        with kvfast.open(out / f"{pid}.ggsq") as d:
            assert {x.k_type for x in d.caches[0].streams[0].layers} == {"q4_0"}
    assert set(man["ctk"]) == {"q4_0"}
    # one prompt's tokens changed, the other left alone; a third prompt new
    before = stamps(out)
    changed = [{"id": "a", "tokens": [253, 230, 241, 194, 108]}, PROMPTS[1], {"id": "c", "tokens": [7, 8]}]
    man = run(out, changed, ctk="q4_0", ctv="q4_0")
    assert outcome(man) == {"a": ("redone", ["tokens"]), "b": ("kept", []), "c": ("new", [])}
    assert stamps(out)["b.ggsq"] == before["b.ggsq"]
    with kvfast.open(out / "a.ggsq") as d:
        assert d.tokens is not None and d.tokens.tolist() == changed[0]["tokens"]
    # a run given fewer prompts leaves the others as they were, and says so
    man = run(out, [PROMPTS[1]], ctk="q4_0", ctv="q4_0")
    assert outcome(man)["b"] == ("kept", []) and outcome(man)["c"] == ("other", [])


def test_no_state_of_other_settings_stays_under_its_name(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(out, queries=2, generate=1)
    assert (out / "a.queries.json").exists() and (out / "a.queries.npy").exists()
    # now too long for the context: the old state is removed, not kept beside a too_long row
    man = run(out, n_ctx=5, queries=2, generate=1)
    assert outcome(man)["a"] == ("redone", ["n_ctx"])
    row = man.filter(prompt_id="a").row(0, named=True)
    assert row["status"] == "too_long" and row["state"] is None
    assert not (out / "a.ggsq").exists() and not (out / "a.queries.json").exists()
    assert not (out / "a.queries.npy").exists()
    assert (out / "b.ggsq").exists() and man.filter(prompt_id="b")["status"].item() == "ok"  # 4 + 1 fits
    # without queries: made again, the old sidecars gone
    man = run(out, generate=1)
    assert outcome(man)["b"] == ("redone", ["n_ctx", "queries_window"])
    assert not list(out.glob("*.queries.*")) and man["queries"].null_count() == 2
    # a deleted state is made again
    (out / "b.ggsq").unlink()
    assert outcome(run(out, generate=1))["b"] == ("redone", ["files"])


def test_cli_says_what_was_made_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n")
    out = str(tmp_path / "run")
    assert main(["probe", MODEL, str(prompts), "-o", out, "--ctx", "64"]) == 0
    assert "2 ok; 2 new;" in capsys.readouterr().out
    assert main(["probe", MODEL, str(prompts), "-o", out, "--ctx", "64", "--ctk", "q8_0"]) == 0
    assert "2 ok; 2 redone (ctk);" in capsys.readouterr().out
    assert main(["probe", MODEL, str(prompts), "-o", out, "--ctx", "64", "--ctk", "q8_0"]) == 0
    assert "2 ok; 2 kept;" in capsys.readouterr().out
