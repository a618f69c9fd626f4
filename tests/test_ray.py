"""kvfast.ray on a real local Ray cluster (a head node and a second worker node, each its own
``ray start`` with one CPU, started once for the session) against the single-machine path on the
same states: read_states against scan, stats against scan_stats, export against export."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import DATA
from polars.testing import assert_frame_equal

ray = pytest.importorskip("ray")

import kvfast
import kvfast.ray as kray
from kvfast import dataset
from kvfast.dataset import states as states_of
from kvfast.ray import plan
from kvfast.ray.local import LocalCluster
from kvfast.ray.source import Work
from kvfast.read.opening import Opening

F16 = sorted(str(p) for p in DATA.glob("qwen3tiny-f16-fa*/seq-0.*"))
SHARED = dataset.expand(DATA / "qwen3tiny-3seq-shared")
KEY = ["dump", "cache", "stream", "layer", "kind", "cell", "seq_id", "head"]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def cluster() -> Iterator[str]:
    """A head and a worker node on this machine (two raylets, one CPU each); the driver connected.
    Kept to the end of the session: later tests that use Ray (test_remote's) find it initialized."""
    with LocalCluster(nodes=2, cpus=1) as c:
        ray.data.DataContext.get_current().enable_progress_bars = False
        yield c.address


def test_the_cluster_has_two_nodes(cluster: str) -> None:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2 and all(n["Resources"].get("CPU") == 1 for n in nodes)


def test_datasets_pickle(cluster: str) -> None:
    """A Dataset goes to other processes (Ray Train, a task): its source holds no open state."""
    ds = kray.read_states(F16, head_dim=32, layer=1)
    assert ds.count() == len(F16) * 2 * 7 * 2  # Ray projects no column to count
    assert ray.get(ray.remote(lambda d: d.count()).remote(ds)) == len(F16) * 2 * 7 * 2


def test_read_states_is_scan(cluster: str) -> None:
    ds = kray.read_states(F16, head_dim=32)
    blocks = ray.get(ds.to_arrow_refs())
    assert blocks and all(isinstance(b, pa.Table) for b in blocks)  # Arrow blocks, not pandas
    assert all(b.schema.field("values").type == pa.list_(pa.float16(), 32) for b in blocks)
    got = kray.to_polars(ds)
    want = kvfast.scan(F16, head_dim=32).collect()
    assert got.schema == want.schema and got.schema["values"] == pl.Array(pl.Float16, 32)
    assert_frame_equal(got.sort(KEY), want.sort(KEY))


def test_read_tasks_run_on_both_nodes(cluster: str) -> None:
    def node(batch: pa.Table) -> pa.Table:
        here = ray.get_runtime_context().get_node_id()
        return pa.table({"node": [here] * batch.num_rows})

    ds = kray.read_states(SHARED, head_dim=32).map_batches(node, batch_format="pyarrow")
    assert len(set(kray.to_polars(ds)["node"].to_list())) == 2


def test_selections_and_filters_are_scans(cluster: str) -> None:
    lf = kvfast.scan(SHARED, head_dim=32)
    cases = [
        ({"layer": 1, "kind": "v"}, lf.filter(pl.col("layer") == 1, pl.col("kind") == "v")),
        ({"head": [1], "seq_id": 2}, lf.filter(pl.col("head") == 1, pl.col("seq_id") == 2)),
        ({"filter": (pl.col("pos") >= 12) & (pl.col("head") == 1)}, lf.filter(pl.col("pos") >= 12, head=1)),
        (
            {"filter": pl.col("values").arr.max() > 2.5, "cache": 0},
            lf.filter(pl.col("values").arr.max() > 2.5),
        ),
        (
            {"dump": kvfast.dump_id(SHARED[0]), "model_layer": [0]},
            lf.filter(dump=kvfast.dump_id(SHARED[0]), layer=0),
        ),
    ]
    for kw, want in cases:
        got = kray.to_polars(kray.read_states(SHARED, head_dim=32, **kw))
        assert_frame_equal(got.sort(KEY), want.collect().sort(KEY))


def test_an_empty_selection_keeps_the_schema(cluster: str) -> None:
    got = kray.to_polars(kray.read_states(F16, head_dim=32, layer=9))
    want = kvfast.scan(F16, head_dim=32).filter(layer=9).collect()
    assert got.is_empty() and got.schema == want.schema
    got = kray.to_polars(kray.read_states(F16, head_dim=32, filter=pl.col("pos") > 99))
    assert got.is_empty() and got.schema == want.schema
    got = kray.to_polars(kray.stats(F16, by="layer", head_dim=32, kind="r"))
    assert got.is_empty() and got.schema == kvfast.scan_stats(F16, by="layer", head_dim=32).collect_schema()


def test_ray_filters_are_pushed_down(cluster: str) -> None:
    from ray.data.expressions import col

    ds = kray.read_states(SHARED, head_dim=32)
    lf = kvfast.scan(SHARED, head_dim=32)
    cases = [
        (col("layer") == 1, lf.filter(layer=1)),
        ((col("head") == 1) & (col("pos") >= 12), lf.filter(pl.col("pos") >= 12, head=1)),
        (col("kind").is_in(["v"]) & ~(col("cell") < 3), lf.filter(pl.col("cell") >= 3, kind="v")),
        ((col("pos") + 1) > 12, lf.filter(pl.col("pos") > 11)),  # not pushed: Ray filters it
    ]
    for expr, want in cases:
        got = kray.to_polars(ds.filter(expr=expr))
        assert_frame_equal(got.sort(KEY), want.collect().sort(KEY))


def test_ray_filters_narrow_the_plan() -> None:
    from ray.data.expressions import col

    from kvfast.ray.ray_expr import to_polars
    from kvfast.ray.source import StatesSource

    how = Opening(head_dim=32)
    sel = plan.selection(None, {"kind": "k"})
    schema = {**dataset.INDEX_SCHEMA, "values": pl.Array(pl.Float16, 32)}
    src = StatesSource(
        plan.plan(_states(SHARED), sel, False, 1), Work(how, sel, "values", None), schema, None, "t"
    )
    pushed = src.apply_predicate(col("layer") == 1)
    assert {r for t in pushed.tasks(1000) for r in t.records} == {(0, 1, "k")}
    assert pushed._work.sel.records is not None and pushed is not src
    rows = src.apply_predicate(col("head") == 0)
    assert rows._work.sel.index_only and len(rows.tasks(1000)) == len(src.tasks(1000))
    # the cache types are record columns: a state of other types is never planned
    q8 = str(DATA / "qwen3tiny-q8_0-fa/seq-0.bin")
    typed = plan.plan(_states([SHARED[0], q8]), plan.selection(pl.col("k_type") == "q8_0", {}), False, 1)
    assert set(typed.records["dump"]) == {kvfast.dump_id(q8)} and typed.records.height == 4
    tokens = plan.selection(pl.col("token").is_null(), {})
    assert tokens.records is None and tokens.index_only
    assert src.apply_predicate((col("pos") + 1) > 2) is src  # arithmetic: left to Ray
    assert src.apply_predicate(col("nope") == 1) is src
    assert str(to_polars(col("seq_id").is_null() | col("pos").not_in([1, 2]))) == str(
        pl.col("seq_id").is_null() | ~pl.col("pos").is_in([1, 2])
    )


def test_columns_and_projection(cluster: str) -> None:
    ds = kray.read_states(F16, head_dim=32, columns=["dump", "pos", "values"])
    got = kray.to_polars(ds.select_columns(["dump", "pos"]))
    want = kvfast.scan(F16, head_dim=32).select("dump", "pos").collect()
    assert got.columns == ["dump", "pos"]
    assert_frame_equal(got.sort("dump", "pos"), want.sort("dump", "pos"))
    with pytest.raises(ValueError, match="no columns"):
        kray.read_states(F16, head_dim=32, columns=["nope"])


def test_two_caches_and_keys_before_rope(cluster: str) -> None:
    """An iSWA pair (Gemma 3: two caches), and keys before RoPE with a model (its geometry and
    GGUF path go to the workers)."""
    gemma = dataset.expand(DATA / "gemma3-270m-f16-fa")
    got = kray.to_polars(kray.read_states(gemma, head_dim=256, kind="k", cache=1))
    want = kvfast.scan(gemma, head_dim=256).filter(kind="k", cache=1).collect()
    assert_frame_equal(got.sort(KEY), want.sort(KEY))
    got = kray.to_polars(kray.stats(gemma, by="head", head_dim=256))
    want = kvfast.scan_stats(gemma, by="head", head_dim=256).collect()
    keys = ["dump", "cache", "layer", "kind", "head"]
    assert_frame_equal(got.sort(keys), want.sort(keys))
    model = DATA / "models" / "tiny-qwen3.gguf"
    d = DATA / "qwen3tiny-3seq-shared"
    got = kray.to_polars(kray.read_states(d, model=model, pre_rope=True, kind="k"))
    want = kvfast.scan(d, model=model, pre_rope=True).filter(kind="k").collect()
    assert got.schema["values"] == pl.Array(pl.Float32, 32)
    assert_frame_equal(got.sort(KEY), want.sort(KEY))


def test_mixed_types_decode_to_float32(cluster: str) -> None:
    paths = [str(DATA / "qwen3tiny-f16-fa/seq-0.bin"), str(DATA / "qwen3tiny-q8_0-fa/seq-0.bin")]
    got = kray.to_polars(kray.read_states(paths, head_dim=32))
    want = kvfast.scan(paths, head_dim=32).collect()
    assert got.schema["values"] == pl.Array(pl.Float32, 32)
    assert_frame_equal(got.sort(KEY), want.sort(KEY))


def _states(paths: list[str]) -> list[tuple[str, kvfast.State]]:
    return [(p, kvfast.open(p, head_dim=32)) for p in paths]


def test_planning_reads_only_the_selected_records() -> None:
    """One layer of many states: the tasks hold that layer's records alone, and reading them reads
    that layer's bytes alone (the tasks run here, in this process, to count)."""
    states = _states(SHARED)
    sel = plan.selection(None, {"layer": 1})
    tasks = plan.plan(states, sel, False, task_bytes=1).tasks(200)
    assert {r[1] for t in tasks for r in t.records} == {1}
    assert sorted({t.path for t in tasks}) == sorted(SHARED)
    how = Opening(head_dim=32)
    want = sum(states_of.record_bytes(d, 0, 1, k) for _, d in states for k in "kv")
    assert sum(t.nbytes for t in tasks) == want
    work = Work(how, sel, "values", None)
    dataset.READS.clear()
    for t in tasks:
        list(work.run(t, [*dataset.INDEX_SCHEMA, "values"]))
    assert dataset.READS["records"] == 2 * len(SHARED) and dataset.READS["bytes"] == want
    dataset.READS.clear()  # without values in the columns: no value byte
    for t in tasks:
        list(work.run(t, ["dump", "pos"]))
    assert dataset.READS["records"] == 0
    # index predicates: records with no row left are not read (only 4 states hold positions >= 12)
    sel = plan.selection(pl.col("pos") >= 12, {"head": 1})
    assert sel.index_only and sel.records is None
    dataset.READS.clear()
    for t in plan.plan(states, sel, False).tasks(1):
        list(Work(how, sel, "values", None).run(t, ["values"]))
    assert dataset.READS["records"] == 4 * 4


def test_tasks_split_states_by_bytes_never_across() -> None:
    states = _states(F16)
    one = plan.plan(states, plan.selection(None, {}), False).tasks(1)
    assert len(one) == len(F16) and all(len(t.records) == 4 for t in one)
    assert plan.plan(states, plan.selection(None, {}), False).tasks(1000) == one  # small: a task a state
    many = plan.plan(states, plan.selection(None, {}), False, 1).tasks(1000)
    assert len(many) == 4 * len(F16) and all(len(t.records) == 1 for t in many)
    stats = plan.plan(states, plan.selection(None, {"kind": "k"}), True, 1).tasks(1000)
    assert len(stats) == 2 * len(F16) and all(t.kinds == ["k"] and len(t.layers) == 1 for t in stats)


def test_bad_selections_are_refused() -> None:
    with pytest.raises(kvfast.SelectionError, match="layer"):
        plan.selection(None, {"layer": "1"})
    with pytest.raises(kvfast.SelectionError, match="kind"):
        plan.selection(None, {"kind": 1})
    # keys before RoPE without the model's GGUF: refused on the driver, by opening, before any task
    with pytest.raises(kvfast.PreRopeError, match="GGUF"):
        kray.read_states(SHARED, pre_rope=True)


@pytest.mark.parametrize("by", ["cell", "channel", "head", "layer"])
def test_stats_is_scan_stats(cluster: str, by: str) -> None:
    got = kray.to_polars(kray.stats(SHARED, by=by, head_dim=32))
    want = kvfast.scan_stats(SHARED, by=by, head_dim=32).collect()
    keys = [c for c, t in want.schema.items() if not t.is_float()]
    assert got.schema == want.schema
    assert_frame_equal(got.sort(keys), want.sort(keys))
    if by == "channel":
        got = kray.to_polars(kray.stats(SHARED, by=by, head_dim=32, layer=1, filter=pl.col("head") == 0))
        want = kvfast.scan_stats(SHARED, by=by, head_dim=32).filter(layer=1, head=0).collect()
        assert got.height
        assert_frame_equal(got.sort(keys), want.sort(keys))


def _tree(out: Path) -> dict[str, object]:
    """Every file of an export (not the staging beside it), Parquet read as tables, markers as JSON."""
    files: dict[str, object] = {}
    for f in sorted(out.rglob("*")):
        if f.is_file():
            rel = str(f.relative_to(out))
            files[rel] = pq.read_table(f) if f.suffix == ".parquet" else json.loads(f.read_text())
    return files


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"what": "stats", "by": "channel", "partition_by": ("layer", "kind")},
        {"hive": True, "dtype": "native", "partition_by": ("layer", "kind")},
    ],
)
def test_export_is_kvfast_export(cluster: str, tmp_path: Path, opts: dict[str, object]) -> None:
    one, many = tmp_path / "one", tmp_path / "many"
    want = kvfast.export(F16, one, head_dim=32, jobs=1, **opts)  # type: ignore[arg-type]
    got = kray.export(F16, many, head_dim=32, **opts)  # type: ignore[arg-type]
    assert_frame_equal(got, want)
    a, b = _tree(one), _tree(many)
    assert list(a) == list(b) and len(a) == len(F16) * (3 if not opts else 5)
    assert opts.get("hive", False) == any("layer=" in name for name in a)
    for name in a:
        assert a[name] == b[name] if name.endswith(".json") else a[name].equals(b[name]), name  # type: ignore[union-attr]
    assert not list(tmp_path.glob(".*"))  # no staging left beside the output
    again = kray.export(F16, many, head_dim=32, **opts)  # type: ignore[arg-type]
    assert again["status"].to_list() == ["skipped"] * len(F16)


def test_export_failures_are_reported(cluster: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(F16[0], src / "a.bin")
    (src / "b.bin").write_bytes(Path(F16[0]).read_bytes()[:1000])  # truncated
    shutil.copy(F16[1], src / "c.ggsq")
    report = kray.export(src, tmp_path / "skip", head_dim=32, on_error="skip")
    assert report["status"].to_list() == ["written", "failed", "written"]
    assert report["error"][1].startswith("TruncatedError") and "byte" in report["error"][1]
    assert not [p for p in (tmp_path / "skip").iterdir() if p.name.startswith("b-")]
    with pytest.raises(kvfast.ExportError) as e:
        kray.export(src, tmp_path / "fail", head_dim=32, on_error="fail", tasks=1)
    assert "b.bin" in str(e.value) and "failed" in e.value.report["status"].to_list()
    with pytest.raises(ValueError, match="partition_by"):
        kray.export(src, tmp_path / "x", partition_by=("head",))


def test_readme_ray_snippet(cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ray guide's example (its one block that imports kvfast.ray) runs as written on the
    cluster (tests/test_docs.py runs it alone, on a Ray it starts)."""
    page = (ROOT / "docs" / "guide" / "ray.md").read_text()
    blocks = re.findall(r"```python\n(import kvfast\.ray.*?)```", page, re.DOTALL)
    assert len(blocks) == 1
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "data").symlink_to(ROOT / "tests" / "data")
    monkeypatch.chdir(tmp_path)
    ns: dict[str, object] = {}
    exec(compile(blocks[0], "docs/guide/ray.md", "exec"), ns)  # noqa: S102 (the guide is the code under test)
    assert list(tmp_path.glob("parquet-ray/*/layer-1.parquet"))
