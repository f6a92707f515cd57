"""Moving traces in and out of a store: import a trace folder, export a run as a trace.

Import goes through the same write path as live ingest (validation, key-based
de-duplication, summaries), so importing a trace twice adds nothing and a trace is exactly
what an exporter would have produced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from collector.ingest import ARROW_TYPES, Batch
from collector.store import Store
from goodlens.model import EVENT_COLUMNS, RUN_COLUMNS, STEP_COLUMNS, Column
from goodlens.trace import Trace, TraceError, read_trace, write_trace

CHUNK_ROWS = 500_000


def _conform(table: pa.Table, columns: tuple[Column, ...], where: str) -> pa.Table:
    """Columns in model order and type; missing optional columns become nulls."""
    arrays = []
    for col in columns:
        if col.name in table.column_names:
            arrays.append(table.column(col.name).cast(ARROW_TYPES[col.kind]))
        elif col.required:
            raise TraceError(f"{where} lacks required column {col.name}")
        else:
            arrays.append(pa.nulls(table.num_rows, ARROW_TYPES[col.kind]))
    return pa.Table.from_arrays(arrays, names=[c.name for c in columns])


def trace_batches(trace: Trace) -> Iterator[Batch]:
    """The trace as store batches, one run at a time, in chunks of ``CHUNK_ROWS``."""
    runs = trace.tables.get("runs")
    steps = trace.tables.get("steps")
    events = trace.tables.get("events")
    for run_id in trace.run_ids:
        meta = None
        if runs is not None:
            rows = runs.filter(pc.equal(runs.column("run_id"), run_id)).to_pylist()
            if rows:
                meta = {c.name: rows[0].get(c.name) for c in RUN_COLUMNS}
        yield Batch(run_id=run_id, run=meta)
        for table, columns, attr in ((events, EVENT_COLUMNS, "events"),
                                     (steps, STEP_COLUMNS, "steps")):
            if table is None:
                continue
            part = table.filter(pc.equal(table.column("run_id"), run_id))
            part = _conform(part, columns, f"{attr} of run {run_id}")
            for offset in range(0, part.num_rows, CHUNK_ROWS):
                yield Batch(run_id=run_id, **{attr: part.slice(offset, CHUNK_ROWS)})


def import_trace(store: Store, path: str | Path,
                 progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """Load a trace folder into ``store``; returns rows inserted and duplicates per table."""
    trace = read_trace(path)
    totals = {"runs": len(trace.run_ids), "steps_inserted": 0, "steps_duplicate": 0,
              "events_inserted": 0, "events_duplicate": 0}
    for batch in trace_batches(trace):
        res = store.write_group([batch])[0]
        for k, v in res.as_dict().items():
            totals[k] += v
        if progress:
            progress(batch.rows)
    store.summarize_dirty()
    return totals


def export_run(store: Store, run_ids: list[str], path: str | Path) -> Path:
    """Write runs from ``store`` as a trace folder."""
    tables: dict[str, list[pa.Table]] = {name: [] for name in ("runs", "steps", "events",
                                                                "attempts")}
    for run_id in run_ids:
        if store.run(run_id) is None:
            raise KeyError(f"no run {run_id!r} in {store.path}; see `goodlens runs`")
        for name in tables:
            tables[name].append(store.table(name, run_id))
    return write_trace(path, {k: pa.concat_tables(v) for k, v in tables.items()}, run_ids)
