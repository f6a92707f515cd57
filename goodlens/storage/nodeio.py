"""The node table's reads: every run's attempts, where each rank ran, and the events that
name a host, in three statements, on DuckDB or Spark.

Why a module of its own: ``goodlens nodes`` asks a question of every run at once (which
hosts fail or straggle in job after job, :mod:`goodlens.analysis.nodes`). Where each rank
ran in each attempt is in the raw step rows, the largest table, so that scan is the one to
hand to an engine that scales out: one SQL text (:func:`presence_select`,
:func:`events_select`) runs on DuckDB over a store (a DuckDB file, or a Parquet dataset's
views) and on Spark over the dataset's segments, and both give the same rows. Each host of
each attempt counts once however often its rows were stored (a batch two collectors
wrote), so the Spark reads need no deduplication.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from goodlens.model.schema import EVENT_COLUMNS, STEP_COLUMNS, EventKind

if TYPE_CHECKING:  # annotations only
    import pandas as pd
    from pyspark.sql import SparkSession

    from goodlens.storage.queries import SqlReader

#: The event kinds that can name a host in trouble (as :data:`goodlens.analysis.nodes.
#: NODE_KINDS`; the model's names, so no layer above is imported here).
KINDS = (EventKind.FAILURE, EventKind.FAILURE_DETECTED, EventKind.STRAGGLER_FLAGGED,
         EventKind.RANK_EVICTED)
#: The attempts, as :func:`goodlens.storage.fleetio.read_inputs` reads them.
ATTEMPTS_SQL = ('SELECT run_id, attempt, start, "end", end_reason, last_activity '
                "FROM attempts ORDER BY run_id, attempt")


def presence_select(steps: str) -> str:
    """Each rank's host in each attempt of every run, from the step rows of ``steps``: one
    SQL text for DuckDB and Spark."""
    return (f"SELECT DISTINCT run_id, attempt, rank, host FROM {steps} "
            "WHERE host IS NOT NULL ORDER BY run_id, attempt, rank, host")


def events_select(events: str) -> str:
    """Every event that can name a host in trouble (:data:`KINDS`), from ``events``; the
    ``detail`` of straggler findings only (it says whether one is resolved). One SQL text
    for DuckDB and Spark; the kinds are the model's constants."""
    kinds = ", ".join(f"'{k.value}'" for k in KINDS)
    return ("SELECT DISTINCT run_id, attempt, source, seq, time, kind, rank, host, cause, "
            f"label, CASE WHEN kind = '{EventKind.STRAGGLER_FLAGGED.value}' THEN detail "
            f"END AS detail FROM {events} WHERE kind IN ({kinds}) "
            "ORDER BY run_id, time, source, seq")


def read_duckdb(store: SqlReader) -> dict[str, pd.DataFrame]:
    """``attempts``, ``presence`` and ``events`` of every run of ``store`` (DuckDB)."""
    cur = store.cursor()
    try:
        return {"attempts": cur.sql(ATTEMPTS_SQL).df(),
                "presence": cur.sql(presence_select("steps")).df(),
                "events": cur.sql(events_select("events")).df()}
    finally:
        cur.close()


def read_spark(spark: SparkSession, root: Path) -> dict[str, pd.DataFrame]:
    """``presence`` and ``events`` of every run of the Parquet dataset at ``root``, read by
    Spark from the segments (the attempts come from a store: they need the summaries)."""
    out = {}
    for table, cols, select in (("steps", STEP_COLUMNS, presence_select),
                                ("events", EVENT_COLUMNS, events_select)):
        files = sorted(str(p) for p in (root / table).glob("*/*/*.parquet"))
        view = f"goodlens_nodes_{table}"
        if not files:  # no rows yet: the same columns, none of them
            spark.createDataFrame([], _schema(cols)).createOrReplaceTempView(view)
            out[table] = spark.sql(select(view)).toPandas()
            continue
        (spark.read.schema(_schema(cols)).option("basePath", str(root / table))
         .option("ignoreMissingFiles", "true").parquet(*files)
         .createOrReplaceTempView(view))
        out[table] = spark.sql(select(view)).toArrow().to_pandas()
    return {"presence": out["steps"], "events": out["events"]}


def _schema(columns: tuple[Any, ...]) -> Any:
    """A table's columns as Spark types (the model's), plus the partition columns read from
    the folder names as text (given a schema, Spark infers no partition types)."""
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    kinds = {"int": LongType(), "float": DoubleType(), "str": StringType()}
    return StructType([StructField(c.name, kinds[c.kind]) for c in columns]
                      + [StructField("run_id", StringType()), StructField("hour", StringType())])
