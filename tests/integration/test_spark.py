"""Spark in local mode against DuckDB: the per-step summaries and the fleet table.

What must hold:
- Summaries: the summarising step (raw step rows to per-step summaries, each key counted
  once) gives the same numbers on Spark local mode as on DuckDB: on a hand-written case whose
  summaries are worked out below by hand, on ``sample_data/sim-64`` written by two
  collectors (disjoint ranks, as the e2e two-collector test writes it), and with the same
  batch stored twice and a compaction in progress. Spark's pass writes the summary
  checkpoints every reader opens, so ``goodlens report`` over them equals DuckDB's report
  bucket by bucket; the pass is incremental (segments a checkpoint covers are not read
  again).
- The fleet table: ``goodlens fleet`` over a generated fleet of 300 small runs writes the
  same table whether DuckDB or Spark summarised the raw rows; the table is plain Parquet
  that DuckDB and Spark read without goodlens, and the documented example query (goodput by
  week and job name, docs/spark.md) gives one answer on both; its numbers are the report's
  (a run's attempts add up to its report) and, on a small run, the ones worked out by hand.

Real Spark (local mode, one session for the module: a JVM costs ~9 s of CPU to start), real
Parquet datasets, no mocks. Both parts share this module so that, with each module on one
xdist worker (``--dist loadfile``), the JVM starts once.

Float tolerance: summaries equal to a relative 1e-12 (medians interpolate in each engine's
own arithmetic; on these datasets they come out identical); reports to 1e-6 s; the fleet
table's floats to 1e-9.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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
from goodlens.collector.replay import import_trace, trace_batches
from goodlens.model.batch import validate_batch
from goodlens.model.trace import read_trace
from goodlens.storage import bulk, ckptfiles, spark
from goodlens.storage.parquet import ParquetStore
from goodlens.storage.schema import RUN_NAMES
from goodlens.storage.segments import hour_name
from goodlens.storage.store import Store
from tests.harness import ROOT, step_batch
from tests.integration import dataset_cases as cases

pytestmark = [pytest.mark.slow,  # pyspark 4.3 warns of pandas 3, which it does not use here
              pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")]
SIM = ROOT / "sample_data" / "sim-64"
REL = 1e-12


@pytest.fixture(scope="module")
def spark_session() -> Iterator[Any]:
    """One local Spark session (2 cores) for the module's tests, stopped with its JVM after
    the last of them: pyspark otherwise keeps the JVM (and its py4j threads) for a next
    session until the process exits, beside the tests that follow on this worker."""
    from pyspark import SparkContext
    context = spark.spark_session("local[2]", {"spark.sql.shuffle.partitions": "2",
                                               "spark.driver.memory": "1g"})
    try:
        yield context.__enter__()
    finally:
        context.__exit__(None, None, None)
        gateway = SparkContext._gateway
        if gateway is not None:  # closing the JVM's stdin ends it
            gateway.shutdown()
            gateway.proc.stdin.close()
            gateway.proc.wait(timeout=60)
            SparkContext._gateway = SparkContext._jvm = None

def spark_pass(spark_session, root: Path) -> bulk.PassStats:
    return bulk.summarize_dataset(root, spark.engine(spark_session, root), engine="spark")


def checkpoint(root: Path, run_id: str) -> pa.Table:
    """The run's summaries from the checkpoint a reader would start from."""
    t = ckptfiles.best_checkpoint(root, run_id)
    assert t is not None, f"no checkpoint of {run_id}"
    return t


def duckdb_summaries(root: Path, run_id: str) -> pa.Table:
    """The run's summaries as a DuckDB reader rebuilds them from every raw segment."""
    store = ParquetStore(root, read_only=True, use_checkpoints=False,
                         save_after_open_s=float("inf"))
    try:
        return pa.Table.from_pandas(store.step_summaries(run_id), preserve_index=False)
    finally:
        store.close()


def assert_same(got: pa.Table, want: pa.Table) -> None:
    """Row for row: integers and text exact, floats to a relative :data:`REL`."""
    key = [("attempt", "ascending"), ("step", "ascending")]
    got, want = got.sort_by(key), want.sort_by(key)
    assert got.num_rows == want.num_rows
    for name in ckptfiles.SUMMARY_SCHEMA.names:
        a = got.column(name).to_pylist()
        b = want.column(name).to_pylist()
        if ckptfiles.SUMMARY_SCHEMA.field(name).type == pa.float64():
            for x, y in zip(a, b):
                assert (x is None) == (y is None), name
                if x is not None:
                    assert x == pytest.approx(y, rel=REL, abs=1e-300), name
        else:
            assert a == b, name


def writers(root: Path, *names: str) -> list[ParquetStore]:
    return [ParquetStore(root, writer_id=n, use_checkpoints=False) for n in names]


def close_without_checkpoints(root: Path, *stores: ParquetStore) -> None:
    """Close the writers, then drop the checkpoints they saved: the passes under test
    start from the raw segments."""
    for s in stores:
        s.close()
    shutil.rmtree(root / "summaries", ignore_errors=True)


# ------------------------------------------------------------------ a case worked by hand
RUN = "job/a b"  # a run id the folder names must encode (and every engine decode)
#: Three ranks, two steps. Step 0: rank 2 reports no host and is slowest to the collective
#: (ready = duration - collective wait: 0.75, 0.625, 0.875). Step 1: rank 1 reports no split
#: (ranked by its duration, 1.0), rank 2 no collective wait (ready = compute + data = 1.0):
#: a tie at 1.0, which goes to the highest rank; only rank 2 reports a data wait.
STEP0 = {"rank": [0, 1, 2], "host": ["h0", "h0", None], "step": 0,
         "start_time": [100.0, 100.125, 99.875], "duration_s": [1.0, 0.75, 1.25],
         "compute_s": [0.5, 0.5, 0.75], "collective_wait_s": [0.25, 0.125, 0.375],
         "data_wait_s": [0.25, 0.125, 0.125], "tokens": [100, 100, 100]}
STEP1 = {"rank": [0, 1, 2], "host": ["h0", "h0", "h1"], "step": 1,
         "start_time": [101.25, 101.25, 101.25], "duration_s": [1.0, 1.0, 1.0],
         "compute_s": [0.5, None, 0.5], "collective_wait_s": [0.5, None, None],
         "data_wait_s": [None, None, 0.5], "tokens": [50, 50, None]}
#: The summaries, worked out by hand from the rows above.
EXPECTED = [
    {"run_id": RUN, "attempt": 0, "step": 0, "ranks": 3, "step_start": 99.875,
     "step_end": 101.125, "ref_start": 100.0, "duration_median": 1.0, "duration_max": 1.25,
     "compute_median": 0.5, "compute_max": 0.75, "compute_ranks": 3, "ready_median": 0.75,
     "ready_max": 0.875, "ready_ranks": 3, "slowest_rank": 2, "slowest_host": None,
     "collective_wait_median": 0.25, "data_wait_median": 0.125, "data_wait_min": 0.125,
     "tokens": 300, "samples": None},
    {"run_id": RUN, "attempt": 0, "step": 1, "ranks": 3, "step_start": 101.25,
     "step_end": 102.25, "ref_start": 101.25, "duration_median": 1.0, "duration_max": 1.0,
     "compute_median": 0.5, "compute_max": 0.5, "compute_ranks": 2, "ready_median": 0.75,
     "ready_max": 1.0, "ready_ranks": 2, "slowest_rank": 2, "slowest_host": "h1",
     "collective_wait_median": 0.5, "data_wait_median": 0.5, "data_wait_min": None,
     "tokens": 100, "samples": None},
]


def hand_dataset(root: Path) -> None:
    """Writer a stores both steps; writer b stores step 0's batch again (the same batch
    stored by two collectors)."""
    a, b = writers(root, "a", "b")
    step0 = {"schema_version": 1, "run_id": RUN, "steps": {"attempt": 0, **STEP0}}
    a.write_group([validate_batch(step0), validate_batch(
        {"schema_version": 1, "run_id": RUN, "steps": {"attempt": 0, **STEP1}})])
    b.write_group([validate_batch(step0)])
    close_without_checkpoints(root, a, b)


def test_a_hand_worked_case_summarises_the_same_on_every_engine(spark_session, tmp_path) -> None:
    hand_dataset(tmp_path / "d")
    shutil.copytree(tmp_path / "d", tmp_path / "e")
    want = pa.Table.from_pylist(EXPECTED, schema=ckptfiles.SUMMARY_SCHEMA)
    stats = spark_pass(spark_session, tmp_path / "d")
    assert (stats.runs_summarised, stats.segments_read, stats.rows_read) == (1, 2, 9)
    assert_same(checkpoint(tmp_path / "d", RUN), want)  # Spark
    assert_same(duckdb_summaries(tmp_path / "d", RUN), want)  # the DuckDB reader
    bulk.summarize_dataset(tmp_path / "e", bulk.duckdb_engine(), engine="duckdb")
    assert_same(checkpoint(tmp_path / "e", RUN), want)  # DuckDB, the same batch pass
    # the run id went through the folder name and back, in both engines
    assert (tmp_path / "d" / "summaries" / "run_id=job%2Fa%20b").is_dir()


# ------------------------------------------------------------------ the dataset cases
def spark_cli(root: Path, *extra: str) -> Any:
    """``goodlens summarize --engine spark`` (on the module's session, which it reuses)."""
    return CliRunner().invoke(main, ["summarize", "--engine", "spark", "--db",
                                     f"parquet:{root}", *extra])


def test_run_ids_round_trip_on_spark(spark_session, tmp_path) -> None:
    """Ids with /, =, %, spaces, non-ASCII, tab, and the values engines read as null:
    goodlens's Spark pass and a plain Spark read of the raw rows (docs/scaling.md) read
    each one back as it was given."""
    cases.ids_round_trip(tmp_path / "d", spark_cli)
    plain = spark_session.read.parquet(str(tmp_path / "d" / "steps"))
    got = {r.run_id: r["count"] for r in plain.groupBy("run_id").count().collect()}
    assert got == dict.fromkeys(cases.FOLDERS, 9)


def test_a_folder_an_earlier_version_named_on_spark(spark_session, tmp_path) -> None:
    cases.legacy_folder(tmp_path / "d", spark_cli)


def test_an_unreadable_covered_segment_and_late_rows_on_spark(spark_session, tmp_path) -> None:
    cases.unreadable_covered_then_late_rows(tmp_path / "d", spark_cli)


def test_a_corrupt_new_segment_on_spark(spark_session, tmp_path) -> None:
    cases.corrupt_new_segment(tmp_path / "d", spark_cli)


def test_a_missing_path_on_spark(tmp_path) -> None:
    cases.missing_path(tmp_path, spark_cli)


# ------------------------------------------------------------------ sim-64, two collectors
def sim64_by_two_collectors(root: Path) -> None:
    """sim-64 stored by two collectors: ranks 0-31 by one, 32-63 by the other; metadata and
    job-level events by the first (as tests/e2e/test_store_parquet.py's collectors)."""
    a, b = writers(root, "collector-a", "collector-b")
    for batch in trace_batches(read_trace(SIM)):
        if batch.steps is None or not batch.steps.num_rows:
            a.write_group([batch])
            continue
        low = pc.less(batch.steps.column("rank"), 32)
        for store, mask in ((a, low), (b, pc.invert(low))):
            part = batch.steps.filter(mask)
            if part.num_rows:
                store.write_group([dataclasses.replace(batch, run=None, events=None,
                                                       steps=part)])
        if batch.events is not None or batch.run:
            a.write_group([dataclasses.replace(batch, steps=None)])
    close_without_checkpoints(root, a, b)


@pytest.fixture(scope="module")
def sim64(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sim64") / "dataset"
    sim64_by_two_collectors(root)
    return root


def test_sim64_from_two_collectors_summarises_the_same_on_spark_and_duckdb(
        spark_session, sim64, tmp_path) -> None:
    root = tmp_path / "d"
    shutil.copytree(sim64, root)
    writers_seen = {p.name.rsplit("-", 2)[0] for p in (root / "steps").rglob("*.parquet")}
    assert writers_seen == {"collector-a", "collector-b"}
    stats = spark_pass(spark_session, root)
    # the sample's ground truth: 2,628 kept + 354 recomputed steps; 64 ranks x 495 steps
    # (attempt 0), 56 x 159 (attempt 1, shrunk), 64 x 2,328 (attempt 2)
    assert stats.rows_read == 189_576 and stats.steps_summarised == 2_982
    assert_same(checkpoint(root, "sim-64"), duckdb_summaries(root, "sim-64"))
    # every reader starts from Spark's checkpoint and summarises nothing itself
    union = ParquetStore(root, read_only=True)
    single = Store(tmp_path / "single.duckdb")
    try:
        assert union.open_stats["checkpoints"] == 1
        assert union.open_stats["steps_summarised"] == 0
        import_trace(single, SIM)
        single.summarize_dirty()
        got, want = report_dict(union, "sim-64"), report_dict(single, "sim-64")
        assert got["wall_clock_s"] == pytest.approx(want["wall_clock_s"], abs=1e-6)
        for k in want["buckets"]:
            assert got["buckets"][k] == pytest.approx(want["buckets"][k], abs=1e-6), k
        for parts in ("startup_parts", "restart_parts", "other_parts"):
            assert got[parts] == pytest.approx(want[parts], abs=1e-6), parts
        assert [x["steps"] for x in got["attempts"]] == [x["steps"] for x in want["attempts"]]
    finally:
        union.close()
        single.close()


def test_the_same_batch_twice_and_a_compaction_in_progress_count_once(spark_session,
                                                                      tmp_path) -> None:
    root = tmp_path / "d"
    # a's merged segment's sources stay beside it for an hour: a compaction in progress
    a = ParquetStore(root, writer_id="a", use_checkpoints=False, grace_s=3600.0)
    (b,) = writers(root, "b")
    for s in range(0, 100, 10):  # ten segments per writer; b stores a's batches again
        a.write_group([validate_batch(step_batch("dup", 0, list(range(s, s + 10))))])
        b.write_group([validate_batch(step_batch("dup", 0, list(range(s, s + 10))))])
        b.write_group([validate_batch(step_batch("dup", 1, list(range(s, s + 10))))])
    assert a.compact(min_files=4) >= 1
    files = list((root / "steps").rglob("*.parquet"))
    assert len(files) == 31  # 30 written, 1 merged, no source removed yet
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    # 200 distinct keys: 300 rows written (rank 0's 100 twice), 200 copied by a's merge
    assert rows == 500
    shutil.copytree(root, tmp_path / "e")  # (the writers stay open: no checkpoint yet)
    stats = spark_pass(spark_session, root)
    assert stats.rows_read == 500
    got = checkpoint(root, "dup")
    assert got.num_rows == 100 and pc.all(pc.equal(got.column("ranks"), 2)).as_py()
    # the copies are exact, so every number is one copy's (step_batch: rank 1 is slowest)
    assert got.column("slowest_rank").to_pylist() == [1] * 100
    assert got.column("duration_median").to_pylist() == [1.0] * 100
    assert_same(got, duckdb_summaries(root, "dup"))
    bulk.summarize_dataset(tmp_path / "e", bulk.duckdb_engine(), engine="duckdb")
    assert_same(checkpoint(tmp_path / "e", "dup"), got)
    a.close()
    b.close()


def test_the_pass_is_incremental_and_stays_exact(spark_session, tmp_path) -> None:
    root = tmp_path / "d"
    (a,) = writers(root, "a")
    for s in range(0, 50, 10):  # five segments of ten steps, four ranks
        a.write_group([validate_batch(step_batch("inc", r, list(range(s, s + 10))))
                       for r in range(4)])
    close_without_checkpoints(root, a)
    first = spark_pass(spark_session, root)
    assert (first.segments, first.segments_read, first.rows_read) == (5, 5, 200)

    # (the writers below stay open: a collector that stops saves a checkpoint of its own)
    b, c = writers(root, "b", "c")  # new steps: only the new segment is read
    b.write_group([validate_batch(step_batch("inc", r, list(range(50, 60)))) for r in range(4)])
    second = spark_pass(spark_session, root)
    assert (second.segments, second.segments_read, second.rows_read) == (6, 1, 40)
    assert_same(checkpoint(root, "inc"), duckdb_summaries(root, "inc"))

    c.write_group([validate_batch(step_batch("inc", 4, [12, 13, 14]))])  # a late rank
    third = spark_pass(spark_session, root)
    assert (third.segments_read, third.rows_read) == (2, 43)
    got = checkpoint(root, "inc")
    assert_same(got, duckdb_summaries(root, "inc"))
    ranks = dict(zip(got.column("step").to_pylist(), got.column("ranks").to_pylist()))
    assert [ranks[s] for s in (11, 12, 13, 14, 15)] == [4, 5, 5, 5, 4]
    assert got.num_rows == 60

    nothing = spark_pass(spark_session, root)  # nothing new: nothing read, nothing written
    assert (nothing.runs_summarised, nothing.segments_read, nothing.checkpoints_written) == (
        0, 0, 0)
    reader = ParquetStore(root, read_only=True)
    assert reader.open_stats["steps_summarised"] == 0
    reader.close()
    b.close()
    c.close()


def test_summarize_and_report_on_the_command_line(spark_session, sim64, tmp_path) -> None:
    root = tmp_path / "d"
    shutil.copytree(sim64, root)
    runner = CliRunner()
    r = runner.invoke(main, ["summarize", "--engine", "spark", "--db", f"parquet:{root}",
                             "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["engine"] == "spark" and doc["steps_summarised"] == 2_982
    assert doc["checkpoints_written"] == 1
    r = runner.invoke(main, ["report", "--db", f"parquet:{root}", "--run", "sim-64", "--json"])
    assert r.exit_code == 0, r.output
    from_spark = json.loads(r.output)
    shutil.rmtree(root / "summaries")
    r = runner.invoke(main, ["summarize", "--db", f"parquet:{root}"])  # DuckDB, the default
    assert r.exit_code == 0 and "DuckDB: 1 of 1 run(s) had new segments" in r.output, r.output
    r = runner.invoke(main, ["report", "--db", f"parquet:{root}", "--run", "sim-64", "--json"])
    from_duckdb = json.loads(r.output)
    assert from_spark["goodput"] == pytest.approx(from_duckdb["goodput"], abs=1e-12)
    for k, v in from_duckdb["buckets"].items():
        assert from_spark["buckets"][k] == pytest.approx(v, abs=1e-6), k
    # usage errors: a DuckDB file keeps its own summaries; --master is Spark's
    r = runner.invoke(main, ["summarize", "--db", str(tmp_path / "single.duckdb")])
    assert r.exit_code == 2
    r = runner.invoke(main, ["summarize", "--db", f"parquet:{root}", "--master", "local[1]"])
    assert r.exit_code == 2 and "--engine spark" in r.output


def test_no_other_command_loads_pyspark() -> None:
    code = ("import sys; from click.testing import CliRunner; from goodlens.cli import main; "
            "import goodlens.cli.batch, goodlens.storage.bulk, goodlens.storage.parquet, "
            "goodlens.storage.spark; CliRunner().invoke(main, ['summarize', '--help']); "
            "print('pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_summary_columns_match_on_types(spark_session, tmp_path) -> None:
    """Spark's Arrow types are cast to the checkpoint's: the file a DuckDB reader saves and
    the file Spark's pass saves have one schema; a run id of digits stays text."""
    hand_dataset(tmp_path / "d")
    (w,) = writers(tmp_path / "d", "w")
    w.write_group([validate_batch(step_batch("0042", 0, [0, 1]))])
    spark_pass(spark_session, tmp_path / "d")
    w.close()
    assert checkpoint(tmp_path / "d", "0042").column("run_id").to_pylist() == ["0042"] * 2
    ranked = ckptfiles.ranked_checkpoints(tmp_path / "d",
                                          ckptfiles.present_segments(tmp_path / "d"))
    (path, _), = ranked[ckptfiles.run_key(RUN)]
    schema = pq.read_schema(path)
    assert schema.remove_metadata() == ckptfiles.SUMMARY_SCHEMA


def test_calls_of_bounded_rows_give_one_calls_summaries(tmp_path) -> None:
    """With ``max_rows`` a pass cuts its work between a run's segments, reads each call's
    neighbours for the steps they share (only the rows inside the call's step ranges
    count), and a step two calls both summarised counts once: DuckDB's pass needs it (its
    medians hold a step's values in memory); the result equals one call's."""
    root = tmp_path / "d"
    a = ParquetStore(root, writer_id="a")
    b = ParquetStore(root, writer_id="b")
    for s in range(0, 50, 10):  # five segments of 40 rows; b adds rank 4 across two of them
        a.write_group([validate_batch(step_batch("r", k, list(range(s, s + 10))))
                       for k in range(4)])
    b.write_group([validate_batch(step_batch("r", 4, list(range(15, 25))))])
    b.write_group([validate_batch(step_batch("r", 0, list(range(10, 20))))])  # a's rows again
    shutil.copytree(root, tmp_path / "e")
    cut = bulk.summarize_dataset(root, bulk.duckdb_engine(), engine="duckdb", max_rows=50)
    whole = bulk.summarize_dataset(tmp_path / "e", bulk.duckdb_engine(), engine="duckdb")
    assert cut.engine_calls > 1 and whole.engine_calls == 1
    assert cut.rows_read > whole.rows_read == 220  # neighbours read again, filtered
    got = checkpoint(root, "r")
    assert got.num_rows == 50 and got.equals(checkpoint(tmp_path / "e", "r"))
    ranks = dict(zip(got.column("step").to_pylist(), got.column("ranks").to_pylist()))
    assert [ranks[s] for s in (14, 15, 24, 25)] == [4, 5, 5, 4]
    want = duckdb_summaries(root, "r")
    assert got.column("ranks").to_pylist() == want.column("ranks").to_pylist()
    assert got.column("duration_median").to_pylist() == want.column(
        "duration_median").to_pylist()
    a.close()
    b.close()


# ------------------------------------------------------------------------------ the fleet
JOBS = ("llama-8b", "llama-70b", "mixtral-8x7b", "gpt-neox-20b", "t5-xxl", "vit-huge",
        "bert-large")
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
SPAN_S = 42 * 86_400.0  # six weeks of runs
RUNS = 300  # 49 groups of the example query hold 3 to 8 runs each
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


# ------------------------------------------------------------------------------ the nodes
def test_goodlens_nodes_gives_equal_rows_on_spark_and_duckdb(spark_session,
                                                             tmp_path) -> None:
    """``goodlens nodes`` over a fleet from tests/nodefleet.py's generator: Spark reading
    where each rank ran from the segments gives the same node table as DuckDB, row for row
    (floats to 1e-9), the same verdicts and the same drain list, the two planted hosts in
    it. A small fleet (40 runs over 140 hosts, the planted hosts 20 times as bad, so 40
    runs name them): Spark's time here is its summary pass and its read over two segments
    a run, and the 320-run fleet took 8 s of it for no more of the claim; whether the
    verdicts find the planted hosts in a realistic fleet is test_node_fleet.py's."""
    from tests.nodefleet import LEMON_FAIL, LEMON_SLOW, fleet_docs, write_parquet
    docs = fleet_docs(0, 40, hosts=140, factor=20.0)
    ran = {h for d in docs for h in d["steps"]["host"]}
    write_parquet(tmp_path / "duckdb", docs)
    shutil.copytree(tmp_path / "duckdb", tmp_path / "spark")
    out = {}
    for engine in ("duckdb", "spark"):
        r = CliRunner().invoke(main, ["nodes", "--db", f"parquet:{tmp_path / engine}",
                                      "--engine", engine, "--json"])
        assert r.exit_code == 0, r.output
        out[engine] = json.loads(r.output)
    a, b = out["duckdb"], out["spark"]
    assert a["engine"] == "duckdb" and b["engine"] == "spark"
    assert len(a["hosts"]) == len(b["hosts"]) and {x["host"] for x in a["hosts"]} == ran
    for x, y in zip(a["hosts"], b["hosts"]):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], float):
                assert y[k] == pytest.approx(x[k], rel=1e-9, abs=1e-12), (x["host"], k)
            else:
                assert x[k] == y[k], (x["host"], k)
    assert a["drain"] == b["drain"] and {LEMON_FAIL, LEMON_SLOW} <= set(a["drain"])
