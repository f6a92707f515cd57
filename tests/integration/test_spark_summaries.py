"""Spark summarises a Parquet dataset exactly as DuckDB does (issue #30).

What must hold: the summarising step (raw step rows to per-step summaries, each key counted
once) gives the same numbers on Spark local mode as on DuckDB: on a hand-written case whose
summaries are worked out below by hand, on ``sample_data/sim-64`` written by two collectors
(disjoint ranks, as the e2e two-collector test writes it), and with the same batch stored
twice and a compaction in progress. Spark's pass writes the summary checkpoints every
reader opens, so ``goodlens report`` over them equals DuckDB's report bucket by bucket; the
pass is incremental (segments a checkpoint covers are not read again). Real Spark (local
mode, one session for both Spark modules), real Parquet datasets, no mocks.

Float tolerance: summaries equal to a relative 1e-12 (medians interpolate in each engine's
own arithmetic; on these datasets they come out identical); reports to 1e-6 s.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

pytest.importorskip("pyspark", reason="the Spark engine needs pip install 'goodlens[spark]'")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime (make test installs default-jre-headless)",
                allow_module_level=True)

from goodlens.analysis.report import report_dict
from goodlens.cli import main
from goodlens.collector.replay import import_trace, trace_batches
from goodlens.model.batch import validate_batch
from goodlens.model.trace import read_trace
from goodlens.storage import bulk, ckptfiles, spark
from goodlens.storage.parquet import ParquetStore
from goodlens.storage.store import Store
from tests.harness import ROOT, step_batch

pytestmark = [pytest.mark.slow,  # pyspark 4.3 warns of pandas 3, which it does not use here
              pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")]
SIM = ROOT / "sample_data" / "sim-64"
REL = 1e-12


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
    assert stats.rows_read == 194_184 and stats.steps_summarised == 3_054
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
    assert doc["engine"] == "spark" and doc["steps_summarised"] == 3_054
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
