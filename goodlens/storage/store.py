"""The DuckDB store: the only module in goodlens that holds SQL.

Why one module: every reader (reports, detectors, ``/metrics``, the dashboard) asks questions
through the read API below, so the schema can change in one place and no query is ever
built by formatting values into SQL (parameters are always bound).

Process model (see docs/architecture.md): DuckDB allows one writing process per file and no
other process may open it while that writer is open, so the collector process owns the
file. Inside it, exactly one thread writes (:class:`goodlens.storage.writer.Writer` calls
:meth:`Store.write_group` and :meth:`Store.summarize_dirty`); readers use their own cursors.
``Store(path, read_only=True)`` opens a file no collector holds (offline analysis).

Idempotency: a step row's key is (run_id, attempt, rank, step) and an event's is
(run_id, source, seq). The writer keeps a high-water mark per key prefix (largest step per
rank of an attempt, largest seq per source), loaded from the stored rows on first use; a
batch whose rows all lie above their marks is gathered and inserted with the rest of its
group in one statement, anything else takes an exact anti-join against stored rows.
Re-sending a batch, or replaying a spill file, thus adds nothing.

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

from goodlens.model.batch import Batch
from goodlens.model.schema import EVENT_COLUMNS, RUN_COLUMNS, SCHEMA_VERSION, STEP_COLUMNS

_SQL_TYPES = {"int": "BIGINT", "float": "DOUBLE", "str": "VARCHAR"}
_STEP_NAMES = [c.name for c in STEP_COLUMNS]
_EVENT_NAMES = [c.name for c in EVENT_COLUMNS]
_RUN_NAMES = [c.name for c in RUN_COLUMNS]
_TERMINAL = "('attempt_end', 'failure_detected', 'preempted')"
#: The rows of a registered batch ``_batch`` that are not stored yet (each key once): the
#: exact check when a batch does not lie above its high-water marks. Parameters: run id,
#: then (steps) the batch's lowest and highest step.
_NEW_STEPS = (f"{', '.join(_STEP_NAMES)} FROM (SELECT DISTINCT ON (attempt, rank, step) * "
              "FROM _batch) b ANTI JOIN (SELECT attempt, rank, step FROM steps WHERE "
              "run_id = ? AND step BETWEEN ? AND ?) s USING (attempt, rank, step)")
_NEW_EVENTS = (f"{', '.join(_EVENT_NAMES)} FROM (SELECT DISTINCT ON (source, seq) * FROM "
               "_batch) b ANTI JOIN (SELECT source, seq FROM events WHERE run_id = ?) e "
               "USING (source, seq)")
#: Raw rows summarised per statement (bounds the memory the medians need).
SUMMARY_CHUNK_ROWS = 4_000_000


def _ddl_columns(columns: tuple) -> str:
    return ",\n  ".join(f"{c.name} {_SQL_TYPES[c.kind]}" for c in columns)


#: The tables rows are written to (a Parquet dataset holds the same three, see
#: :mod:`goodlens.storage.parquet`).
_DATA_TABLES = f"""
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
"""

#: What every store keeps next to its rows: the step ranges awaiting summaries and the
#: summaries themselves, and the attempts view over events and summaries.
_DERIVED = f"""
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
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
    arg_min(CASE kind WHEN 'attempt_end' THEN coalesce(cause, 'ended')
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

_SCHEMA = _DATA_TABLES + _DERIVED

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
        if not read_only:
            # checkpoint the write-ahead log every 256 MB rather than DuckDB's 16 MB: fewer
            # stalls of the single writer at high ingest rates
            config["checkpoint_threshold"] = "256MB"
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
            self._summarize_leftovers()
        else:
            self._con.execute(_SCHEMA)
            if not self._con.execute("SELECT 1 FROM meta WHERE key = 'schema_version'").fetchall():
                self._con.execute("INSERT INTO meta VALUES ('schema_version', ?)",
                                  [str(SCHEMA_VERSION)])
            self._check_version()
        # high-water marks, loaded lazily from the stored rows (so they are as durable as
        # the rows): per (run, attempt) the largest step of each rank, per (run, source)
        # the largest event seq
        self._marks: dict[tuple[str, int], np.ndarray] = {}
        self._event_marks: dict[tuple[str, str], int] = {}
        self._known_runs = {r for (r,) in self._con.execute("SELECT run_id FROM runs").fetchall()}

    def _summarize_leftovers(self) -> None:
        """A file whose collector stopped before summarising everything (a crash, a kill)
        still has dirty step ranges: summarise them into temporary tables that shadow the
        stored ones (in every cursor this store hands out), so reads over the file are exact.
        The file itself is not changed; the next collector to open it summarises for good."""
        self._shadow: pa.Table | None = None
        if not self._con.execute("SELECT count(*) FROM dirty").fetchall()[0][0]:
            return
        self._con.execute("CREATE TEMP TABLE step_summaries AS "
                          "SELECT * FROM main.step_summaries")
        self._con.execute("CREATE TEMP TABLE dirty AS SELECT * FROM main.dirty")
        self.summarize_dirty()
        self._shadow = self._con.sql("SELECT * FROM step_summaries").to_arrow_table()

    def _new_cursor(self) -> duckdb.DuckDBPyConnection:
        cur = self._con.cursor()
        if getattr(self, "_shadow", None) is not None:
            # temporary tables belong to one connection: give each cursor its own copy
            cur.register("_shadow", self._shadow)
            cur.execute("CREATE TEMP TABLE step_summaries AS SELECT * FROM _shadow")
            cur.unregister("_shadow")
        return cur

    def _check_version(self) -> None:
        rows = self._con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
        row = rows[0] if rows else None
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

        Only the writer thread may call this. When it returns the data is committed. Rows
        that pass the high-water-mark check are gathered and inserted with one statement
        per table for the whole group; the in-memory marks advance only after the commit.
        """
        if self.read_only:
            raise RuntimeError("store opened read-only")
        g = _Group(self)
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            results = [self._write_batch(b, g) for b in batches]
            g.flush()
            if g.dirty:
                con.register("_dirty", pa.table({
                    "run_id": [k[0] for k in g.dirty], "attempt": [k[1] for k in g.dirty],
                    "lo": [v[0] for v in g.dirty.values()],
                    "hi": [v[1] for v in g.dirty.values()]}))
                con.execute("INSERT INTO dirty SELECT * FROM _dirty")
                con.unregister("_dirty")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        g.commit()
        return results

    def _write_batch(self, b: Batch, g: _Group) -> WriteResult:
        res = WriteResult()
        if b.run or (b.run_id not in self._known_runs and b.run_id not in g.new_runs):
            meta = b.run or {}
            cols = ", ".join(_RUN_NAMES)
            updates = ", ".join(f"{c} = coalesce(excluded.{c}, runs.{c})" for c in _RUN_NAMES)
            self._con.execute(
                f"INSERT INTO runs (run_id, {cols}, first_seen) VALUES (?, "
                f"{', '.join('?' * len(_RUN_NAMES))}, ?) ON CONFLICT (run_id) DO UPDATE SET "
                f"{updates}, first_seen = least(runs.first_seen, excluded.first_seen)",
                [b.run_id, *[meta.get(c) for c in _RUN_NAMES], _first_time(b)])
            g.new_runs.add(b.run_id)
        if b.steps is not None and b.steps.num_rows:
            res.steps_inserted = self._insert_steps(b.run_id, b.steps, g)
            res.steps_duplicate = b.steps.num_rows - res.steps_inserted
        if b.events is not None and b.events.num_rows:
            res.events_inserted = self._insert_events(b.run_id, b.events, g)
            res.events_duplicate = b.events.num_rows - res.events_inserted
        return res

    def _step_marks(self, run_id: str, attempt: int, g: _Group) -> np.ndarray:
        """Largest stored step per rank of (run, attempt) (-1: none), loaded on first use."""
        key = (run_id, attempt)
        marks = g.step_marks.get(key)
        if marks is None:
            marks = self._marks.get(key)
            if marks is None:
                marks = self._stored_step_marks(run_id, attempt)
            g.step_marks[key] = marks = marks.copy()
        return marks

    # the high-water marks as the stored rows give them, and the exact check of a batch
    # that is not all above them (shared with the Parquet store, which stores elsewhere)
    def _stored_step_marks(self, run_id: str, attempt: int) -> np.ndarray:
        """Largest stored step per rank of (run, attempt), -1 where none."""
        rows = self._con.execute("SELECT rank, max(step) FROM steps WHERE run_id = ? AND "
                                 "attempt = ? GROUP BY rank", [run_id, attempt]).fetchall()
        marks = np.full(max([r for r, _ in rows], default=-1) + 1, -1, dtype=np.int64)
        for r, m in rows:
            marks[r] = m
        return marks

    def _stored_event_mark(self, run_id: str, source: str) -> int:
        """Largest stored event seq of a source, -1 when none."""
        row = self._con.execute("SELECT max(seq) FROM events WHERE run_id = ? AND source = ?",
                                [run_id, source]).fetchall()[0]
        return -1 if row[0] is None else int(row[0])

    def _insert_steps(self, run_id: str, t: pa.Table, g: _Group) -> int:
        att = t.column("attempt").to_numpy()
        rank = t.column("rank").to_numpy()
        step = t.column("step").to_numpy()
        fast = True
        updates = []
        for a in (np.unique(att) if att.min() != att.max() else att[:1]):
            sel = slice(None) if att.min() == att.max() else att == a
            r, s = rank[sel], step[sel]
            marks, above, top_r, top_s = check_marks(self._step_marks(run_id, int(a), g), r, s)
            g.step_marks[(run_id, int(a))] = marks
            fast = fast and above
            updates.append((marks, top_r, top_s, int(a), int(s.min()), int(s.max())))
        if fast:
            g.add_steps(run_id, t)
            inserted = t.num_rows
        else:
            g.flush()  # rows gathered earlier in this group must be visible to the check
            con = self._con
            con.register("_batch", t)
            try:
                inserted = con.execute(
                    f"INSERT INTO steps (run_id, {', '.join(_STEP_NAMES)}) SELECT ?, "
                    f"{_NEW_STEPS}", [run_id, run_id, int(step.min()), int(step.max())]
                ).fetchall()[0][0]
            finally:
                con.unregister("_batch")
        for marks, r, s, a, lo, hi in updates:
            marks[r] = np.maximum(marks[r], s)  # r is unique here
            if inserted:
                d = g.dirty.get((run_id, a))
                g.dirty[(run_id, a)] = (min(lo, d[0]), max(hi, d[1])) if d else (lo, hi)
        return int(inserted)

    def _insert_events(self, run_id: str, t: pa.Table, g: _Group) -> int:
        con = self._con
        sources = t.column("source").to_pylist()
        seqs = t.column("seq").to_pylist()
        fast = True
        last: dict[str, int] = {}
        for src, q in zip(sources, seqs):
            key = (run_id, src)
            if key not in last:
                mark = g.event_marks.get(key, self._event_marks.get(key))
                last[key] = self._stored_event_mark(run_id, src) if mark is None else mark
            if q <= last[key]:
                fast = False
            last[key] = max(last[key], q)
        if fast:
            g.add_events(run_id, t)
            inserted = t.num_rows
        else:
            g.flush()
            con.register("_batch", t)
            try:
                inserted = con.execute(
                    f"INSERT INTO events (run_id, {', '.join(_EVENT_NAMES)}) SELECT ?, "
                    f"{_NEW_EVENTS}", [run_id, run_id]).fetchall()[0][0]
            finally:
                con.unregister("_batch")
        g.event_marks.update(last)
        return int(inserted)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new cursor on the file for a thread of its own (the summariser's)."""
        return self._new_cursor()

    def summarize_dirty(self, con: duckdb.DuckDBPyConnection | None = None) -> int:
        """Recompute the summaries of every dirty step range; returns the steps summarised.

        ``con`` lets a summariser thread use its own cursor while the writer inserts.
        """
        con = con or self._con
        total = 0
        # one snapshot for everything: the dirty rows read are exactly the ones deleted, and
        # rows the writer commits meanwhile stay dirty for the next pass
        con.execute("BEGIN TRANSACTION")
        try:
            rows = con.execute("SELECT run_id, attempt, lo, hi FROM dirty "
                               "ORDER BY run_id, attempt, lo").fetchall()
            for run_id, attempt, lo, hi in _merge_ranges(rows):
                # summarise the steps that exist (a stray step number must not make us walk
                # a huge numeric range), a few million rows per statement: medians need every
                # value of a step in memory (an import, a backlog after an outage)
                per_step = con.execute(
                    "SELECT step, count(*) FROM steps WHERE run_id = ? AND attempt = ? "
                    "AND step BETWEEN ? AND ? GROUP BY step ORDER BY step",
                    [run_id, attempt, lo, hi]).fetchall()
                present = [step for step, _ in per_step]
                counts = dict(per_step)
                i = 0
                while i < len(present):
                    j, budget = i, 0
                    while j < len(present) and (j == i or budget + counts[present[j]]
                                                <= SUMMARY_CHUNK_ROWS):
                        budget += counts[present[j]]
                        j += 1
                    params = [run_id, attempt, present[i], present[j - 1]]
                    con.execute("DELETE FROM step_summaries WHERE run_id = ? AND attempt = ? "
                                "AND step BETWEEN ? AND ?", params)
                    total += con.execute("INSERT INTO step_summaries " + _SUMMARY_SELECT,
                                         params).fetchall()[0][0]
                    i = j
            con.execute("DELETE FROM dirty")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return int(total)

    def external_changes(self) -> bool:
        """Whether other processes may have added rows to summarise (never, for a DuckDB
        file this process owns; a Parquet dataset shared by collectors says yes now and
        then)."""
        return False

    def has_dirty(self) -> bool:
        """Whether some step ranges await summarising."""
        return self._con.execute("SELECT count(*) FROM dirty").fetchall()[0][0] > 0

    # ------------------------------------------------------------------ reads
    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cur = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._local.cur = self._new_cursor()
        return cur

    def _df(self, sql: str, params: list | dict | None = None) -> pd.DataFrame:
        return self._cursor().execute(sql, params or []).df()

    def runs(self) -> pd.DataFrame:
        """One row per run: metadata, attempts, steps summarised, first and last time, state."""
        return self._runs()

    def _runs(self, run_id: str | None = None) -> pd.DataFrame:
        only = "WHERE run_id = $run" if run_id is not None else ""
        return self._df(f"""
            WITH a AS (SELECT run_id, count(*) AS attempts, min(start) AS start,
                         max(coalesce("end", last_activity)) AS last_time,
                         arg_max_null(end_reason, attempt) AS last_reason
                       FROM attempts {only} GROUP BY run_id),
                 s AS (SELECT run_id, count(*) AS steps, max(step) AS last_step
                       FROM step_summaries {only} GROUP BY run_id)
            SELECT r.run_id, r.name, r.world_size, r.gpus_per_rank, r.global_batch,
              r.model_params, r.tags, coalesce(a.attempts, 0) AS attempts,
              coalesce(s.steps, 0) AS steps, s.last_step,
              coalesce(a.start, r.first_seen) AS start, a.last_time,
              CASE WHEN a.last_reason = 'completed' THEN 'completed'
                   WHEN a.last_reason IS NULL THEN 'running' ELSE a.last_reason END AS state
            FROM (SELECT * FROM runs {only}) r LEFT JOIN a USING (run_id)
              LEFT JOIN s USING (run_id)
            ORDER BY start DESC NULLS LAST, r.run_id""",
            {"run": run_id} if run_id is not None else None)

    def run(self, run_id: str) -> dict[str, Any] | None:
        """One run's metadata and overview row, or None when unknown."""
        rows = self._runs(run_id).to_dict("records")
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

    def step_range(self, run_id: str, attempt: int) -> tuple[int, int, int] | None:
        """``(first step, last step, ranks)`` of one attempt's summaries, None when empty."""
        row = self._cursor().execute(
            "SELECT min(step), max(step), max(ranks) FROM step_summaries "
            "WHERE run_id = ? AND attempt = ?", [run_id, attempt]).fetchone()
        return None if row is None or row[0] is None else (int(row[0]), int(row[1]),
                                                           int(row[2] or 0))

    def heatmap(self, run_id: str, attempt: int, step_min: int, step_max: int,
                rank_bins: int, step_bins: int) -> pd.DataFrame:
        """Per-rank compute pooled into a ``rank_bins`` x ``step_bins`` grid (for the
        dashboard's heatmap of 16k ranks): per cell the mean and the max of each rank's
        compute (its step time where no split was reported), the slowest rank and the cell's
        rank and step span. Max-pooling keeps a single slow rank visible in a bin of many."""
        n_ranks = self._cursor().execute(
            "SELECT max(rank) + 1 FROM steps WHERE run_id = ? AND attempt = ? AND step = ?",
            [run_id, attempt, step_min]).fetchone()[0] or 1
        span = max(step_max - step_min + 1, 1)
        return self._df("""
            SELECT rank * $rb // $nr AS rbin, (step - $s0) * $sb // $span AS sbin,
              avg(v) AS mean, max(v) AS max, arg_max(rank, v) AS worst_rank,
              min(rank) AS rank_lo, max(rank) AS rank_hi, min(step) AS step_lo,
              max(step) AS step_hi
            FROM (SELECT rank, step, coalesce(compute_s, duration_s) AS v FROM steps
                  WHERE run_id = $run AND attempt = $att AND step BETWEEN $s0 AND $s1)
            GROUP BY ALL ORDER BY sbin, rbin""",
            {"rb": rank_bins, "nr": max(int(n_ranks), 1), "s0": step_min, "s1": step_max,
             "sb": step_bins, "span": span, "run": run_id, "att": attempt})

    def host_compute(self, run_id: str, attempt: int, step_min: int, step_max: int
                     ) -> pd.DataFrame:
        """Per host over a step window: ranks, mean compute (step time where no split was
        reported) and its slowest rank's mean (the host roll-up of the ranks view)."""
        return self._df("""
            WITH r AS (SELECT host, rank, avg(coalesce(compute_s, duration_s)) AS v FROM steps
                       WHERE run_id = ? AND attempt = ? AND step BETWEEN ? AND ?
                         AND host IS NOT NULL GROUP BY host, rank)
            SELECT host, count(*) AS ranks, avg(v) AS mean, max(v) AS worst_rank_mean,
              arg_max(rank, v) AS worst_rank, min(rank) AS first_rank
            FROM r GROUP BY host ORDER BY first_rank""", [run_id, attempt, step_min, step_max])

    def rank_hosts(self, run_id: str, attempt: int | None = None) -> pd.DataFrame:
        """``rank, host`` as the ranks reported them at the first step of an attempt
        (default: the latest); empty when the run has no step records."""
        if attempt is None:
            row = self._cursor().execute("SELECT max(attempt) FROM step_summaries "
                                         "WHERE run_id = ?", [run_id]).fetchone()
            if row is None or row[0] is None:
                return pd.DataFrame({"rank": [], "host": []})
            attempt = int(row[0])
        return self._df("""
            SELECT rank, any_value(host) AS host FROM steps
            WHERE run_id = ? AND attempt = ? AND step = (
              SELECT min(step) FROM step_summaries WHERE run_id = ? AND attempt = ?)
            GROUP BY rank ORDER BY rank""", [run_id, attempt, run_id, attempt])

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
        return {t: cur.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                for t in ("runs", "steps", "events", "step_summaries")}

    def table(self, name: str, run_id: str) -> pa.Table:
        """A whole table for one run as Arrow (trace export): runs, steps, events, attempts,
        step_summaries."""
        if name not in ("runs", "steps", "events", "attempts", "step_summaries"):
            raise ValueError(f"unknown table {name}")
        rel = self._cursor().sql(f"SELECT * FROM {name} WHERE run_id = $1", params=[run_id])
        # duckdb >= 1.4 names it to_arrow_table(); older releases call it arrow()
        return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()


class _Group:
    """One transaction's pending work: rows gathered for a single INSERT per table, marks
    and dirty ranges that become the store's only once the transaction commits."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.steps: list[pa.Table] = []
        self.events: list[pa.Table] = []
        self.step_marks: dict[tuple[str, int], np.ndarray] = {}
        self.event_marks: dict[tuple[str, str], int] = {}
        self.dirty: dict[tuple[str, int], tuple[int, int]] = {}
        self.new_runs: set[str] = set()

    def add_steps(self, run_id: str, t: pa.Table) -> None:
        self.steps.append(t.add_column(0, "run_id", pa.array([run_id] * t.num_rows,
                                                             pa.string())))

    def add_events(self, run_id: str, t: pa.Table) -> None:
        self.events.append(t.add_column(0, "run_id", pa.array([run_id] * t.num_rows,
                                                              pa.string())))

    def flush(self) -> None:
        """Insert the gathered rows (one statement per table)."""
        con = self.store._con
        for name, pending, cols in (("steps", self.steps, _STEP_NAMES),
                                    ("events", self.events, _EVENT_NAMES)):
            if not pending:
                continue
            table = pa.concat_tables(pending) if len(pending) > 1 else pending[0]
            names = ", ".join(["run_id", *cols])
            con.register("_rows", table)
            try:
                con.execute(f"INSERT INTO {name} ({names}) SELECT {names} FROM _rows")
            finally:
                con.unregister("_rows")
            pending.clear()

    def commit(self) -> None:
        """The transaction committed: the marks and known runs are now true."""
        self.store._marks.update(self.step_marks)
        self.store._event_marks.update(self.event_marks)
        self.store._known_runs |= self.new_runs


def _merge_ranges(rows: list[tuple]) -> list[tuple]:
    """Dirty ``(run, attempt, lo, hi)`` rows, sorted, merged where they overlap or touch."""
    out: list[list] = []
    for run_id, attempt, lo, hi in rows:
        if out and out[-1][0] == run_id and out[-1][1] == attempt and lo <= out[-1][3] + 1:
            out[-1][3] = max(out[-1][3], hi)
        else:
            out.append([run_id, attempt, lo, hi])
    return [tuple(r) for r in out]


def check_marks(marks: np.ndarray, rank: np.ndarray, step: np.ndarray
                ) -> tuple[np.ndarray, bool, np.ndarray, np.ndarray]:
    """The high-water-mark check of one (run, attempt)'s step rows: ``(marks grown to
    cover every rank, whether every row lies above its rank's mark and no (rank, step)
    repeats, the ranks present, each one's largest step)``. Marks are not advanced."""
    if rank.max() >= len(marks):
        grown = np.full(int(rank.max()) + 1, -1, dtype=np.int64)
        grown[:len(marks)] = marks
        marks = grown
    above = not np.any(step <= marks[rank])
    order = np.lexsort((step, rank))
    rs, ss = rank[order], step[order]
    same = rs[1:] == rs[:-1]
    above = above and not np.any(same & (ss[1:] <= ss[:-1]))  # a (rank, step) twice
    last = np.flatnonzero(np.r_[~same, True])  # each rank's largest step
    return marks, above, rs[last], ss[last]


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
