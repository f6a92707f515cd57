"""20,000 generated hostile pushes to a real collector, recorded (``hostile``): what it
answered, counted and stored, and the good rows it stored pushed again, in-process.

The recording (``tests/record/elastic.py``) sent ``hostile_requests(20000, seed=2024)`` and
three rounds of every bomb to a real collector over keep-alive connections from 4 threads, as the
live test (``tests/e2e/test_hostile_ingest_http.py``) sends its 2,000: ``job.json`` holds
the answers by status, the rows acknowledged, the refusals ``/metrics`` counted by reason,
the rows stored per run and the collector's memory; the trace holds the rows stored of the
main run (``hostile``; a bit flip in a run id makes a few runs of one push each). The
recorded books are checked here as they were; then the stored rows go through the
collector's ASGI app again and must all be accepted, stored as they were, and readable.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.recorded import InProcessCollector, Recording, load

RSS_GROWTH_LIMIT = 300 * 1024 * 1024   # as tests/e2e/test_hostile_ingest_http.py's


@pytest.fixture(scope="module")
def rec() -> Recording:
    return load("hostile")


def test_the_recorded_collector_stored_exactly_what_it_acknowledged(rec):
    j, s = rec.job, rec.job["settings"]
    # every push answered, never a 5xx (a hang would have failed the recording)
    assert j["sent"] == s["requests"] + j["bombs"] and j["bombs"] > 0
    assert sum(j["statuses"].values()) == j["sent"] and j["server_errors"] == 0
    assert not [k for k in j["statuses"] if int(k) >= 500], j["statuses"]
    assert j["statuses"].get("200", 0) < 0.1 * j["sent"], j["statuses"]
    # its memory stayed bounded through the bombs and the 20,000 (the kernel's high-water
    # mark of its resident memory against its resident memory before)
    assert j["rss"]["high_water"] - j["rss"]["baseline"] <= RSS_GROWTH_LIMIT, j["rss"]
    # nothing refused was stored: the store held exactly the rows acknowledged
    stored = j["stored_by_run"]
    for table in ("steps", "events"):
        assert sum(v[table] for v in stored.values()) == j["acknowledged"][table], table
    # every refusal counted by its reason: the bombs by what they declared, none too large
    # by its body (no push here exceeded --max-body) and none failed to be written
    rejected = j["rejected"]
    assert rejected["decoded_too_large"] >= j["bombs"]
    assert rejected["too_large"] == 0 and rejected["write_error"] == 0
    assert sum(rejected.values()) == j["sent"] - j["statuses"]["200"]
    # the trace holds the main run as the collector stored it
    assert rec.tables["steps"].num_rows == stored["hostile"]["steps"]
    assert rec.tables["events"].num_rows == stored["hostile"]["events"]


def test_the_good_rows_are_accepted_again_stored_as_they_were_and_readable(
        rec, tmp_path: Path) -> None:
    """What a real collector accepted from hostile pushes (extreme but valid values) goes
    through ingest, storage, the summaries and the read API of today's collector."""
    col = InProcessCollector(tmp_path / "hostile.duckdb")
    try:
        run = {k: v for k, v in rec.tables["runs"].to_pylist()[0].items()
               if k not in ("run_id", "first_seen") and v is not None}
        docs = [{"schema_version": 1, "run_id": rec.run_id, "run": run}]
        for table in ("steps", "events"):
            rows = rec.tables[table].drop_columns(["run_id"]).to_pydict()
            rows = {k: v for k, v in rows.items() if any(x is not None for x in v)}
            docs.append({"schema_version": 1, "run_id": rec.run_id, table: rows})
        for doc in docs:
            col.push(doc)
        col.sync(detect=True)
        assert len(col.store.steps(rec.run_id)) == rec.tables["steps"].num_rows
        assert len(col.store.events(rec.run_id)) == rec.tables["events"].num_rows
        col.get(f"/v1/runs/{rec.run_id}")
        col.get("/v1/report", run=rec.run_id)
        col.get("/v1/runs")
    finally:
        col.close()
