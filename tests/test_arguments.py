"""Bad arguments (issue 24, item 19): checked at the public boundary by kvfast.read.select's one rule
(an integer is an int or a NumPy integer, never a bool, a float or a string, and fits what it goes
to; a kind is 'k', 'v', 'r' or 's' as the tables write it; a dtype or a cache type one of its names).
A read's argument raises SelectionError, a write's WriteError naming it: never a TypeError or an
OverflowError from the binding, never a value silently changed."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import DATA

import kvfast
from kvfast import SelectionError, WriteError

SEQ = DATA / "qwen3tiny-f16-fa/seq-0.bin"
WHOLE = DATA / "qwen3tiny-3seq/state.bin"


@pytest.fixture
def d() -> Any:
    with kvfast.open(SEQ, head_dim=32) as state:
        yield state


def test_seq_ids_are_integers_numpy_ones_included(d: Any, tmp_path: Path) -> None:
    out = tmp_path / "o.bin"
    for bad in (1.5, True, np.float64(3.0), "3", -1, 256, 2**40):
        with pytest.raises(WriteError) as e:
            kvfast.write(d, out, seq_id=bad)
        assert e.value.field == "seq_id", bad
    with pytest.raises(WriteError, match="seq_id"):
        kvfast.write([d, d], out, seq_id=[0, True])
    with pytest.raises(WriteError, match="seq_id: a sequence id must be an integer, not 1.0"):
        kvfast.write(d, out, seq_map={0: 1.0})  # the ids' rule is seq_id's
    # a valid id as a NumPy integer: renamed as an int would be
    kvfast.write(d, out, seq_id=np.int64(3))
    assert kvfast.open(out).seq_id == 3
    kvfast.write(d, tmp_path / "m.bin", seq_map={np.int32(0): np.uint8(5)})
    assert kvfast.open(tmp_path / "m.bin").seq_id == 5


def test_values_keys_are_integers_and_lower_case_kinds(d: Any, tmp_path: Path) -> None:
    rows = d.values(1, "k").astype(np.float32)
    out = tmp_path / "o.bin"
    for key in [(1.0, "k"), (True, "k"), (1, "K"), (1, "x"), (np.float32(0), 1, "k")]:
        with pytest.raises(WriteError) as e:
            kvfast.write(d, out, values={key: rows})
        assert e.value.field == "values"
    kvfast.write(d, out, values={(np.int64(1), "k"): rows})
    np.testing.assert_array_equal(kvfast.open(out).values(1, "k"), d.values(1, "k"))


def test_tokens_are_token_ids(tmp_path: Path) -> None:
    d = kvfast.open(DATA / "qwen3tiny-f16-fa/seq-0.ggsq")
    n = len(d.tokens)
    out = tmp_path / "o.ggsq"
    for bad in ([1.5] * n, [2**40] * n, [-1] * n, [True] * n, "abc", 7):
        with pytest.raises(WriteError) as e:
            kvfast.write(d, out, tokens=bad)
        assert e.value.field == "tokens"
    kvfast.write(d, out, tokens=np.arange(n, dtype=np.int64) + 10)
    assert kvfast.open(out).tokens.tolist() == list(range(10, 10 + n))


def test_cache_types_of_write_are_names(d: Any, tmp_path: Path) -> None:
    for bad in (8, "Q8_0", "q9"):
        with pytest.raises(WriteError) as e:
            kvfast.write(d, tmp_path / "o.bin", cache_type_k=bad)
        assert e.value.field == "cache_type_k"


def test_read_arguments(d: Any) -> None:
    cases = [
        lambda: d.stats(by="layer", skip_first=2**40),
        lambda: d.stats(by="layer", skip_first=1.0),
        lambda: d.stats(by="layer", skip_first=True),
        lambda: d.quant_error("q8_0", skip_first=2**31),
        lambda: d.quant_error(None),
        lambda: d.quant_error(8),
        lambda: d.quant_error("Q8_0"),
        lambda: d.values(0, "k", dtype=1),
        lambda: d.values(0, "k", dtype="float64"),
        lambda: d.to_polars(dtype=1),
        lambda: d.to_polars(heads=[2**40]),
        lambda: d.values(True, "k"),
        lambda: d.values(1.0, "k"),
        lambda: d.values(0, "K"),
        lambda: d.values(0, "k", cache=True),
        lambda: d.stats(by="layer", kinds="K"),
        lambda: d.stats(by="layer", layers=[True]),
        lambda: d.to_polars(kinds=["V"]),
        lambda: d.address(0, 0, head=0, elem=0, kind="V"),
    ]
    for i, case in enumerate(cases):
        with pytest.raises(SelectionError):
            case()
            pytest.fail(f"case {i} accepted")
    # NumPy integers are integers everywhere
    assert d.stats(by="layer", skip_first=np.int64(1)).equals(d.stats(by="layer", skip_first=1))
    assert d.quant_error("q8_0", skip_first=np.int32(2)).equals(d.quant_error("q8_0", skip_first=2))
    np.testing.assert_array_equal(d.values(np.int64(1), "v", cache=np.uint8(0)), d.values(1, "v"))


def test_the_pruning_rules_are_there_after_import_kvfast() -> None:
    code = """
import warnings
import kvfast
assert callable(kvfast.analysis.prune.by_score)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert kvfast.prune is kvfast.analysis.prune  # the old path: an alias that warns
assert [w.category for w in caught] == [DeprecationWarning]
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.stdout.strip() == "ok", r.stderr
