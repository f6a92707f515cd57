"""Stored run reports: a finished run's accounting computed once, the runs list as one query.

Why a module of its own: a collector lives for months and finished runs pile up. Reading
them must cost a lookup, not a re-run of the accounting of every run ever stored (that made
a ``/metrics`` scrape take 18 s at 200 runs). The accounting itself lives in analysis; this
module only keeps its results, in ``run_reports``, and knows when they went out of date:

- every write that stores rows of a run appends its id to ``report_dirty``, in the write's
  own transaction;
- the summarising pass that makes those rows' step summaries (:func:`take_changed`, called
  in the same transaction) marks the run's stored report ``stale``, clears ``report_dirty``
  and hands the ids to the collector, which recomputes and :func:`save`\\ s the reports;
- so a report is recomputed only when rows of its run arrive (a live run, or late rows of a
  finished one), and a crash between the two leaves it marked stale, never silently old.

The same table holds the runs list's sort keys (state, start, goodput, duration), so a page
of 10,000 runs is one indexed query (:func:`runs_page`). A store that a collector of this
version never served has no rows there yet: its runs are listed from the raw tables instead,
without goodput, until a collector indexes them (:func:`index_missing`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb
import orjson

if TYPE_CHECKING:  # the runs page's type only: a store opens without importing pandas
    import pandas as pd

#: The runs list's sort keys (``sort=`` of ``/v1/runs``, ``goodlens runs --sort``) and the
#: SQL each one orders by. ``duration``: the accounted wall-clock, else first to last activity.
SORT_KEYS = {
    "start": "start",
    "goodput": "goodput",
    "duration": "coalesce(wall_clock_s, last_time - start)",
    "state": "state",
    "name": "coalesce(name, run_id)",
    "run": "run_id",
    "steps": "steps",
    "last_activity": "last_time",
}

#: The runs list's columns, in order (what ``SqlReader.runs()`` has always returned, plus
#: the report's goodput and wall-clock, null until the run was accounted).
LIST_COLUMNS = ("run_id", "name", "world_size", "gpus_per_rank", "global_batch",
                "model_params", "tags", "attempts", "steps", "last_step", "start",
                "last_time", "state", "goodput", "wall_clock_s")

#: One row per run from the raw tables (events, summaries and metadata): the runs list of a
#: store without reports, and the index rows :func:`index_missing` writes. ``{only}``: an
#: optional ``WHERE`` on ``run_id``, applied inside each scan.
RUNS_FROM_ROWS = """
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
           WHEN a.last_reason IS NULL THEN 'running' ELSE a.last_reason END AS state,
      CAST(NULL AS DOUBLE) AS goodput, CAST(NULL AS DOUBLE) AS wall_clock_s
    FROM (SELECT * FROM runs {only}) r LEFT JOIN a USING (run_id)
      LEFT JOIN s USING (run_id)"""


@dataclass
class ReportRow:
    """One run's stored report: the list columns, the report and its /metrics series."""

    run_id: str
    computed_at: float
    final: bool
    state: str | None
    start: float | None
    last_time: float | None
    attempts: int
    steps: int
    last_step: int | None
    wall_clock_s: float | None
    goodput: float | None
    report: dict[str, Any] | None
    metrics: dict[str, Any] | None


#: The stored rows' columns and their pyarrow types, by name (:func:`save` builds the schema:
#: pyarrow is imported to write rows, never to read them).
_ROW_TYPES = (("run_id", "string"), ("computed_at", "float64"), ("final", "bool_"),
              ("state", "string"), ("start", "float64"), ("last_time", "float64"),
              ("attempts", "int64"), ("steps", "int64"), ("last_step", "int64"),
              ("wall_clock_s", "float64"), ("goodput", "float64"), ("report", "string"),
              ("metrics", "string"))


def mark_changed(con: duckdb.DuckDBPyConnection, run_ids: Iterable[str]) -> None:
    """Record, in the caller's write transaction, that rows of ``run_ids`` were stored."""
    ids = sorted(set(run_ids))
    if ids:
        con.execute("INSERT INTO report_dirty SELECT unnest($1::VARCHAR[])", [ids])


def take_changed(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The runs whose rows changed since the last call, with ``report_dirty`` cleared and
    their stored rows marked stale, in the caller's transaction (the summarising pass's):
    until the collector saves them again, readers take those runs from the raw tables, and
    a collector restarted after a crash redoes them first."""
    ids = [r for (r,) in con.execute(
        "SELECT DISTINCT run_id FROM report_dirty ORDER BY run_id").fetchall()]
    if ids:
        con.execute("UPDATE run_reports SET stale = true WHERE NOT stale AND "
                    "run_id IN (SELECT run_id FROM report_dirty)")
        con.execute("DELETE FROM report_dirty")
    return ids


def mark_all_stale(con: duckdb.DuckDBPyConnection, version: str) -> bool:
    """Mark every stored row stale when the reports were computed by another goodlens
    version than ``version`` (the accounting may have changed); record ``version``.
    Returns whether it marked them."""
    row = con.execute("SELECT value FROM meta WHERE key = 'reports_version'").fetchall()
    if row and row[0][0] == version:
        return False
    con.execute("UPDATE run_reports SET stale = true WHERE NOT stale")
    con.execute("INSERT OR REPLACE INTO meta VALUES ('reports_version', ?)", [version])
    return bool(row)


def save(con: duckdb.DuckDBPyConnection, rows: list[ReportRow]) -> None:
    """Store ``rows`` (each replaces its run's previous one; none is stale)."""
    if not rows:
        return
    import pyarrow as pa  # here: a store opened to read (goodlens detect) never writes

    schema = pa.schema([(k, getattr(pa, t)()) for k, t in _ROW_TYPES])
    t = pa.Table.from_pylist([{
        **{k: getattr(r, k) for k in schema.names if k not in ("report", "metrics")},
        "report": None if r.report is None else orjson.dumps(r.report).decode(),
        "metrics": None if r.metrics is None else orjson.dumps(r.metrics).decode()}
        for r in rows], schema=schema)
    con.register("_reports", t)
    try:
        con.execute("INSERT OR REPLACE INTO run_reports SELECT run_id, computed_at, final, "
                    "false, state, start, last_time, attempts, steps, last_step, "
                    "wall_clock_s, goodput, report, metrics FROM _reports")
    finally:
        con.unregister("_reports")


def index_missing(con: duckdb.DuckDBPyConnection) -> int:
    """Give every run without a stored row an index row (its list columns from the raw
    tables, no report yet): one scan, so the runs list needs no fallback. Returns how many
    runs were indexed."""
    sql = RUNS_FROM_ROWS.format(only="")
    return int(con.execute(f"""
        INSERT INTO run_reports
        SELECT run_id, NULL, false, false, state, start, last_time, attempts, steps, last_step,
          NULL, NULL, NULL, NULL
        FROM ({sql}) WHERE run_id NOT IN (SELECT run_id FROM run_reports)""").fetchall()[0][0])


def due(con: duckdb.DuckDBPyConnection, limit: int) -> list[str]:
    """Up to ``limit`` runs whose stored report is stale or missing, most recent first."""
    return [r for (r,) in con.execute(
        "SELECT run_id FROM run_reports WHERE stale OR report IS NULL "
        "ORDER BY last_time DESC NULLS LAST, run_id LIMIT ?", [limit]).fetchall()]


def load(con: duckdb.DuckDBPyConnection, run_ids: list[str] | None = None, *,
         since: float | None = None) -> list[ReportRow]:
    """Stored rows of ``run_ids`` (default: all), or of the runs active at or after ``since``
    (unix time); index-only rows included (their ``report`` is None)."""
    conds, params = [], []
    if run_ids is not None:
        conds.append("run_id IN (SELECT unnest(?::VARCHAR[]))")
        params.append(list(run_ids))
    if since is not None:
        conds.append("last_time >= ?")
        params.append(since)
    where = f"WHERE {' AND '.join(conds)}" if conds else ""
    rows = con.execute(
        "SELECT run_id, computed_at, final, state, start, last_time, attempts, steps, "
        f"last_step, wall_clock_s, goodput, report, metrics FROM run_reports {where} "
        "ORDER BY run_id", params).fetchall()
    return [ReportRow(*r[:11], report=_json(r[11]), metrics=_json(r[12])) for r in rows]


def current_report(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any] | None:
    """The stored report of a finished run when it is still exact (no rows arrived since),
    else None (the caller computes it)."""
    rows = con.execute(
        "SELECT report FROM run_reports WHERE run_id = ? AND final AND NOT stale AND "
        "report IS NOT NULL AND run_id NOT IN (SELECT run_id FROM report_dirty)",
        [run_id]).fetchall()
    return _json(rows[0][0]) if rows else None


def runs_page(con: duckdb.DuckDBPyConnection, *, limit: int | None = None, offset: int = 0,
              sort: str = "start", descending: bool = True, state: str | None = None,
              text: str | None = None, stored: bool = True) -> tuple[pd.DataFrame, int]:
    """One page of the runs list and how many runs match: sorted by one of
    :data:`SORT_KEYS` (nulls last, then by run id), filtered by ``state`` and by ``text``
    (a case-insensitive substring of the run id or name). ``stored``: the store holds a
    ``run_reports`` table (a file of an earlier goodlens opened read-only does not)."""
    if sort not in SORT_KEYS:
        raise ValueError(f"unknown sort {sort!r}; one of {', '.join(SORT_KEYS)}")
    source = _list_source(con, stored)
    conds, params = [], []
    if state:
        conds.append("state = ?")
        params.append(state)
    if text:
        conds.append("(contains(lower(run_id), lower(?)) OR contains(lower(name), lower(?)))")
        params += [text, text]
    where = f"WHERE {' AND '.join(conds)}" if conds else ""
    order = f"{SORT_KEYS[sort]} {'DESC' if descending else 'ASC'} NULLS LAST, run_id"
    page = f"LIMIT {int(limit)} OFFSET {int(offset)}" if limit is not None else (
        f"OFFSET {int(offset)}")
    df = con.execute(f"SELECT {', '.join(LIST_COLUMNS)}, count(*) OVER () AS _total "
                     f"FROM ({source}) {where} ORDER BY {order} {page}", params).df()
    if len(df):
        total = int(df.pop("_total").iloc[0])
    else:
        df = df.drop(columns="_total")
        total = int(con.execute(f"SELECT count(*) FROM ({source}) {where}",
                                params).fetchall()[0][0])
    return df, total


#: The runs whose stored row is current: not stale, and no rows of theirs awaiting a pass.
_CURRENT = ("SELECT run_id FROM run_reports WHERE NOT stale AND run_id NOT IN "
            "(SELECT run_id FROM report_dirty)")


def _list_source(con: duckdb.DuckDBPyConnection, stored: bool) -> str:
    """The runs list as a relation: the stored rows that are current, joined with the
    metadata, plus the raw tables' rows of the other runs (not indexed yet, stale, or with
    rows no summarising pass has taken yet: a few live runs in a collector; every changed
    run of a file written without one, e.g. by ``end-run --db``)."""
    if not stored:
        return RUNS_FROM_ROWS.format(only="")
    others = con.execute(f"SELECT count(*) FROM runs WHERE run_id NOT IN ({_CURRENT})"
                         ).fetchall()[0][0]
    known = f"""SELECT r.run_id, r.name, r.world_size, r.gpus_per_rank, r.global_batch,
                 r.model_params, r.tags, p.attempts, p.steps, p.last_step,
                 coalesce(p.start, r.first_seen) AS start, p.last_time, p.state, p.goodput,
                 p.wall_clock_s
               FROM runs r JOIN run_reports p USING (run_id)
               WHERE p.run_id IN ({_CURRENT})"""
    if not others:
        return known
    raw = RUNS_FROM_ROWS.format(only=f"WHERE run_id NOT IN ({_CURRENT})")
    return f"{known} UNION ALL SELECT * FROM ({raw})"


def has_reports_table(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store holds ``run_reports`` (a file written before it existed, opened
    read-only, does not)."""
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = "
                            "'run_reports'").fetchall()[0][0])


def _json(text: str | None) -> dict[str, Any] | None:
    return None if text is None else orjson.loads(text)
