"""The fleet table's reads and its file: every run's inputs at once, and plain Parquet out.

Why a module of its own: the fleet table (:mod:`goodlens.analysis.fleet` builds its rows) is
about thousands of runs at once. Reading them run by run through the read API costs a few
statements per run (over a dataset's views, each one lists every segment), so
:func:`read_inputs` reads every run's attempts, step summaries and accounting events in
three statements. The table is then read by DuckDB, Spark and Trino without goodlens, so its
file holds nothing they would need goodlens to decode: flat columns of plain types (text,
64-bit integers, doubles, booleans, and timestamps in UTC without a time zone, so
``date_trunc('week', ...)`` means the same in every engine), in a folder of its own
(``DIR/fleet/fleet.parquet``: a Spark path or a Trino ``external_location``). It is replaced
whole and atomically: a reader sees the previous table or the new one, and the hidden
temporary name matches no engine's glob.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from goodlens.model.jsonable import is_missing
from goodlens.storage.segments import atomic_write_bytes

if TYPE_CHECKING:  # annotations only
    import pandas as pd

    from goodlens.storage.queries import SqlReader

#: Arrow types of the column kinds (:data:`goodlens.analysis.fleet.FLEET_COLUMNS`).
KIND_TYPES = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
              "time": pa.timestamp("us")}
FOLDER = "fleet"
FILE = "fleet.parquet"


@dataclass
class FleetInputs:
    """Every run's list row, attempts, step summaries and events (of the kinds asked for),
    each frame with a ``run_id`` column and ordered by run."""

    runs: pd.DataFrame
    attempts: pd.DataFrame
    steps: pd.DataFrame
    events: pd.DataFrame


def read_inputs(store: SqlReader, kinds: Iterable[str]) -> FleetInputs:
    """What the accounting of every run of ``store`` reads, in one statement per table
    (events: only of ``kinds``)."""
    cur = store.cursor()
    try:
        kinds = [str(k) for k in kinds]
        return FleetInputs(
            runs=store.runs(),
            attempts=cur.sql('SELECT run_id, attempt, start, "end", end_reason, last_activity '
                             "FROM attempts ORDER BY run_id, attempt").df(),
            steps=cur.sql("SELECT * FROM step_summaries ORDER BY run_id, attempt, step").df(),
            events=cur.sql("SELECT * FROM events WHERE kind IN (SELECT unnest($kinds)) "
                           "ORDER BY run_id, time, source, seq",
                           params={"kinds": kinds}).df())
    finally:
        cur.close()


def default_path(db: str) -> Path | None:
    """Where the fleet table of ``--db`` goes by default: ``DIR/fleet/fleet.parquet`` for a
    Parquet dataset ``parquet:DIR``; None for a DuckDB file (give a path)."""
    if str(db).startswith("parquet:"):
        return Path(str(db)[len("parquet:"):]) / FOLDER / FILE
    return None


def as_table(frame: pd.DataFrame, columns: Iterable[tuple[str, str]],
             metadata: dict[str, str] | None = None) -> pa.Table:
    """``frame`` as an Arrow table of ``(name, kind)`` columns; ``time`` columns hold epoch
    seconds in the frame and become UTC timestamps (microseconds)."""
    arrays, names = [], []
    for name, kind in columns:
        values = [None if is_missing(v) else v for v in frame[name].tolist()]
        if kind == "time":
            values = [None if v is None else round(float(v) * 1e6) for v in values]
            arr = pa.array(values, pa.int64()).cast(KIND_TYPES["time"])
        else:
            arr = pa.array(values, KIND_TYPES[kind])
        arrays.append(arr)
        names.append(name)
    t = pa.Table.from_arrays(arrays, names=names)
    if metadata:
        t = t.replace_schema_metadata({k.encode(): v.encode() for k, v in metadata.items()})
    return t


def write(path: str | Path, table: pa.Table) -> Path:
    """Replace the file at ``path`` with ``table``, atomically and durably; the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    atomic_write_bytes(path, buf.getvalue())
    return path
