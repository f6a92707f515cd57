"""Recorded real runs, replayed exactly.

A recording (``tests/fixtures/runs/NAME/``, made by ``tests/record_fixtures.py``, ``make
record-fixtures``) is what a live collector stored of one real job (a goodlens trace:
``runs``, ``steps`` and ``events`` Parquet, without the collector's own findings), the job's
own clock (``clock.parquet``: every line each rank wrote about itself) and ``job.json`` (the
job's settings and any fact about its files the tests need).

:func:`replay` pushes the stored rows through the collector's ASGI app in this process: the
real decoding, validation, single writer, summaries and detection service. The rows arrive
in the order and cadence the job produced them (by the recorded end of each step, ``window_s``
of the job's time at a time), and after each window the detection service makes one pass
with the recorded instant as its clock, as its thread does every 2 s live. The result is a
:class:`~tests.jobclock.JobResult` that the claims about the job's clock read exactly as they
read a live one; it does not depend on this machine's load, so its tolerances can be tight.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.harness import ROOT, AppCollector
from tests.jobclock import JobResult

FIXTURES = ROOT / "tests" / "fixtures" / "runs"
CLOCK = "clock.parquet"
JOB = "job.json"


@dataclass
class Recording:
    """One recorded job: its trace's tables, its clock and its settings."""

    name: str
    path: Path
    job: dict[str, Any]
    tables: dict[str, pa.Table] = field(default_factory=dict)
    truth: dict[tuple[int, int], list[dict]] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        """The recorded run's id."""
        return self.job["run_id"]


def load(name: str) -> Recording:
    """The recording ``tests/fixtures/runs/<name>``."""
    from goodlens.model.trace import read_trace
    path = FIXTURES / name
    if not (path / JOB).exists():
        raise FileNotFoundError(f"no recording {name!r} in {FIXTURES}: record it with "
                                f"`make record-fixtures ONLY={name}`")
    trace = read_trace(path)
    clock = pq.read_table(path / CLOCK).to_pydict()
    truth: dict[tuple[int, int], list[dict]] = {}
    for rank, attempt, line in zip(clock["rank"], clock["attempt"], clock["line"],
                                   strict=True):
        truth.setdefault((rank, attempt), []).append(json.loads(line))
    return Recording(name, path, json.loads((path / JOB).read_text()), trace.tables, truth)


def write_clock(folder: Path, out: Path) -> int:
    """The job's clock files of ``folder`` (``rank{R}-attempt{A}.jsonl``) as ``out``, one
    row per line, in each file's order; returns the number of lines."""
    rows: dict[str, list] = {"rank": [], "attempt": [], "line": []}
    for f in sorted(folder.glob("rank*-attempt*.jsonl")):
        rank, attempt = f.stem.removeprefix("rank").split("-attempt")
        for line in f.read_text().splitlines():
            if line.strip():
                rows["rank"].append(int(rank))
                rows["attempt"].append(int(attempt))
                rows["line"].append(line)
    pq.write_table(pa.table(rows, schema=pa.schema([("rank", pa.int32()),
                                                    ("attempt", pa.int32()),
                                                    ("line", pa.string())])),
                   out, compression="zstd")
    return len(rows["line"])


class InProcessCollector(AppCollector):
    """The collector's app over a new DuckDB file, in this process (:class:`AppCollector`),
    whose detection passes the caller drives (no thread), with the checks a replay wants."""

    def __init__(self, db: Path, *, straggler: Any = None, hang_floor_s: float = 60.0) -> None:
        super().__init__(db, detection_thread=False, straggler=straggler,
                         hang_floor_s=hang_floor_s)

    def push(self, doc: dict[str, Any]) -> None:
        """POST one wire batch (Arrow IPC, as the exporter sends it); it must be accepted."""
        from goodlens.model.wire import ARROW, encode_arrow_batch
        status, body = self.http("POST", "/v1/ingest", encode_arrow_batch(doc),
                                 {"content-type": ARROW})
        assert status == 200, body

    def get(self, path: str, **params: Any) -> dict:
        """A GET of the read API, answered 200."""
        status, body = self.http("GET", f"{path}?{urlencode(params)}" if params else path)
        assert status == 200, body
        return body

    def close(self) -> None:
        """Stop the writer and close the store (the file stays)."""
        self.stop()


def _columns(table: pa.Table, idx: np.ndarray) -> dict[str, list]:
    cols = table.take(pa.array(idx)).to_pydict()
    return {k: v for k, v in cols.items() if any(x is not None for x in v)}


def replay(name: str, tmp_path: Path, *, window_s: float = 2.0, tail_s: float = 0.0,
           straggler: Any = None, hang_floor_s: float = 60.0,
           each_pass: Callable[[InProcessCollector, float], None] | None = None) -> JobResult:
    """Replay recording ``name`` into a new store under ``tmp_path`` (see the module's
    docstring) and read back what goodlens made of it: the stored steps and events (its
    findings included), ``/v1/report``, ``/v1/actions``, ``/v1/runs/RUN`` and the job's
    clock. ``tail_s``: detection passes go on that long past the last row, as a live
    collector's do while a hung job sends nothing. ``each_pass(collector, now)`` runs after
    every detection pass (``now``: its recorded instant): what a job polling the live
    collector (``/v1/actions``) saw then."""
    rec = load(name)
    run_id = rec.run_id
    steps = rec.tables["steps"].drop_columns(["run_id"])
    events = rec.tables["events"].drop_columns(["run_id"])
    runs = rec.tables["runs"].to_pylist()
    # the run's wire fields (first_seen is the store's own: the earliest row it holds)
    meta = {k: v for k, v in runs[0].items()
            if k not in ("run_id", "first_seen") and v is not None} if runs else {}
    s_at = (steps.column("start_time").to_numpy(zero_copy_only=False)
            + steps.column("duration_s").to_numpy(zero_copy_only=False))
    e_at = events.column("time").to_numpy(zero_copy_only=False)
    t0 = float(min(s_at.min(initial=np.inf), e_at.min(initial=np.inf)))
    t_end = float(max(s_at.max(initial=-np.inf), e_at.max(initial=-np.inf)))
    s_win = np.floor((s_at - t0) / window_s).astype(int)
    e_win = np.floor((e_at - t0) / window_s).astype(int)
    windows = int(np.ceil((t_end + tail_s - t0) / window_s)) + 1
    col = InProcessCollector(tmp_path / f"{name}.duckdb", straggler=straggler,
                             hang_floor_s=hang_floor_s)
    try:
        for k in range(windows):   # rows of [t0 + k w, t0 + (k + 1) w), then a pass at its end
            doc: dict[str, Any] = {"schema_version": 1, "run_id": run_id}
            if k == 0:
                doc["run"] = meta
            ev, st = np.flatnonzero(e_win == k), np.flatnonzero(s_win == k)
            if len(ev):
                doc["events"] = _columns(events, ev[np.argsort(e_at[ev], kind="stable")])
            if len(st):
                doc["steps"] = _columns(steps, st[np.argsort(s_at[st], kind="stable")])
            if "events" in doc or "steps" in doc or k == 0:
                col.push(doc)
            col.sync()
            now = t0 + (k + 1) * window_s
            col.detection.poll_once(now=now)
            if each_pass is not None:
                each_pass(col, now)
        col.sync(detect=True)
        return JobResult(col.db, run_id, rec.truth, job=rec.job,
                         report=col.get("/v1/report", run=run_id),
                         actions=col.get("/v1/actions", run=run_id),
                         run=col.get(f"/v1/runs/{run_id}"),
                         steps=col.store.steps(run_id), events=col.store.events(run_id))
    finally:
        col.close()
