"""A Parquet dataset's live writer and readers when rows a summary counted are gone (a
segment removed by hand), and a run id too long for a folder: the collector keeps each such
step's earlier figures and says so once (the batch pass refuses instead:
test_dataset_guard.py); a run id no folder can hold is a 422 for that push only.

Hand-known rows (``tests.harness.step_batch``): rank r computes 0.6 + 0.01 r s, so with
ranks 0-3 a step's ``compute_max`` is 0.63 and its slowest rank 3; the late rank 4 alone
would read 1 rank, 0.64 and rank 4.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import pyarrow as pa
from click.testing import CliRunner

from goodlens.cli import main
from goodlens.model.batch import validate_batch
from goodlens.storage.parquet import ParquetStore
from tests.harness import AppCollector, step_batch
from tests.integration import dataset_cases as cases

EARLIER = {"ranks": 4, "compute_max": 0.63, "slowest_rank": 3}


def figures(store: ParquetStore, run: str = "r") -> dict[int, dict]:
    df = store.cursor().sql("SELECT step, ranks, compute_max, slowest_rank FROM "
                            "step_summaries WHERE run_id = ? ORDER BY step",
                            params=[run]).df()
    return {int(r.step): {"ranks": int(r.ranks), "compute_max": round(r.compute_max, 6),
                          "slowest_rank": int(r.slowest_rank)} for r in df.itertuples()}


def push(store: ParquetStore, *batches: dict) -> None:
    store.write_group([validate_batch(b) for b in batches])
    store.summarize_dirty()


def test_a_collector_keeps_a_steps_figures_when_its_rows_are_removed(tmp_path, caplog) -> None:
    root = tmp_path / "d"
    store = ParquetStore(root, writer_id="c")
    try:
        push(store, *[step_batch("r", k, list(range(6))) for k in range(4)])
        assert figures(store) == dict.fromkeys(range(6), EARLIER)
        assert store.warnings == []
        (seg,) = (root / "steps").glob("*/*/*.parquet")
        seg.unlink()  # removed by hand while the collector runs
        with caplog.at_level(logging.WARNING, "goodlens.parquet"):
            push(store, step_batch("r", 4, [2, 3]))  # a late rank
            push(store, step_batch("r", 4, [4]), step_batch("r", 0, [6]))  # and more
        got = figures(store)
        assert {s: got[s] for s in range(6)} == dict.fromkeys(range(6), EARLIER)
        # a step no summary counted before is summarised from its rows, as ever
        assert got[6] == {"ranks": 1, "compute_max": 0.6, "slowest_rank": 0}
        (text,) = store.warnings
        assert text.startswith("run 'r': 2 step(s) would be summarised again from fewer "
                               "ranks than before (attempt 0 step 2: 1 rank(s), was 4)")
        assert "kept the earlier figures of 3 step(s)" in text
        assert f"delete {root / 'summaries' / 'run_id=r'}" in text
        # said once, when first found (2 steps then)
        assert [r.getMessage() for r in caplog.records] == [
            text.replace("of 3 step", "of 2 step")]
    finally:
        store.close()


def test_a_reader_compares_with_a_checkpoint_whose_segments_are_all_gone(tmp_path) -> None:
    root = tmp_path / "d"
    cases.write(root, "a", [step_batch("r", k, list(range(6))) for k in range(4)])
    ParquetStore(root).close()  # a writer's close saves the run's checkpoint
    shutil.rmtree(next((root / "steps" / "run_id=r").iterdir()))  # every segment it covers
    cases.write(root, "late", [step_batch("r", 4, [2, 3])])
    reader = ParquetStore(root, read_only=True)
    try:
        assert figures(reader) == {2: EARLIER, 3: EARLIER}
        (text,) = reader.warnings
        assert "(attempt 0 step 2: 1 rank(s), was 4)" in text
    finally:
        reader.close()


def test_a_reader_starting_from_a_checkpoint_missing_one_of_its_segments(tmp_path) -> None:
    root = tmp_path / "d"
    cases.write(root, "a", [step_batch("r", k, [0, 1, 2]) for k in (0, 1)])
    cases.write(root, "b", [step_batch("r", k, [0, 1, 2]) for k in (2, 3)])
    ParquetStore(root).close()
    os.remove(next((root / "steps").glob("*/*/a-*.parquet")))  # ranks 0 and 1 of 0-2
    cases.write(root, "late", [step_batch("r", 4, [1])])
    reader = ParquetStore(root, read_only=True)
    try:
        # step 1 from what is left would be ranks 2-4: 3 ranks; it keeps the 4 it had
        assert figures(reader) == dict.fromkeys(range(3), EARLIER)
        assert "(attempt 0 step 1: 3 rank(s), was 4)" in reader.warnings[0]
    finally:
        reader.close()
    r = CliRunner().invoke(main, ["report", "--db", f"parquet:{root}", "--run", "r"])
    assert r.exit_code == 0
    assert r.stderr.startswith("warning: run 'r': 1 step(s) would be summarised again")


def test_ranks_that_only_grow_say_nothing(tmp_path) -> None:
    root = tmp_path / "d"
    store = ParquetStore(root, writer_id="c")
    try:
        push(store, *[step_batch("r", k, [0, 1]) for k in range(3)])
        push(store, step_batch("r", 3, [0, 1]))
        assert figures(store) == dict.fromkeys(range(2), EARLIER)
        assert store.warnings == []
    finally:
        store.close()


def test_a_parquet_collector_refuses_a_run_id_no_folder_holds(tmp_path) -> None:
    """248 bytes fit a folder ``run_id=<value>`` (255 a name); 'ü' takes 2 bytes, so 124 of
    them fit and 125 (within the API's 256 characters) do not: a 422 for that push only.
    Then /healthz counts a run that keeps earlier figures."""
    c = AppCollector(f"parquet:{tmp_path / 'd'}", detect=False)

    def ingest(*batches: dict) -> list[tuple[int, dict]]:
        return [c.http("POST", "/v1/ingest", json.dumps(b).encode()) for b in batches]
    try:
        fits, too_long = "ü" * 124, "ü" * 125
        ((status, body),) = ingest(step_batch(too_long, 0, [0, 1]))
        assert status == 422 and body["field"] == "run_id"
        assert "is 250 bytes as a folder name (at most 248" in body["error"]
        assert "use a shorter run id" in body["error"]
        for status, body in ingest(step_batch(fits, 0, [0, 1]), step_batch("ok", 0, [0, 1]),
                                   step_batch("ok", 1, [0, 1])):
            assert status == 200 and body["steps_inserted"] == 2, body
        assert sorted(p.name for p in (tmp_path / "d" / "steps").iterdir()) == [
            "run_id=ok", f"run_id={fits}"]
        _, metrics = c.http("GET", "/metrics")
        assert 'goodlens_ingest_rejected_batches_total{reason="invalid"} 1.0' in metrics
        c.sync()
        assert c.http("GET", "/healthz")[1]["store_warnings"] == 0
        for seg in (tmp_path / "d" / "steps" / "run_id=ok").glob("*/*.parquet"):
            seg.unlink()
        ((status, _),) = ingest(step_batch("ok", 2, [1]))
        c.sync()
        assert status == 200 and c.http("GET", "/healthz")[1]["store_warnings"] == 1
    finally:
        c.stop()


def test_import_into_a_dataset_refuses_a_run_id_no_folder_holds(tmp_path) -> None:
    from goodlens.model.trace import write_trace
    run = "/" * 83  # 83 x '%2F': 249 bytes
    steps = validate_batch(step_batch(run, 0, [0, 1])).steps
    steps = steps.append_column("run_id", pa.array([run] * steps.num_rows))
    write_trace(tmp_path / "t", {"steps": steps}, [run])
    r = CliRunner().invoke(main, ["import", str(tmp_path / "t"), "--db",
                                  f"parquet:{tmp_path / 'd'}"])
    text = cases.one_line(r, 1)
    assert "is 249 bytes as a folder name (at most 248" in text
    assert text.endswith("use a shorter run id; nothing was imported")
    assert not any((tmp_path / "d" / "steps").iterdir())
