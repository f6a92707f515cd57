"""The summarising SQL is one text for DuckDB and Spark: the two dialects differ
only in the names :class:`goodlens.storage.schema.Dialect` lists, so an aggregate changed
for one engine is changed for the other."""

from __future__ import annotations

from goodlens.storage.schema import (
    DUCKDB,
    SPARK,
    SUMMARY_NAMES,
    SUMMARY_SELECT,
    deduplicated,
    summary_select,
)


def test_the_summary_select_differs_only_in_the_dialect_names() -> None:
    duck, spark = summary_select("t", dialect=DUCKDB), summary_select("t", dialect=SPARK)
    assert duck != spark
    as_spark = duck.replace(f"{DUCKDB.max_by}(", f"{SPARK.max_by}(").replace(
        f"{DUCKDB.struct}(", f"{SPARK.struct}(")
    assert as_spark == spark


def test_every_summary_column_is_selected_once_in_order() -> None:
    text = summary_select("t", dialect=SPARK)
    aliases = [line.rsplit(" AS ", 1)[1].rstrip(",") for line in text.splitlines()
               if " AS " in line]
    assert aliases == SUMMARY_NAMES


def test_the_stores_range_statement_is_the_shared_text() -> None:
    shared = summary_select("steps", "run_id = ? AND attempt = ? AND step BETWEEN ? AND ?",
                            DUCKDB)
    assert shared == SUMMARY_SELECT


def test_deduplication_keeps_one_row_per_key_in_both_dialects() -> None:
    duck, spark = deduplicated("steps", "raw", DUCKDB), deduplicated("steps", "raw", SPARK)
    key = "PARTITION BY run_id, attempt, rank, step"
    assert key in duck and "QUALIFY" in duck and "ORDER BY" not in duck
    assert key in spark and "QUALIFY" not in spark and "WHERE _copy = 1" in spark
