"""Decoding and validation of wire batches: JSON in, Arrow tables out, or an error naming the field.

A wire batch (``POST /v1/ingest``, ``Content-Type: application/json``) is one JSON object::

    {"schema_version": 1, "run_id": "llama-70b-0412",
     "run": {"world_size": 1024, ...},                  # optional run metadata
     "steps": {"attempt": 0, "rank": 3, "host": "node-7",  # a scalar applies to every row
               "step": [100, 101], "start_time": [...], "duration_s": [...], ...},
     "events": {"source": "node-7/4242", "seq": [0, 1], "kind": [...], ...},
     "exporter": {"source": "node-7/4242", "dropped_rows": 0}}   # optional stats

Columns are lists of equal length or scalars broadcast to that length. Unknown fields are
rejected (a typo must not silently lose a column). The whole batch is accepted or rejected:
a bad batch changes nothing, and other batches are unaffected. Column names and meanings
come from :mod:`goodlens.model.schema`. No SQL and no I/O here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from goodlens.model.schema import (
    EVENT_COLUMNS,
    EVENT_KINDS,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    STEP_COLUMNS,
    Column,
)
from goodlens.model.wire import ARROW_TYPES

_TOP_LEVEL = {"schema_version", "run_id", "run", "steps", "events", "exporter"}
_EXPORTER_FIELDS = {"source": str, "dropped_rows": int, "spilled_batches": int,
                    "rejected_batches": int}
MAX_RUN_ID = 256


class BatchError(ValueError):
    """A refused batch: ``field`` names the offending part, ``status`` the HTTP code."""

    def __init__(self, message: str, field: str | None = None, status: int = 422) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.status = status

    def as_dict(self) -> dict[str, Any]:
        """The JSON body returned to the client."""
        return {"error": self.message, "field": self.field}


@dataclass
class Batch:
    """A validated batch: Arrow tables with every column of the model present (nulls if absent)."""

    run_id: str
    run: dict[str, Any] | None = None
    steps: pa.Table | None = None
    events: pa.Table | None = None
    exporter: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        """Step and event rows in the batch."""
        return (self.steps.num_rows if self.steps is not None else 0) + (
            self.events.num_rows if self.events is not None else 0)


def decode_batch(body: bytes) -> Batch:
    """Parse and validate one wire batch; raises :class:`BatchError` saying what is wrong."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BatchError(f"body is not valid JSON: {exc}", None, 400) from None
    return validate_batch(doc)


def validate_batch(doc: Any) -> Batch:
    """Validate an already-decoded batch object (see the module docstring for the format)."""
    if not isinstance(doc, dict):
        raise BatchError("batch must be a JSON object", None, 400)
    unknown = set(doc) - _TOP_LEVEL
    if unknown:
        raise BatchError(f"unknown top-level field(s) {sorted(unknown)}; known: "
                         f"{sorted(_TOP_LEVEL)}", sorted(unknown)[0])
    version = doc.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BatchError("schema_version is required and must be an integer", "schema_version")
    if version != SCHEMA_VERSION:
        hint = "upgrade the collector" if version > SCHEMA_VERSION else "upgrade the exporter"
        raise BatchError(f"schema_version {version} is not supported by this collector "
                         f"(it speaks {SCHEMA_VERSION}); {hint}", "schema_version")
    run_id = doc.get("run_id")
    if not isinstance(run_id, str) or not run_id.strip() or len(run_id) > MAX_RUN_ID:
        raise BatchError(f"run_id is required: a non-empty string of at most {MAX_RUN_ID} "
                         "characters", "run_id")
    batch = Batch(run_id=run_id)
    if doc.get("run") is not None:
        batch.run = _validate_run(doc["run"])
    if doc.get("steps") is not None:
        batch.steps = columns_to_table(doc["steps"], STEP_COLUMNS, "steps")
    if doc.get("events") is not None:
        batch.events = columns_to_table(doc["events"], EVENT_COLUMNS, "events")
        _check_kinds(batch.events)
    if doc.get("exporter") is not None:
        batch.exporter = _validate_exporter(doc["exporter"])
    return batch


def _validate_run(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BatchError("run must be an object", "run")
    known = {c.name: c for c in RUN_COLUMNS}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        col = known.get(key)
        if col is None:
            raise BatchError(f"unknown field run.{key}; known: {sorted(known)}", f"run.{key}")
        if key == "tags" and isinstance(value, dict):
            value = orjson.dumps(value).decode()
        if value is not None and not _scalar_ok(value, col.kind):
            raise BatchError(f"run.{key} must be {_KIND_NAMES[col.kind]}", f"run.{key}")
        if col.nonnegative and value is not None and value < 0:
            raise BatchError(f"run.{key} must not be negative", f"run.{key}")
        out[key] = value
    return out


def _validate_exporter(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BatchError("exporter must be an object", "exporter")
    unknown = set(obj) - set(_EXPORTER_FIELDS)
    if unknown:
        raise BatchError(f"unknown field exporter.{sorted(unknown)[0]}; known: "
                         f"{sorted(_EXPORTER_FIELDS)}", f"exporter.{sorted(unknown)[0]}")
    out = {}
    for key, typ in _EXPORTER_FIELDS.items():
        if key in obj:
            if not isinstance(obj[key], typ) or isinstance(obj[key], bool):
                raise BatchError(f"exporter.{key} must be {typ.__name__}", f"exporter.{key}")
            out[key] = obj[key]
    return out


_KIND_NAMES = {"int": "an integer", "float": "a number", "str": "a string"}


def _scalar_ok(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int)
    if kind == "float":
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, str)


def columns_to_table(obj: Any, columns: tuple[Column, ...], where: str) -> pa.Table:
    """Columnar JSON (lists or broadcast scalars) to an Arrow table with every model column."""
    if not isinstance(obj, dict):
        raise BatchError(f"{where} must be an object mapping column names to lists", where)
    known = {c.name: c for c in columns}
    unknown = [k for k in obj if k not in known]
    if unknown:
        raise BatchError(f"unknown column {where}.{unknown[0]}; known: {sorted(known)}",
                         f"{where}.{unknown[0]}")
    lengths = {k: len(v) for k, v in obj.items() if isinstance(v, list)}
    if len(set(lengths.values())) > 1:
        raise BatchError(f"{where} columns have different lengths: {lengths}", where)
    n = next(iter(lengths.values())) if lengths else 1
    arrays = []
    for col in columns:
        name = f"{where}.{col.name}"
        if col.name not in obj or obj[col.name] is None:
            if col.required:
                raise BatchError(f"{name} is required ({col.doc})", name)
            arrays.append(pa.nulls(n, ARROW_TYPES[col.kind]))
            continue
        arrays.append(_column(obj[col.name], col, n, name))
    return pa.Table.from_arrays(arrays, names=[c.name for c in columns])


def _column(value: Any, col: Column, n: int, name: str) -> pa.Array:
    typ = ARROW_TYPES[col.kind]
    if not isinstance(value, list):
        if not _scalar_ok(value, col.kind):
            raise BatchError(f"{name} must be {_KIND_NAMES[col.kind]} or a list of them", name)
        if col.nonnegative and value < 0:
            raise BatchError(f"{name} must not be negative (got {value})", name)
        if col.maximum is not None and value > col.maximum:
            raise BatchError(f"{name} must be at most {col.maximum} (got {value})", name)
        return pa.array([value], typ).take(pa.array(np.zeros(n, dtype=np.int64)))
    if col.kind == "str":
        if not all(v is None or isinstance(v, str) for v in value):
            raise BatchError(f"{name} must be a list of strings", name)
        arr = pa.array(value, typ)
    else:
        arr = _numeric(value, col, name)
    if col.required and arr.null_count:
        raise BatchError(f"{name} must not contain nulls", name)
    return arr


def _numeric(value: list, col: Column, name: str) -> pa.Array:
    want = _KIND_NAMES[col.kind]
    try:
        nd = np.asarray(value) if value else np.zeros(0, dtype=np.float64)
    except (ValueError, TypeError):
        raise BatchError(f"{name} must be a flat list of {want.split(' ', 1)[1]}s", name) from None
    kind = nd.dtype.kind if nd.ndim == 1 else "nested"
    if kind in "iu" or (kind == "f" and col.kind == "float"):
        if kind == "f" and not np.isfinite(nd).all():
            raise BatchError(f"{name} must be finite numbers", name)
        if col.nonnegative and nd.size and nd.min() < 0:
            raise BatchError(f"{name} must not be negative (got {nd.min()})", name)
        if kind == "u" and nd.size and nd.max() > np.iinfo(np.int64).max:
            raise BatchError(f"{name} has a value too large for a 64-bit integer", name)
        if col.maximum is not None and nd.size and nd.max() > col.maximum:
            raise BatchError(f"{name} must be at most {col.maximum} (got {nd.max()})"
                             f"{unit_hint(col)}", name)
        return pa.array(nd.astype(np.int64 if col.kind == "int" else np.float64, copy=False))
    if kind == "O":  # nulls or mixed types: check element by element
        for v in value:
            if v is not None and not _scalar_ok(v, col.kind):
                raise BatchError(f"{name} must be a list of {want.split(' ', 1)[1]}s or null "
                                 f"(found {type(v).__name__} {v!r:.40})", name)
        arr = pa.array(value, ARROW_TYPES[col.kind])
        if col.nonnegative and arr.null_count < len(arr) and pc.min(arr).as_py() < 0:
            raise BatchError(f"{name} must not be negative", name)
        if col.maximum is not None and arr.null_count < len(arr) and \
                pc.max(arr).as_py() > col.maximum:
            raise BatchError(f"{name} must be at most {col.maximum}{unit_hint(col)}", name)
        return arr
    raise BatchError(f"{name} must be a list of {want.split(' ', 1)[1]}s "
                     f"(found {nd.dtype.name} values)", name)


def _check_kinds(events: pa.Table) -> None:
    kinds = set(events.column("kind").unique().to_pylist())
    bad = kinds - EVENT_KINDS
    if bad:
        raise BatchError(f"unknown event kind(s) {sorted(bad)}; known: {sorted(EVENT_KINDS)}",
                         "events.kind")


def unit_hint(col: Any) -> str:
    return ("; instants are seconds since the epoch, not milliseconds or nanoseconds"
            if col.unit == "s (epoch)" else "")
