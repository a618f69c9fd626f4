"""Issue 35, the queries: NaN or infinite inputs of an attention pass (queries, a scale, a sink) are
refused naming the row, the model layer and the head, never handed out as weights that entropy,
top-k and the mass would rank; a query sidecar or its values that is a FIFO is refused at once; a
values file truncated after Queries.load is a FileChangedError, never a SIGBUS; a head asked twice is
refused."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA

import kvfast
from kvfast import attn
from kvfast.errors import FileChangedError, QueriesError, SelectionError

QWEN3 = DATA / "models/tiny-qwen3.gguf"
STATE = DATA / "qwen3tiny-f16-fa/seq-0.ggsq"
POS = [0, 3, 6]


def queries(poison: float | None = None, row: int = 1, layer: int = 1, head: int = 2) -> attn.Queries:
    rng = np.random.default_rng(0)
    layers = {il: rng.standard_normal((len(POS), 4, 32)).astype(np.float32) for il in (0, 1)}
    if poison is not None:
        layers[layer][row, head, 5] = poison
    return attn.Queries.from_arrays(layers, POS, 0, str(QWEN3))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("what", ["attention", "entropy", "top_k", "mass", "sinks"])
def test_a_non_finite_query_is_refused_naming_row_layer_and_head(bad: float, what: str) -> None:
    q = queries(bad)
    with kvfast.open(STATE, model=QWEN3) as st:
        with pytest.raises(
            QueriesError, match=r"row 1 \(position 3, sequence 0\), model layer 1, head 2"
        ) as e:
            getattr(attn, what)(st, q)
        assert e.value.field == "values"


def test_only_what_the_pass_computes_is_checked() -> None:
    q = queries(np.nan, layer=1, head=2)
    with kvfast.open(STATE, model=QWEN3) as st:
        assert attn.entropy(st, q, layers=[0])["entropy"].is_finite().all()
        assert attn.entropy(st, q, heads=[0, 3])["entropy"].is_finite().all()
        with pytest.raises(QueriesError):
            attn.entropy(st, q, heads=[2])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_scale_or_sink_is_refused(bad: float) -> None:
    q = queries()
    with kvfast.open(STATE, model=QWEN3) as st:
        with pytest.raises(QueriesError, match="scale") as e:
            attn.entropy(st, q, scale=bad)
        assert e.value.field == "scale"
        with pytest.raises(QueriesError, match="model layer 0, head 1: the sink logit") as e:
            attn.top_k(st, q, sinks={0: [0.0, bad, 0.0, 0.0], 1: [0.0] * 4})
        assert e.value.field == "sinks"
        # a finite sink is a number like any other
        assert attn.entropy(st, q, sinks={0: [0.0, 30.0, -30.0, 0.0]})["entropy"].is_finite().all()


def test_a_head_asked_twice_is_refused() -> None:
    with kvfast.open(STATE, model=QWEN3) as st, pytest.raises(SelectionError, match="head 0 is asked twice"):
        attn.attention(st, queries(), heads=[0, 0])


def sidecar(folder: Path, values: np.ndarray | None = None) -> Path:
    """A sidecar of the tiny qwen3's queries at POS, its values in x.queries.npy."""
    if values is None:
        values = queries().values
    np.save(folder / "x.queries.npy", values)
    side = {
        "format": "kvfast-queries",
        "version": 1,
        "values": "x.queries.npy",
        "shape": list(values.shape),
        "model": str(QWEN3),
        "rows": {"pos": POS, "seq": [0, 0, 0]},
        "layers": [
            {"model_layer": 0, "offset": 0, "n_head": 4, "head_dim": 32},
            {"model_layer": 1, "offset": 128, "n_head": 4, "head_dim": 32},
        ],
    }
    p = folder / "x.queries.json"
    p.write_text(json.dumps(side))
    return p


@contextlib.contextmanager
def fifo(path: Path) -> Iterator[Path]:
    """A FIFO at `path`, with a writer waiting that closes at once (a reader that waits gets an
    empty file rather than hanging the test); released at the end."""
    os.mkfifo(path)
    t = threading.Thread(target=lambda: open(path, "wb").close(), daemon=True)
    t.start()
    try:
        yield path
    finally:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer, if still waiting, go
        t.join()
        os.close(fd)


def test_a_fifo_as_sidecar_or_values_is_refused_at_once(tmp_path: Path) -> None:
    p = sidecar(tmp_path)
    (tmp_path / "x.queries.npy").unlink()
    with fifo(tmp_path / "x.queries.npy"), pytest.raises(OSError, match="a FIFO, not a regular file") as e:
        attn.Queries.load(p)
    assert e.value.errno == errno.EINVAL and e.value.filename == str(tmp_path / "x.queries.npy")
    with fifo(tmp_path / "y.queries.json") as f, pytest.raises(OSError, match="a FIFO") as e:
        attn.Queries.load(f)
    assert e.value.errno == errno.EINVAL


def test_a_fifo_as_queries_on_the_command_line_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvfast.cli import main

    with fifo(tmp_path / "q.queries.json") as f:
        assert main(["stats", str(STATE), "--model", str(QWEN3), "--queries", str(f)]) == 1
    assert "a FIFO, not a regular file" in capsys.readouterr().err


TRUNCATE = """
import sys
import numpy as np
import kvfast
from kvfast import attn
q = attn.Queries.load(sys.argv[1])
with open(sys.argv[2], "r+b") as f:
    f.truncate(200)
with kvfast.open(sys.argv[3], model=sys.argv[4]) as st:
    try:
        attn.entropy(st, q)
    except kvfast.FileChangedError as e:
        print("refused:", e)
"""


def test_values_truncated_after_load_are_refused_not_sigbus(tmp_path: Path) -> None:
    p = sidecar(tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", TRUNCATE, str(p), str(tmp_path / "x.queries.npy"), str(STATE), str(QWEN3)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr  # -7: SIGBUS
    assert "refused:" in run.stdout and "its size went from" in run.stdout


def test_values_rewritten_after_load_are_refused(tmp_path: Path) -> None:
    p = sidecar(tmp_path)
    q = attn.Queries.load(p)
    with kvfast.open(STATE, model=QWEN3) as st:
        assert len(attn.entropy(st, q))
        np.save(tmp_path / "other.npy", queries(1.0).values)
        os.replace(tmp_path / "other.npy", tmp_path / "x.queries.npy")
        with pytest.raises(FileChangedError, match="another file"):
            attn.entropy(st, q)


@pytest.mark.parametrize(
    ("key", "value"),
    [("rotation", "x"), ("rotation", -1), ("model_layer", 2**32), ("softcap", "x"), ("softcap", -1.0)],
)
def test_sidecar_fields_out_of_range_are_queries_errors(key: str, value: object, tmp_path: Path) -> None:
    p = sidecar(tmp_path)
    side = json.loads(p.read_text())
    side["layers"][0][key] = value
    p.write_text(json.dumps(side))
    with pytest.raises(QueriesError) as e:
        attn.Queries.load(p)
    assert e.value.field == f"layers[0].{key}"


def test_a_sidecar_softcap_the_model_does_not_apply_is_refused(tmp_path: Path) -> None:
    p = sidecar(tmp_path)
    side = json.loads(p.read_text())
    side["layers"][1]["softcap"] = 30.0
    p.write_text(json.dumps(side))
    with kvfast.open(STATE, model=QWEN3) as st:
        with pytest.raises(kvfast.ModelMismatchError, match="soft-capped the logits at 30.0"):
            attn.entropy(st, p)
        side["layers"][1]["softcap"] = None  # none recorded: the model's (none) is right
        p.write_text(json.dumps(side))
        assert attn.entropy(st, p)["entropy"].is_finite().all()
