"""Stores written before the step summaries had ready times and ``data_wait_min``: a DuckDB
file is migrated on a writable open (the summaries rebuilt from the raw rows), summarised
into its shadow copy on a read-only open (the file untouched), and a Parquet dataset's summary
checkpoint without the new columns is ignored, its run re-summarised from the segments. In
every case the report gives the new rule's number, never the old summaries' silently."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from goodlens.analysis.accounting import account_run
from goodlens.storage.parquet import ParquetStore
from goodlens.storage.schema import SUMMARY_COLUMNS
from goodlens.storage.store import Store
from tests.timelines import T0, Run, check_invariants

NEW = ("ready_median", "ready_max", "ready_ranks", "data_wait_min")
#: The previous version's summary columns and aggregates (its slowest rank by compute).
OLD = [(n, k, f"arg_max({'rank' if n == 'slowest_rank' else 'host'}, "
        "coalesce(compute_s, duration_s))" if n.startswith("slowest") else e)
       for n, k, e, _ in SUMMARY_COLUMNS if n not in NEW]
#: ten 1 s steps; rank 3 starved by its data loader (0.2 s against 0.001 s): 0.199 s of
#: straggler wait per step by ready time, none by compute, and 0.001 s of input stall
STRAGGLER, INPUT_STALL = 0.199 * 10, 0.001 * 10


def write_run(store: Store | ParquetStore) -> None:
    run = Run(store, ranks=4)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(10)], data={0: 0.001, 1: 0.001, 2: 0.001, 3: 0.2})
    run.event("attempt_end", T0 + 10, 0, cause="completed")


def check_new_rule(store: Store | ParquetStore) -> None:
    s = store.step_summaries("r")
    assert set(NEW) <= set(s.columns) and (s.ready_ranks == 4).all()
    assert (s.slowest_rank == 3).all()
    b = account_run(store, "r").breakdown()
    check_invariants(b)
    assert b.buckets["straggler_wait"] == pytest.approx(STRAGGLER)
    assert b.other_parts["input_stall"] == pytest.approx(INPUT_STALL)


def old_duckdb_file(path: Path) -> Path:
    """A file as the previous version left it: its step_summaries table, filled by its
    aggregates, and nothing dirty."""
    s = Store(path)
    write_run(s)
    s.summarize_dirty()
    con = s._con
    con.execute("DROP TABLE step_summaries")
    con.execute("CREATE TABLE step_summaries ("
                + ", ".join(f"{n} {k}" for n, k, _ in OLD) + ")")
    con.execute(f"INSERT INTO step_summaries SELECT {', '.join(e for _, _, e in OLD)} "
                "FROM steps GROUP BY run_id, attempt, step")
    assert not s.has_dirty()
    s.close()
    return path


def columns(path: Path) -> list[str]:
    import duckdb
    con = duckdb.connect(str(path), read_only=True)
    try:
        return [r[0] for r in con.execute("DESCRIBE step_summaries").fetchall()]
    finally:
        con.close()


def test_a_read_only_open_summarises_an_old_file_into_its_shadow(tmp_path):
    path = old_duckdb_file(tmp_path / "old.duckdb")
    assert not set(NEW) & set(columns(path))
    ro = Store(path, read_only=True)
    try:
        check_new_rule(ro)
    finally:
        ro.close()
    assert not set(NEW) & set(columns(path))  # the file itself is untouched


def test_a_writable_open_migrates_an_old_file(tmp_path):
    path = old_duckdb_file(tmp_path / "old.duckdb")
    rw = Store(path)
    try:
        assert not rw.has_dirty()  # summarised during the open
        check_new_rule(rw)
    finally:
        rw.close()
    assert columns(path) == [c[0] for c in SUMMARY_COLUMNS]  # today's layout and order
    ro = Store(path, read_only=True)
    try:
        assert ro._shadow is None  # nothing left to summarise
        check_new_rule(ro)
    finally:
        ro.close()


@pytest.mark.parametrize("read_only", [False, True])
def test_a_parquet_checkpoint_without_the_new_columns_is_ignored(tmp_path, read_only):
    root = tmp_path / "ds"
    p = ParquetStore(root)
    write_run(p)
    p.close()  # saves the run's summary checkpoint
    again = ParquetStore(root, read_only=True)
    assert again.open_stats["checkpoints"] == 1 and again.open_stats["steps_summarised"] == 0
    again.close()
    # the checkpoint as the previous version saved it: the same metadata, the old columns
    (ckpt,) = (root / "summaries").glob("*/*.parquet")
    t = pq.read_table(ckpt)
    pq.write_table(t.drop_columns(list(NEW)).replace_schema_metadata(t.schema.metadata), ckpt)
    p = ParquetStore(root, read_only=read_only)
    try:
        assert p.open_stats["checkpoints"] == 0
        assert p.open_stats["steps_summarised"] == 10  # re-summarised from the segments
        check_new_rule(p)
    finally:
        p.close()
