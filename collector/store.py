"""The DuckDB store: the only module in goodlens that holds SQL.

Why one module: every reader (reports, detectors, ``/metrics``, the dashboard) asks questions
through the read API below, so the schema can change in one place and no query is ever
built by formatting values into SQL (parameters are always bound).

Process model (see docs/architecture.md): DuckDB allows one writing process per file and no
other process may open it while that writer is open, so the collector process owns the
file. Inside it, exactly one thread writes (:class:`collector.writer.Writer` calls
:meth:`Store.write_group` and :meth:`Store.summarize_dirty`); readers use their own cursors.
``Store(path, read_only=True)`` opens a file no collector holds (offline analysis).

Idempotency: a step row's key is (run_id, attempt, rank, step) and an event's is
(run_id, source, seq). Each key part keeps a high-water mark (largest step or seq stored);
a batch whose rows all lie above their marks is inserted directly, anything else takes an
exact anti-join against stored rows. Re-sending a batch, or replaying a spill file, thus
adds nothing.

Per-step summaries (ranks reporting, median and max compute, slowest rank, step end, ...)
are maintained as data arrives: each write records the step range it touched in ``dirty``
in the same transaction, and the writer re-summarises dirty ranges every second or so (and
on :meth:`Store.summarize_dirty`). A crash between the two loses nothing: the dirty ranges
are durable and are summarised after restart.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from collector.ingest import Batch
from goodlens.model import EVENT_COLUMNS, RUN_COLUMNS, SCHEMA_VERSION, STEP_COLUMNS

_SQL_TYPES = {"int": "BIGINT", "float": "DOUBLE", "str": "VARCHAR"}
_STEP_NAMES = [c.name for c in STEP_COLUMNS]
_EVENT_NAMES = [c.name for c in EVENT_COLUMNS]
_RUN_NAMES = [c.name for c in RUN_COLUMNS]
_TERMINAL = "('attempt_end', 'failure_detected', 'preempted')"


def _ddl_columns(columns: tuple) -> str:
    return ",\n  ".join(f"{c.name} {_SQL_TYPES[c.kind]}" for c in columns)


_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS runs (
  run_id VARCHAR PRIMARY KEY,
  {_ddl_columns(RUN_COLUMNS)},
  first_seen DOUBLE
);
CREATE TABLE IF NOT EXISTS steps (
  run_id VARCHAR,
  {_ddl_columns(STEP_COLUMNS)}
);
CREATE TABLE IF NOT EXISTS events (
  run_id VARCHAR,
  {_ddl_columns(EVENT_COLUMNS)}
);
CREATE TABLE IF NOT EXISTS progress (
  run_id VARCHAR, stream VARCHAR, part VARCHAR, hwm BIGINT,
  PRIMARY KEY (run_id, stream, part)
);
CREATE TABLE IF NOT EXISTS dirty (run_id VARCHAR, attempt BIGINT, lo BIGINT, hi BIGINT);
CREATE TABLE IF NOT EXISTS step_summaries (
  run_id VARCHAR, attempt BIGINT, step BIGINT,
  ranks BIGINT,              -- ranks that reported the step
  step_start DOUBLE,         -- earliest rank start (epoch s)
  step_end DOUBLE,           -- latest rank end (epoch s)
  ref_start DOUBLE,          -- start on the lowest reporting rank's clock (reference clock)
  duration_median DOUBLE, duration_max DOUBLE,
  compute_median DOUBLE, compute_max DOUBLE,
  compute_ranks BIGINT,      -- ranks that reported a compute time (0: split not measured)
  slowest_rank BIGINT,       -- rank with the longest compute (or duration if unmeasured)
  slowest_host VARCHAR,
  collective_wait_median DOUBLE, data_wait_median DOUBLE,
  tokens BIGINT, samples BIGINT
);
CREATE OR REPLACE VIEW attempts AS
WITH s AS (
  SELECT run_id, attempt, min(step_start) AS first_step, max(step_end) AS last_step_end
  FROM step_summaries GROUP BY run_id, attempt),
e AS (
  SELECT run_id, attempt,
    min(time) FILTER (WHERE kind = 'attempt_start') AS start_ev,
    min(time) FILTER (WHERE kind <> 'heartbeat') AS first_ev,
    max(time) AS last_ev,
    min(time) FILTER (WHERE kind IN {_TERMINAL}) AS end_ev,
    arg_min(CASE kind WHEN 'attempt_end' THEN coalesce(cause, 'unknown')
                      WHEN 'failure_detected' THEN 'failed' ELSE 'preempted' END, time)
      FILTER (WHERE kind IN {_TERMINAL}) AS end_reason
  FROM events GROUP BY run_id, attempt),
a AS (
  SELECT coalesce(s.run_id, e.run_id) AS run_id, coalesce(s.attempt, e.attempt) AS attempt,
    coalesce(e.start_ev, least(s.first_step, e.first_ev), s.first_step, e.last_ev) AS start,
    e.end_ev, e.end_reason,
    greatest(s.last_step_end, e.last_ev) AS last_activity
  FROM s FULL OUTER JOIN e ON s.run_id = e.run_id AND s.attempt = e.attempt)
SELECT run_id, attempt, start,
  CASE WHEN end_ev IS NOT NULL THEN end_ev
       WHEN lead(attempt) OVER w IS NOT NULL THEN last_activity END AS "end",
  CASE WHEN end_ev IS NOT NULL THEN end_reason
       WHEN lead(attempt) OVER w IS NOT NULL THEN 'unknown' END AS end_reason,
  last_activity
FROM a WINDOW w AS (PARTITION BY run_id ORDER BY attempt);
"""

_SUMMARY_SELECT = """
SELECT run_id, attempt, step, count(*), min(start_time), max(start_time + duration_s),
  arg_min(start_time, rank), median(duration_s), max(duration_s),
  median(compute_s), max(compute_s), count(compute_s),
  arg_max(rank, coalesce(compute_s, duration_s)), arg_max(host, coalesce(compute_s, duration_s)),
  median(collective_wait_s), median(data_wait_s), sum(tokens), sum(samples)
FROM steps WHERE run_id = ? AND attempt = ? AND step BETWEEN ? AND ?
GROUP BY run_id, attempt, step
"""


class SchemaMismatch(RuntimeError):
    """The file was written by a goodlens with another schema version."""


@dataclass
class WriteResult:
    """What one batch changed: rows inserted and rows recognised as already stored."""

    steps_inserted: int = 0
    steps_duplicate: int = 0
    events_inserted: int = 0
    events_duplicate: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain dict (the ingest endpoint's response body)."""
        return dict(self.__dict__)


class Store:
    """A goodlens DuckDB file: schema, the writer's operations and the read API."""

    def __init__(self, path: str | Path, *, read_only: bool = False,
                 memory_limit: str | None = None, threads: int | None = None) -> None:
        self.path = str(path)
        self.read_only = read_only
        config: dict[str, Any] = {}
        if memory_limit:
            config["memory_limit"] = memory_limit
        if threads:
            config["threads"] = threads
        if read_only and not Path(self.path).exists():
            raise FileNotFoundError(f"no goodlens store at {self.path}")
        try:
            self._con = duckdb.connect(self.path, read_only=read_only, config=config)
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise RuntimeError(
                    f"{self.path} is held by another process (a running `goodlens serve`?); "
                    "query that collector over HTTP (--url) or stop it first") from None
            raise
        self._local = threading.local()
        if read_only:
            self._check_version()
        else:
            self._con.execute(_SCHEMA)
            if self._con.execute("SELECT 1 FROM meta WHERE key = 'schema_version'").fetchone() \
                    is None:
                self._con.execute("INSERT INTO meta VALUES ('schema_version', ?)",
                                  [str(SCHEMA_VERSION)])
            self._check_version()
        self._hwm: dict[tuple[str, str, str], int] = {
            (r, s, p): h for r, s, p, h in
            self._con.execute("SELECT run_id, stream, part, hwm FROM progress").fetchall()}
        self._known_runs = {r for (r,) in self._con.execute("SELECT run_id FROM runs").fetchall()}

    def _check_version(self) -> None:
        row = self._con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None or int(row[0]) != SCHEMA_VERSION:
            found = row[0] if row else "none"
            raise SchemaMismatch(f"{self.path} has schema version {found}; this goodlens "
                                 f"reads version {SCHEMA_VERSION}. Export it with the goodlens "
                                 "that wrote it, or start a new file.")

    def close(self) -> None:
        """Close the file (checkpointing the write-ahead log)."""
        self._con.close()

    # ------------------------------------------------------------------ writes
    def write_group(self, batches: list[Batch]) -> list[WriteResult]:
        """Write several batches in one transaction (group commit); all or nothing.

        Only the writer thread may call this. When it returns the data is committed.
        """
        if self.read_only:
            raise RuntimeError("store opened read-only")
        pending_hwm: dict[tuple[str, str, str], int] = {}
        new_runs: set[str] = set()
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            results = [self._write_batch(b, pending_hwm, new_runs) for b in batches]
            if pending_hwm:
                prog = pa.table({
                    "run_id": [k[0] for k in pending_hwm], "stream": [k[1] for k in pending_hwm],
                    "part": [k[2] for k in pending_hwm], "hwm": list(pending_hwm.values())})
                con.register("_prog", prog)
                con.execute("INSERT INTO progress SELECT * FROM _prog ON CONFLICT "
                            "(run_id, stream, part) DO UPDATE SET "
                            "hwm = greatest(progress.hwm, excluded.hwm)")
                con.unregister("_prog")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        self._hwm.update(pending_hwm)
        self._known_runs |= new_runs
        return results

    def _mark(self, key: tuple[str, str, str], pending: dict) -> int:
        return pending.get(key, self._hwm.get(key, -1))

    def _write_batch(self, b: Batch, pending: dict, new_runs: set) -> WriteResult:
        con = self._con
        res = WriteResult()
        if b.run or (b.run_id not in self._known_runs and b.run_id not in new_runs):
            meta = b.run or {}
            cols = ", ".join(_RUN_NAMES)
            updates = ", ".join(f"{c} = coalesce(excluded.{c}, runs.{c})" for c in _RUN_NAMES)
            first_seen = _first_time(b)
            con.execute(
                f"INSERT INTO runs (run_id, {cols}, first_seen) VALUES (?, "
                f"{', '.join('?' * len(_RUN_NAMES))}, ?) ON CONFLICT (run_id) DO UPDATE SET "
                f"{updates}, first_seen = least(runs.first_seen, excluded.first_seen)",
                [b.run_id, *[meta.get(c) for c in _RUN_NAMES], first_seen])
            new_runs.add(b.run_id)
        if b.steps is not None and b.steps.num_rows:
            res.steps_inserted = self._insert_steps(b.run_id, b.steps, pending)
            res.steps_duplicate = b.steps.num_rows - res.steps_inserted
        if b.events is not None and b.events.num_rows:
            res.events_inserted = self._insert_events(b.run_id, b.events, pending)
            res.events_duplicate = b.events.num_rows - res.events_inserted
        return res

    def _insert_steps(self, run_id: str, t: pa.Table, pending: dict) -> int:
        con = self._con
        att = t.column("attempt").to_numpy()
        rank = t.column("rank").to_numpy()
        step = t.column("step").to_numpy()
        key = (att.astype(np.int64) << 32) | rank.astype(np.int64)
        order = np.lexsort((step, key))
        ks, ss = key[order], step[order]
        same = ks[1:] == ks[:-1]
        ends = np.flatnonzero(~same)
        firsts = np.r_[0, ends + 1]
        lasts = np.r_[ends, len(ks) - 1]
        parts = [(f"{int(k) >> 32}:{int(k) & 0xFFFFFFFF}", int(ss[f]), int(ss[e]))
                 for k, f, e in zip(ks[firsts], firsts, lasts)]
        fast = not np.any(same & (ss[1:] <= ss[:-1])) and all(
            lo > self._mark((run_id, "steps", p), pending) for p, lo, _ in parts)
        cols = ", ".join(_STEP_NAMES)
        con.register("_steps", t)
        try:
            if fast:
                con.execute(f"INSERT INTO steps (run_id, {cols}) SELECT ?, {cols} FROM _steps",
                            [run_id])
                inserted = t.num_rows
            else:
                inserted = con.execute(
                    f"INSERT INTO steps (run_id, {cols}) SELECT ?, {cols} FROM "
                    f"(SELECT DISTINCT ON (attempt, rank, step) * FROM _steps) b "
                    f"ANTI JOIN (SELECT attempt, rank, step FROM steps WHERE run_id = ? "
                    f"AND step BETWEEN ? AND ?) s USING (attempt, rank, step)",
                    [run_id, run_id, int(step.min()), int(step.max())]).fetchone()[0]
        finally:
            con.unregister("_steps")
        for p, _, hi in parts:
            k = (run_id, "steps", p)
            pending[k] = max(hi, self._mark(k, pending))
        if inserted:
            span = pa.table({"attempt": att, "step": step}).group_by("attempt").aggregate(
                [("step", "min"), ("step", "max")])
            con.register("_span", span)
            con.execute("INSERT INTO dirty SELECT ?, attempt, step_min, step_max FROM _span",
                        [run_id])
            con.unregister("_span")
        return int(inserted)

    def _insert_events(self, run_id: str, t: pa.Table, pending: dict) -> int:
        con = self._con
        sources = t.column("source").to_pylist()
        seqs = t.column("seq").to_pylist()
        spans: dict[str, list[int]] = {}
        fast = True
        last: dict[str, int] = {}
        for s, q in zip(sources, seqs):
            if q <= last.get(s, self._mark((run_id, "events", s), pending)):
                fast = False
            last[s] = q
            lo_hi = spans.setdefault(s, [q, q])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], q), max(lo_hi[1], q)
        cols = ", ".join(_EVENT_NAMES)
        con.register("_events", t)
        try:
            if fast:
                con.execute(f"INSERT INTO events (run_id, {cols}) SELECT ?, {cols} FROM _events",
                            [run_id])
                inserted = t.num_rows
            else:
                inserted = con.execute(
                    f"INSERT INTO events (run_id, {cols}) SELECT ?, {cols} FROM "
                    f"(SELECT DISTINCT ON (source, seq) * FROM _events) b "
                    f"ANTI JOIN (SELECT source, seq FROM events WHERE run_id = ?) e "
                    f"USING (source, seq)", [run_id, run_id]).fetchone()[0]
        finally:
            con.unregister("_events")
        for s, (_, hi) in spans.items():
            k = (run_id, "events", s)
            pending[k] = max(hi, self._mark(k, pending))
        return int(inserted)

    def summarize_dirty(self) -> int:
        """Recompute the summaries of every dirty step range; returns the steps summarised."""
        con = self._con
        ranges = con.execute("SELECT run_id, attempt, min(lo), max(hi) FROM dirty "
                             "GROUP BY run_id, attempt").fetchall()
        if not ranges:
            return 0
        total = 0
        con.execute("BEGIN TRANSACTION")
        try:
            for run_id, attempt, lo, hi in ranges:
                params = [run_id, attempt, lo, hi]
                con.execute("DELETE FROM step_summaries WHERE run_id = ? AND attempt = ? "
                            "AND step BETWEEN ? AND ?", params)
                total += con.execute("INSERT INTO step_summaries " + _SUMMARY_SELECT,
                                     params).fetchone()[0]
            con.execute("DELETE FROM dirty")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return int(total)

    def has_dirty(self) -> bool:
        """Whether some step ranges await summarising."""
        return self._con.execute("SELECT count(*) FROM dirty").fetchone()[0] > 0

    # ------------------------------------------------------------------ reads
    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cur = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._local.cur = self._con.cursor()
        return cur

    def _df(self, sql: str, params: list | None = None) -> pd.DataFrame:
        return self._cursor().execute(sql, params or []).df()

    def runs(self) -> pd.DataFrame:
        """One row per run: metadata, attempts, steps summarised, first and last time, state."""
        return self._df("""
            WITH a AS (SELECT run_id, count(*) AS attempts, min(start) AS start,
                         max(coalesce("end", last_activity)) AS last_time,
                         arg_max_null(end_reason, attempt) AS last_reason
                       FROM attempts GROUP BY run_id),
                 s AS (SELECT run_id, count(*) AS steps, max(step) AS last_step
                       FROM step_summaries GROUP BY run_id)
            SELECT r.run_id, r.name, r.world_size, r.gpus_per_rank, r.global_batch,
              r.model_params, r.tags, coalesce(a.attempts, 0) AS attempts,
              coalesce(s.steps, 0) AS steps, s.last_step,
              coalesce(a.start, r.first_seen) AS start, a.last_time,
              CASE WHEN a.last_reason = 'completed' THEN 'completed'
                   WHEN a.last_reason IS NULL THEN 'running' ELSE a.last_reason END AS state
            FROM runs r LEFT JOIN a USING (run_id) LEFT JOIN s USING (run_id)
            ORDER BY start DESC NULLS LAST, r.run_id""")

    def run(self, run_id: str) -> dict[str, Any] | None:
        """One run's metadata and overview row, or None when unknown."""
        df = self.runs()
        rows = df[df.run_id == run_id].to_dict("records")
        return rows[0] if rows else None

    def attempts(self, run_id: str) -> pd.DataFrame:
        """The run's attempts: number, start, end (null while running), end_reason."""
        return self._df('SELECT attempt, start, "end", end_reason, last_activity FROM attempts '
                        "WHERE run_id = ? ORDER BY attempt", [run_id])

    def step_summaries(self, run_id: str, attempt: int | None = None,
                       since: float | None = None, until: float | None = None) -> pd.DataFrame:
        """Per-step summaries of a run, ordered by attempt and step; optionally one attempt
        and the steps that end after ``since`` and start before ``until`` (epoch seconds)."""
        where, params = _where({"run_id = ?": run_id, "attempt = ?": attempt,
                                "step_end >= ?": since, "step_start <= ?": until})
        return self._df(f"SELECT * FROM step_summaries WHERE {where} ORDER BY attempt, step",
                        params)

    def events(self, run_id: str, kinds: list[str] | None = None, since: float | None = None,
               until: float | None = None, attempt: int | None = None) -> pd.DataFrame:
        """The run's events ordered by time, optionally of some kinds and in a window."""
        where, params = _where({"run_id = ?": run_id, "time >= ?": since, "time <= ?": until,
                                "attempt = ?": attempt})
        if kinds:
            where += f" AND kind IN ({', '.join('?' * len(kinds))})"
            params += list(kinds)
        return self._df(f"SELECT * EXCLUDE (run_id) FROM events WHERE {where} "
                        "ORDER BY time, source, seq", params)

    def steps(self, run_id: str, attempt: int | None = None, step_min: int | None = None,
              step_max: int | None = None, ranks: list[int] | None = None) -> pd.DataFrame:
        """Raw per-rank step records (for heatmaps and detectors); filter as narrowly as you can."""
        where, params = _where({"run_id = ?": run_id, "attempt = ?": attempt,
                                "step >= ?": step_min, "step <= ?": step_max})
        if ranks:
            where += f" AND rank IN ({', '.join('?' * len(ranks))})"
            params += [int(r) for r in ranks]
        return self._df(f"SELECT * EXCLUDE (run_id) FROM steps WHERE {where} "
                        "ORDER BY attempt, step, rank", params)

    def run_metrics(self, window_steps: int = 100) -> pd.DataFrame:
        """Per run, for /metrics: steps summarised, last step, ranks reporting the last step,
        and step-time quantiles (slowest rank's duration) over the latest ``window_steps``."""
        return self._df("""
            WITH latest AS (SELECT run_id, max(attempt) AS attempt FROM step_summaries
                            GROUP BY run_id),
                 top AS (SELECT s.run_id, s.attempt, max(s.step) AS last_step
                         FROM step_summaries s JOIN latest USING (run_id, attempt)
                         GROUP BY ALL),
                 recent AS (SELECT s.* FROM step_summaries s JOIN top USING (run_id, attempt)
                            WHERE s.step > top.last_step - ?),
                 totals AS (SELECT run_id, count(*) AS steps FROM step_summaries GROUP BY run_id)
            SELECT run_id, totals.steps, max(step) AS last_step, max(attempt) AS attempt,
              arg_max(ranks, step) AS ranks_reporting,
              quantile_cont(duration_max, 0.5) AS step_p50,
              quantile_cont(duration_max, 0.9) AS step_p90,
              quantile_cont(duration_max, 0.99) AS step_p99
            FROM recent JOIN totals USING (run_id) GROUP BY run_id, totals.steps
            ORDER BY run_id""", [window_steps])

    def row_counts(self) -> dict[str, int]:
        """Rows stored per table (steps, events, runs, step_summaries)."""
        cur = self._cursor()
        return {t: cur.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("runs", "steps", "events", "step_summaries")}

    def table(self, name: str, run_id: str) -> pa.Table:
        """A whole table for one run as Arrow (trace export): runs, steps, events, attempts,
        step_summaries."""
        if name not in ("runs", "steps", "events", "attempts", "step_summaries"):
            raise ValueError(f"unknown table {name}")
        rel = self._cursor().sql(f"SELECT * FROM {name} WHERE run_id = $1", params=[run_id])
        # duckdb >= 1.4 names it to_arrow_table(); older releases call it arrow()
        return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()


def _where(conds: dict[str, Any]) -> tuple[str, list]:
    """``(where, params)`` from ``{"col op ?": value}``, skipping None values."""
    kept = [(c, v) for c, v in conds.items() if v is not None]
    return " AND ".join(c for c, _ in kept) or "TRUE", [v for _, v in kept]


def _first_time(b: Batch) -> float | None:
    times = []
    if b.steps is not None and b.steps.num_rows:
        times.append(float(np.min(b.steps.column("start_time").to_numpy())))
    if b.events is not None and b.events.num_rows:
        times.append(float(np.min(b.events.column("time").to_numpy())))
    return min(times) if times else None
