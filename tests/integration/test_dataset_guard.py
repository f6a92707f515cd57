"""``goodlens summarize`` (DuckDB) on the Parquet dataset cases of dataset_cases.py: run ids
every engine must decode alike, a folder an earlier goodlens named, an unreadable segment a
checkpoint covers with late rows arriving, a corrupt new segment, a missing path; and the
checks that keep a pass from saving a checkpoint its engine got wrong. The same cases run
on Spark in test_spark.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from click.testing import CliRunner, Result

from goodlens.cli import main
from goodlens.storage import bulk, ckptfiles
from goodlens.storage.passguard import DatasetError, spark_reads
from goodlens.storage.segments import PartitionTooLong, partition_value
from tests.harness import step_batch
from tests.integration import dataset_cases as cases


def summarize(root: Path, *extra: str) -> Result:
    return CliRunner().invoke(main, ["summarize", "--db", f"parquet:{root}", *extra])


def test_run_ids_round_trip(tmp_path) -> None:
    cases.ids_round_trip(tmp_path / "d", summarize)
    # the documented plain query (docs/scaling.md) reads every id back
    glob = str(tmp_path / "d" / "steps" / "*" / "*" / "*.parquet")
    got = duckdb.sql(f"SELECT DISTINCT run_id FROM read_parquet('{glob}', hive_partitioning "
                     "= true)").fetchall()
    assert sorted(r for (r,) in got) == sorted(cases.FOLDERS)


def test_a_folder_an_earlier_version_named(tmp_path) -> None:
    cases.legacy_folder(tmp_path / "d", summarize)


def test_an_unreadable_covered_segment_and_late_rows(tmp_path) -> None:
    cases.unreadable_covered_then_late_rows(tmp_path / "d", summarize)


def test_a_corrupt_new_segment(tmp_path) -> None:
    cases.corrupt_new_segment(tmp_path / "d", summarize)


def test_a_missing_path(tmp_path) -> None:
    cases.missing_path(tmp_path, summarize)


def test_the_full_trace_is_behind_verbose(tmp_path) -> None:
    root = tmp_path / "d"
    cases.write(root, "a", [step_batch("r", 0, [0])])
    (seg,) = (root / "steps").glob("*/*/*.parquet")
    seg.write_bytes(b"x")
    r = summarize(root, "--verbose")
    assert r.exit_code == 1 and "Traceback" in r.output
    assert r.output.strip().splitlines()[-1].startswith(f"Error: cannot read {seg}")


def test_report_over_a_corrupt_segment_is_one_line(tmp_path) -> None:
    root = tmp_path / "d"
    cases.write(root, "a", [step_batch("r", 0, [0, 1])])
    (seg,) = (root / "steps").glob("*/*/*.parquet")
    seg.write_bytes(b"x")
    r = CliRunner().invoke(main, ["report", "--db", f"parquet:{root}", "--run", "r"])
    text = cases.one_line(r, 1)
    assert f"cannot read {seg}" in text


@pytest.mark.parametrize("command", [["report", "--run", "r"], ["detect", "--run", "r"],
                                     ["runs"], ["summarize"], ["fleet"], ["nodes"]])
def test_every_command_reading_a_dataset_has_verbose(tmp_path, command) -> None:
    """One line naming the segment; with --verbose the trace first, the same line last."""
    root = tmp_path / "d"
    cases.write(root, "a", [step_batch("r", 0, [0, 1])])
    (seg,) = (root / "steps").glob("*/*/*.parquet")
    seg.write_bytes(b"x")
    args = [*command, "--db", f"parquet:{root}"]
    assert f"cannot read {seg}" in cases.one_line(CliRunner().invoke(main, args), 1)
    r = CliRunner().invoke(main, [*args, "--verbose"])
    assert r.exit_code == 1 and "Traceback" in r.output
    assert r.output.strip().splitlines()[-1].startswith(f"Error: cannot read {seg}")


def test_a_folder_duckdb_reads_as_null_fails_loudly(tmp_path) -> None:
    """A folder an earlier goodlens named ``run_id=__HIVE_DEFAULT_PARTITION__``: DuckDB's
    hive partitioning reads the run id as null; the pass says so and writes nothing."""
    root = tmp_path / "d"
    cases.write(root, "a", [step_batch("__HIVE_DEFAULT_PARTITION__", 0, [0, 1])])
    os.rename(root / "steps" / "run_id=%5F_HIVE_DEFAULT_PARTITION__",
              root / "steps" / "run_id=__HIVE_DEFAULT_PARTITION__")
    text = cases.one_line(summarize(root), 1)
    assert "to run id null, which no run folder there names" in text
    assert cases.checkpoints(root) == []


def fake_engine(rename: dict[str, str | None]):
    """DuckDB's engine, with the run ids of its result replaced (an engine that decodes a
    folder name otherwise)."""
    real = bulk.duckdb_engine()

    def summarise(files, boxes):
        t = real(files, boxes)
        ids = [rename.get(r, r) for r in t.column("run_id").to_pylist()]
        return t.set_column(0, "run_id", pa.array(ids, pa.string()))
    return summarise


@pytest.mark.parametrize("rename", [{"ü": "Ã¼"}, {"ü": None}])
def test_rows_no_run_owns_fail_the_pass(tmp_path, rename) -> None:
    root = tmp_path / "d"
    cases.write(root, "a", [step_batch(r, 0, [0, 1]) for r in ("ü", "plain")])
    with pytest.raises(DatasetError, match="which no run folder there names"):
        bulk.summarize_dataset(root, fake_engine(rename), engine="test")
    assert cases.checkpoints(root) == []


def test_a_run_with_rows_but_no_summaries_fails_the_pass(tmp_path) -> None:
    root = tmp_path / "d"
    cases.write(root, "a", [step_batch(r, 0, [0, 1]) for r in ("ü", "plain")])
    real = bulk.duckdb_engine()

    def drops(files, boxes):
        t = real(files, boxes)
        return t.filter(pa.array([r != "ü" for r in t.column("run_id").to_pylist()]))
    with pytest.raises(DatasetError, match="found no rows of run 'ü' in its 2 new row"):
        bulk.summarize_dataset(root, drops, engine="test")
    assert cases.checkpoints(root) == []


def test_partition_values_by_hand() -> None:
    assert partition_value("a b/c=d%e ü") == "a%20b%2Fc%3Dd%25e%20ü"
    assert partition_value("x\x00y") == "x%00y"
    assert partition_value("~a_b.c-d") == "~a_b.c-d"
    assert partition_value("__HIVE_DEFAULT_PARTITION__") == "%5F_HIVE_DEFAULT_PARTITION__"
    assert spark_reads("a%20b%2Fc%3Dd%25e%20%C3%BC") == "a b/c=d%e Ã¼"  # what Spark read
    assert spark_reads("a%20b%2Fc%3Dd%25e%20ü") == "a b/c=d%e ü"
    assert ckptfiles.run_of_key("run_id=a%20b%20%C3%BC") == "a b ü"
    assert ckptfiles.key_of("run_id=a%20b%20%C3%BC") == "run_id=a%20b%20ü"
    with pytest.raises(PartitionTooLong, match="use a shorter run id"):
        partition_value("ü" * 125)  # 250 bytes
    assert len(partition_value("ü" * 124).encode()) == 248
