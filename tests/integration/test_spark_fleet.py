"""The fleet table: one row per run and attempt, the same from either engine (issue #30).

What must hold: ``goodlens fleet`` over a generated fleet of 300 small runs writes the
same table whether DuckDB or Spark summarised the raw rows; the table is plain Parquet that
DuckDB and Spark read without goodlens, and the documented example query (goodput by week
and job name, docs/spark.md) gives one answer on both; its numbers are the report's (a
run's attempts add up to its report) and, on a small run, the ones worked out by hand.
Real Spark (local mode, one session for both Spark modules), real Parquet datasets, no mocks.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from urllib.parse import quote

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

pytest.importorskip("pyspark", reason="the Spark engine needs pip install 'goodlens[spark]'")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime (make test installs default-jre-headless)",
                allow_module_level=True)

from goodlens.analysis.fleet import FLEET_COLUMNS, FLEET_NAMES
from goodlens.analysis.report import report_dict
from goodlens.cli import main
from goodlens.model.batch import validate_batch
from goodlens.storage.parquet import ParquetStore
from goodlens.storage.schema import RUN_NAMES
from goodlens.storage.segments import hour_name
from tests.harness import ROOT

pytestmark = [pytest.mark.slow,  # pyspark 4.3 warns of pandas 3, which it does not use here
              pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")]
JOBS = ("llama-8b", "llama-70b", "mixtral-8x7b", "gpt-neox-20b", "t5-xxl", "vit-huge",
        "bert-large")
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
SPAN_S = 42 * 86_400.0  # six weeks of runs
RUNS = 300  # 49 groups of the example query hold 3 to 8 runs each; 1,000 until
#           2026-12-07 (twice the accounting's 12 s and the summaries' writes: docs/testing.md)
AT = T0 + SPAN_S + 86_400.0  # runs still in progress are accounted up to here


def fleet_run(i: int, n: int) -> dict:
    """Run ``i`` of ``n``: 2, 4 or 8 ranks, 1 to 3 attempts (a GPU failure rolls back to the
    last checkpoint), a slow rank in every fourth run, checkpoints in every third, and the
    ending mix of a real fleet: most complete, some are preempted, the last few still run."""
    rng = np.random.default_rng(i)
    ranks = int(rng.choice([2, 4, 8]))
    t = T0 + i * SPAN_S / n + float(rng.uniform(0, 600))
    attempts = 1 + (i % 3 == 0) + (i % 7 == 0)
    ending = "running" if i >= n - 5 else ("preempted" if i % 11 == 0 else "completed")
    steps: dict[str, list] = {k: [] for k in (
        "attempt", "rank", "host", "step", "start_time", "duration_s", "compute_s",
        "collective_wait_s", "data_wait_s", "samples")}
    ev: dict[str, list] = {k: [] for k in ("seq", "kind", "time", "attempt", "step", "cause")}

    def event(kind: str, at: float, a: int, step: int | None = None,
              cause: str | None = None) -> None:
        for k, v in (("seq", len(ev["seq"])), ("kind", kind), ("time", at), ("attempt", a),
                     ("step", step), ("cause", cause)):
            ev[k].append(v)
    first, slow = 0, (int(rng.integers(ranks)) if i % 4 == 0 else None)
    for a in range(attempts):
        event("attempt_start", t, a)
        t += float(rng.uniform(5, 20))  # init
        n_steps = int(rng.integers(10, 30))
        ckpt_at = first + n_steps // 2
        for s in range(first, first + n_steps):
            dur = 1.0 + float(rng.gamma(2.0, 0.02))
            comp = 0.6 + rng.normal(0, 0.01, ranks) + (0.15 * (np.arange(ranks) == slow))
            data = rng.exponential(0.002, ranks)
            steps["attempt"] += [a] * ranks
            steps["rank"] += list(range(ranks))
            steps["host"] += [f"h{i}-{r // 2}" for r in range(ranks)]
            steps["step"] += [s] * ranks
            steps["start_time"] += (t + rng.normal(0, 1e-4, ranks)).tolist()
            steps["duration_s"] += [dur] * ranks
            steps["compute_s"] += comp.tolist()
            steps["data_wait_s"] += data.tolist()
            steps["collective_wait_s"] += np.maximum(0.0, dur - comp - data).tolist()
            steps["samples"] += [4] * ranks
            t += dur
            if s == ckpt_at and i % 3 == 0:
                event("ckpt_save_start", t, a, step=s)
                t += float(rng.uniform(0.5, 3))
                event("ckpt_save_blocking_end", t, a, step=s)
        if a < attempts - 1:
            event("failure", t + 0.3, a, cause="gpu_xid")
            t += float(rng.uniform(5, 30))
            event("failure_detected", t, a, cause="gpu_xid")
            t += float(rng.uniform(10, 60))  # queue
            first = ckpt_at + 1
        elif ending == "completed":
            event("attempt_end", t + 0.5, a, cause="completed")
        elif ending == "preempted":
            event("preempted", t + 0.5, a)
    return {"schema_version": 1, "run_id": f"fleet-{i:04d}",
            "run": {"name": JOBS[i % len(JOBS)], "world_size": ranks, "gpus_per_rank": 1},
            "steps": steps, "events": {"source": f"launcher-{i}", **ev}}


def write_fleet(root: Path, n: int) -> None:
    """The fleet as a dataset: segments laid out as collectors write them (run and hour
    partitions, sorted), written directly rather than through a collector's durable writer
    (a thousand fsyncs would dominate the test)."""
    ParquetStore(root).close()  # the dataset's marker
    metas = []
    for i in range(n):
        b = validate_batch(fleet_run(i, n))
        key = f"run_id={quote(b.run_id, safe='')}"
        for table, t, col, order in (
                ("steps", b.steps, "start_time", ("attempt", "step", "rank")),
                ("events", b.events, "time", ("time", "source", "seq"))):
            t = t.sort_by([(c, "ascending") for c in order])
            hours = (t.column(col).to_numpy() // 3600).astype("int64")
            for h in np.unique(hours):
                folder = root / table / key / f"hour={hour_name(h)}"
                folder.mkdir(parents=True, exist_ok=True)
                pq.write_table(t.filter(pa.array(hours == h)),
                               folder / f"gen-00000000-{i:08d}.parquet")
        metas.append({"run_id": b.run_id, **{c: b.run.get(c) for c in RUN_NAMES},
                      "first_seen": float(np.min(b.steps.column("start_time"))),
                      "written": 0.0})
    types = {c: (pa.string() if c in ("name", "tags") else pa.int64()) for c in RUN_NAMES}
    pq.write_table(pa.table({"run_id": pa.array([m["run_id"] for m in metas]),
                             **{c: pa.array([m[c] for m in metas], types[c])
                                for c in RUN_NAMES},
                             "first_seen": [m["first_seen"] for m in metas],
                             "written": [m["written"] for m in metas]}),
                   root / "runs" / "gen-00000000-00000000.parquet")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, spark_session) -> dict[str, Path]:
    """The fleet written once, its table built by each engine from its own copy."""
    base = tmp_path_factory.mktemp("fleet")
    write_fleet(base / "duckdb", RUNS)
    shutil.copytree(base / "duckdb", base / "spark")
    out = {}
    for engine in ("duckdb", "spark"):
        r = CliRunner().invoke(main, ["fleet", "--db", f"parquet:{base / engine}", "--engine",
                                      engine, "--at", str(AT), "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
        assert doc["summarize"]["engine"] == engine
        assert doc["summarize"]["runs_summarised"] == RUNS
        out[engine] = Path(doc["path"])
    return out


def test_the_fleet_table_is_the_same_from_either_engine(fleet) -> None:
    a, b = pq.read_table(fleet["duckdb"]), pq.read_table(fleet["spark"])
    assert a.schema.names == b.schema.names == FLEET_NAMES
    assert a.num_rows == b.num_rows
    assert len(set(a.column("run_id").to_pylist())) == RUNS
    assert a.num_rows == sum(1 + (i % 3 == 0) + (i % 7 == 0) for i in range(RUNS))
    for name in FLEET_NAMES:
        x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
        if pa.types.is_floating(a.schema.field(name).type):
            assert np.allclose(np.array(x, dtype=float), np.array(y, dtype=float),
                               rtol=1e-9, atol=1e-9, equal_nan=True), name
        else:
            assert x == y, name
    # written by each engine, as its file's metadata says
    assert pq.read_schema(fleet["spark"]).metadata[b"goodlens.summaries_engine"] == b"spark"


def example_query() -> str:
    """The SQL block of docs/spark.md's example (goodput by week and job name)."""
    text = (ROOT / "docs" / "spark.md").read_text()
    block = re.search(r"<!-- fleet-example -->\s*```sql\n(.*?)```", text, re.S)
    assert block, "docs/spark.md lost its example query"
    return block.group(1)


def test_the_documented_query_answers_the_same_on_duckdb_and_spark(fleet, spark_session) -> None:
    query = example_query()
    con = duckdb.connect()
    con.execute(f"CREATE VIEW fleet AS SELECT * FROM read_parquet('{fleet['duckdb']}')")
    by_duckdb = con.execute(query).fetchall()
    spark_session.read.parquet(str(fleet["duckdb"].parent)).createOrReplaceTempView("fleet")
    by_spark = [tuple(r) for r in spark_session.sql(query).collect()]
    # runs start over six weeks from Thursday 2026-01-01: seven calendar weeks, seven names
    assert len(by_duckdb) == len(by_spark) == 7 * len(JOBS)
    assert sum(r[2] for r in by_duckdb) == RUNS  # every run once
    for d, s in zip(by_duckdb, by_spark):
        assert d[:3] == s[:3]  # week, job, runs
        assert d[3:] == pytest.approx(s[3:], rel=1e-12)
        assert 0.0 < d[3] < 1.0  # a goodput


def test_a_runs_attempts_add_up_to_its_report(fleet) -> None:
    t = pq.read_table(fleet["duckdb"]).to_pandas()
    store = ParquetStore(fleet["duckdb"].parent.parent, read_only=True)
    try:
        for run in ("fleet-0000", "fleet-0007", "fleet-0011", f"fleet-{RUNS - 1:04d}"):
            rep = report_dict(store, run, now=AT)
            rows = t[t.run_id == run]
            assert len(rows) == len(rep["attempts"])
            assert rows.wall_clock_s.sum() == pytest.approx(rep["wall_clock_s"], abs=1e-6)
            for b, v in rep["buckets"].items():
                assert rows[f"{b}_s"].sum() == pytest.approx(v, abs=1e-6), (run, b)
            for p, v in rep["restart_parts"].items():
                assert rows[f"restart_{p}_s"].sum() == pytest.approx(v, abs=1e-6), (run, p)
            assert rows.gpu_hours.sum() == pytest.approx(
                rep["gpu_seconds"]["allocated"] / 3600, abs=1e-9)
            assert (rows.state == rep_state(store, run)).all()
    finally:
        store.close()


def rep_state(store: ParquetStore, run: str) -> str:
    return str(store.run(run)["state"])


def test_a_small_run_has_the_numbers_worked_out_by_hand(tmp_path) -> None:
    """Three ranks. Attempt 0 starts at 0, steps 0-3 run 10-14 (1 s each, no straggler),
    a GPU fails at 14, found at 20; attempt 1 starts at 30, resumes at step 2 (rolled
    back), steps 2-5 run 40-44, ends at 44. So: startup init 10 (0-10); productive 2
    (steps 0-1) + 4 (steps 2-5 again); recompute 2 (steps 2-3 of attempt 0); restart
    detection 6 (14-20), queue 10 (20-30), init 10 (30-40); wall-clock 44; 3 GPUs."""
    root = tmp_path / "d"
    store = ParquetStore(root)
    rows = {"attempt": [], "rank": [], "step": [], "start_time": [], "duration_s": [],
            "compute_s": [], "collective_wait_s": []}
    for attempt, first, t0 in ((0, 0, 10.0), (1, 2, 40.0)):
        for k in range(4):
            for r in range(3):
                for c, v in (("attempt", attempt), ("rank", r), ("step", first + k),
                             ("start_time", 1e6 + t0 + k), ("duration_s", 1.0),
                             ("compute_s", 0.5), ("collective_wait_s", 0.5)):
                    rows[c].append(v)
    events = {"source": "launcher", "seq": list(range(5)),
              "kind": ["attempt_start", "failure", "failure_detected", "attempt_start",
                       "attempt_end"],
              "time": [1e6 + x for x in (0.0, 14.0, 20.0, 30.0, 44.0)],
              "attempt": [0, 0, 0, 1, 1], "cause": [None, "gpu_xid", "gpu_xid", None,
                                                   "completed"]}
    store.write_group([validate_batch({
        "schema_version": 1, "run_id": "small", "run": {"name": "tiny", "world_size": 3},
        "steps": rows, "events": events})])
    store.close()
    r = CliRunner().invoke(main, ["fleet", "--db", f"parquet:{root}", "--json"])
    assert r.exit_code == 0, r.output
    t = pq.read_table(json.loads(r.output)["path"]).to_pylist()
    assert [x["attempt"] for x in t] == [0, 1]
    a0, a1 = t
    assert a0["wall_clock_s"] == pytest.approx(30.0) and a1["wall_clock_s"] == pytest.approx(14)
    assert (a0["startup_s"], a0["startup_init_s"]) == pytest.approx((10.0, 10.0))
    assert (a0["productive_s"], a0["recompute_s"]) == pytest.approx((2.0, 2.0))
    assert (a0["restart_detection_s"], a0["restart_queue_s"]) == pytest.approx((6.0, 10.0))
    assert (a1["restart_init_s"], a1["productive_s"]) == pytest.approx((10.0, 4.0))
    assert a1["restart_s"] == pytest.approx(10.0) and a1["startup_s"] == 0.0
    assert a0["straggler_wait_s"] == pytest.approx(0.0)
    assert a0["goodput"] == pytest.approx(2 / 30) and a1["goodput"] == pytest.approx(4 / 14)
    total_hours = a0["gpu_hours"] + a1["gpu_hours"]
    assert total_hours == pytest.approx(3 * 44 / 3600)
    assert (a0["ranks"], a0["world_size"], a0["state"]) == (3, 3, "completed")
    assert (a0["attempt_end"], a1["attempt_end"]) == ("failed", "completed")
    assert (a0["steps_kept"], a0["steps_recomputed"], a1["steps_kept"]) == (2, 2, 4)
    assert str(a0["run_start_utc"]) == "1970-01-12 13:46:40"  # 1e6 s after the epoch, UTC
    assert a0["other_s"] == a1["other_s"] == pytest.approx(0.0, abs=1e-9)


def test_every_fleet_column_is_documented() -> None:
    text = (ROOT / "docs" / "spark.md").read_text()
    missing = [name for name, _, _ in FLEET_COLUMNS if f"`{name}`" not in text]
    assert not missing, f"docs/spark.md does not describe {missing}"
