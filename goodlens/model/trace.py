"""The trace format: a folder of Parquet files that any tool can read without goodlens.

A trace holds one or more runs::

    TRACE/
      manifest.json        {"format": "goodlens-trace", "schema_version": 1,
                            "runs": ["demo-8x"], "tables": {"steps": "steps.parquet", ...}}
      runs.parquet         one row per run (columns of goodlens.model.schema.RUN_COLUMNS + run_id)
      steps.parquet        per-rank step records (run_id + STEP_COLUMNS)
      events.parquet       events (run_id + EVENT_COLUMNS)
      attempts.parquet     derived attempts (run_id, attempt, start, end, end_reason), for readers

Read it with pandas (``pd.read_parquet("TRACE/steps.parquet")``), DuckDB
(``SELECT * FROM 'TRACE/steps.parquet'``), Spark or Trino. Units are those of
``docs/data-model.md``: seconds, epoch seconds for instants, bytes. Only pyarrow here; loading
a trace into a store is :mod:`goodlens.collector.replay`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from goodlens.model.schema import SCHEMA_VERSION

FORMAT = "goodlens-trace"
TABLES = ("runs", "steps", "events", "attempts")


class TraceError(ValueError):
    """A folder that is not a readable goodlens trace."""


@dataclass
class Trace:
    """The tables of a trace, as Arrow."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)

    @property
    def run_ids(self) -> list[str]:
        """Runs in the trace."""
        return list(self.manifest.get("runs", []))


def write_trace(path: str | Path, tables: dict[str, pa.Table], run_ids: list[str]) -> Path:
    """Write ``tables`` (any of runs, steps, events, attempts) as a trace folder."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    names = {}
    for name, table in tables.items():
        if name not in TABLES:
            raise ValueError(f"unknown trace table {name}; known: {TABLES}")
        fname = f"{name}.parquet"
        tmp = out / (fname + ".tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, out / fname)
        names[name] = fname
    manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "runs": run_ids,
                "tables": names}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def read_trace(path: str | Path) -> Trace:
    """Read a trace folder; raises :class:`TraceError` saying what is missing or wrong."""
    root = Path(path)
    mpath = root / "manifest.json"
    if not mpath.exists():
        raise TraceError(f"{root} is not a goodlens trace (no manifest.json); "
                         "create one with `goodlens export` or sample_data/generate.py")
    manifest = json.loads(mpath.read_text())
    if manifest.get("format") != FORMAT:
        raise TraceError(f"{mpath} is not a goodlens trace manifest")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise TraceError(f"{root} has schema version {manifest.get('schema_version')}; this "
                         f"goodlens reads {SCHEMA_VERSION}")
    tables = {}
    for name, fname in manifest.get("tables", {}).items():
        fpath = root / fname
        if not fpath.exists():
            raise TraceError(f"{fpath} is listed in the manifest but missing")
        tables[name] = pq.read_table(fpath)
    return Trace(tables, manifest)
