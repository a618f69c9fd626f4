"""examples/prune_loop.py end to end on the tiny random-weight model (seconds): the probe runner's
queries, every rule at every ratio written, loaded into llama.cpp and compared with the full cache."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import polars as pl
import pytest
from conftest import DATA

pytest.importorskip("llama_cpp")
pytest.importorskip("matplotlib")

HD128 = DATA / "models/tiny-qwen3-hd128.gguf"


def example() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "examples/prune_loop.py"
    spec = importlib.util.spec_from_file_location("prune_loop", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_prune_loop_compares_every_rule(tmp_path: Path) -> None:
    mod = example()
    tokens, key = mod.token_prompt(256, 48, 0.1)
    assert len(tokens) == 48 and tokens[4:9] == key
    table = mod.run(HD128, tokens, key, [0.0, 0.5], 2, 4, 3, tmp_path, answer_tokens=4, log=lambda s: None)
    assert table["rule"].to_list() == ["full cache"] + [r for r in mod.RULES for _ in range(2)]
    assert (tmp_path / "prune_loop.png").stat().st_size > 1000
    assert pl.read_csv(tmp_path / "prune_loop.csv").height == table.height
    # nothing dropped: every rule's state gives the full cache's distributions exactly
    none = table.filter(pl.col("ratio") == 0)
    assert none["kl_max"].max() == 0 and none["top1_agreement"].min() == 1
    assert none["answer"].n_unique() == 1 and none["cells_kept"].min() == 1
    half = table.filter(pl.col("ratio") == 0.5)
    # floor(0.5 * (47 - 2 sinks - 4 window)) = 20 of the 47 cells go, whatever the rule
    assert half["cells_kept"].unique().to_list() == [27 / 47]
    assert half["kl_max"].min() > 0
    assert (tmp_path / "probe/manifest.parquet").exists()  # the queries came from the probe runner
    assert not list(tmp_path.glob("pruned-*.ggsq"))


def test_the_rules_keep_what_they_score(tmp_path: Path) -> None:
    """The masks of the loop: StreamingLLM keeps the newest, the attention rules the cells their
    scores rank highest, random a fixed draw."""
    import kvfast
    from kvfast import attn

    mod = example()
    tokens, _ = mod.token_prompt(256, 40, 0.1)
    state, queries = mod.capture(HD128, tokens, tmp_path, "all", 512)
    with kvfast.open(state, model=HD128) as st:
        stream = mod.keep_mask(st, queries, "streaming", 0.5, 2, 4)
        dropped = [p for p, k in zip(st.caches[0].streams[0].pos.tolist(), stream, strict=True) if not k]
        assert dropped == list(range(2, 2 + 17))  # floor(0.5 * 34) of the oldest after the sinks
        for rule in ("h2o", "snapkv", "tova"):
            keep = mod.keep_mask(st, queries, rule, 0.5, 2, 4)
            assert keep == attn.by_attention(st, queries, 0.5, rule, sinks=2, window=4)
        h2o = attn.scores(st, queries, "h2o").sort("cell")["score"].to_numpy()
        keep = mod.keep_mask(st, queries, "h2o", 0.5, 2, 4)
        free = range(2, 36)
        assert min(h2o[c] for c in free if keep[c]) >= max(h2o[c] for c in free if not keep[c])
        rnd = mod.keep_mask(st, queries, "random", 0.5, 2, 4)
        assert rnd == mod.keep_mask(st, queries, "random", 0.5, 2, 4) and rnd not in (stream, keep)
    assert mod._found([1, 11, 13, 17, 19, 23, 2], [11, 13, 17, 19, 23], str)
    assert not mod._found([11, 13, 17, 19], [11, 13, 17, 19, 23], str)
    assert mod._found([1, 2], "68315", lambda ids: " 68315.")


def test_the_prune_loop_says_first_when_it_falls_back_to_the_tiny_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One command, end to end: without Gemma's package the example runs the tiny random-weight
    model, and says so on the first line of its output (not only among the progress lines)."""
    mod = example()
    monkeypatch.setattr(mod, "gemma", lambda: None)
    argv = ["prune_loop.py", "--tokens", "40", "--ratios", "0.5", "--steps", "2", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    assert mod.main() == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert "tiny random-weight model" in first and "not Gemma 3 270M" in first
    assert all(rule in out for rule in mod.RULES)
    model, line = mod.choose_model(HD128)
    assert model == HD128 and line == f"model: {HD128}"
