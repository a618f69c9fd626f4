"""Queries are checked against the state and the model they are used with (kvfast.attn.belongs):
another prompt's sidecar is refused in one line naming both and the first differing position, in
Python and in kvfast stats / prune / plot; queries of one's own must sit at positions the state
holds; a model given must be the queries' (by its header, not its path). A probe manifest row
that does not describe the state beside it (a state renamed or copied there) is not used."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA

import kvfast
from kvfast import attn
from kvfast.cli import main

QWEN3 = DATA / "models/tiny-qwen3.gguf"
STATE = DATA / "qwen3tiny-f16-fa/seq-0.ggsq"  # tokens 68 32 130 60 253 230 241
SHARED = DATA / "qwen3tiny-3seq-shared/state.bin"  # a whole state of three sequences, no tokens


def sidecar(path: Path, pos: list[int], token: list[int] | None, **meta: object) -> Path:
    rng = np.random.default_rng(0)
    values = rng.standard_normal((len(pos), 2 * 4 * 32)).astype(np.float32)
    np.save(path.with_suffix(".npy"), values)
    rows: dict[str, object] = {"pos": pos, "seq": [0] * len(pos)}
    if token is not None:
        rows["token"] = token
    side = {
        "format": "kvfast-queries",
        "version": 1,
        "values": path.with_suffix(".npy").name,
        "shape": list(values.shape),
        "model": str(QWEN3),
        **meta,
        "rows": rows,
        "layers": [
            {"model_layer": il, "offset": il * 128, "n_head": 4, "head_dim": 32, "llama_scale": 32**-0.5}
            for il in (0, 1)
        ],
    }
    path.write_text(json.dumps(side))
    return path


def test_the_tokens_decide(tmp_path: Path) -> None:
    good = sidecar(tmp_path / "a.json", [4, 5, 6], [253, 230, 241], prompt_id="a", state="seq-0.ggsq")
    bad = sidecar(tmp_path / "b.json", [4, 5, 6], [253, 99, 241], prompt_id="b", state="b.ggsq")
    with kvfast.open(STATE, model=QWEN3) as st:
        assert attn.attention(st, good).height > 0
        with pytest.raises(kvfast.QueriesError) as e:
            attn.mass(st, bad)
        msg = str(e.value)
        assert "\n" not in msg and str(bad) in msg and "prompt 'b'" in msg and str(STATE) in msg
        assert "at position 5 the queries were captured on token 99, the state holds token 230" in msg
        assert e.value.field == "rows.token"
        for f in (attn.sinks, attn.scores, attn.entropy):
            with pytest.raises(kvfast.QueriesError, match="position 5"):
                f(st, bad)  # type: ignore[operator]
        # SnapKV keeps the last rows: their tokens are checked too
        with pytest.raises(kvfast.QueriesError, match="position 5"):
            attn.scores(st, bad, "snapkv", observe=2)


def test_queries_of_ones_own_sit_where_the_state_has_cells() -> None:
    rng = np.random.default_rng(1)
    with kvfast.open(STATE, model=QWEN3) as st:
        mine = attn.Queries.from_arrays(
            {il: rng.standard_normal((2, 4, 32)).astype(np.float32) for il in (0, 1)}, [3, 6]
        )
        assert attn.attention(st, mine).height > 0  # no tokens: no token check
        past = attn.Queries.from_arrays(
            {il: rng.standard_normal((2, 4, 32)).astype(np.float32) for il in (0, 1)}, [3, 40]
        )
        with pytest.raises(kvfast.QueriesError, match="row 1 is a query at position 40 of sequence 0") as e:
            attn.attention(st, past)
        assert e.value.field == "rows.pos"


def test_a_state_without_tokens_is_checked_by_name(tmp_path: Path) -> None:
    other = sidecar(tmp_path / "x.json", [2, 3], [0, 0], prompt_id="x", state="x.ggsq", whole_state=None)
    mine = sidecar(
        tmp_path / "y.json", [2, 3], [0, 0], prompt_id="y", state="y.ggsq", whole_state="state.bin"
    )
    with kvfast.open(SHARED, model=QWEN3) as st:
        assert st.cell_tokens()["token"].null_count() == st.cell_tokens().height  # no tokens known
        with pytest.raises(kvfast.QueriesError, match=r"captured for x\.ggsq, not .*state\.bin") as e:
            attn.attention(st, other)
        assert e.value.field == "state"
        assert attn.attention(st, mine).height > 0  # its whole_state names the file


def test_the_model_is_compared_by_its_header(tmp_path: Path) -> None:
    side = sidecar(tmp_path / "a.json", [4, 5], [253, 230], prompt_id="a", arch="qwen3")
    copy = tmp_path / "elsewhere.gguf"
    shutil.copyfile(QWEN3, copy)
    with kvfast.open(STATE, model=QWEN3) as st:
        assert attn.attention(st, side, model=copy).height > 0  # the same model at another path
        with pytest.raises(kvfast.ModelMismatchError, match="captured with a qwen3 model .*is gemma3"):
            attn.attention(st, side, model=DATA / "models/tiny-gemma3.gguf")
        hd128 = DATA / "models/tiny-qwen3-hd128.gguf"  # the same arch, another geometry
        with pytest.raises(kvfast.ModelMismatchError, match="is another model"):
            attn.attention(st, side, model=hd128)


@pytest.fixture(scope="module")
def two_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("llama_cpp")
    from kvfast import probe

    out = tmp_path_factory.mktemp("belong")
    prompts = [
        {"id": "a", "tokens": [68, 32, 130, 60, 253, 230, 241]},
        {"id": "b", "tokens": [68, 32, 130, 60, 11, 12, 13]},  # a's first 4, then others
        {"id": "c", "tokens": [5, 6, 7]},
    ]
    probe.run(QWEN3, prompts, out / "run", n_ctx=64, queries="all", progress=False)
    return out / "run"


def test_commands_refuse_another_prompts_queries(
    two_prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = str(two_prompts / "a.ggsq"), str(two_prompts / "b.queries.json")
    assert main(["stats", a, "--queries", str(two_prompts / "a.queries.json")]) == 0
    capsys.readouterr()
    runs = [
        ["stats", a, "--queries", b],
        ["prune", a, "-o", str(tmp_path / "p.ggsq"), "--ratio", "0.5", "--score", "snapkv", "--queries", b],
    ]
    try:
        import matplotlib  # noqa: F401

        runs.append(["plot", "attention", a, "--queries", b, "--layer", "0", "-o", str(tmp_path / "m.png")])
    except ImportError:
        pass
    for argv in runs:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert "prompt 'b'" in err and "a.ggsq" in err and "at position 4" in err, err
    assert not (tmp_path / "p.ggsq").exists()


def test_a_renamed_state_does_not_take_another_rows_pieces(two_prompts: Path, tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(two_prompts, folder)
    with kvfast.open(folder / "b.ggsq") as st:
        assert st.pieces is not None  # its own row: pieces and geometry from the manifest
    # the same size (7 tokens each), other tokens: a's state under b's name
    os.replace(folder / "a.ggsq", folder / "b.ggsq")
    with pytest.warns(kvfast.ManifestWarning, match="records other tokens than the file holds"):
        st = kvfast.open(folder / "b.ggsq")
    assert st.pieces is None
    assert st.tokens is not None and st.tokens.tolist()[4:] == [253, 230, 241]
    st.close()
    # another size: c's row (3 tokens) beside a 7-token state
    shutil.copyfile(two_prompts / "a.ggsq", folder / "c.ggsq")
    with pytest.warns(kvfast.ManifestWarning, match="records a state of .* bytes, the file has"):
        st = kvfast.open(folder / "c.ggsq", model=QWEN3)
    assert st.pieces is None
    st.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with kvfast.open(two_prompts / "a.ggsq") as st:  # the run's own state: no warning
            assert st.pieces is not None
