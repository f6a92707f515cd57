"""Generated hostile pushes against the decoders, in-process: every one is refused with a
4xx :class:`BatchError` (or, for a fuzzed body that happens to be valid, accepted), never any
other exception. The generator (:func:`hostile_requests`) is shared with the end-to-end test
that sends 20,000 of them to a real collector (``tests/e2e/test_hostile_ingest.py``).

Categories: decompression and dictionary bombs, row and column floods, 64-bit overflow,
invalid UTF-8 and offsets in Arrow strings, out-of-range instants and durations, missing,
extra and mistyped fields, truncated and bit-flipped Arrow streams, random bytes.
"""

from __future__ import annotations

import copy
import functools
import json
import random
from collections.abc import Iterator

import numpy as np
import orjson
import pyarrow as pa
import pytest

from goodlens.model.batch import BatchError, decode_batch
from goodlens.model.batch_arrow import decode_arrow_batch
from goodlens.model.wire import ARROW, JSON, META_KEY
from tests.harness import step_batch

HOSTILE_RUN = "hostile"
_POOL = [None, True, False, "x", "", [], {}, [[1]], [None], -1, -1e15, 1e300, -1e300,
         2**63, 2**64 - 1, 2**64, -(2**63) - 1, 1.5, "nan", float("nan"), float("inf"),
         "\ud800", "é" * 3000, "x" * 70_000, 4.2e9, 1.7e12, 86_401.0, {"a": [1]}, [1, "a"],
         [2**63, None], [2**64 - 1, 1], [1.0, float("nan")], [-5, 5], ["a", 1]]
_STEP_COLS = ["attempt", "rank", "host", "step", "start_time", "duration_s", "compute_s",
              "collective_wait_s", "data_wait_s", "tokens", "samples", "bogus"]
_EVENT_COLS = ["source", "seq", "kind", "time", "attempt", "rank", "host", "step", "bytes",
               "tier", "cause", "label", "world_size", "detail", "bogus"]
_RUN_FIELDS = ["name", "world_size", "gpus_per_rank", "global_batch", "model_params", "tags",
               "bogus"]
_EXPORTER_FIELDS = ["source", "dropped_rows", "spilled_batches", "rejected_batches", "bogus"]
_TOP = ["schema_version", "run_id", "run", "steps", "events", "exporter", "bogus"]


def base_doc(rng: random.Random) -> dict:
    """A valid batch of the hostile run with steps, events, run and exporter parts."""
    n = rng.randint(1, 4)
    doc = step_batch(HOSTILE_RUN, rng.randint(0, 7), list(range(n)))
    doc["events"] = {"source": "h/1", "seq": list(range(n)), "kind": ["heartbeat"] * n,
                     "time": [1000.0 + i for i in range(n)], "attempt": 0}
    doc["run"] = {"world_size": 8, "name": "h", "tags": {"t": 1}}
    doc["exporter"] = {"source": "h/1", "dropped_rows": 0}
    return doc


def _json_mutation(rng: random.Random) -> dict | list | str:
    doc = base_doc(rng)
    part = rng.choice(["steps", "events", "run", "exporter", "top", "delete"])
    value = copy.deepcopy(rng.choice(_POOL))
    if part == "top":
        doc[rng.choice(_TOP)] = value
    elif part == "delete":
        where = rng.choice(["steps", "events"])
        doc[where].pop(rng.choice(["attempt", "step", "start_time", "duration_s", "rank"])
                       if where == "steps" else rng.choice(["source", "seq", "kind", "time"]),
                       None)
        doc["steps"]["duration_s"] = -1.0  # and a bad value, so it is refused either way
    else:
        fields = {"steps": _STEP_COLS, "events": _EVENT_COLS, "run": _RUN_FIELDS,
                  "exporter": _EXPORTER_FIELDS}[part]
        col = rng.choice(fields)
        if isinstance(value, list) and part in ("steps", "events") and rng.random() < 0.5:
            good = doc[part].get(col)
            n = len(doc[part]["step" if part == "steps" else "seq"])
            value = ([good] * n if not isinstance(good, list) else list(good))[:n]
            if value:
                value[rng.randrange(len(value))] = copy.deepcopy(rng.choice(_POOL))
        doc[part][col] = value
    return doc


def json_body(rng: random.Random) -> bytes:
    """A JSON push with one hostile value (stdlib json: big ints, NaN, lone surrogates)."""
    doc = _json_mutation(rng)
    return json.dumps(doc, allow_nan=True).encode()


def _arrow(table: pa.Table, meta: dict | bytes | None = None, compression: str | None = None
           ) -> bytes:
    raw = meta if isinstance(meta, bytes) else orjson.dumps(
        meta or {"schema_version": 1, "run_id": HOSTILE_RUN})
    table = table.replace_schema_metadata({META_KEY: raw})
    sink = pa.BufferOutputStream()
    opts = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=opts) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _steps_table(n: int, rng: random.Random) -> dict:
    ints = rng.choice([pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint32()])
    return {"attempt": pa.array(np.zeros(n, dtype=np.int64), ints),
            "rank": pa.array(np.full(n, rng.randint(0, 7)), ints),
            "step": pa.array(np.arange(n), pa.int64()),
            "start_time": pa.array(1000.0 + np.arange(n), rng.choice([pa.float32(),
                                                                       pa.float64()])),
            "duration_s": pa.array(np.ones(n)),
            "host": pa.array(["node-0"] * n).dictionary_encode() if rng.random() < 0.5
            else pa.array(["node-0"] * n)}


def _bad_strings(n: int, rng: random.Random) -> bytes:
    """An Arrow push whose ``host`` strings hold invalid UTF-8 or offsets: pyarrow refuses to
    build such an array, so a valid stream is patched where its buffers lie."""
    cols = _steps_table(n, rng)
    cols["host"] = pa.array(["QZQZ"] * n)
    body = bytearray(_arrow(pa.table(cols)))
    if rng.random() < 0.5:
        data = b"QZQZ" * n
        at = body.index(data)
        body[at:at + len(data)] = bytes(rng.choice([0xFF, 0xC0, 0xED, 0x80]) for _ in data)
    else:  # offsets past the data, negative or decreasing
        offsets = (np.arange(n + 1, dtype=np.int32) * 4).tobytes()
        at = body.index(offsets)
        k = rng.randrange(1, n + 1)
        bad = rng.choice([-7, 4 * n + 999, 2**31 - 1, 1 if k > 1 else -1])
        body[at + 4 * k:at + 4 * k + 4] = np.int32(bad).tobytes()
    return bytes(body)


def _value_mutation(cols: dict, n: int, rng: random.Random) -> None:
    col = rng.choice(["attempt", "rank", "step", "start_time", "duration_s", "compute_s",
                      "tokens"])
    if col in ("start_time", "duration_s", "compute_s"):
        bad = rng.choice([float("nan"), float("inf"), -1e15, 1e300, -1.0, 4.2e9, 1.7e12,
                          86_401.0])
        values = np.ones(n) * (1000.0 if col == "start_time" else 1.0)
        values[rng.randrange(n)] = bad
        cols[col] = pa.array(values)
    else:
        values = np.zeros(n, dtype=np.uint64)
        values[rng.randrange(n)] = rng.choice([2**63, 2**64 - 1, 2**24, 2**31])
        cols[col] = pa.array(values, pa.uint64())
        if rng.random() < 0.3:
            cols[col] = pa.array([None] + [2**63] * (n - 1), pa.uint64())


def arrow_body(rng: random.Random) -> bytes:
    """An Arrow push that is hostile in one way (values, schema, metadata or bytes)."""
    n = rng.randint(1, 6)
    cols = _steps_table(n, rng)
    how = rng.choice(["value", "value", "strings", "schema", "meta", "truncate", "flip", "flip"])
    if how == "strings":
        return _bad_strings(n, rng)
    comp = rng.choice([None, None, "zstd", "lz4"])
    if how == "value":
        _value_mutation(cols, n, rng)
    elif how == "schema":
        pick = rng.randrange(5)
        if pick == 0:
            cols["step"] = pa.array([[1]] * n)
        elif pick == 1:
            cols["bogus"] = pa.array(np.ones(n))
        elif pick == 2:
            cols.pop(rng.choice(["attempt", "rank", "step", "start_time", "duration_s"]))
        elif pick == 3:
            cols["rank"] = pa.array([{"a": 1}] * n)
        else:
            cols.update({f"c{k}": pa.array(np.ones(n)) for k in range(70)})
    elif how == "meta":
        doc = _json_mutation(rng)
        doc.pop("steps", None) if isinstance(doc, dict) and rng.random() < 0.8 else None
        return _arrow(pa.table(cols), json.dumps(doc, allow_nan=True).encode(), comp)
    body = _arrow(pa.table(cols), None, comp)
    if how == "truncate":
        return body[:rng.randrange(len(body))]
    if how == "flip":
        raw = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return bytes(raw)
    return body


@functools.cache
def bombs() -> list[tuple[str, str, bytes]]:
    """Bodies of kilobytes to a few megabytes that would expand to gigabytes if decoded
    (built without materialising what they declare)."""
    out = []
    for rows, comp in ((2_000_000, "zstd"), (10_000_000, "zstd"), (5_000_000, "lz4")):
        z = pa.array(np.zeros(rows, dtype=np.int8))
        out.append((f"rows-{rows}-{comp}", ARROW, _arrow(pa.table({
            "attempt": z, "rank": z, "step": z, "start_time": z, "duration_s": z}),
            None, comp)))
    n = 900_000  # under the row limit, over the bytes
    z = pa.array(np.zeros(n, dtype=np.int8))
    big = pa.DictionaryArray.from_arrays(z, pa.array(["x" * 10_000]))
    out.append(("dictionary", ARROW, _arrow(pa.table({
        "attempt": z, "rank": z, "step": z, "start_time": z, "duration_s": z, "host": big}),
        None, "zstd")))
    wide = pa.array(np.zeros(n, dtype=np.float64))  # 40 columns of 7 MB: 290 MB decoded
    out.append(("wide", ARROW, _arrow(pa.table({f"c{k}": wide for k in range(40)}),
                                      None, "zstd")))
    schema = pa.schema([("step", pa.int64())],
                       metadata={META_KEY: b'{"schema_version":1,"run_id":"h"}'})
    empty = pa.record_batch([pa.array([], pa.int64())], schema=schema).serialize()
    out.append(("empty-batches", ARROW, schema.serialize().to_pybytes()
                + empty.to_pybytes() * 250_000 + b"\xff\xff\xff\xff\x00\x00\x00\x00"))
    out.append(("json-values", JSON, b'{"schema_version":1,"run_id":"h","steps":{"step":['
                + b"0," * 9_000_000 + b"0]}}"))
    out.append(("json-rows", JSON, orjson.dumps({
        "schema_version": 1, "run_id": "h", "steps": {
            "attempt": 0, "rank": 0, "step": list(range(1_000_001)), "start_time": 1000.0,
            "duration_s": 1.0}})))
    return out


def hostile_requests(count: int, seed: int = 0) -> Iterator[tuple[str, str, bytes]]:
    """``count`` generated hostile pushes ``(category, content type, body)``: JSON and
    Arrow mutations, random bytes, both content types; bombs are not included (see
    :func:`bombs`: they are few and large, a test sends them on their own)."""
    rng = random.Random(seed)
    for _ in range(count):
        r = rng.random()
        if r < 0.45:
            yield "json", JSON, json_body(rng)
        elif r < 0.93:
            yield "arrow", ARROW, arrow_body(rng)
        else:
            body = rng.randbytes(rng.randint(0, 400))
            if rng.random() < 0.5:
                body = b"\xff\xff\xff\xff" + body
            yield "random", rng.choice([JSON, ARROW]), body


def decode(ctype: str, body: bytes):
    return (decode_arrow_batch if ctype == ARROW else decode_batch)(body)


@pytest.mark.parametrize("seed", [1, 2])
def test_generated_hostile_pushes_are_refused_with_a_4xx(seed: int) -> None:
    refused = accepted = 0
    for category, ctype, body in hostile_requests(1500, seed):
        try:
            decode(ctype, body)
            accepted += 1
        except BatchError as exc:
            assert 400 <= exc.status < 500, (category, exc.status, exc.message)
            assert exc.message
            refused += 1
    assert refused > 0.9 * (refused + accepted), (refused, accepted)


def test_bombs_are_refused_with_413_before_they_are_decoded() -> None:
    import time
    for label, ctype, body in bombs():
        assert len(body) < 64 * 1024 * 1024, label
        t = time.process_time()  # the work done, not the wait for a core on a busy box
        with pytest.raises(BatchError) as info:
            decode(ctype, body)
        assert info.value.status == 413, (label, info.value.message)
        assert info.value.reason == "decoded_too_large"
        assert time.process_time() - t < 5, label  # refused from headers, not decoded
