"""The Parquet segment store: several collectors, one dataset, the same answers.

What must hold: two real collectors fed disjoint ranks of one run write one dataset whose
accounting equals that of a single DuckDB store fed the same data; a collector killed while
writing leaves no partial segment visible and loses nothing it acknowledged; duplicates
(two collectors storing the same batch, or a compaction) count once; other engines read the
dataset as plain hive-partitioned Parquet.
"""

from __future__ import annotations

import http.client as http_client
import json
import subprocess
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from goodlens.analysis.report import report_dict
from goodlens.collector.replay import import_trace, trace_batches
from goodlens.model.trace import read_trace
from goodlens.model.wire import ARROW as CONTENT_TYPE
from goodlens.model.wire import encode_arrow_batch
from goodlens.storage.parquet import ParquetStore
from goodlens.storage.store import Store
from tests.harness import GOODLENS, ROOT, Collector, http, step_batch

SIM = ROOT / "sample_data" / "sim-64"


def _docs(run_filter=None) -> list[dict]:
    """sim-64 as wire batch objects: (metadata, events, steps), rows as column lists."""
    out = []
    for b in trace_batches(read_trace(SIM)):
        doc: dict = {"schema_version": 1, "run_id": b.run_id}
        if b.run:
            doc["run"] = {k: v for k, v in b.run.items() if v is not None}
        if b.events is not None:
            ev = b.events.to_pydict()
            doc["events"] = {k: v for k, v in ev.items() if any(x is not None for x in v)}
        if b.steps is not None:
            doc["steps"] = b.steps.to_pydict()
        out.append(doc)
    return out


def _split_steps(doc: dict, keep) -> dict | None:
    steps = doc.get("steps")
    if not steps:
        return doc
    mask = np.array([keep(r) for r in steps["rank"]])
    if not mask.any():
        return None
    part = {k: [v for v, m in zip(col, mask) if m] for k, col in steps.items()}
    return {**doc, "steps": part}


def _push(url: str, doc: dict, rows_per: int = 20_000) -> None:
    steps = doc.get("steps")
    if not steps:
        status, body = http("POST", url + "/v1/ingest", encode_arrow_batch(doc),
                            {"Content-Type": CONTENT_TYPE})
        assert status == 200, body
        return
    n = len(steps["rank"])
    for i in range(0, n, rows_per):
        part = {**doc, "steps": {k: v[i:i + rows_per] for k, v in steps.items()}}
        status, body = http("POST", url + "/v1/ingest", encode_arrow_batch(part),
                            {"Content-Type": CONTENT_TYPE})
        assert status == 200, body


@pytest.mark.slow
def test_two_collectors_disjoint_ranks_equal_one_duckdb_store(tmp_path: Path) -> None:
    data = tmp_path / "dataset"
    ca = Collector(f"parquet:{data}", "--no-detect", "--no-dashboard").start()
    cb = Collector(f"parquet:{data}", "--no-detect", "--no-dashboard").start()
    try:
        for doc in _docs():
            if doc.get("steps") is None:
                _push(ca.url, doc)  # metadata and job-level events: one collector
                continue
            low = _split_steps(doc, lambda r: r < 32)
            high = _split_steps(doc, lambda r: r >= 32)
            if low:
                _push(ca.url, low)
            if high:
                _push(cb.url, high)
    finally:
        ca.stop()
        cb.stop()
    union = ParquetStore(data, read_only=True)
    single = Store(tmp_path / "single.duckdb")
    try:
        import_trace(single, SIM)
        single.summarize_dirty()
        got, want = report_dict(union, "sim-64"), report_dict(single, "sim-64")
        assert got["wall_clock_s"] == pytest.approx(want["wall_clock_s"], abs=1e-6)
        for k in want["buckets"]:
            assert got["buckets"][k] == pytest.approx(want["buckets"][k], abs=1e-6), k
        assert got["restart_parts"] == pytest.approx(want["restart_parts"], abs=1e-6)
        assert [x["steps"] for x in got["attempts"]] == [x["steps"] for x in want["attempts"]]
        assert union.row_counts()["steps"] == single.row_counts()["steps"]
        # both collectors wrote segments of their own
        writers = {p.name.rsplit("-", 1)[0] for p in (data / "steps").rglob("*.parquet")}
        assert len(writers) == 2
    finally:
        union.close()
        single.close()


def test_killed_collector_leaves_no_partial_segment_and_keeps_what_it_acked(
        tmp_path: Path) -> None:
    data = tmp_path / "dataset"
    c = Collector(f"parquet:{data}", "--no-detect", "--no-dashboard").start()
    acked: list[tuple[int, int]] = []  # (rank, last step) of every acknowledged push
    stop = threading.Event()

    def pusher(rank: int) -> None:
        step = 0
        while not stop.is_set():
            steps = list(range(step, step + 5_000))
            try:
                status, _ = http("POST", c.url + "/v1/ingest",
                                 json.dumps(step_batch("k", rank, steps)).encode(), timeout=10)
            except (OSError, http_client.HTTPException):  # the kill cut the answer short
                return
            if status == 200:
                acked.append((rank, steps[-1]))
            step += 5_000
    threads = [threading.Thread(target=pusher, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    c.kill()  # SIGKILL while segments are being written
    stop.set()
    for t in threads:
        t.join(15)
    assert acked, "nothing was acknowledged before the kill"
    # every visible segment is whole: each one opens and reads fully
    files = list((data / "steps").rglob("*.parquet"))
    assert files
    for f in files:
        assert pq.read_table(f).num_rows > 0
    # a reader ignores whatever the kill left half-written (and a planted one)
    (files[0].parent / ".planted-00000009.parquet.inprogress").write_bytes(b"PAR1garbage")
    store = ParquetStore(data, read_only=True)
    try:
        got = store.steps("k")
        have = got.groupby("rank").step.max().to_dict()
        for rank, last in acked:
            assert have.get(rank, -1) >= last, f"acknowledged rows of rank {rank} were lost"
        assert not got.duplicated(["attempt", "rank", "step"]).any()
    finally:
        store.close()


def test_duplicates_and_compaction_count_once(tmp_path: Path) -> None:
    from goodlens.model.batch import validate_batch
    a = ParquetStore(tmp_path / "d", writer_id="a", grace_s=0.0)
    b = ParquetStore(tmp_path / "d", writer_id="b")
    try:
        for s in range(0, 100, 10):  # ten small segments per writer, and b repeats a's rows
            batch = validate_batch(step_batch("dup", 0, list(range(s, s + 10))))
            a.write_group([batch])
            b.write_group([validate_batch(step_batch("dup", 0, list(range(s, s + 10))))])
            b.write_group([validate_batch(step_batch("dup", 1, list(range(s, s + 10))))])
        reader = ParquetStore(tmp_path / "d", read_only=True)
        before = report_dict(reader, "dup")
        assert reader.row_counts()["steps"] == 200
        files_before = len(list((tmp_path / "d" / "steps").rglob("*.parquet")))
        assert files_before == 30
        assert a.compact(min_files=4) >= 1
        # the sources stay for a grace period (readers that listed them still find them):
        # merged and sources side by side still count once
        reader.summarize_dirty()
        assert reader.row_counts()["steps"] == 200
        assert report_dict(reader, "dup")["buckets"] == pytest.approx(before["buckets"])
        a.compact(min_files=4)  # the grace period (0 here) is over: the sources go
        assert len(list((tmp_path / "d" / "steps").rglob("*.parquet"))) < files_before
        reader.summarize_dirty()
        after = report_dict(reader, "dup")
        assert reader.row_counts()["steps"] == 200
        assert after["buckets"] == pytest.approx(before["buckets"])
        reader.close()
        # a writer's own duplicate (a retried push) is refused at write time
        res = a.write_group([validate_batch(step_batch("dup", 0, [5, 6, 200]))])
        assert (res[0].steps_inserted, res[0].steps_duplicate) == (1, 2)
    finally:
        a.close()
        b.close()


def test_other_engines_read_the_dataset(tmp_path: Path) -> None:
    store = ParquetStore(tmp_path / "x")
    import_trace(store, SIM)
    store.close()
    # pyarrow's dataset API (as Spark and Trino do) sees hive partitions run_id and hour
    dataset = ds.dataset(tmp_path / "x" / "steps", format="parquet", partitioning="hive")
    t = dataset.to_table(columns=["run_id", "rank", "step"])
    # the sample's rows: 64 ranks x 495 steps, 56 x 159 (shrunk), 64 x 2,328 (its attempts)
    assert set(t.column("run_id").to_pylist()) == {"sim-64"} and t.num_rows == 189_576
    # plain DuckDB, no goodlens: rows per hour
    con = duckdb.connect()
    rows = con.execute(f"SELECT hour, count(*) FROM read_parquet('{tmp_path}/x/steps/*/*/*."
                       "parquet', hive_partitioning = true) GROUP BY hour ORDER BY hour"
                       ).fetchall()
    assert sum(n for _, n in rows) == 189_576 and len(rows) == 2


def test_cli_report_and_dashboard_data_on_parquet(tmp_path: Path) -> None:
    out = subprocess.run([*GOODLENS, "import", str(SIM), "--db", f"parquet:{tmp_path}/p",
                          "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rep = subprocess.run([*GOODLENS, "report", "--db", f"parquet:{tmp_path}/p", "--run",
                          "sim-64", "--json"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert rep.returncode == 0, rep.stderr
    single = Store(tmp_path / "s.duckdb")
    import_trace(single, SIM)
    single.summarize_dirty()
    assert json.loads(rep.stdout)["goodput"] == pytest.approx(
        report_dict(single, "sim-64")["goodput"], abs=1e-9)
    single.close()
    # the detectors read the same rows through the same API: the same findings
    found = subprocess.run([*GOODLENS, "detect", "--store", f"parquet:{tmp_path}/p", "--run",
                            "sim-64", "--json"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert found.returncode == 0, found.stderr
    want = subprocess.run([*GOODLENS, "detect", "--db", str(tmp_path / "s.duckdb"), "--run",
                           "sim-64", "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert json.loads(found.stdout)["findings"] == json.loads(want.stdout)["findings"]
    assert json.loads(found.stdout)["findings"], "sim-64 has a planted slow switch"
    bad = subprocess.run([*GOODLENS, "report", "--db", f"parquet:{tmp_path}/nothing"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "no goodlens Parquet dataset" in bad.stderr
    from goodlens.dashboard.data import RunData
    store = ParquetStore(tmp_path / "p", read_only=True)
    try:
        d = RunData(store)
        assert d.overview("sim-64")["report"]["goodput"] == pytest.approx(
            json.loads(rep.stdout)["goodput"])
        assert d.ranks("sim-64")["grid"] is not None
        d.findings("sim-64", wait=True)  # the batch pass it started, done before close
    finally:
        store.close()


# ---------------------------------------------------------------------- summary checkpoints
def _same_summaries(a: ParquetStore, b: ParquetStore, run: str) -> None:
    import pandas as pd
    pd.testing.assert_frame_equal(a.step_summaries(run).reset_index(drop=True),
                                  b.step_summaries(run).reset_index(drop=True))


def test_reopening_starts_from_the_summary_checkpoint(tmp_path: Path) -> None:
    """A closed writer leaves a checkpoint; opening again summarises nothing and answers
    exactly as a full rebuild from the raw segments."""
    w = ParquetStore(tmp_path / "d", writer_id="w")
    import_trace(w, SIM)
    run = w.runs().run_id[0]
    expected = report_dict(w, run)
    w.close()
    assert len(list((tmp_path / "d" / "summaries").glob("*/*.parquet"))) == 1
    again = ParquetStore(tmp_path / "d", read_only=True)
    full = ParquetStore(tmp_path / "d", read_only=True, use_checkpoints=False)
    try:
        assert again.open_stats["checkpoints"] == 1
        assert again.open_stats["steps_summarised"] == 0
        assert full.open_stats["checkpoints"] == 0
        assert full.open_stats["steps_summarised"] > 1000
        _same_summaries(again, full, run)
        assert report_dict(again, run) == report_dict(full, run) == expected
    finally:
        again.close()
        full.close()


def test_a_checkpoint_stays_exact_when_segments_are_added_and_compacted(tmp_path: Path) -> None:
    """After the checkpoint: another collector adds ranks to steps the checkpoint summarised,
    and a compaction replaces the covered segments by a merged one. The reopened store
    recomputes exactly those steps (no more) and equals a full rebuild."""
    from goodlens.model.batch import validate_batch
    d = tmp_path / "d"
    a = ParquetStore(d, writer_id="a", grace_s=0.0)
    for s in range(0, 100, 10):
        a.write_group([validate_batch(step_batch("r", rank, list(range(s, s + 10))))
                       for rank in range(4)])
    a.close()  # checkpoint: steps 0-99 over ranks 0-3
    b = ParquetStore(d, writer_id="b", use_checkpoints=False)
    b.write_group([validate_batch(step_batch("r", 4, list(range(40, 60))))])
    b.write_group([validate_batch(step_batch("r", 0, list(range(100, 110))))])
    # b opened after a's close and saves its own checkpoint only at close: not yet
    partial = ParquetStore(d, read_only=True)
    assert partial.open_stats["steps_summarised"] == 30  # 40-59 (rank 4 added) and 100-109
    full = ParquetStore(d, read_only=True, use_checkpoints=False)
    _same_summaries(partial, full, "r")
    assert partial.step_summaries("r").ranks.max() == 5  # ranks of steps 40-59
    partial.close()
    full.close()
    merged = ParquetStore(d, writer_id="c", grace_s=0.0)
    assert merged.compact(min_files=2) >= 1
    merged.compact(min_files=2)  # the grace period (0) is over: the covered sources go
    merged.close()
    b.close()
    after = ParquetStore(d, read_only=True)
    full = ParquetStore(d, read_only=True, use_checkpoints=False)
    try:
        _same_summaries(after, full, "r")
    finally:
        after.close()
        full.close()


def test_a_broken_checkpoint_is_ignored_and_superseded_ones_are_pruned(tmp_path: Path) -> None:
    d = tmp_path / "d"
    w = ParquetStore(d, writer_id="w", grace_s=0.0, summary_every_s=0.0)
    import_trace(w, SIM)
    run = w.runs().run_id[0]
    w.summarize_dirty()  # saves one (summary_every_s=0)
    from goodlens.model.batch import validate_batch
    w.write_group([validate_batch(step_batch(run, 0, [100_000]))])
    w.summarize_dirty()  # a second one, covering the first's segments and one more
    w.close()  # the first is superseded: pruned at close
    kept = sorted((d / "summaries").glob("*/*.parquet"))
    assert len(kept) == 1
    # a torn checkpoint (written by hand, or by a newer schema) is skipped
    (kept[0].parent / "zz-torn.parquet").write_bytes(b"PAR1 not really")
    r = ParquetStore(d, read_only=True)
    try:
        assert r.open_stats["checkpoints"] == 1
        assert r.open_stats["steps_summarised"] == 0
    finally:
        r.close()


def test_a_reader_that_had_to_summarise_for_long_leaves_a_checkpoint(tmp_path: Path) -> None:
    """A dataset written by collectors that never closed (killed): the first reader pays
    for the summaries and saves them (here: whatever it took), the next one does not."""
    w = ParquetStore(tmp_path / "d", writer_id="w")
    import_trace(w, SIM)  # not closed: no checkpoint
    assert not list((tmp_path / "d" / "summaries").glob("*/*.parquet"))
    first = ParquetStore(tmp_path / "d", read_only=True, save_after_open_s=0.0)
    assert first.open_stats["checkpoints"] == 0 and first.open_stats["steps_summarised"]
    second = ParquetStore(tmp_path / "d", read_only=True)
    try:
        assert second.open_stats["checkpoints"] == 1
        assert second.open_stats["steps_summarised"] == 0
        run = second.runs().run_id[0]
        _same_summaries(first, second, run)
    finally:
        first.close()
        second.close()
        w._con.close()


def test_compacting_seen_segments_does_not_summarise_them_again(tmp_path: Path) -> None:
    """A collector merging segments it has summarised marks the merged one seen: the next
    pass summarises nothing, and the answers equal a full rebuild. A reader that did not
    merge them recomputes those steps once, exactly."""
    from goodlens.model.batch import validate_batch
    w = ParquetStore(tmp_path / "d", writer_id="w", grace_s=0.0)
    reader = ParquetStore(tmp_path / "d", read_only=True, rescan_every_s=0.0)
    try:
        for s in range(0, 100, 10):
            w.write_group([validate_batch(step_batch("r", k, list(range(s, s + 10))))
                           for k in range(4)])
        w.summarize_dirty()
        reader.summarize_dirty()
        assert w.compact(min_files=2) == 1
        assert w.summarize_dirty() == 0
        assert reader.summarize_dirty() == 100  # it sees a new segment: recomputed
        full = ParquetStore(tmp_path / "d", read_only=True, use_checkpoints=False)
        _same_summaries(w, full, "r")
        _same_summaries(reader, full, "r")
        full.close()
    finally:
        reader.close()
        w.close()


def test_checkpoints_are_per_run_and_a_finished_run_is_not_rewritten(tmp_path: Path) -> None:
    """Two runs: each gets its own checkpoint; new steps of one rewrite only its own; a
    reader loads both and equals a full rebuild."""
    from goodlens.model.batch import validate_batch
    d = tmp_path / "d"
    w = ParquetStore(d, writer_id="w", summary_every_s=3600.0, grace_s=3600.0)
    try:
        for run in ("a/1", "b"):  # a run id that needs encoding, too
            w.write_group([validate_batch(step_batch(run, k, list(range(50))))
                           for k in range(2)])
        w.summarize_dirty()
        w.save_summaries()
        first = {p.parent.name: p for p in (d / "summaries").glob("*/*.parquet")}
        assert sorted(first) == ["run_id=a%2F1", "run_id=b"]
        w.write_group([validate_batch(step_batch("b", 0, list(range(50, 60))))])
        w.summarize_dirty()
        assert [Path(p).parent.name for p in w.save_summaries()] == ["run_id=b"]
        files = sorted((d / "summaries").glob("*/*.parquet"))
        assert [p.parent.name for p in files].count("run_id=a%2F1") == 1  # not rewritten
        assert [p.parent.name for p in files].count("run_id=b") == 2  # old one in its grace
    finally:
        w.close()
    r = ParquetStore(d, read_only=True)
    full = ParquetStore(d, read_only=True, use_checkpoints=False)
    try:
        assert r.open_stats == {**r.open_stats, "checkpoints": 2, "steps_summarised": 0}
        for run in ("a/1", "b"):
            _same_summaries(r, full, run)
    finally:
        r.close()
        full.close()
