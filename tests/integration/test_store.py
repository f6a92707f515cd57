"""The DuckDB store: idempotent writes, per-step summaries, attempts, durability, locking."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from goodlens.model.batch import validate_batch
from goodlens.storage.store import SchemaMismatch, Store
from tests.harness import step_batch


def batch(run, rank, steps, attempt=0, **kw):
    return validate_batch(step_batch(run, rank, steps, attempt, **kw))


def events(run, source, seqs, kinds, times, attempt=0, **cols):
    return validate_batch({"schema_version": 1, "run_id": run,
                           "events": {"source": source, "seq": seqs, "kind": kinds,
                                      "time": times, "attempt": attempt, **cols}})


def test_resent_batches_and_overlaps_add_nothing(store):
    r1 = store.write_group([batch("r", 0, [0, 1, 2]), batch("r", 1, [0, 1, 2])])
    assert [r.steps_inserted for r in r1] == [3, 3]
    again = store.write_group([batch("r", 0, [0, 1, 2])])[0]
    assert (again.steps_inserted, again.steps_duplicate) == (0, 3)
    overlap = store.write_group([batch("r", 0, [2, 3, 4])])[0]
    assert (overlap.steps_inserted, overlap.steps_duplicate) == (2, 1)
    # duplicates inside one batch, and an out-of-order gap fill below the high-water mark
    inner = store.write_group([batch("r", 1, [5, 5, 4, 4])])[0]
    assert (inner.steps_inserted, inner.steps_duplicate) == (2, 2)
    gap = store.write_group([batch("r", 2, [7]), batch("r", 2, [6, 7])])
    assert [g.steps_inserted for g in gap] == [1, 1]
    df = store.steps("r")
    assert len(df) == 3 + 3 + 2 + 2 + 2
    assert not df.duplicated(["attempt", "rank", "step"]).any()


def test_same_step_in_another_attempt_is_a_new_row(store):
    store.write_group([batch("r", 0, [10, 11], attempt=0)])
    res = store.write_group([batch("r", 0, [10, 11], attempt=1)])[0]
    assert res.steps_inserted == 2


def test_events_are_idempotent_by_source_and_seq(store):
    e = events("r", "a", [0, 1], ["attempt_start", "init_start"], [1.0, 2.0])
    assert store.write_group([e])[0].events_inserted == 2
    assert store.write_group([e])[0].events_inserted == 0
    e2 = events("r", "a", [1, 2], ["init_start", "init_end"], [2.0, 3.0])
    assert store.write_group([e2])[0].events_inserted == 1
    e3 = events("r", "b", [0], ["heartbeat"], [4.0])
    assert store.write_group([e3])[0].events_inserted == 1
    assert list(store.events("r").kind) == ["attempt_start", "init_start", "init_end",
                                            "heartbeat"]


def test_summaries_match_numpy(store):
    rng = np.random.default_rng(1)
    comp = rng.uniform(0.5, 0.9, size=(5, 4))  # 5 ranks x 4 steps
    batches = []
    for r in range(5):
        doc = step_batch("r", r, [0, 1, 2, 3])
        doc["steps"]["compute_s"] = comp[r].tolist()
        doc["steps"]["duration_s"] = [1.0 + 0.1 * r] * 4
        doc["steps"]["start_time"] = [100.0 + 2 * s + 0.01 * r for s in range(4)]
        # blocked in the all-reduce for what is left after compute and a 0.02 s data wait
        doc["steps"]["collective_wait_s"] = (1.0 + 0.1 * r - comp[r] - 0.02).tolist()
        batches.append(validate_batch(doc))
    store.write_group(batches[:3])
    store.write_group(batches[3:])  # ranks arrive in two groups
    assert store.summarize_dirty() == 4
    df = store.step_summaries("r")
    assert list(df.step) == [0, 1, 2, 3]
    assert (df.ranks == 5).all()
    np.testing.assert_allclose(df.compute_median, np.median(comp, axis=0))
    np.testing.assert_allclose(df.compute_max, comp.max(axis=0))
    assert list(df.slowest_rank) == list(comp.argmax(axis=0))
    np.testing.assert_allclose(df.step_start, [100.0 + 2 * s for s in range(4)])
    np.testing.assert_allclose(df.step_end, [100.0 + 2 * s + 0.04 + 1.4 for s in range(4)])
    np.testing.assert_allclose(df.ref_start, [100.0 + 2 * s for s in range(4)])
    assert (df.compute_ranks == 5).all()
    # time to reach the collective: duration - collective wait = compute + 0.02
    np.testing.assert_allclose(df.ready_median, np.median(comp, axis=0) + 0.02)
    np.testing.assert_allclose(df.ready_max, comp.max(axis=0) + 0.02)
    assert (df.ready_ranks == 5).all()
    np.testing.assert_allclose(df.data_wait_min, 0.02)


def test_ready_time_falls_back_to_compute_plus_data_wait_and_data_wait_min_needs_all(store):
    """Rank 0 reports collective wait (ready = 1.0 - 0.1), rank 1 compute and data wait only
    (ready = 0.5 + 0.3), rank 2 compute only (0.7: no data wait, so no data_wait_min),
    rank 3 nothing (not counted)."""
    cols = {0: {"compute_s": None, "collective_wait_s": 0.1, "data_wait_s": 0.2},
            1: {"compute_s": 0.5, "collective_wait_s": None, "data_wait_s": 0.3},
            2: {"compute_s": 0.7, "collective_wait_s": None, "data_wait_s": None},
            3: {"compute_s": None, "collective_wait_s": None, "data_wait_s": None}}
    for r, c in cols.items():
        doc = step_batch("r", r, [0])
        for k, v in c.items():
            if v is None:
                del doc["steps"][k]
            else:
                doc["steps"][k] = [v]
        store.write_group([validate_batch(doc)])
    store.summarize_dirty()
    row = store.step_summaries("r").iloc[0]
    assert row.ready_ranks == 3
    assert row.ready_max == pytest.approx(0.9)  # rank 0: 1.0 - 0.1
    assert row.ready_median == pytest.approx(0.8)  # rank 1: 0.5 + 0.3
    # the slowest is the arg max of ready time, else duration: rank 3 with its whole 1.0 s
    assert row.slowest_rank == 3
    assert np.isnan(row.data_wait_min)  # ranks 2 and 3 reported no data wait
    assert row.compute_ranks == 2 and row.compute_max == pytest.approx(0.7)


def test_summary_without_split_says_not_measured(store):
    doc = step_batch("r", 0, [0])
    for c in ("compute_s", "collective_wait_s", "data_wait_s"):
        del doc["steps"][c]
    store.write_group([validate_batch(doc)])
    store.summarize_dirty()
    row = store.step_summaries("r").iloc[0]
    assert row.compute_ranks == 0
    assert np.isnan(row.compute_median)


def test_dirty_ranges_survive_a_crash_before_summarising(tmp_path):
    path = tmp_path / "c.duckdb"
    s = Store(path)
    s.write_group([batch("r", 0, [0, 1, 2])])
    s._con.close()  # no summarize: as if the process died right after the commit
    s2 = Store(path)
    assert s2.has_dirty()
    assert s2.summarize_dirty() == 3
    # the high-water marks are durable too: a re-send after restart adds nothing
    assert s2.write_group([batch("r", 0, [0, 1, 2])])[0].steps_inserted == 0
    s2.close()


def test_attempts_are_derived_from_events_and_steps(store):
    store.write_group([events(
        "r", "launcher", [0, 1, 2, 3], ["attempt_start", "failure_detected", "attempt_start",
                                        "attempt_end"],
        [0.0, 50.0, 80.0, 200.0], attempt=[0, 0, 1, 1], cause=[None, "gpu", None, "completed"])])
    store.write_group([batch("r", 0, [0, 1]), batch("r", 0, [0, 1, 2], attempt=2)])
    store.summarize_dirty()
    a = store.attempts("r")
    assert list(a.attempt) == [0, 1, 2]
    first = a.iloc[0]
    assert (first.start, first.end, first.end_reason) == (0.0, 50.0, "failed")
    assert (a.iloc[1].start, a.iloc[1].end, a.iloc[1].end_reason) == (80.0, 200.0, "completed")
    last = a.iloc[2]  # no events: starts at its first step, still running
    assert last.start == 1000.0 and pd.isna(last.end) and pd.isna(last.end_reason)
    runs = store.runs()
    assert runs.iloc[0].state == "running" and runs.iloc[0].attempts == 3


def test_attempt_without_end_event_is_inferred_from_the_next_one(store):
    store.write_group([batch("r", 0, [0, 1, 2]), batch("r", 0, [1, 2], attempt=1)])
    store.summarize_dirty()
    a = store.attempts("r")
    assert a.iloc[0].end_reason == "unknown"
    assert a.iloc[0].end == pytest.approx(1003.0)


def test_run_metadata_upserts_and_later_values_win(store):
    store.write_group([validate_batch({"schema_version": 1, "run_id": "r",
                                       "run": {"name": "a", "world_size": 8}})])
    store.write_group([validate_batch({"schema_version": 1, "run_id": "r",
                                       "run": {"world_size": 16, "tags": {"team": "x"}}})])
    run = store.run("r")
    assert (run["name"], run["world_size"], run["tags"]) == ("a", 16, '{"team":"x"}')
    assert store.run("nope") is None


def test_failed_group_changes_nothing_and_keeps_marks(store, monkeypatch):
    good = batch("r", 0, [0, 1])
    original = store._insert_events

    def boom(*a, **k):
        raise RuntimeError("disk on fire")
    monkeypatch.setattr(store, "_insert_events", boom)
    with pytest.raises(RuntimeError):
        store.write_group([good, events("r", "a", [0], ["heartbeat"], [1.0])])
    monkeypatch.setattr(store, "_insert_events", original)
    assert len(store.steps("r")) == 0
    assert store.write_group([good])[0].steps_inserted == 2  # marks were not advanced


def test_read_only_open_while_a_writer_holds_the_file_is_refused_clearly(tmp_path):
    import subprocess
    import sys
    import textwrap
    path = tmp_path / "held.duckdb"
    Store(path).close()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from goodlens.storage.store import Store
        s = Store({str(path)!r}); print('held', flush=True); time.sleep(60)""")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RuntimeError, match="held by another process"):
            Store(path, read_only=True)
    finally:
        holder.kill()
        holder.wait()


def test_schema_version_mismatch_is_refused(tmp_path):
    path = tmp_path / "old.duckdb"
    s = Store(path)
    s._con.execute("UPDATE meta SET value = '0' WHERE key = 'schema_version'")
    s.close()
    with pytest.raises(SchemaMismatch, match="schema version 0"):
        Store(path)
    with pytest.raises(FileNotFoundError):
        Store(tmp_path / "missing.duckdb", read_only=True)


def test_long_dirty_ranges_are_summarised_in_chunks(store, monkeypatch):
    import goodlens.storage.summaries as mod
    monkeypatch.setattr(mod, "SUMMARY_CHUNK_ROWS", 7)  # 3 ranks: 2 steps per statement
    store.write_group([batch("r", r, list(range(11))) for r in range(3)])
    assert store.summarize_dirty() == 11
    df = store.step_summaries("r")
    assert list(df.step) == list(range(11)) and (df.ranks == 3).all()


def test_a_stray_step_number_does_not_make_summaries_walk_the_gap(store):
    stray = step_batch("r", 1, [0, 10**15])
    stray["steps"]["start_time"] = [1000.0, 1001.0]  # a stray step number, a sane time
    store.write_group([batch("r", 0, [0, 1, 2]), validate_batch(stray)])
    assert store.summarize_dirty() == 4  # steps 0, 1, 2 and 10^15: not the 10^15 between
    assert sorted(store.step_summaries("r").step) == [0, 1, 2, 10**15]


def test_read_only_open_summarises_what_a_crashed_collector_left_dirty(tmp_path):
    """A collector killed before its summariser ran leaves dirty ranges: a read-only open
    (goodlens report --db, the dashboard) summarises them in memory, so reads are exact,
    and leaves the file as it was."""
    path = tmp_path / "crashed.duckdb"
    s = Store(path)
    s.write_group([batch("r", rank, list(range(10))) for rank in range(4)])
    s.summarize_dirty()
    s.write_group([batch("r", rank, list(range(10, 25))) for rank in range(4)])  # not summarised
    s.close()
    ro = Store(path, read_only=True)
    try:
        assert len(ro.step_summaries("r")) == 25
        assert ro.run("r")["steps"] == 25 and ro.run("r")["last_step"] == 24
    finally:
        ro.close()
    rw = Store(path)
    try:
        assert rw.has_dirty()  # the file was not changed by the read-only open
        rw.summarize_dirty()
        assert len(rw.step_summaries("r")) == 25
    finally:
        rw.close()
