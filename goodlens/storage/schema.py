"""The storage schema: every CREATE TABLE and CREATE VIEW both stores run, in one place.

Why a module of its own: the DuckDB file (:mod:`goodlens.storage.store`) and the Parquet
dataset (:mod:`goodlens.storage.parquet`) hold the same tables, so their DDL is built here
once, from the column specifications of :mod:`goodlens.model.schema` (a field added there
reaches both stores), plus what storage derives itself: the step summaries (their columns and
the aggregate that fills each one, side by side), the dirty step ranges and the attempts
view. The Parquet dataset's views and compaction queries are here too, since they define what
its files *mean* as tables (later run metadata wins, a key counts once). The summarising step
(rows counted once per key, then per-step summaries) is one SQL text that DuckDB runs here
and Spark runs past one machine (:mod:`goodlens.storage.spark`), rendered for each by a thin
:class:`Dialect`.
"""

from __future__ import annotations

from dataclasses import dataclass

from goodlens.model.schema import (
    EVENT_COLUMNS,
    EVENT_KEY,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    STEP_COLUMNS,
    STEP_KEY,
    Column,
    EventKind,
)

SQL_TYPES = {"int": "BIGINT", "float": "DOUBLE", "str": "VARCHAR"}
STEP_NAMES = [c.name for c in STEP_COLUMNS]
EVENT_NAMES = [c.name for c in EVENT_COLUMNS]
RUN_NAMES = [c.name for c in RUN_COLUMNS]
#: The row tables' columns after ``run_id``, and each one's key and sort order on disk.
COLUMNS = {"steps": STEP_NAMES, "events": EVENT_NAMES}
KEYS = {"steps": STEP_KEY, "events": EVENT_KEY}
ORDER = {"steps": ("attempt", "step", "rank"), "events": ("time", "source", "seq")}
_K = EventKind
#: Event kinds that end an attempt, as an SQL list (constants from the enum, never user text).
_TERMINAL = f"('{_K.ATTEMPT_END}', '{_K.FAILURE_DETECTED}', '{_K.PREEMPTED}')"


class SchemaMismatch(RuntimeError):
    """The file was written by a goodlens with another schema version."""


def version_mismatch(where: str, found: object, hint: str = "") -> SchemaMismatch:
    """The error for a store at ``where`` whose schema version is ``found``."""
    return SchemaMismatch(f"{where} has schema version {found}; this goodlens reads "
                          f"version {SCHEMA_VERSION}{hint}")


def _columns(columns: tuple[Column, ...]) -> str:
    return ",\n  ".join(f"{c.name} {SQL_TYPES[c.kind]}" for c in columns)


def data_tables(prefix: str = "") -> str:
    """The tables rows are written to: ``runs``, ``steps``, ``events`` (a Parquet store
    creates them empty as ``_empty_<table>``, what its views show before any file exists)."""
    return f"""
CREATE TABLE IF NOT EXISTS {prefix}runs (
  run_id VARCHAR PRIMARY KEY,
  {_columns(RUN_COLUMNS)},
  first_seen DOUBLE
);
CREATE TABLE IF NOT EXISTS {prefix}steps (
  run_id VARCHAR,
  {_columns(STEP_COLUMNS)}
);
CREATE TABLE IF NOT EXISTS {prefix}events (
  run_id VARCHAR,
  {_columns(EVENT_COLUMNS)}
);
"""


#: A rank's time to reach the step's collective (its *ready* time): the step time minus the
#: time it was blocked in collectives when it reported that, else its compute plus its data
#: wait; null when it reported neither. A rank starved by its data loader delays the
#: all-reduce as a slow GPU does, so the straggler wait is measured on this, not on compute.
READY = ("CASE WHEN collective_wait_s IS NOT NULL THEN duration_s - collective_wait_s "
         "WHEN compute_s IS NOT NULL THEN compute_s + coalesce(data_wait_s, 0) END")

#: What a step's slowest rank is ranked by: its ready time (its duration when unmeasured),
#: ties going to the highest rank id, so every engine, and every run of one, names the same
#: rank and host (the tie-break is a struct compared field by field).
_SLOWEST = f"{{struct}}(coalesce({READY}, duration_s), rank)"

#: The step summaries: per column its type, the aggregate over a step's rank rows that fills
#: it, and what it means. The aggregates are one text for every engine (DuckDB and Spark SQL
#: both read ``median``, ``min_by``, ``count``...); ``{max_by}`` and ``{struct}`` are the
#: two names that differ, filled in by :class:`Dialect`.
SUMMARY_COLUMNS: tuple[tuple[str, str, str, str], ...] = (
    ("run_id", "VARCHAR", "run_id", ""),
    ("attempt", "BIGINT", "attempt", ""),
    ("step", "BIGINT", "step", ""),
    ("ranks", "BIGINT", "count(*)", "ranks that reported the step"),
    ("step_start", "DOUBLE", "min(start_time)", "earliest rank start (epoch s)"),
    ("step_end", "DOUBLE", "max(start_time + duration_s)", "latest rank end (epoch s)"),
    ("ref_start", "DOUBLE", "min_by(start_time, rank)",
     "start on the lowest reporting rank's clock (reference clock)"),
    ("duration_median", "DOUBLE", "median(duration_s)", ""),
    ("duration_max", "DOUBLE", "max(duration_s)", ""),
    ("compute_median", "DOUBLE", "median(compute_s)", ""),
    ("compute_max", "DOUBLE", "max(compute_s)", ""),
    ("compute_ranks", "BIGINT", "count(compute_s)",
     "ranks that reported a compute time (0: split not measured)"),
    ("ready_median", "DOUBLE", f"median({READY})", "median rank's time to reach the collective"),
    ("ready_max", "DOUBLE", f"max({READY})", "slowest rank's time to reach the collective"),
    ("ready_ranks", "BIGINT", f"count({READY})",
     "ranks whose ready time is known (0: not measured)"),
    ("slowest_rank", "BIGINT", f"{{max_by}}(rank, {_SLOWEST})",
     "rank slowest to reach the collective (longest duration if unmeasured; ties: highest id)"),
    ("slowest_host", "VARCHAR", f"{{max_by}}(host, {_SLOWEST})",
     "the slowest rank's host (null when it reported none)"),
    ("collective_wait_median", "DOUBLE", "median(collective_wait_s)", ""),
    ("data_wait_median", "DOUBLE", "median(data_wait_s)", ""),
    ("data_wait_min", "DOUBLE",
     "CASE WHEN count(data_wait_s) = count(*) THEN min(data_wait_s) END",
     "every rank waited for data at least this long (null unless every rank reported it)"),
    ("tokens", "BIGINT", "sum(tokens)", ""),
    ("samples", "BIGINT", "sum(samples)", ""),
)
SUMMARY_NAMES = [name for name, _, _, _ in SUMMARY_COLUMNS]


@dataclass(frozen=True)
class Dialect:
    """What differs between the SQL engines that summarise step rows (DuckDB here, Spark SQL
    past one machine, :mod:`goodlens.storage.spark`); everything else of the summarising
    step (:func:`summary_select`, :func:`deduplicated`) is one text, so they cannot drift."""

    name: str
    max_by: str
    """``max_by`` that keeps a null argument (the slowest rank's host may be unknown):
    DuckDB's ``max_by`` skips rows whose argument is null, its ``arg_max_null`` does not;
    Spark's ``max_by`` does not."""
    struct: str
    """A struct of positional fields, ordered field by field."""
    qualify: bool
    """``QUALIFY`` filters a window (DuckDB); else a subquery does, and the window is
    ordered (Spark's ``row_number()`` needs an ``ORDER BY``)."""


DUCKDB = Dialect("duckdb", max_by="arg_max_null", struct="row", qualify=True)
SPARK = Dialect("spark", max_by="max_by", struct="struct", qualify=False)


def summary_select(source: str = "steps", where: str = "", dialect: Dialect = DUCKDB) -> str:
    """Per-step summaries (:data:`SUMMARY_COLUMNS`, in order) of the step rows in
    ``source`` (a table, view or parenthesised subquery whose rows count once per key),
    optionally filtered by ``where``, in ``dialect``."""
    names = {"max_by": dialect.max_by, "struct": dialect.struct}
    exprs = ",\n  ".join(f"{expr.format(**names)} AS {name}"
                         for name, _, expr, _ in SUMMARY_COLUMNS)
    return (f"SELECT\n  {exprs}\nFROM {source}" + (f"\nWHERE {where}" if where else "")
            + "\nGROUP BY run_id, attempt, step")


def deduplicated(table: str, source: str, dialect: Dialect = DUCKDB) -> str:
    """The rows of ``table`` (``steps`` or ``events``) in ``source`` (raw segment rows),
    each key counted once: a batch two collectors stored, or rows a compaction copied and
    has not removed yet, are exact copies, so which copy is kept does not matter."""
    cols = f"run_id, {', '.join(COLUMNS[table])}"
    keys = ", ".join(KEYS[table])
    if dialect.qualify:
        return (f"SELECT {cols} FROM {source} "
                f"QUALIFY row_number() OVER (PARTITION BY {keys}) = 1")
    return (f"SELECT {cols} FROM (SELECT {cols}, row_number() OVER (PARTITION BY {keys} "
            f"ORDER BY {keys}) AS _copy FROM {source}) WHERE _copy = 1")


#: The columns of a relation of step ranges (:func:`in_boxes`).
BOX_COLUMNS = ("run_id", "attempt_lo", "attempt_hi", "step_lo", "step_hi")


def in_boxes(source: str, boxes: str) -> str:
    """The rows of ``source`` inside one of the step ranges in the relation ``boxes``
    (``run_id``, ``attempt_lo``, ``attempt_hi``, ``step_lo``, ``step_hi``): what a batch
    pass re-summarises (:mod:`goodlens.storage.bulk`). One text for every engine."""
    return (f"(SELECT * FROM {source} r WHERE EXISTS (SELECT 1 FROM {boxes} b WHERE "
            "b.run_id = r.run_id AND r.attempt BETWEEN b.attempt_lo AND b.attempt_hi AND "
            "r.step BETWEEN b.step_lo AND b.step_hi))")


#: The summaries of one step range. Parameters: run id, attempt, first and last step.
SUMMARY_SELECT = summary_select("steps", "run_id = ? AND attempt = ? AND step BETWEEN ? AND ?")

#: Every stored step range of every run and attempt, as ``dirty`` rows (a migration that
#: recomputes all summaries).
ALL_STEP_RANGES = ("SELECT run_id, attempt, min(step), max(step) FROM steps "
                   "GROUP BY run_id, attempt")

_ATTEMPTS_VIEW = f"""
CREATE OR REPLACE VIEW attempts AS
WITH s AS (
  SELECT run_id, attempt, min(step_start) AS first_step, max(step_end) AS last_step_end
  FROM step_summaries GROUP BY run_id, attempt),
e AS (
  SELECT run_id, attempt,
    min(time) FILTER (WHERE kind = '{_K.ATTEMPT_START}') AS start_ev,
    min(time) FILTER (WHERE kind <> '{_K.HEARTBEAT}') AS first_ev,
    max(time) AS last_ev,
    min(time) FILTER (WHERE kind IN {_TERMINAL}) AS end_ev,
    arg_min(CASE kind WHEN '{_K.ATTEMPT_END}' THEN coalesce(cause, 'ended')
                      WHEN '{_K.FAILURE_DETECTED}' THEN 'failed' ELSE 'preempted' END, time)
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


def summary_ddl(create: str = "CREATE TABLE IF NOT EXISTS") -> str:
    """The ``step_summaries`` table's DDL (``create``: ``CREATE TEMP TABLE`` for the shadow
    copy of a read-only open)."""
    last = len(SUMMARY_COLUMNS) - 1
    cols = "\n  ".join(f"{name} {kind}{',' if i < last else ''}" + (f"  -- {doc}" if doc else "")
                       for i, (name, kind, _, doc) in enumerate(SUMMARY_COLUMNS))
    return f"{create} step_summaries (\n  {cols}\n);"


#: Each run's report as last computed (:mod:`goodlens.storage.reports`): the runs list's
#: columns, and the whole report as JSON. ``final``: the run had ended when it was computed;
#: ``stale``: rows arrived since (set in the summarising transaction that saw them).
REPORTS_DDL = """
CREATE TABLE IF NOT EXISTS report_dirty (run_id VARCHAR);
CREATE TABLE IF NOT EXISTS run_reports (
  run_id VARCHAR PRIMARY KEY,
  computed_at DOUBLE,     -- unix time the report was computed (its "now" for a live run)
  final BOOLEAN,          -- the run had ended: kept until rows arrive again
  stale BOOLEAN,          -- rows arrived after it was computed
  state VARCHAR,          -- running, completed, failed, preempted, ...
  start DOUBLE,
  last_time DOUBLE,       -- the run's latest activity
  attempts BIGINT,
  steps BIGINT,
  last_step BIGINT,
  wall_clock_s DOUBLE,    -- null until the accounting ran (an index-only row)
  goodput DOUBLE,
  report VARCHAR,         -- the report (JSON), null for an index-only row
  metrics VARCHAR         -- the per-run series /metrics exports (JSON)
);"""

#: What every store keeps next to its rows: its schema version, the step ranges awaiting
#: summaries and the summaries themselves, the runs whose reports rows changed, the reports,
#: and the attempts view over events and summaries.
DERIVED = f"""
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS dirty (run_id VARCHAR, attempt BIGINT, lo BIGINT, hi BIGINT);
{REPORTS_DDL}
{summary_ddl()}
{_ATTEMPTS_VIEW}"""


def upsert_run() -> str:
    """Insert or update one run's metadata row: the values given win, nulls keep the stored
    ones. Parameters: run id, :data:`RUN_NAMES` in order, the first time seen."""
    cols = ", ".join(RUN_NAMES)
    updates = ", ".join(f"{c} = coalesce(excluded.{c}, runs.{c})" for c in RUN_NAMES)
    return (f"INSERT INTO runs (run_id, {cols}, first_seen) VALUES (?, "
            f"{', '.join('?' * len(RUN_NAMES))}, ?) ON CONFLICT (run_id) DO UPDATE SET "
            f"{updates}, first_seen = least(runs.first_seen, excluded.first_seen)")


# ---------------------------------------------------------------- the Parquet dataset
#: Options of ``read_parquet`` over a table's hive partitions.
HIVE = "hive_partitioning = true, hive_types = {'run_id': VARCHAR, 'hour': VARCHAR}"
_LATEST_META = ", ".join(f"arg_max({c}, written) FILTER (WHERE {c} IS NOT NULL) AS {c}"
                         for c in RUN_NAMES)


def empty_view(table: str) -> str:
    """``table`` as a view of its empty stand-in (a dataset with no files for it yet)."""
    return f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM _empty_{table}"


def dataset_view(table: str, glob: str) -> str:
    """``table`` as a view over the dataset's files matching ``glob`` (a quoted SQL string
    literal's content): run metadata rows merged per run, the latest value of each column
    winning; step and event rows counted once per key."""
    if table == "runs":
        return f"""CREATE OR REPLACE VIEW runs AS
            SELECT run_id, {_LATEST_META}, min(first_seen) AS first_seen
            FROM read_parquet('{glob}', union_by_name = true)
            GROUP BY run_id"""
    return (f"CREATE OR REPLACE VIEW {table} AS " + deduplicated(
        table, f"read_parquet('{glob}', {HIVE}, union_by_name = true)"))


def compacted(table: str) -> str:
    """The rows of the segments ``$files`` (one partition of ``table``, or the run metadata
    files) merged into one segment's content, with the views' rules."""
    source = "read_parquet($files, union_by_name = true, hive_partitioning = false)"
    if table == "runs":
        return (f"SELECT run_id, {_LATEST_META}, min(first_seen) AS first_seen, "
                f"max(written) AS written FROM {source} GROUP BY run_id ORDER BY run_id")
    keys = [k for k in KEYS[table] if k != "run_id"]
    return (f"SELECT {', '.join(COLUMNS[table])} FROM {source} QUALIFY row_number() OVER "
            f"(PARTITION BY {', '.join(keys)}) = 1 ORDER BY {', '.join(ORDER[table])}")
