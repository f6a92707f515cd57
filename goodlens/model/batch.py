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

Every value is checked against its column (:func:`check_values`, shared with the Arrow
decoder): integers fit 64 bits and lie in the column's range, floats are finite, instants
lie in the window of :class:`Limits`, durations and waits between 0 and its maximum, strings
no longer than the column allows. A push may hold at most ``Limits.max_rows`` rows and
expand to at most ``Limits.max_decoded_bytes`` (413 otherwise, before the memory is spent).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from goodlens.model.schema import (
    EVENT_COLUMNS,
    EVENT_KINDS,
    MAX_DURATION_S,
    MAX_EPOCH_S,
    MAX_INT,
    MIN_EPOCH_S,
    RESTORE_PHASES,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    STEP_COLUMNS,
    Column,
    EventKind,
)
from goodlens.model.wire import ARROW_TYPES

_TOP_LEVEL = {"schema_version", "run_id", "run", "steps", "events", "exporter"}
_EXPORTER_FIELDS = {"source": str, "dropped_rows": int, "spilled_batches": int,
                    "rejected_batches": int}
MAX_RUN_ID = 256
MAX_SOURCE = 256
"""Longest ``exporter.source`` (characters)."""
JSON_BYTES_PER_VALUE = 32
"""What one JSON value costs once parsed (a Python float and its list slot): a JSON body with
more values than ``max_decoded_bytes / 32`` is refused before it is parsed."""


@dataclass(frozen=True)
class Limits:
    """What one push may hold and the window its values must lie in (a collector's settings;
    the defaults are the collector's defaults)."""

    max_rows: int = 1_000_000
    """Step plus event rows of one push."""
    max_decoded_bytes: int = 256 * 1024 * 1024
    """What a push may expand to once decoded: decompressed Arrow buffers, dictionaries
    expanded, JSON values parsed."""
    max_duration_s: float = MAX_DURATION_S
    """Longest step duration or wait (``*_s`` columns)."""
    min_epoch_s: float = MIN_EPOCH_S
    """Earliest instant (``start_time``, ``time``), seconds since the epoch."""
    max_epoch_s: float = MAX_EPOCH_S
    """Latest instant."""


DEFAULT_LIMITS = Limits()


class BatchError(ValueError):
    """A refused batch: ``field`` names the offending part, ``status`` the HTTP code."""

    def __init__(self, message: str, field: str | None = None, status: int = 422) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.status = status

    @property
    def reason(self) -> str:
        """The rejection reason counted on ``/metrics``: ``decoded_too_large`` for a 413 (the
        body was within the size limit, what it expands to is not), else ``invalid``."""
        return "decoded_too_large" if self.status == 413 else "invalid"

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


def refusing(decode: Callable[..., Batch]) -> Callable[..., Batch]:
    """A decoder that raises nothing but :class:`BatchError`: whatever else escapes decoding
    (a pyarrow or numpy error on a value nobody foresaw) is a 400 naming it, never a 500
    that an exporter would retry forever; running out of memory is a 413."""
    @functools.wraps(decode)
    def wrapper(body: bytes, *args: Any, **kwargs: Any) -> Batch:
        try:
            return decode(body, *args, **kwargs)
        except BatchError:
            raise
        except MemoryError:
            raise BatchError("batch is too large to decode; send smaller batches", None,
                             413) from None
        except Exception as exc:
            raise BatchError(f"batch could not be decoded: {type(exc).__name__}: "
                             f"{str(exc)[:300]}", None, 400) from None
    return wrapper


@refusing
def decode_batch(body: bytes, limits: Limits = DEFAULT_LIMITS) -> Batch:
    """Parse and validate one wire batch; raises :class:`BatchError` saying what is wrong."""
    values = body.count(b",") + 1  # an upper bound of the values in it
    if values * JSON_BYTES_PER_VALUE > limits.max_decoded_bytes:
        raise BatchError(f"batch holds up to {values} JSON values, more than the "
                         f"{limits.max_decoded_bytes} bytes a push may expand to allow; send "
                         "smaller batches", None, 413)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BatchError(f"body is not valid JSON: {exc}", None, 400) from None
    return validate_batch(doc, limits)


def validate_batch(doc: Any, limits: Limits = DEFAULT_LIMITS, rows: int = 0) -> Batch:
    """Validate an already-decoded batch object (see the module docstring for the format);
    ``rows``: rows of the push already decoded elsewhere (Arrow step rows)."""
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
        batch.steps = columns_to_table(doc["steps"], STEP_COLUMNS, "steps", limits, rows)
        rows += batch.steps.num_rows
    if doc.get("events") is not None:
        batch.events = columns_to_table(doc["events"], EVENT_COLUMNS, "events", limits, rows)
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
        if value is not None:
            if not _scalar_ok(value, col.kind):
                raise BatchError(f"run.{key} must be {_want(col)}", f"run.{key}")
            check_values(pa.array([value], ARROW_TYPES[col.kind]), col, f"run.{key}",
                         DEFAULT_LIMITS)
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
            value = obj[key]
            if not isinstance(value, typ) or isinstance(value, bool):
                raise BatchError(f"exporter.{key} must be {typ.__name__}", f"exporter.{key}")
            if typ is int and not 0 <= value <= MAX_INT:
                raise BatchError(f"exporter.{key} must be between 0 and {MAX_INT} "
                                 f"(got {value})", f"exporter.{key}")
            if typ is str and not 0 < len(value) <= MAX_SOURCE:
                raise BatchError(f"exporter.{key} must be a non-empty string of at most "
                                 f"{MAX_SOURCE} characters", f"exporter.{key}")
            out[key] = value
    return out


_KIND_NAMES = {"int": "an integer", "float": "a number", "str": "a string"}


def _want(col: Column) -> str:
    """What a value of the column must be, as a message says it."""
    return {"int": f"an integer from {-MAX_INT - 1} to {MAX_INT} (64 bits)",
            "float": "a finite number", "str": "a string"}[col.kind]


def _scalar_ok(value: Any, kind: str) -> bool:
    """Whether a JSON value has the column's type (integers: one that fits 64 bits)."""
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int) and -MAX_INT - 1 <= value <= MAX_INT
    if kind == "float":
        return (isinstance(value, float) and math.isfinite(value)) or (
            isinstance(value, int) and abs(value) <= MAX_INT)
    return isinstance(value, str)


def bounds(col: Column, limits: Limits) -> tuple[float | None, float | None]:
    """The smallest and largest value of a numeric column (None: no bound but finiteness)."""
    if col.kind == "int":
        return (0 if col.nonnegative else -MAX_INT - 1,
                MAX_INT if col.maximum is None else col.maximum)
    if col.unit == "s (epoch)":
        return (limits.min_epoch_s, limits.max_epoch_s if col.maximum is None
                else min(col.maximum, limits.max_epoch_s))
    hi = limits.max_duration_s if col.unit == "s" else col.maximum
    return (0.0 if col.nonnegative else None), hi


def check_values(arr: pa.Array, col: Column, name: str, limits: Limits) -> None:
    """Refuse (422, ``name`` named) the first value of ``arr`` its column does not allow:
    nulls where required, non-finite floats, values outside :func:`bounds`, too long
    strings. ``arr`` has the column's Arrow type and has been validated."""
    if col.required and arr.null_count:
        raise BatchError(f"{name} must not contain nulls", name)
    if arr.null_count == len(arr):
        return
    if col.kind == "str":
        longest = pc.max(pc.binary_length(arr)).as_py()
        if longest > col.max_len:
            raise BatchError(f"{name} values must be at most {col.max_len} bytes of UTF-8 "
                             f"(got one of {longest})", name)
        return
    if col.kind == "float" and not pc.all(pc.is_finite(arr)).as_py():
        raise BatchError(f"{name} must be finite numbers (no NaN or infinity)", name)
    lo, hi = bounds(col, limits)
    mm = pc.min_max(arr)
    low, high = mm["min"].as_py(), mm["max"].as_py()
    if lo is not None and low < lo:
        if lo == 0:
            raise BatchError(f"{name} must not be negative (got {low}){unit_hint(col)}", name)
        raise BatchError(f"{name} must be at least {lo} (got {low}){unit_hint(col)}", name)
    if hi is not None and high > hi:
        raise BatchError(f"{name} must be at most {hi} (got {high}){unit_hint(col)}", name)


def columns_to_table(obj: Any, columns: tuple[Column, ...], where: str,
                     limits: Limits = DEFAULT_LIMITS, rows: int = 0) -> pa.Table:
    """Columnar JSON (lists or broadcast scalars) to an Arrow table with every model column;
    ``rows``: rows of the push before these (the push may hold ``limits.max_rows``)."""
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
    if rows + n > limits.max_rows:
        raise BatchError(f"batch holds {rows + n} rows, more than the {limits.max_rows} a push "
                         "may hold; send smaller batches", where, 413)
    arrays = []
    for col in columns:
        name = f"{where}.{col.name}"
        if col.name not in obj or obj[col.name] is None:
            if col.required:
                raise BatchError(f"{name} is required ({col.doc})", name)
            arrays.append(pa.nulls(n, ARROW_TYPES[col.kind]))
            continue
        arr = _column(obj[col.name], col, name)
        check_values(arr, col, name, limits)
        if not isinstance(obj[col.name], list):
            arr = arr.take(pa.array(np.zeros(n, dtype=np.int64)))
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, names=[c.name for c in columns])


def _column(value: Any, col: Column, name: str) -> pa.Array:
    """One JSON column as an Arrow array of the column's type (a scalar: one value), its
    values unchecked but of the right type."""
    typ = ARROW_TYPES[col.kind]
    want = _KIND_NAMES[col.kind]
    if not isinstance(value, list):
        if not _scalar_ok(value, col.kind):
            raise BatchError(f"{name} must be {_want(col)}, or a list of them", name)
        return pa.array([value], typ)
    if col.kind == "str":
        if not all(v is None or isinstance(v, str) for v in value):
            raise BatchError(f"{name} must be a list of strings", name)
        return pa.array(value, typ)
    try:
        nd = np.asarray(value) if value else np.zeros(0, dtype=np.float64)
    except (ValueError, TypeError, OverflowError):
        raise BatchError(f"{name} must be a flat list of {want.split(' ', 1)[1]}s", name) from None
    kind = nd.dtype.kind if nd.ndim == 1 else "nested"
    if kind in "iu" or (kind == "f" and col.kind == "float"):
        if kind == "u" and nd.size and nd.max() > MAX_INT:
            raise BatchError(f"{name} has a value too large for a 64-bit integer "
                             f"(got {nd.max()})", name)
        return pa.array(nd.astype(np.int64 if col.kind == "int" else np.float64, copy=False))
    if kind == "f" and col.kind == "int" and all(isinstance(v, int) for v in value):
        raise BatchError(f"{name} has a value too large for a 64-bit integer", name)
    if kind == "O":  # nulls or mixed types: check element by element
        for v in value:
            if v is not None and not _scalar_ok(v, col.kind):
                raise BatchError(f"{name} must be a list of {want.split(' ', 1)[1]}s or null "
                                 f"(found {type(v).__name__} {v!r:.40}"
                                 f"{', beyond 64 bits' if isinstance(v, int) else ''})", name)
        return pa.array(value, typ)
    raise BatchError(f"{name} must be a list of {want.split(' ', 1)[1]}s "
                     f"(found {nd.dtype.name} values)", name)


def _check_kinds(events: pa.Table) -> None:
    kinds = set(events.column("kind").unique().to_pylist())
    bad = kinds - EVENT_KINDS
    if bad:
        raise BatchError(f"unknown event kind(s) {sorted(bad)}; known: {sorted(EVENT_KINDS)}",
                         "events.kind")
    if EventKind.CKPT_RESTORE_PROGRESS in kinds:
        progress = pc.equal(events.column("kind"), EventKind.CKPT_RESTORE_PROGRESS.value)
        labels = events.column("label") if "label" in events.column_names else None
        phases = (set() if labels is None else
                  set(labels.filter(progress).unique().to_pylist()))
        if labels is None or phases - set(RESTORE_PHASES):
            raise BatchError(f"ckpt_restore_progress needs label one of {list(RESTORE_PHASES)} "
                             f"(the restore's phase; found {sorted(map(str, phases))})",
                             "events.label")


def unit_hint(col: Any) -> str:
    """What a range error should remind the sender of: the column's unit."""
    if col.unit == "s (epoch)":
        return "; instants are seconds since the epoch, not milliseconds or nanoseconds"
    return "; durations are seconds" if col.unit == "s" else ""
