"""Per-step summaries, recomputed from the raw step rows of dirty step ranges.

Why a module of its own: both stores keep ``step_summaries`` (ranks reporting, median and
max compute, slowest rank, step end, ...) up to date the same way. Each write records the
step range it touched in ``dirty`` (in the same transaction, or right after a Parquet
segment is in place), and :func:`summarize_dirty` recomputes those ranges, over a DuckDB
file's tables or a dataset's views alike. A crash between the two loses nothing: the dirty
ranges are durable (or re-found by the dataset's rescan) and are summarised after restart.

A file written by an earlier goodlens may keep summaries without the columns added since
(:func:`stale_columns`); its summaries are then recomputed from the raw rows
(:func:`mark_all_dirty`), since a new column's value cannot be derived from the old ones.
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb

from goodlens.storage import reports
from goodlens.storage.schema import ALL_STEP_RANGES, SUMMARY_NAMES, SUMMARY_SELECT

#: Raw rows summarised per statement (bounds the memory the medians need).
SUMMARY_CHUNK_ROWS = 4_000_000
_NAMES = ", ".join(SUMMARY_NAMES)
#: Called in a pass's transaction with the merged dirty ranges ``(run, attempt, lo, hi)``
#: before they are summarised; what it returns is called once they are (a Parquet reader
#: keeps a step's earlier figures where rows it counted are gone).
Guard = Callable[[duckdb.DuckDBPyConnection, list[tuple]], Callable[[], None]]


def stale_columns(con: duckdb.DuckDBPyConnection, table: str = "step_summaries") -> list[str]:
    """The summary columns ``table`` on ``con`` lacks (a file an earlier goodlens wrote);
    empty when it is up to date."""
    have = {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}
    return [c for c in SUMMARY_NAMES if c not in have]


def mark_all_dirty(con: duckdb.DuckDBPyConnection) -> None:
    """Mark every stored step range of every run dirty."""
    con.execute("INSERT INTO dirty " + ALL_STEP_RANGES)


def summarize_dirty(con: duckdb.DuckDBPyConnection, changed: list[str] | None = None,
                    guard: Guard | None = None) -> int:
    """Recompute the summaries of every dirty step range on ``con`` (in one transaction) and
    clear ``dirty``; returns the steps summarised.

    ``changed`` (the writer's summariser passes a list): also take the runs whose rows
    changed (``report_dirty``), mark their stored reports stale in the same transaction and
    append their ids to ``changed``: the summaries those reports need are then in place, and
    a crash after the commit leaves the reports marked stale, never silently old.
    ``guard``: see :data:`Guard`."""
    total = 0
    # one snapshot for everything: the dirty rows read are exactly the ones deleted, and
    # rows the writer commits meanwhile stay dirty for the next pass
    con.execute("BEGIN TRANSACTION")
    try:
        rows = con.execute("SELECT run_id, attempt, lo, hi FROM dirty "
                           "ORDER BY run_id, attempt, lo").fetchall()
        ranges = merge_ranges(rows)
        after = guard(con, ranges) if guard is not None and ranges else None
        for run_id, attempt, lo, hi in ranges:
            total += _summarize_range(con, run_id, attempt, lo, hi)
        if after is not None:
            after()
        con.execute("DELETE FROM dirty")
        if changed is not None:
            changed += reports.take_changed(con)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return int(total)


def _summarize_range(con: duckdb.DuckDBPyConnection, run_id: str, attempt: int, lo: int,
                     hi: int) -> int:
    # summarise the steps that exist (a stray step number must not make us walk a huge
    # numeric range), a few million rows per statement: medians need every value of a step
    # in memory (an import, a backlog after an outage)
    per_step = con.execute(
        "SELECT step, count(*) FROM steps WHERE run_id = ? AND attempt = ? "
        "AND step BETWEEN ? AND ? GROUP BY step ORDER BY step",
        [run_id, attempt, lo, hi]).fetchall()
    present = [step for step, _ in per_step]
    counts = dict(per_step)
    total = i = 0
    while i < len(present):
        j, budget = i, 0
        while j < len(present) and (j == i or budget + counts[present[j]]
                                    <= SUMMARY_CHUNK_ROWS):
            budget += counts[present[j]]
            j += 1
        params = [run_id, attempt, present[i], present[j - 1]]
        con.execute("DELETE FROM step_summaries WHERE run_id = ? AND attempt = ? "
                    "AND step BETWEEN ? AND ?", params)
        total += con.execute(f"INSERT INTO step_summaries ({_NAMES}) " + SUMMARY_SELECT,
                             params).fetchall()[0][0]
        i = j
    return total


def merge_ranges(rows: list[tuple]) -> list[tuple]:
    """Dirty ``(run, attempt, lo, hi)`` rows, sorted, merged where they overlap or touch."""
    out: list[list] = []
    for run_id, attempt, lo, hi in rows:
        if out and out[-1][0] == run_id and out[-1][1] == attempt and lo <= out[-1][3] + 1:
            out[-1][3] = max(out[-1][3], hi)
        else:
            out.append([run_id, attempt, lo, hi])
    return [tuple(r) for r in out]
