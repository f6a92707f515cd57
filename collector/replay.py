"""Moving traces in and out of a store: import a trace folder, export a run as a trace,
stream a trace through a live collector.

Import goes through the same validation and write path as live ingest (key-based
de-duplication, summaries), so importing a trace twice adds nothing and a trace is exactly
what an exporter would have produced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from goodlens.model.batch import Batch, BatchError, validate_batch
from goodlens.model.batch_arrow import arrow_steps
from goodlens.model.schema import RUN_COLUMNS, SCHEMA_VERSION
from goodlens.model.trace import Trace, TraceError, read_trace, write_trace
from goodlens.storage.reader import RunReader
from goodlens.storage.store import Store

CHUNK_ROWS = 500_000


def trace_batches(trace: Trace) -> Iterator[Batch]:
    """The trace as store batches, one run at a time, in chunks of ``CHUNK_ROWS``, each
    validated exactly like a live push (a bad trace is refused, naming file and field)."""
    runs = trace.tables.get("runs")
    steps = trace.tables.get("steps")
    events = trace.tables.get("events")
    known = set(trace.run_ids)
    for name, table in (("runs", runs), ("steps", steps), ("events", events)):
        if table is not None and "run_id" in table.column_names:
            stray = set(pc.unique(table.column("run_id")).to_pylist()) - known
            if stray:
                raise TraceError(f"{name}.parquet has rows of runs the manifest does not list: "
                                 f"{sorted(map(str, stray))[:5]}")
    for run_id in trace.run_ids:
        meta = None
        if runs is not None:
            rows = runs.filter(pc.equal(runs.column("run_id"), run_id)).to_pylist()
            if rows:
                meta = {c.name: rows[0].get(c.name) for c in RUN_COLUMNS
                        if rows[0].get(c.name) is not None}
        try:
            yield validate_batch({"schema_version": SCHEMA_VERSION, "run_id": run_id,
                                  "run": meta})
            if events is not None:
                part = events.filter(pc.equal(events.column("run_id"), run_id))
                part = part.drop_columns(["run_id"]).to_pydict()
                for offset in range(0, len(next(iter(part.values()), [])), CHUNK_ROWS):
                    chunk = {k: v[offset:offset + CHUNK_ROWS] for k, v in part.items()}
                    yield validate_batch({"schema_version": SCHEMA_VERSION, "run_id": run_id,
                                          "events": chunk})
            if steps is not None:
                part = steps.filter(pc.equal(steps.column("run_id"), run_id))
                part = part.drop_columns(["run_id"])
                for offset in range(0, part.num_rows, CHUNK_ROWS):
                    yield Batch(run_id=run_id,
                                steps=arrow_steps(part.slice(offset, CHUNK_ROWS)))
        except BatchError as exc:
            raise TraceError(f"run {run_id!r} of the trace: {exc.message}") from None


def import_trace(store: Store, path: str | Path,
                 progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """Load a trace folder into ``store``, all or nothing: the whole trace is validated
    first (a :class:`TraceError` naming the file and column leaves the store as it was),
    then written in one transaction. Returns rows inserted and duplicates per table."""
    trace = read_trace(path)
    totals = {"runs": len(trace.run_ids), "steps_inserted": 0, "steps_duplicate": 0,
              "events_inserted": 0, "events_duplicate": 0}
    for name in ("runs", "steps", "events"):
        table = trace.tables.get(name)
        if table is not None and "run_id" not in table.column_names:
            raise TraceError(f"{name}.parquet of {path} has no run_id column")
    try:
        batches = list(trace_batches(trace))
    except (KeyError, pa.ArrowException) as exc:  # a column the checks above rely on
        raise TraceError(f"{path} is not a valid goodlens trace: {exc}") from None
    results = store.write_group(batches)
    for batch, res in zip(batches, results):
        for k, v in res.as_dict().items():
            totals[k] += v
        if progress:
            progress(batch.rows)
    store.summarize_dirty()
    return totals


def export_run(store: RunReader, run_ids: list[str], path: str | Path) -> Path:
    """Write runs from ``store`` as a trace folder."""
    tables: dict[str, list[pa.Table]] = {name: [] for name in ("runs", "steps", "events",
                                                                "attempts")}
    for run_id in run_ids:
        if store.run(run_id) is None:
            raise KeyError(f"no run {run_id!r} in {store.path}; see `goodlens runs`")
        for name in tables:
            tables[name].append(store.table(name, run_id))
    return write_trace(path, {k: pa.concat_tables(v) for k, v in tables.items()}, run_ids)


class Retime:
    """How a live replay stamps a trace's instants: trace time ``t`` becomes ``base + (t -
    t0) * scale``, every duration of a step row times ``scale``. The identity by default
    (the trace's own times)."""

    #: The step row columns that are durations (scaled with the instants).
    DURATIONS = ("duration_s", "compute_s", "collective_wait_s", "data_wait_s")

    def __init__(self, t0: float = 0.0, base: float = 0.0, scale: float = 1.0) -> None:
        self.t0, self.base, self.scale = t0, base, scale
        self.identity = base == t0 and scale == 1.0

    @classmethod
    def as_now(cls, t0: float, t_end: float, speed: float, now: float) -> Retime:
        """``--as-now``: a row available at trace time ``t`` is sent ``(t - t0) / speed``
        after ``now``, so it is stamped exactly then, ``now + (t - t0) / speed`` (the trace
        compressed ``speed`` times, starting now: never stamped after it is sent); at speed 0
        (everything at once) every instant moves by one amount so that the trace ends now."""
        if speed > 0:
            return cls(t0, now, 1.0 / speed)
        return cls(t0, now - (t_end - t0), 1.0)

    def at(self, t: float) -> float:
        """The stamp of trace instant ``t``."""
        return self.base + (t - self.t0) * self.scale

    def steps(self, cols: dict[str, list]) -> dict[str, list]:
        """Step rows (columns as lists) re-timed, in place."""
        if self.identity:
            return cols
        cols["start_time"] = [self.at(t) for t in cols["start_time"]]
        if self.scale != 1.0:
            for name in self.DURATIONS:
                if name in cols:
                    cols[name] = [None if v is None else v * self.scale for v in cols[name]]
        return cols

    def events(self, cols: dict[str, list]) -> dict[str, list]:
        """Events (columns as lists) re-timed, in place."""
        if not self.identity:
            cols["time"] = [self.at(t) for t in cols["time"]]
        return cols


def stream_trace(path: str | Path, url: str, speed: float = 1.0, token: str | None = None,
                 batch_rows: int = 50_000, tick_s: float = 0.1,
                 progress: Callable[[int], None] | None = None,
                 sleep: Callable[[float], None] | None = None,
                 give_up_s: float = 60.0, as_now: bool = False) -> dict[str, int]:
    """Push a trace through a collector's ingest as if it were happening, ``speed`` times
    faster than real time (0: as fast as the collector takes it).

    A step row is sent once its step has ended in trace time, an event once it happened, so
    a collector (and a dashboard) sees the run unfold. Timestamps are kept as recorded, or
    with ``as_now`` re-timed so the run happens now and no row is stamped after the instant
    it is sent (:class:`Retime`: a run still going reads as live rather than as months old).
    Batches travel as Arrow IPC; the collector's answer for each is checked, and a refused
    batch stops the replay with its reason, and so does a collector unreachable for
    ``give_up_s``.
    """
    import time

    import numpy as np

    from goodlens.exporter.transport import Transport
    from goodlens.model.wire import ARROW as CONTENT_TYPE
    from goodlens.model.wire import encode_arrow_batch

    if speed < 0:
        raise ValueError("speed must be >= 0 (0: as fast as possible)")
    sleep = sleep or time.sleep
    trace = read_trace(path)
    transport = Transport(url, token, timeout_s=60.0, spill_path=None)
    items: list[tuple[np.ndarray, Batch]] = []  # (availability times, rows) per run and table
    for batch in trace_batches(trace):
        if batch.steps is not None:
            t = batch.steps
            avail = (t.column("start_time").to_numpy() + t.column("duration_s").to_numpy())
            items.append((avail, batch))
        elif batch.events is not None:
            items.append((batch.events.column("time").to_numpy(), batch))
        else:
            items.append((np.array([-np.inf]), batch))
    finite = [a[np.isfinite(a)] for a, _ in items if np.isfinite(a).any()]
    t0 = min(a.min() for a in finite) if finite else 0.0
    t_end = max(a.max() for a in finite) if finite else 0.0
    order = [(np.argsort(a, kind="stable"), a, b) for a, b in items]
    cursor = [0] * len(order)
    sent = {"steps": 0, "events": 0, "batches": 0}
    retime = Retime.as_now(t0, t_end, speed, time.time()) if as_now else Retime()
    wall0 = time.monotonic()
    while any(c < len(o[0]) for c, o in zip(cursor, order)):
        now = t0 + (time.monotonic() - wall0) * speed if speed else np.inf
        for i, (idx, avail, batch) in enumerate(order):
            c = cursor[i]
            if c >= len(idx):
                continue
            end = int(np.searchsorted(avail[idx], now, side="right"))
            while c < end:
                take = idx[c:min(end, c + batch_rows)]
                c += len(take)
                doc: dict = {"schema_version": 1, "run_id": batch.run_id}
                if batch.run:
                    doc["run"] = {k: v for k, v in batch.run.items() if v is not None}
                rows = 0
                if batch.steps is not None:
                    doc["steps"] = retime.steps(batch.steps.take(take).to_pydict())
                    rows = sent_rows = len(take)
                    sent["steps"] += sent_rows
                if batch.events is not None:
                    ev = retime.events(batch.events.take(take).to_pydict())
                    doc["events"] = {k: v for k, v in ev.items() if any(x is not None for x in v)}
                    rows = len(take)
                    sent["events"] += rows
                body = encode_arrow_batch(doc)
                outcome = transport._post(body, CONTENT_TYPE)
                failing_since = time.monotonic()
                while outcome == "retry":
                    if time.monotonic() - failing_since > give_up_s:
                        raise ValueError(f"gave up after {give_up_s:.0f} s: "
                                         f"{transport.stats.last_error}")
                    sleep(min(5.0, max(0.1, transport._backoff)))
                    outcome = transport._post(body, CONTENT_TYPE)
                if outcome == "rejected":
                    raise ValueError(f"the collector refused a batch: {transport.stats.last_error}")
                sent["batches"] += 1
                if progress:
                    progress(rows)
            cursor[i] = c
        if speed and any(c < len(o[0]) for c, o in zip(cursor, order)):
            nxt = min(o[1][o[0][c]] for c, o in zip(cursor, order) if c < len(o[0]))
            wait = (nxt - t0) / speed - (time.monotonic() - wall0)
            sleep(min(max(wait, 0.0), tick_s) if wait > 0 else 0.0)
    transport.close()
    return sent
