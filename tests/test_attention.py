"""kvfast.attention and its reductions against a NumPy computation of the same weights from the
same keys (kvfast's values), on llama.cpp-written states; the queries file format; the errors.
The comparison with llama.cpp's own softmax is in test_attention_llama.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import DATA

import kvfast
from kvfast import attn

QWEN3 = DATA / "models/tiny-qwen3.gguf"
STATE = DATA / "qwen3tiny-f16-fa/seq-0.ggsq"
SHARED = DATA / "qwen3tiny-3seq-shared/state.bin"


def random_queries(pos: list[int], seq: list[int] | int = 0, seed: int = 0) -> attn.Queries:
    rng = np.random.default_rng(seed)
    n = len(pos)
    return attn.Queries.from_arrays(
        {il: rng.standard_normal((n, 4, 32)).astype(np.float32) * 3 for il in (0, 1)}, pos, seq, str(QWEN3)
    )


def reference(
    st: kvfast.State, q: attn.Queries, scale: float, sinks: dict[int, list[float]] | None = None
) -> pl.DataFrame:
    """The weights in NumPy, float64: causal by position and sequence, query head h reading KV head h // 2."""
    out = []
    for li in (0, 1):
        for s in st.caches[0].streams:
            if not s.cell_count:
                continue
            k = st.values(li, "k", stream=s.index).astype(np.float64).reshape(s.cell_count, 2, 32)
            seqs = s.seq_ids
            for r in range(len(q.pos)):
                p1, sq = int(q.pos[r]), int(q.seq[r])
                vis = [c for c in range(s.cell_count) if s.pos[c] <= p1 and sq in seqs[c]]
                if not vis:
                    continue
                qq = q.layer(li)[r].astype(np.float64)
                for h in range(4):
                    lg = scale * (k[vis, h // 2] @ qq[h])
                    m = lg.max() if sinks is None else max(lg.max(), sinks[li][h])
                    e = np.exp(lg - m)
                    den = e.sum() + (0.0 if sinks is None else np.exp(sinks[li][h] - m))
                    for c, wgt in zip(vis, e / den, strict=True):
                        out.append((li, s.index, h, p1, sq, c, int(s.pos[c]), float(wgt)))
    return pl.DataFrame(
        out, schema=["layer", "stream", "head", "query_pos", "seq_id", "cell", "pos", "ref"], orient="row"
    )


KEYS = ["layer", "stream", "head", "query_pos", "seq_id", "cell"]


def joined(w: pl.DataFrame, ref: pl.DataFrame) -> pl.DataFrame:
    w = w.with_columns(pl.col(c).cast(pl.Int64) for c in KEYS)
    ref = ref.with_columns(pl.col(c).cast(pl.Int64) for c in KEYS)
    j = w.join(ref, on=KEYS, how="full", coalesce=True)
    assert j["weight"].null_count() == 0 and j["ref"].null_count() == 0, "the same cells on both sides"
    return j


def test_weights_equal_numpy_on_one_sequence() -> None:
    with kvfast.open(STATE, model=QWEN3) as st:
        q = random_queries([0, 3, 6])
        w = attn.attention(st, q)
        assert w.columns == [
            "cache", "stream", "layer", "model_layer", "head", "query_pos", "seq_id", "cell", "pos", "weight",
        ]  # fmt: skip
        j = joined(w, reference(st, q, 1 / np.sqrt(32)))
        assert len(j) == 2 * 4 * (1 + 4 + 7)  # layers x heads x cells seen (causal)
        np.testing.assert_allclose(j["weight"], j["ref"], rtol=1e-5, atol=1e-12)  # f32 logits
        sums = w.group_by("layer", "head", "query_pos").agg(pl.col("weight").sum())["weight"]
        np.testing.assert_allclose(sums, 1.0, rtol=1e-12)
        # heads and layers select; the other reductions agree with the weights
        assert set(
            attn.attention(st, q, layers=[1], heads=[2, 3]).select("model_layer", "head").unique().rows()
        ) == {
            (1, 2),
            (1, 3),
        }
        m = attn.mass(st, q).sort("layer", "head", "cell")
        by = (
            w.group_by("layer", "head", "cell")
            .agg(pl.col("weight").sum(), pl.len().alias("n"))
            .sort("layer", "head", "cell")
        )
        np.testing.assert_allclose(m["mass"], by["weight"], rtol=1e-12)
        assert m["queries"].to_list() == by["n"].to_list()
        e = attn.entropy(st, q).sort("layer", "head", "query_pos")
        ent = (
            w.group_by("layer", "head", "query_pos")
            .agg((-(pl.col("weight") * pl.col("weight").log())).sum().alias("h"), pl.len().alias("n"))
            .sort("layer", "head", "query_pos")
        )
        np.testing.assert_allclose(e["entropy"], ent["h"], rtol=1e-6, atol=1e-12)  # from f32 sums
        assert e["cells"].to_list() == ent["n"].to_list()
        t = attn.top_k(st, q, k=2)
        best = w.sort("weight", descending=True).group_by("layer", "head", "query_pos").head(2)
        assert set(t.select("layer", "head", "query_pos", "cell").rows()) == set(
            best.select("layer", "head", "query_pos", "cell").rows()
        )
        assert t.filter(pl.col("query_pos") == 0)["rank"].to_list() == [0] * 8  # one cell seen


def test_reductions_in_one_pass_equal_each_alone() -> None:
    with kvfast.open(STATE, model=QWEN3) as st:
        q = random_queries([0, 1, 2, 3, 4, 5, 6])
        got = attn.reductions(st, q, ("weights", "mass", "entropy", "top_k"), k=3, chunk=2)
        assert list(got) == ["weights", "mass", "entropy", "top_k"]
        alone = {
            "weights": attn.attention(st, q, chunk=2),
            "mass": attn.mass(st, q, chunk=2),
            "entropy": attn.entropy(st, q, chunk=2),
            "top_k": attn.top_k(st, q, 3, chunk=2),
        }
        for name, want in alone.items():
            assert got[name].columns == want.columns and got[name].height == want.height > 0
            if name == "mass":  # sums over chunks added in the order they finish
                assert got[name].drop("mass").equals(want.drop("mass"))
                np.testing.assert_allclose(got[name]["mass"], want["mass"], rtol=1e-12)
            else:
                assert got[name].equals(want), name
        assert list(attn.reductions(st, q)) == ["mass", "entropy", "top_k"]
        for bad in ([], ["mass", "mass"]):
            with pytest.raises(ValueError, match="at most once, and one at least"):
                attn.reductions(st, q, bad)
        with pytest.raises(ValueError, match="what must be 'weights', 'mass'"):
            attn.reductions(st, q, ["heads"])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="k must be positive"):
            attn.reductions(st, q, ["top_k"], k=0)


def test_weights_follow_the_sequences_of_a_shared_state() -> None:
    """A whole-context state of three sequences sharing a prefix: a query sees its own
    sequence's cells (the prefix's cells hold all three)."""
    with kvfast.open(SHARED, model=QWEN3) as st:
        s = st.caches[0].streams[0]
        pos = [int(s.pos[c]) for c in range(s.cell_count)]
        last = {q: max(p for p, ids in zip(pos, s.seq_ids, strict=True) if q in ids) for q in (0, 1, 2)}
        q = random_queries([last[0], last[1], last[2], 2], [0, 1, 2, 1], seed=1)  # cells of each
        w = attn.attention(st, q, incomplete="skip")
        j = joined(w, reference(st, q, 1 / np.sqrt(32)))
        np.testing.assert_allclose(j["weight"], j["ref"], rtol=1e-5, atol=1e-12)  # f32 logits
        assert w["seq_id"].unique().sort().to_list() == sorted({0, 1, 2} & set(w["seq_id"].to_list()))


def test_scale_and_sinks_given() -> None:
    with kvfast.open(STATE, model=QWEN3) as st:
        q = random_queries([6])
        sinks = {0: [0.5, -1.0, 2.0, 0.0], 1: [1.0, 1.0, 1.0, 1.0]}
        w = attn.attention(st, q, scale=0.05, sinks=sinks)
        j = joined(w, reference(st, q, 0.05, sinks))
        np.testing.assert_allclose(j["weight"], j["ref"], rtol=1e-5, atol=1e-12)  # f32 logits
        total = w.group_by("layer", "head").agg(pl.col("weight").sum())["weight"]
        assert (total < 1).all()  # the sink takes its share


def test_queries_files_round_trip(tmp_path: Path) -> None:
    q = random_queries([1, 2])
    np.save(tmp_path / "x.queries.npy", q.values)
    side = {
        "format": "kvfast-queries",
        "version": 1,
        "values": "x.queries.npy",
        "shape": list(q.values.shape),
        "model": str(QWEN3),
        "rows": {"pos": [1, 2], "seq": [0, 0], "token": [32, 130], "generated": [False, True]},
        "layers": [
            {"model_layer": lay.model_layer, "offset": lay.offset, "n_head": 4, "head_dim": 32}
            for lay in q.layers
        ],
    }
    (tmp_path / "x.queries.json").write_text(json.dumps(side))
    back = attn.Queries.load(tmp_path / "x.queries.json")
    np.testing.assert_array_equal(back.layer(1), q.layer(1))
    df = back.to_polars()
    assert df.shape[0] == 2 * 4 * 2 and df.schema["q"] == pl.Array(pl.Float32, 32)
    with kvfast.open(STATE, model=QWEN3) as st:
        np.testing.assert_array_equal(
            attn.attention(st, tmp_path / "x.queries.json")["weight"], attn.attention(st, q)["weight"]
        )
    side["version"] = 2
    (tmp_path / "x.queries.json").write_text(json.dumps(side))
    with pytest.raises(ValueError, match="not a kvfast queries sidecar"):
        attn.Queries.load(tmp_path / "x.queries.json")


def test_bad_requests_name_what_is_wrong() -> None:
    with kvfast.open(STATE, model=QWEN3) as st:
        wrong = attn.Queries.from_arrays({0: np.zeros((1, 2, 32), np.float32)}, [3])
        with pytest.raises(
            kvfast.ModelMismatchError, match="the queries have 2 heads of 32 values, the model 4 of 32"
        ):
            attn.attention(st, wrong)
        q = random_queries([3])
        with pytest.raises(kvfast.SelectionError, match="head 4 out of range") as e:
            attn.attention(st, q, heads=[4])
        assert e.value.field == "heads"
        with pytest.raises(kvfast.SelectionError, match="model layer 7"):
            attn.attention(st, q, layers=[7])
        other = random_queries([3], seq=5)  # a sequence the state does not hold: not its queries
        with pytest.raises(
            kvfast.QueriesError, match="position 3 of sequence 5, where .* holds no cell"
        ) as e:
            attn.attention(st, other, incomplete="skip")
        assert e.value.field == "rows.pos"
        with pytest.raises(ValueError, match="k must be positive"):
            attn.top_k(st, q, k=0)
    with (
        kvfast.open(STATE, model=QWEN3, pre_rope=True) as st,
        pytest.raises(kvfast.SelectionError, match="pre_rope"),
    ):
        attn.attention(st, q)
    with kvfast.open(STATE) as st, pytest.raises(kvfast.SelectionError, match="model's GGUF"):
        attn.attention(st, attn.Queries.from_arrays({0: np.zeros((1, 4, 32), np.float32)}, [3]))
    with pytest.raises(ValueError, match="values of shape"):
        attn.Queries(np.zeros((2, 4), np.float32), np.zeros(3, np.int32), np.zeros(3, np.int32), [])


def sidecar(q: attn.Queries, path: Path) -> Path:
    """Queries as the probe runner writes them (values .npy and the JSON sidecar)."""
    np.save(path.with_name(path.name + ".npy"), q.values)
    side = {
        "format": "kvfast-queries",
        "version": 1,
        "values": path.name + ".npy",
        "shape": list(q.values.shape),
        "model": str(QWEN3),
        "rows": {"pos": q.pos.tolist(), "seq": q.seq.tolist()},
        "layers": [
            {"model_layer": x.model_layer, "offset": x.offset, "n_head": 4, "head_dim": 32} for x in q.layers
        ],
    }
    out = path.with_name(path.name + ".json")
    out.write_text(json.dumps(side))
    return out


def test_attention_scores_for_pruning(tmp_path: Path) -> None:
    from kvfast.cli import main

    with kvfast.open(STATE, model=QWEN3) as st:
        q = random_queries([3, 4, 5, 6], seed=3)
        per_cell = attn.mass(st, q).group_by("cell").agg(pl.col("mass").sum()).sort("cell")
        h2o = attn.scores(st, q, "h2o").sort("cell")
        np.testing.assert_allclose(h2o["score"], per_cell["mass"], rtol=1e-12)
        last = random_queries([6], seed=3)  # TOVA: the last query alone (the same vectors: row 3)
        last.values[:] = q.values[3:]
        tova = attn.scores(st, q, "tova").sort("cell")
        np.testing.assert_allclose(
            tova["score"], attn.mass(st, last).group_by("cell").agg(pl.col("mass").sum()).sort("cell")["mass"]
        )
        snap = attn.scores(st, q, "snapkv", observe=2, pool=1).sort("cell")
        two = attn.Queries(q.values[2:].copy(), q.pos[2:], q.seq[2:], q.layers, q.model)
        want = attn.mass(st, two).group_by("cell").agg(pl.col("mass").sum()).sort("cell")["mass"]
        np.testing.assert_allclose(snap["score"], want)
        pooled = attn.scores(st, q, "snapkv", observe=2, pool=3).sort("cell")["score"].to_numpy()
        np.testing.assert_allclose(pooled[1], want[:3].mean())  # a centred mean of 3 cells
        keep = attn.by_attention(st, q, 0.5, "h2o", sinks=1, window=1)
        assert len(keep) == 7 and keep[0] and keep[6]  # the sink and the last position kept
        free = h2o.filter(pl.col("pos").is_between(1, 5)).sort("score")["cell"].to_list()
        assert [c for c in range(7) if not keep[c]] == sorted(free[:2])  # floor(5 * 0.5) least attended go
        n = kvfast.write(st, tmp_path / "pruned.bin", keep=keep)
        assert n > 0
        s = attn.sinks(st, q)
        assert s.columns == [
            "cache", "stream", "cell", "pos", "piece", "share", "mass", "k_l2", "share_rank", "mass_rank", "k_l2_rank",
        ]  # fmt: skip
        assert s["share_rank"].to_list()[0] == 1 and s.height == 7
        with pytest.raises(ValueError, match="rule must be one of"):
            attn.scores(st, q, "knorm")  # type: ignore[arg-type]
    with kvfast.open(tmp_path / "pruned.bin", model=QWEN3) as e:
        assert e.caches[0].streams[0].pos.tolist() == [c for c in range(7) if keep[c]]
    side = sidecar(q, tmp_path / "q.queries")
    out = tmp_path / "cli.bin"
    args = ["prune", str(STATE), "-o", str(out), "--ratio", "0.5", "--sinks", "1", "--model", str(QWEN3)]
    assert main([*args, "--score", "h2o", "--queries", str(side)]) == 0
    with kvfast.open(out, model=QWEN3) as e:
        assert e.caches[0].streams[0].pos.tolist() == [c for c in range(7) if keep[c]]
    assert main([*args, "--score", "tova"]) == 2  # a usage error: --score tova needs --queries
