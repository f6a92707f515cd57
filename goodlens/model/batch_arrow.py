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
Validation is the same (:func:`goodlens.model.batch.check_values`): unknown columns, wrong
types, nulls in required columns, values out of range or non-finite numbers are refused with
the field named; so are strings with invalid UTF-8 or offsets (every column is fully
validated before it is read). What a stream expands to (rows, decompressed buffers,
dictionaries) is bounded before it is decoded (:mod:`goodlens.model.arrow_bounds`).
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from goodlens.model.arrow_bounds import scan_stream
from goodlens.model.batch import (
    DEFAULT_LIMITS,
    Batch,
    BatchError,
    Limits,
    check_values,
    decode_batch,
    refusing,
    validate_batch,
)
from goodlens.model.schema import STEP_COLUMNS, Column
from goodlens.model.wire import ARROW, ARROW_TYPES, JSON, META_KEY

_COLUMNS = {c.name: c for c in STEP_COLUMNS}


@refusing
def decode_arrow_batch(body: bytes, limits: Limits = DEFAULT_LIMITS) -> Batch:
    """Parse and validate an Arrow IPC wire batch; raises :class:`BatchError`. What the
    stream expands to is bounded from its headers before anything is decoded."""
    size = scan_stream(body, limits)
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(body))
        table = reader.read_all()
    except (pa.ArrowException, OSError) as exc:
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
    batch = validate_batch(doc, limits, table.num_rows)
    if table.num_columns:
        batch.steps = arrow_steps(table, limits, limits.max_decoded_bytes - size.decoded_bytes)
    return batch


def dictionary_bytes(arr: pa.ChunkedArray) -> int:
    """What a dictionary-encoded column takes once cast to its value type (a 10 KB string
    behind a million indices is 10 GB): exact for strings, 8 bytes a value otherwise."""
    total = 0
    for chunk in arr.chunks:
        values = chunk.dictionary
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type) or \
                pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
            lengths = pc.binary_length(values).fill_null(0)
            total += (pc.sum(lengths.take(chunk.indices)).as_py() or 0) + 8 * len(chunk)
        else:
            total += 8 * len(chunk)
    return total


def arrow_steps(table: pa.Table, limits: Limits = DEFAULT_LIMITS,
                budget: int | None = None) -> pa.Table:
    """Validate and normalise a steps table: model columns, order and types; ``budget``:
    bytes its dictionary-encoded columns may expand to (413 beyond)."""
    names = table.column_names
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BatchError(f"column steps.{twice[0]} appears more than once", f"steps.{twice[0]}")
    unknown = [n for n in names if n not in _COLUMNS]
    if unknown:
        raise BatchError(f"unknown column steps.{unknown[0]}; known: {sorted(_COLUMNS)}",
                         f"steps.{unknown[0]}")
    budget = limits.max_decoded_bytes if budget is None else budget
    for name in names:  # every column checked and bounded before any is cast
        arr = table.column(name)
        try:
            arr.validate(full=True)  # offsets, UTF-8, dictionary indices: before any use
        except pa.ArrowException as exc:
            raise BatchError(f"steps.{name} holds invalid Arrow data: {exc}",
                             f"steps.{name}") from None
        if pa.types.is_dictionary(arr.type):
            budget -= dictionary_bytes(arr)
            if budget < 0:
                raise BatchError(f"steps.{name} is dictionary-encoded and expands to more "
                                 f"than the {limits.max_decoded_bytes} bytes a push may decode "
                                 "to; send smaller batches", f"steps.{name}", 413)
    arrays = []
    for col in STEP_COLUMNS:
        name = f"steps.{col.name}"
        if col.name not in names:
            if col.required:
                raise BatchError(f"{name} is required ({col.doc})", name)
            arrays.append(pa.nulls(table.num_rows, ARROW_TYPES[col.kind]))
            continue
        arr = _cast(table.column(col.name), col, name)
        check_values(arr, col, name, limits)
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, names=[c.name for c in STEP_COLUMNS])


def _cast(arr: pa.ChunkedArray, col: Column, name: str) -> pa.Array:
    """One validated column as one array of the column's Arrow type (422 if it cannot be)."""
    typ = arr.type
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    ok = {"int": pa.types.is_integer(typ),
          "float": pa.types.is_integer(typ) or pa.types.is_floating(typ),
          "str": pa.types.is_string(typ) or pa.types.is_large_string(typ)}[col.kind]
    if not ok and not pa.types.is_null(typ):
        raise BatchError(f"{name} must be {col.kind} (got Arrow type {typ})", name)
    try:
        if pa.types.is_dictionary(arr.type):
            arr = arr.cast(typ)
        arr = arr.cast(ARROW_TYPES[col.kind])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise BatchError(f"{name} does not fit a {col.kind} column: {exc}", name) from None
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


DECODERS = {JSON: decode_batch, ARROW: decode_arrow_batch}
"""The push decoder for each accepted ``Content-Type`` (the collector's and the relay's)."""
