"""Arrow IPC wire batches: the fast path for step rows.

JSON (:mod:`goodlens.model.batch`) is the universal format: any language, curl, a human. Parsing
it costs the collector about half a microsecond per row in Python, which caps one collector
well below a million rows per second. The same batch as an Arrow IPC stream
(``Content-Type: application/vnd.apache.arrow.stream``) decodes without touching each value
in Python; the goodlens exporter sends it by default.

The stream's record batches are the ``steps`` rows (columns as in ``docs/data-model.md``;
integer, floating and (dictionary-)string types are accepted and cast). Everything else of
the batch (``schema_version``, ``run_id``, ``run``, ``events``, ``exporter``) is the JSON
object of the JSON format, minus ``steps``, stored in the schema metadata under ``goodlens``.
Validation is the same: unknown columns, wrong types, nulls in required columns, negative
durations or non-finite numbers are refused with the field named.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from goodlens.model.batch import Batch, BatchError, decode_batch, unit_hint, validate_batch
from goodlens.model.schema import STEP_COLUMNS
from goodlens.model.wire import ARROW, ARROW_TYPES, JSON, META_KEY

_COLUMNS = {c.name: c for c in STEP_COLUMNS}


def decode_arrow_batch(body: bytes) -> Batch:
    """Parse and validate an Arrow IPC wire batch; raises :class:`BatchError`."""
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(body))
        table = reader.read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise BatchError(f"body is not an Arrow IPC stream: {exc}", None, 400) from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise BatchError("Arrow batch lacks the 'goodlens' schema metadata (schema_version, "
                         "run_id, ...)", "metadata", 400)
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BatchError(f"'goodlens' metadata is not JSON: {exc}", "metadata", 400) from None
    if not isinstance(doc, dict):
        raise BatchError("'goodlens' metadata must be a JSON object", "metadata", 400)
    if "steps" in doc:
        raise BatchError("steps travel as the Arrow record batches, not in the metadata",
                         "steps")
    batch = validate_batch(doc)
    if table.num_columns:
        batch.steps = arrow_steps(table)
    return batch


def arrow_steps(table: pa.Table) -> pa.Table:
    """Validate and normalise a steps table: model columns, order and types."""
    names = table.column_names
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BatchError(f"column steps.{twice[0]} appears more than once", f"steps.{twice[0]}")
    unknown = [n for n in names if n not in _COLUMNS]
    if unknown:
        raise BatchError(f"unknown column steps.{unknown[0]}; known: {sorted(_COLUMNS)}",
                         f"steps.{unknown[0]}")
    n = table.num_rows
    arrays = []
    for col in STEP_COLUMNS:
        name = f"steps.{col.name}"
        if col.name not in table.column_names:
            if col.required:
                raise BatchError(f"{name} is required ({col.doc})", name)
            arrays.append(pa.nulls(n, ARROW_TYPES[col.kind]))
            continue
        arr = table.column(col.name)
        typ = arr.type
        if pa.types.is_dictionary(typ):
            arr, typ = arr.cast(typ.value_type), typ.value_type
        ok = {"int": pa.types.is_integer(typ),
              "float": pa.types.is_integer(typ) or pa.types.is_floating(typ),
              "str": pa.types.is_string(typ) or pa.types.is_large_string(typ)}[col.kind]
        if not ok and not pa.types.is_null(typ):
            raise BatchError(f"{name} must be {col.kind} (got Arrow type {typ})", name)
        try:
            arr = arr.cast(ARROW_TYPES[col.kind])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise BatchError(f"{name} does not fit a {col.kind} column: {exc}", name) from None
        if col.required and arr.null_count:
            raise BatchError(f"{name} must not contain nulls", name)
        if arr.null_count < n and n:
            if col.kind == "float" and not pc.all(pc.is_finite(arr)).as_py():
                raise BatchError(f"{name} must be finite numbers", name)
            if col.nonnegative and pc.min(arr).as_py() < 0:
                raise BatchError(f"{name} must not be negative", name)
            if col.maximum is not None and pc.max(arr).as_py() > col.maximum:
                raise BatchError(f"{name} must be at most {col.maximum}{unit_hint(col)}", name)
        arrays.append(arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr)
    return pa.Table.from_arrays(arrays, names=[c.name for c in STEP_COLUMNS])


DECODERS = {JSON: decode_batch, ARROW: decode_arrow_batch}
"""The push decoder for each accepted ``Content-Type`` (the collector's and the relay's)."""
