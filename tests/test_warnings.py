"""Warnings a person reads (issue 27): raised at the user's call, once per state, and only by a
pass that reads the values they are about; on the command line one line per distinct warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import kvfast
from kvfast.cli import main

DATA = Path(__file__).parent / "data"
Q8 = DATA / "qwen3tiny-q8_0-fa"  # no model: kvfast cannot be sure how these caches are stored
F16 = DATA / "qwen3tiny-f16-fa/seq-0.ggsq"


def caught(call: object) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        call()  # type: ignore[operator]
    return [w for w in seen if issubclass(w.category, kvfast.KvfastWarning)]


def test_open_info_and_layout_do_not_warn_values_do_once_at_the_users_line() -> None:
    d = kvfast.open(Q8 / "seq-0.ggsq")
    assert caught(lambda: (d.layout(), d.caches, d.rotation, repr(d))) == []
    assert caught(lambda: d.values(0, "k", stored=True)) == []  # as stored: nothing undecided
    first = caught(lambda: d.values(0, "k"))
    assert len(first) == 1 and issubclass(first[0].category, kvfast.RotationWarning)
    w = first[0].message
    assert isinstance(w, kvfast.KvfastWarning) and w.about == d.path and w.detail is not None
    assert Path(first[0].filename) == Path(__file__)  # the user's line, not kvfast's
    assert str(w).startswith(f"{d.path}: kvfast cannot be sure")
    assert caught(lambda: (d.values(0, "v"), d.stats(by="layer"), d.to_polars())) == []  # once
    d.close()


def test_a_state_kvfast_is_sure_of_never_warns() -> None:
    with kvfast.open(F16) as d:
        assert caught(lambda: (d.values(0, "k"), d.stats(by="layer"))) == []


def test_a_warning_raised_deep_inside_names_the_callers_line(tmp_path: Path) -> None:
    seen = caught(lambda: kvfast.export([Q8 / "seq-0.ggsq", Q8 / "seq-0.bin"], tmp_path / "out"))
    assert len(seen) == 2  # one per state
    assert {Path(w.filename) for w in seen} == {Path(__file__)}
    assert {w.message.about for w in seen} == {str(Q8 / "seq-0.ggsq"), str(Q8 / "seq-0.bin")}  # type: ignore[attr-defined]


def test_cli_says_each_distinct_warning_once_with_a_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [str(Q8 / n) for n in ("seq-0.ggsq", "seq-0.bin", "state.ggsn", "state.bin")]
    assert main(["export", *paths, "-o", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if "RotationWarning" in line]
    assert len(said) == 1, err
    assert said[0].startswith("kvfast: RotationWarning: kvfast cannot be sure")
    assert "(4 states: " in said[0] and "and 1 more" in said[0]
    assert not [line for line in err if ".py:" in line or "warnings.warn" in line], err


def test_cli_plot_layout_reads_no_values_and_does_not_warn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    assert main(["plot", "layout", str(Q8 / "seq-0.ggsq"), "-o", str(tmp_path / "l.png")]) == 0
    assert "Warning" not in capsys.readouterr().err


def test_cli_leaves_python_warning_options_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.warnoptions", ["error"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", kvfast.RotationWarning)
        with pytest.raises(kvfast.RotationWarning):
            main(["stats", str(Q8 / "seq-0.ggsq"), "--by", "layer"])
