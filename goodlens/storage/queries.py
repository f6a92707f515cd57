"""The read API as SQL over DuckDB: the queries both stores answer reads with.

Why a module of its own: the DuckDB file and the Parquet dataset hold the same tables (the
dataset as views over its files, see :mod:`goodlens.storage.schema`), so every read
(:class:`goodlens.storage.reader.RunReader`) is the same query over either. A store is a
:class:`SqlReader` given a way to open a cursor; values are always bound as parameters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np

from goodlens.model.schema import EventKind as _K
from goodlens.storage import reports

if TYPE_CHECKING:  # the frames' and tables' types only: ``goodlens detect``'s reads
    import pandas as pd  # (run_row, ready_matrix, rank_host_map) import neither
    import pyarrow as pa


class SparseRanks(ValueError):
    """A run's rank ids are far sparser than its ranks (a typo, a hostile push): a layout
    with one column per rank id would size memory by an id's value."""


def rank_id_limit(reporting: int) -> int:
    """The largest rank id + 1 a per-rank layout is sized for, given how many ranks report
    (the live detector and :meth:`SqlReader.ready_matrix` both hold to it): memory follows
    the ranks that exist, never the value of an id."""
    return 4 * reporting + 1024


class SqlReader:
    """The read API (:class:`~goodlens.storage.reader.RunReader`) over cursors from
    ``new_cursor``, one per reading thread. ``retry_io``: retry a query once that fails to
    read a file (a Parquet dataset whose compaction removed it between listing and read)."""

    def __init__(self, new_cursor: Callable[[], duckdb.DuckDBPyConnection], *,
                 retry_io: bool = False) -> None:
        self._open_cursor = new_cursor
        self._retry_io = retry_io
        self._local = threading.local()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new cursor on the store for a thread of its own (the summariser's)."""
        return self._open_cursor()

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        """The calling thread's cursor (a DuckDB connection is not shared between threads)."""
        cur = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._local.cur = self._open_cursor()
        return cur

    def _df(self, sql: str, params: list | dict | None = None) -> pd.DataFrame:
        for attempt in (0, 1):
            try:
                return self._cursor().execute(sql, params or []).df()
            except duckdb.IOException:
                if attempt or not self._retry_io:
                    raise
                time.sleep(0.05)
        raise AssertionError("unreachable")

    def runs(self) -> pd.DataFrame:
        """One row per run, most recently started first: metadata, attempts, steps
        summarised, first and last time, state, and the stored report's goodput and
        wall-clock (null until a collector accounted the run)."""
        return self.runs_page()[0]

    def runs_page(self, limit: int | None = None, offset: int = 0, sort: str = "start",
                  descending: bool = True, state: str | None = None,
                  text: str | None = None) -> tuple[pd.DataFrame, int]:
        """A page of :meth:`runs` and how many runs match (sort keys, filters:
        :func:`goodlens.storage.reports.runs_page`)."""
        cur = self._cursor()
        return reports.runs_page(cur, limit=limit, offset=offset, sort=sort,
                                 descending=descending, state=state, text=text,
                                 stored=self._has_reports(cur))

    def _has_reports(self, cur: duckdb.DuckDBPyConnection) -> bool:
        has = getattr(self, "_reports_table", None)
        if has is None:
            has = self._reports_table = reports.has_reports_table(cur)
        return has

    def stored_report(self, run_id: str) -> dict[str, Any] | None:
        """The stored report of a finished run while no rows arrived since, else None."""
        cur = self._cursor()
        return reports.current_report(cur, run_id) if self._has_reports(cur) else None

    def stored_reports(self, run_ids: list[str] | None = None, since: float | None = None
                       ) -> list[reports.ReportRow]:
        """Stored report rows (:func:`goodlens.storage.reports.load`)."""
        cur = self._cursor()
        return reports.load(cur, run_ids, since=since) if self._has_reports(cur) else []

    def runs_of(self, run_ids: list[str]) -> pd.DataFrame:
        """The list rows of ``run_ids`` computed from the raw tables (exact as of now; what
        the stored rows are refreshed from)."""
        return self._df(reports.RUNS_FROM_ROWS.format(
            only="WHERE run_id IN (SELECT unnest($runs::VARCHAR[]))"), {"runs": list(run_ids)})

    def _runs(self, run_id: str | None = None) -> pd.DataFrame:
        only = "WHERE run_id = $run" if run_id is not None else ""
        return self._df(reports.RUNS_FROM_ROWS.format(only=only) +
                        " ORDER BY start DESC NULLS LAST, r.run_id",
                        {"run": run_id} if run_id is not None else None)

    def run(self, run_id: str) -> dict[str, Any] | None:
        """One run's metadata and overview row, or None when unknown."""
        rows = self._runs(run_id).to_dict("records")
        return rows[0] if rows else None

    def run_row(self, run_id: str) -> dict[str, Any] | None:
        """One run's metadata as stored (``run_id, name, world_size, gpus_per_rank,
        global_batch, model_params, tags, first_seen``; NULL as None), or None when unknown:
        a lookup of one row, without the overview's aggregates or a frame (what
        ``goodlens detect`` reads)."""
        cur = self._cursor().execute("SELECT * FROM runs WHERE run_id = ?", [run_id])
        row = cur.fetchone()
        return None if row is None else dict(zip([d[0] for d in cur.description], row))

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

    def ready_matrix(self, run_id: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """What the straggler detector reads, laid out for it: the run's steps in (attempt,
        step) order with each step's median duration and its start on the lowest reporting
        rank's clock (arrays ``attempt``, ``step``, ``duration_s`` and ``start_s``, NaN where
        none is known), and a steps x ranks float32 matrix of each
        rank's time to reach the collective (NaN: no report). The cell of each rank-step
        (its step's row x ranks + its rank) is computed in the query
        (:func:`_cells_query`), so millions of rows cost two narrow columns and one
        scatter, not a frame and a sort (nor pandas)."""
        cur = self._cursor()
        n, total = self._rank_columns(cur, run_id)
        keys = cur.execute(
            "SELECT attempt, step, coalesce(duration_median, 'NaN'::DOUBLE) AS duration_s, "
            "coalesce(ref_start, 'NaN'::DOUBLE) AS start_s "
            "FROM step_summaries WHERE run_id = ? ORDER BY attempt, step",
            [run_id]).fetchnumpy()
        rows = len(keys["step"])
        # a relation's fetchnumpy (not a cursor's result's): it converts twice as fast
        sql, params = _cells_query(run_id, keys["attempt"], keys["step"], n)
        got = cur.sql(sql, params=params).fetchnumpy()
        m = np.full((rows, n), np.nan, np.float32)
        m.reshape(-1)[got["cell"]] = got["ready"]
        # as many columns as the rank ids of the rows laid out: every row's, unless some are
        # of steps not summarised yet (a rank may have no other)
        ranks = n if len(got["cell"]) == total else (
            int((got["cell"] % n).max()) + 1 if len(got["cell"]) else 0)
        return keys, m if ranks == n else np.ascontiguousarray(m[:, :ranks])

    def _rank_columns(self, cur: duckdb.DuckDBPyConnection, run_id: str) -> tuple[int, int]:
        """The largest rank id + 1 of the run's step rows (0: none) and how many rows there
        are, once the ids are known not to be too sparse to lay out one column per rank id
        (:func:`rank_id_limit`; else :class:`SparseRanks`). The ranks of the step most ranks
        reported are counted first, a lower bound of the ranks reporting: the count over
        every row is taken only when that bound does not clear the ids."""
        top, total = cur.execute("SELECT max(rank), count(*) FROM steps WHERE run_id = ?",
                                 [run_id]).fetchone()
        if top is None:
            return 0, 0
        busiest = cur.execute("SELECT attempt, step FROM step_summaries WHERE run_id = ? "
                              "ORDER BY ranks DESC, attempt, step LIMIT 1", [run_id]).fetchone()
        if busiest is not None:
            seen = cur.execute("SELECT count(DISTINCT rank) FROM steps WHERE run_id = ? AND "
                               "attempt = ? AND step = ?", [run_id, *busiest]).fetchone()[0]
            if top + 1 <= rank_id_limit(seen):
                return int(top) + 1, int(total)
        distinct = cur.execute("SELECT count(DISTINCT rank) FROM steps WHERE run_id = ?",
                               [run_id]).fetchone()[0]
        if top + 1 > rank_id_limit(distinct):
            raise SparseRanks(f"run {run_id!r}: rank ids up to {top} for {distinct} ranks "
                              "reporting: too sparse to lay out one column per rank id")
        return int(top) + 1, int(total)

    def step_range(self, run_id: str, attempt: int, since: float | None = None,
                   until: float | None = None) -> tuple[int, int, int] | None:
        """``(first step, last step, ranks)`` of one attempt's summaries, None when empty;
        with ``since``/``until`` (epoch seconds), of the steps whose time overlaps the window
        (as :meth:`step_summaries`: they end at or after ``since`` and start at or before
        ``until``)."""
        where, params = _where({"run_id = ?": run_id, "attempt = ?": attempt,
                                "step_end >= ?": since, "step_start <= ?": until})
        row = self._cursor().execute(
            f"SELECT min(step), max(step), max(ranks) FROM step_summaries WHERE {where}",
            params).fetchone()
        return None if row is None or row[0] is None else (int(row[0]), int(row[1]),
                                                           int(row[2] or 0))

    def heatmap(self, run_id: str, attempt: int, step_min: int, step_max: int,
                rank_bins: int, step_bins: int) -> pd.DataFrame:
        """Per-rank compute pooled into a ``rank_bins`` x ``step_bins`` grid (for the
        dashboard's heatmap of 16k ranks): per cell the mean and the max of each rank's
        compute (its step time where no split was reported), the slowest rank and the cell's
        rank and step span (the bin's bounds). Max-pooling keeps a single slow rank visible
        in a bin of many. Rank ids are pooled over the ranks reporting the first step
        (``max(rank) + 1``), as ``rank * rank_bins // ranks``.

        One aggregate over one integer key (a cell's step bin and rank bin packed in a
        BIGINT): two grouping columns cost DuckDB twice the hashing, and the spans are
        arithmetic on the bin, not four more aggregates."""
        span = max(step_max - step_min + 1, 1)
        return self._df("""
            WITH n AS (SELECT greatest(coalesce(max(rank) + 1, 1), 1) AS nr FROM steps
                       WHERE run_id = $run AND attempt = $att AND step = $s0),
            g AS (SELECT ((step - $s0) * $sb // $span) * 4294967296 + rank * $rb // nr AS k,
                    avg(v) AS mean, max(v) AS max, arg_max(rank, v) AS worst_rank
                  FROM (SELECT rank, step, coalesce(compute_s, duration_s) AS v FROM steps
                        WHERE run_id = $run AND attempt = $att AND step BETWEEN $s0 AND $s1),
                       n
                  GROUP BY k)
            SELECT k % 4294967296 AS rbin, k // 4294967296 AS sbin, mean, max, worst_rank,
              (rbin * nr + $rb - 1) // $rb AS rank_lo,
              ((rbin + 1) * nr + $rb - 1) // $rb - 1 AS rank_hi,
              $s0 + (sbin * $span + $sb - 1) // $sb AS step_lo,
              least($s0 + ((sbin + 1) * $span + $sb - 1) // $sb - 1, $s1) AS step_hi
            FROM g, n ORDER BY k""",
            {"rb": rank_bins, "s0": step_min, "s1": step_max, "sb": step_bins, "span": span,
             "run": run_id, "att": attempt})

    def host_compute(self, run_id: str, attempt: int, step_min: int, step_max: int
                     ) -> pd.DataFrame:
        """Per host over a step window: ranks, mean compute (step time where no split was
        reported) and its slowest rank's mean (the host roll-up of the ranks view).

        A rank runs on one host through an attempt: each rank's mean is taken grouping by
        the rank alone (an integer: DuckDB's perfect hash aggregate, no string hashing) and
        its host read at the window's first and last steps. Should a rank miss either of them
        or report two hosts, the window is grouped by host and rank instead (the exact
        answer: a rank that moved counts on each host it ran on)."""
        params = {"run": run_id, "att": attempt, "s0": step_min, "s1": step_max}
        cur = self._cursor()
        cur.execute(f"SET perfect_ht_threshold = {_PERFECT_HT_BITS}")
        try:
            df = self._df(_HOSTS_BY_RANK, params)
        finally:
            cur.execute("RESET perfect_ht_threshold")
        if len(df) and df.pop("unsure").any():
            return self._df(_HOSTS_BY_HOST_RANK, params)
        return df.drop(columns="unsure", errors="ignore")

    def rank_hosts(self, run_id: str, attempt: int | None = None) -> pd.DataFrame:
        """``rank, host`` as the ranks reported them at the first step of an attempt
        (default: the latest); empty when the run has no step records."""
        attempt = self._host_attempt(run_id, attempt)
        if attempt is None:
            import pandas as pd
            return pd.DataFrame({"rank": [], "host": []})
        return self._df(_RANK_HOSTS, [run_id, attempt, run_id, attempt])

    def rank_host_map(self, run_id: str, attempt: int | None = None) -> dict[int, str | None]:
        """:meth:`rank_hosts` as ``{rank: host}`` (None: no host reported), in rank order;
        without a frame (what ``goodlens detect`` reads)."""
        attempt = self._host_attempt(run_id, attempt)
        if attempt is None:
            return {}
        rows = self._cursor().execute(_RANK_HOSTS, [run_id, attempt, run_id, attempt])
        return {int(r): h for r, h in rows.fetchall()}

    def _host_attempt(self, run_id: str, attempt: int | None) -> int | None:
        """``attempt``, or the run's latest (None: the run has no step summaries)."""
        if attempt is not None:
            return attempt
        row = self._cursor().execute("SELECT max(attempt) FROM step_summaries "
                                     "WHERE run_id = ?", [run_id]).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def run_metrics(self, window_steps: int = 100, run_ids: list[str] | None = None
                    ) -> pd.DataFrame:
        """Per run (default: every run), for /metrics: steps summarised, last step, ranks
        reporting the last step, step-time quantiles (slowest rank's duration) over the latest
        ``window_steps``, the sum and count of every step's time, and failures and hangs."""
        only = "WHERE run_id IN (SELECT unnest($runs::VARCHAR[]))" if run_ids is not None \
            else ""
        params: dict[str, Any] = {"window": window_steps}
        if run_ids is not None:
            params["runs"] = list(run_ids)
        return self._df(f"""
            WITH sums AS (SELECT * FROM step_summaries {only}),
                 latest AS (SELECT run_id, max(attempt) AS attempt FROM sums
                            GROUP BY run_id),
                 top AS (SELECT s.run_id, s.attempt, max(s.step) AS last_step
                         FROM sums s JOIN latest USING (run_id, attempt)
                         GROUP BY ALL),
                 recent AS (SELECT s.* FROM sums s JOIN top USING (run_id, attempt)
                            WHERE s.step > top.last_step - $window),
                 totals AS (SELECT run_id, count(*) AS steps,
                              sum(duration_max) AS step_seconds FROM sums GROUP BY run_id),
                 ev AS (SELECT run_id,
                          count(DISTINCT attempt) FILTER (WHERE kind IN
                            ('{_K.FAILURE}', '{_K.FAILURE_DETECTED}')) AS failures,
                          count(*) FILTER (WHERE kind = '{_K.FAILURE_DETECTED}'
                            AND cause = 'hang') AS hangs
                        FROM events {only} GROUP BY run_id)
            SELECT run_id, totals.steps, totals.step_seconds, max(step) AS last_step,
              max(attempt) AS attempt, arg_max(ranks, step) AS ranks_reporting,
              quantile_cont(duration_max, 0.5) AS step_p50,
              quantile_cont(duration_max, 0.9) AS step_p90,
              quantile_cont(duration_max, 0.99) AS step_p99,
              coalesce(any_value(ev.failures), 0) AS failures,
              coalesce(any_value(ev.hangs), 0) AS hangs
            FROM recent JOIN totals USING (run_id) LEFT JOIN ev USING (run_id)
            GROUP BY run_id, totals.steps, totals.step_seconds
            ORDER BY run_id""", params)

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


#: Each rank's host at the first step of an attempt (:meth:`SqlReader.rank_hosts`).
_RANK_HOSTS = """
    SELECT rank, any_value(host) AS host FROM steps
    WHERE run_id = ? AND attempt = ? AND step = (
      SELECT min(step) FROM step_summaries WHERE run_id = ? AND attempt = ?)
    GROUP BY rank ORDER BY rank"""

#: Key bits up to which a GROUP BY indexes an array instead of hashing (DuckDB's default is
#: 12: 4,096 ranks); 16 covers 65,536 ranks.
_PERFECT_HT_BITS = 16

_WINDOW = "run_id = $run AND attempt = $att AND step BETWEEN $s0 AND $s1 AND host IS NOT NULL"

#: The host roll-up from per-rank means (:meth:`SqlReader.host_compute`); ``unsure``: some
#: rank did not report a host at both ends of the window, or reported two.
_HOSTS_BY_RANK = f"""
    WITH r AS (SELECT rank, avg(coalesce(compute_s, duration_s)) AS v FROM steps
               WHERE {_WINDOW} GROUP BY rank),
    e AS (SELECT rank, min(host) AS h0, max(host) AS h1, count(*) AS ends FROM steps
          WHERE run_id = $run AND attempt = $att AND (step = $s0 OR step = $s1)
            AND host IS NOT NULL GROUP BY rank),
    rh AS (SELECT r.rank, e.h0 AS host, r.v,
             e.h0 IS NULL OR e.h0 <> e.h1 OR e.ends < CASE WHEN $s0 = $s1 THEN 1 ELSE 2 END
               AS unsure
           FROM r LEFT JOIN e USING (rank))
    SELECT host, count(*) AS ranks, avg(v) AS mean, max(v) AS worst_rank_mean,
      arg_max(rank, v) AS worst_rank, min(rank) AS first_rank, bool_or(unsure) AS unsure
    FROM rh GROUP BY host ORDER BY first_rank"""

#: The same grouped by host and rank over every row of the window.
_HOSTS_BY_HOST_RANK = f"""
    WITH r AS (SELECT host, rank, avg(coalesce(compute_s, duration_s)) AS v FROM steps
               WHERE {_WINDOW} GROUP BY host, rank)
    SELECT host, count(*) AS ranks, avg(v) AS mean, max(v) AS worst_rank_mean,
      arg_max(rank, v) AS worst_rank, min(rank) AS first_rank
    FROM r GROUP BY host ORDER BY first_rank"""


#: Attempt numbers a run's attempts may span for :func:`_cells_query` to look each one's
#: row offset up in a list indexed by the attempt (else the steps are joined instead).
_MAX_ATTEMPT_SPAN = 1 << 16


def _cells_query(run_id: str, attempt: np.ndarray, step: np.ndarray, n: int
                 ) -> tuple[str, dict[str, Any]]:
    """The query of each step row's cell in :meth:`SqlReader.ready_matrix`'s matrix of
    ``n`` columns (its row x n + its rank) and its time to reach the collective, and its
    parameters. A row is its (attempt, step)'s rank among the run's step summaries, whose
    keys (sorted) are ``attempt``, ``step``: where each attempt's steps are consecutive
    (nearly always), that is the step plus its attempt's shift (the rows of the attempts
    before it, less its first step), looked up by attempt; rows of steps without a summary
    are left out. Otherwise each row's key is joined with the summaries' row numbers."""
    from goodlens.storage.schema import READY
    cell = "INTEGER" if len(step) * n < 2**31 else "BIGINT"
    ready = f"coalesce(({READY})::FLOAT, 'NaN'::FLOAT) AS ready"
    params: dict[str, Any] = {"run": run_id, "n": n}
    same = attempt[1:] == attempt[:-1]
    if len(step) and (np.diff(step)[same] == 1).all() \
            and attempt[-1] - attempt[0] < _MAX_ATTEMPT_SPAN:
        first = np.flatnonzero(np.r_[True, ~same])   # each attempt's first row
        last = np.r_[first[1:], len(step)] - 1
        a0, span = int(attempt[0]), int(attempt[-1] - attempt[0]) + 1
        shift, lo, hi = np.zeros(span, np.int64), np.ones(span, np.int64), np.zeros(span, np.int64)
        at = attempt[first] - a0
        shift[at], lo[at], hi[at] = first - step[first], step[first], step[last]
        params |= {"a0": a0, "a1": a0 + span - 1, "shift": shift.tolist(), "lo": lo.tolist(),
                   "hi": hi.tolist()}
        i = "s.attempt - $a0 + 1"   # (an attempt without summaries: an empty step range)
        return f"""
            SELECT ((s.step + $shift[{i}]) * $n + s.rank)::{cell} AS cell, {ready}
            FROM steps s WHERE s.run_id = $run AND s.attempt BETWEEN $a0 AND $a1
              AND s.step BETWEEN $lo[{i}] AND $hi[{i}]""", params
    return f"""
        WITH k AS (SELECT attempt, step, row_number() OVER (ORDER BY attempt, step) - 1
                     AS row FROM step_summaries WHERE run_id = $run)
        SELECT (k.row * $n + s.rank)::{cell} AS cell, {ready}
        FROM steps s JOIN k ON s.attempt = k.attempt AND s.step = k.step
        WHERE s.run_id = $run""", params


def _where(conds: dict[str, Any]) -> tuple[str, list]:
    """``(where, params)`` from ``{"col op ?": value}``, skipping None values."""
    kept = [(c, v) for c, v in conds.items() if v is not None]
    return " AND ".join(c for c, _ in kept) or "TRUE", [v for _, v in kept]

