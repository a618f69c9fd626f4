"""One meaning per option and messages that name the cause (issue 33's smaller items): the
sidecar's scale fields, one ``incomplete`` default across kvfast.attn and kvfast.plot, Replay's
context sized from the state and its refusals explained, the probe's defaults in --help and its
token count, a malformed prompts file named, usage errors exiting 2, and a comparison by position
that does not suggest itself."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA

import kvfast
from kvfast import attn
from kvfast.cli import main
from kvfast.errors import LoadError

QWEN3 = DATA / "models/tiny-qwen3.gguf"
STATE = DATA / "qwen3tiny-f16-fa/seq-0.ggsq"
SHARED = DATA / "qwen3tiny-3seq-shared"  # sequences of 9, 12 and 15 tokens


def test_an_older_sidecars_kq_scale_is_read_as_the_ops_scale(tmp_path: Path) -> None:
    np.save(tmp_path / "g.queries.npy", np.zeros((1, 8), np.float32))
    layer = {"model_layer": 0, "offset": 0, "n_head": 1, "head_dim": 8}
    old = {**layer, "llama_scale": 0.125, "kq_scale": 1.0, "q_prescale": 0.125}
    side = {
        "format": "kvfast-queries",
        "version": 1,
        "values": "g.queries.npy",
        "shape": [1, 8],
        "rows": {"pos": [0], "seq": [0]},
        "layers": [old],
    }
    (tmp_path / "g.queries.json").write_text(json.dumps(side))
    [lay] = attn.Queries.load(tmp_path / "g.queries.json").layers
    assert lay.llama_scale == 0.125  # the scale of q . k: the one to use
    assert lay.info["op_scale"] == 1.0 and "kq_scale" not in lay.info  # a factor of it, named so


def test_one_incomplete_default_across_attention() -> None:
    from kvfast import plot

    found = {}
    for mod in (attn, plot):
        for name in mod.__all__:
            f = getattr(mod, name)
            if callable(f) and not inspect.isclass(f):
                p = inspect.signature(f).parameters.get("incomplete")
                if p is not None:
                    found[f"{mod.__name__}.{name}"] = p.default
    assert {"kvfast.attn.attention", "kvfast.attn.reductions", "kvfast.attn.sinks"} <= set(found)
    assert set(found.values()) == {"skip"}, found


def test_probe_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["probe", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 4096)" in text and "K cache type (default: f16)" in text and "--count" in text


def test_count_says_which_prompts_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("llama_cpp")
    from kvfast.probe.count import count

    prompts = tmp_path / "p.jsonl"
    rows = [{"id": "short", "tokens": [5, 6, 7]}, {"id": "long", "tokens": list(range(1, 70))}]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    df = count(QWEN3, prompts, n_ctx=64, generate=2)
    assert df.select("prompt_id", "tokens", "cells", "fits").rows() == [
        ("short", 3, 5, True),
        ("long", 69, 71, False),
    ]
    assert main(["probe", str(QWEN3), str(prompts), "--count", "--ctx", "64"]) == 0
    out = capsys.readouterr()
    assert "short\t3 tokens\tfits (--ctx 64)" in out.out
    assert "long\t69 tokens\tdoes not fit: 69 > 64" in out.out
    assert "2 prompts, 1 fit, 1 too long" in out.err
    assert not (tmp_path / "manifest.parquet").exists()
    assert main(["probe", str(QWEN3), str(prompts)]) == 2  # no -o and no --count: a usage error
    assert "-o/--output is required" in capsys.readouterr().err


def test_a_malformed_prompts_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvfast.probe.runner import load_prompts

    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"id": "a", "prompt": "x"}\n\n{"id": "b", "prompt": "y",}\n')
    with pytest.raises(kvfast.KvfastError) as e:
        load_prompts(bad)
    msg = str(e.value)
    assert str(bad) in msg and "line 3" in msg and "expected one JSON object per line" in msg
    assert "\n" not in msg
    assert main(["probe", str(QWEN3), str(bad), "-o", str(tmp_path / "run")]) == 1
    assert "line 3" in capsys.readouterr().err


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    base = ["prune", str(STATE), "-o", str(tmp_path / "x.ggsq"), "--model", str(QWEN3)]
    for ratio in ("1.5", "-0.1", "half"):
        with pytest.raises(SystemExit) as e:
            main([*base, "--ratio", ratio])
        assert e.value.code == 2
    assert main([*base, "--ratio", "0.5", "--score", "h2o"]) == 2  # needs --queries
    assert main([*base, "--ratio", "1"]) == 0


def test_a_position_match_does_not_suggest_itself() -> None:
    long, short = kvfast.open(SHARED / "seq-1.ggsq"), kvfast.open(SHARED / "seq-0.ggsq")
    with pytest.raises(kvfast.MatchError) as e:
        kvfast.compare(long, short, match="position")
    msg = str(e.value)
    assert "match='position'" in msg and "compare with match='position'" not in msg
    assert "3 positions of A's cache 0 stream 0 have no cell in B (first: position 9)" in msg
    assert "sequence" not in msg


def test_replay_sizes_its_context_from_the_state(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    from kvfast import probe
    from kvfast.probe.replay import ROOM, Replay

    prompt = [{"id": "x", "tokens": [(7 * i) % 250 + 1 for i in range(300)]}]
    probe.run(QWEN3, prompt, tmp_path, n_ctx=512, progress=False)
    state = tmp_path / "x.ggsq"
    with Replay(QWEN3) as r:  # no n_ctx: sized from the state (300 cells > the first ROOM)
        assert ROOM < 300
        r.load(state)
        assert r.seq_pos_max() == 299 and r.r.n_ctx >= 300
        logits = r.step(5, pos=300)
        assert np.isfinite(logits).all()
    small = pytest.raises(LoadError, match="its cache 0 holds 300 cells, the context 128")
    with Replay(QWEN3, n_ctx=128) as r, small:
        r.load(state)
    types = pytest.raises(LoadError, match="its cache types are K f16, V f16; the context's K q8_0")
    with Replay(QWEN3, ctk="q8_0", n_ctx=512) as r, types:
        r.load(state)
