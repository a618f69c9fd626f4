"""kvfast.compare's match modes (sequence, position, common token prefix), the token check, and
compare_scan: one reference state against many, as a lazy frame."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import kvfast

D = Path(__file__).parent / "data" / "qwen3tiny-3seq-shared"
# three sequences of 9, 12 and 15 tokens sharing a 4-token prefix


def test_sequence_match_of_other_sequences_says_what_to_do() -> None:
    a, b = kvfast.open(D / "seq-0.ggsq"), kvfast.open(D / "seq-1.ggsq")
    with pytest.raises(kvfast.MatchError, match="match='position'"):
        kvfast.compare(a, b)


def test_position_match_compares_every_position_of_a_and_warns_of_other_tokens() -> None:
    a, b = kvfast.open(D / "seq-0.ggsq"), kvfast.open(D / "seq-1.ggsq")
    with pytest.warns(kvfast.TokenMismatchWarning, match="5 positions .first: 4."):
        df = kvfast.compare(a, b, match="position")
    # 9 positions x 2 layers x (K, V) (no head size given: one row per cell)
    assert df.height == 9 * 2 * 2
    assert sorted(df["pos"].unique()) == list(range(9))
    assert df["seq_id"].unique().to_list() == [0]  # A's sequence
    shared = df.filter(pl.col("pos") < 4)
    assert shared["max_abs"].max() == 0.0  # the shared prefix: the same K and V
    assert df.filter(pl.col("pos") >= 4)["max_abs"].min() > 0


def test_tokens_match_compares_the_common_prefix_only() -> None:
    a, b = kvfast.open(D / "seq-0.ggsq"), kvfast.open(D / "seq-2.ggsq")
    df = kvfast.compare(a, b, match="tokens", by="layer")
    assert df["rows"].to_list() == [4] * 4  # 4 positions per (layer, kind)
    assert df["max_abs"].max() == 0.0
    assert df["cosine_min"].min() == pytest.approx(1.0)


def test_tokens_match_needs_tokens() -> None:
    a, b = kvfast.open(D / "seq-0.bin"), kvfast.open(D / "seq-1.ggsq")
    with pytest.raises(kvfast.MatchError, match="A .*seq-0.bin. stores none"):
        kvfast.compare(a, b, match="tokens")
    with pytest.raises(ValueError, match="match must be"):
        kvfast.compare(a, b, match="cells")  # type: ignore[arg-type]


def test_same_tokens_do_not_warn() -> None:
    a = kvfast.open(D / "seq-0.ggsq")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = kvfast.compare(a, kvfast.open(D / "seq-0.ggsq"), by="layer")
    assert df["max_abs"].max() == 0.0


def test_compare_scan_is_lazy_and_pushes_down_the_dump() -> None:
    lf = kvfast.compare_scan(D / "seq-0.ggsq", str(D / "seq-*.ggsq"), match="tokens")
    assert isinstance(lf, pl.LazyFrame)
    df = lf.collect()
    assert df["dump"].n_unique() == 3
    assert df.height == 3 * 4
    assert df["max_abs"].max() == 0.0
    one = lf.filter(pl.col("dump").str.starts_with("seq-2")).collect()
    assert one["dump"].n_unique() == 1 and one.height == 4
    cells = kvfast.compare_scan(D / "seq-0.ggsq", [D / "seq-1.ggsq"], by="cell", match="position")
    with pytest.warns(kvfast.TokenMismatchWarning):
        got = cells.select("dump", "pos", "rel").collect()
    assert got.height == 36 and got.columns == ["dump", "pos", "rel"]


def test_compare_scan_errors() -> None:
    lf = kvfast.compare_scan(D / "seq-0.ggsq", str(D / "seq-*.ggsq"))
    with pytest.raises(kvfast.MatchError):
        lf.collect()
    with pytest.warns(UserWarning, match="left out"):
        df = kvfast.compare_scan(D / "seq-0.ggsq", str(D / "seq-*.ggsq"), on_error="skip").collect()
    assert df["dump"].n_unique() == 1  # seq-0 against itself


def test_cli_diff_match_and_token_warning() -> None:
    run = [sys.executable, "-m", "kvfast", "diff", str(D / "seq-0.ggsq"), str(D / "seq-1.ggsq")]
    out = subprocess.run([*run, "--match", "position"], check=False, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "different tokens at 5 positions" in out.stderr
    out = subprocess.run([*run, "--match", "tokens"], check=False, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "different tokens" not in out.stderr
    out = subprocess.run(run, check=False, capture_output=True, text=True)
    assert out.returncode != 0
    assert "match='position'" in out.stderr


def test_probe_states_of_one_batch(tmp_path: Path) -> None:
    """The issue's case: two prompts of one probe batch are sequences 0 and 1."""
    pytest.importorskip("llama_cpp")
    from kvfast import probe

    prompts = [{"id": "p0", "tokens": [7, 8, 9, 10, 11]}, {"id": "p1", "tokens": [7, 8, 9, 40, 41, 42]}]
    out = tmp_path / "probe"
    model = Path(__file__).parent / "data" / "models" / "tiny-qwen3.gguf"
    probe.run(model, prompts, out, parallel=2, n_ctx=64, progress=False)
    p0, p1 = kvfast.open(out / "p0.ggsq"), kvfast.open(out / "p1.ggsq")
    with pytest.raises(kvfast.MatchError, match="match='position'"):
        kvfast.compare(p0, p1)
    same = kvfast.compare(p0, p1, match="tokens")
    assert sorted(same["pos"].unique()) == [0, 1, 2]
    assert same["rel"].max() < 1e-3
    with pytest.warns(kvfast.TokenMismatchWarning, match="2 positions .first: 3."):
        kvfast.compare(p0, p1, match="position")
    many = kvfast.compare_scan(p0, out, match="tokens").collect()
    assert many["dump"].n_unique() == 2 and many["rel_max"].max() < 1e-3
