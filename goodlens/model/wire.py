"""Encoding wire batches: the exporter's side of ``POST /v1/ingest``.

Split from the decoders (:mod:`goodlens.model.batch`, :mod:`goodlens.model.batch_arrow`)
because this side runs inside training: it needs the standard library and pyarrow only (no
numpy, no orjson), so the exporter installs without the server's dependencies. The formats
are documented in ``docs/ingest-api.md``; a batch object is the JSON object described there.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pyarrow as pa

from goodlens.model.schema import STEP_COLUMNS

JSON = "application/json"
ARROW = "application/vnd.apache.arrow.stream"
META_KEY = b"goodlens"
"""Schema-metadata key of an Arrow batch: the rest of the batch object, as JSON."""
ARROW_TYPES = {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}
_KINDS = {c.name: c.kind for c in STEP_COLUMNS}


def _finite(value: Any) -> Any:
    """NaN and infinities as null (JSON has no spelling for them; the collector refuses them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _dumps(doc: dict[str, Any]) -> bytes:
    try:
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a NaN somewhere: the slow path, only then
        text = json.dumps(_finite(doc), separators=(",", ":"))
    return text.encode()


def encode_batch(doc: dict[str, Any]) -> bytes:
    """A batch object as JSON bytes (decoded by :func:`goodlens.model.batch.decode_batch`)."""
    return _dumps(doc)


def encode_arrow_batch(doc: dict[str, Any]) -> bytes:
    """A batch object (as for JSON, with ``steps`` as columns: lists or scalars) as an Arrow
    IPC stream (decoded by :func:`goodlens.model.batch_arrow.decode_arrow_batch`)."""
    doc = dict(doc)
    steps = doc.pop("steps", None)
    if steps:
        n = max((len(v) for v in steps.values() if isinstance(v, list)), default=1)
        cols = {}
        for name, v in steps.items():
            if v is None:
                continue
            cols[name] = pa.array(v if isinstance(v, list) else [v] * n,
                                  ARROW_TYPES.get(_KINDS.get(name, "str")))
        table = pa.table(cols)
    else:
        table = pa.table({})
    table = table.replace_schema_metadata({META_KEY: _dumps(doc)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        if table.num_columns:
            writer.write_table(table)
    return sink.getvalue().to_pybytes()
