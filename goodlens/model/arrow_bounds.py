"""What an Arrow IPC stream expands to, read from its message headers before it is decoded.

Why a module of its own: an Arrow body of a few kilobytes can declare millions of rows, or
zstd/LZ4 buffers that decompress to gigabytes, and pyarrow allocates all of it the moment the
stream is read. The headers of the stream say everything needed beforehand: each record
batch's row count and buffer lengths (flatbuffers, ``format/Message.fbs`` of the Arrow
project), and a compressed buffer starts with its uncompressed length. :func:`scan_stream`
walks the messages (pyarrow frames them without decoding anything) and sums rows and bytes
so the decoder can refuse a push with 413 before spending the memory. Dictionary batches
count too; what a dictionary-encoded column expands to once cast is bounded by the decoder
(:func:`goodlens.model.batch_arrow.dictionary_bytes`), since it depends on the indices.

Every offset read from the headers is checked against the header's length: a hostile header
gets a :class:`~goodlens.model.batch.BatchError` (400), never an exception from here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa

from goodlens.model.batch import BatchError, Limits

MAX_FIELDS = 64
"""Fields (nested ones included) a steps schema may declare: the model has 11 columns."""
MAX_DEPTH = 4
"""Nesting depth of the schema's fields followed before the stream is refused."""
MESSAGE_COST = 1024
"""Bytes one record batch costs decoded beyond its buffers (objects, per-chunk state)..."""
NODE_COST = 256
"""... plus this per column of it: a stream of a million empty batches is a bomb too."""

_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3


class _Flat:
    """Reads tables, scalars and vectors out of one flatbuffer, every offset bounds-checked."""

    def __init__(self, buf: bytes) -> None:
        self.buf = buf

    def read(self, fmt: str, pos: int) -> int:
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > len(self.buf):
            raise BatchError("Arrow message header is malformed (an offset points outside "
                             "it)", None, 400)
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def root(self) -> int:
        return self.read("<I", 0)

    def field(self, table: int, i: int) -> int | None:
        """Position of field ``i`` of the table at ``table``, None when absent."""
        vtable = table - self.read("<i", table)
        size = self.read("<H", vtable)
        if 4 + 2 * i + 2 > size:
            return None
        off = self.read("<H", vtable + 4 + 2 * i)
        return table + off if off else None

    def scalar(self, table: int, i: int, fmt: str, default: int = 0) -> int:
        pos = self.field(table, i)
        return default if pos is None else self.read(fmt, pos)

    def ref(self, table: int, i: int) -> int | None:
        """The table, vector or string field ``i`` points at."""
        pos = self.field(table, i)
        return None if pos is None else pos + self.read("<I", pos)

    def vector(self, table: int, i: int) -> tuple[int, int]:
        """``(position of the first element, element count)`` of a vector field."""
        pos = self.ref(table, i)
        if pos is None:
            return 0, 0
        count = self.read("<I", pos)
        if count > len(self.buf):
            raise BatchError("Arrow message header is malformed (a vector longer than the "
                             "header)", None, 400)
        return pos + 4, count


@dataclass
class StreamSize:
    """What a stream decodes to: step rows, and bytes (buffers decompressed, dictionaries
    and per-batch overhead included)."""

    rows: int = 0
    decoded_bytes: int = 0
    compressed: bool = False
    record_batches: int = 0


def scan_stream(body: bytes, limits: Limits) -> StreamSize:
    """Sum the rows and decoded bytes an Arrow IPC stream declares, without decoding it;
    raises :class:`BatchError` 413 once a limit is passed, 400 for a malformed stream."""
    size = StreamSize()
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(body))
        messages = iter(reader)
        while True:
            try:
                msg = next(messages)
            except StopIteration:
                break
            _account(msg, size)
            if size.rows > limits.max_rows:
                raise BatchError(f"Arrow batch declares more than {limits.max_rows} rows, the "
                                 "most a push may hold; send smaller batches", "steps", 413)
            if size.decoded_bytes > limits.max_decoded_bytes:
                raise BatchError(f"Arrow batch expands to more than {limits.max_decoded_bytes} "
                                 f"bytes once decoded{' (compressed buffers)' * size.compressed}"
                                 "; send smaller batches", None, 413)
    except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
        if isinstance(exc, BatchError):
            raise
        raise BatchError(f"body is not an Arrow IPC stream: {exc}", None, 400) from None
    return size


def _account(msg: pa.ipc.Message, size: StreamSize) -> None:
    flat = _Flat(msg.metadata.to_pybytes())
    message = flat.root()
    kind = flat.scalar(message, 1, "<B")
    header = flat.ref(message, 2)
    if header is None:
        raise BatchError("Arrow message has no header", None, 400)
    if kind == _SCHEMA:
        _count_fields(flat, header, 0, [0])
    elif kind == _RECORD_BATCH:
        size.rows += _batch_bytes(flat, header, msg, size)
        size.record_batches += 1
    elif kind == _DICTIONARY:
        data = flat.ref(header, 1)
        if data is None:
            raise BatchError("Arrow dictionary batch has no data", None, 400)
        _batch_bytes(flat, data, msg, size)
    else:
        raise BatchError(f"Arrow message of type {kind} is not accepted (schema, dictionary "
                         "and record batches only)", None, 400)


def _count_fields(flat: _Flat, table: int, depth: int, seen: list[int]) -> None:
    """Refuse a schema with more than :data:`MAX_FIELDS` fields or deeper than
    :data:`MAX_DEPTH` (the table is a Schema at depth 0, a Field below)."""
    if depth > MAX_DEPTH:
        raise BatchError(f"Arrow schema nests deeper than {MAX_DEPTH} levels; steps columns "
                         "are flat", "steps", 422)
    start, count = flat.vector(table, 1 if depth == 0 else 5)
    seen[0] += count
    if seen[0] > MAX_FIELDS:
        raise BatchError(f"Arrow schema declares more than {MAX_FIELDS} columns", "steps", 422)
    for k in range(count):
        pos = start + 4 * k
        _count_fields(flat, pos + flat.read("<I", pos), depth + 1, seen)


def _batch_bytes(flat: _Flat, batch: int, msg: pa.ipc.Message, size: StreamSize) -> int:
    """Add what one (dictionary or record) batch decodes to to ``size``; its row count."""
    rows = flat.scalar(batch, 0, "<q")
    node_start, nodes = flat.vector(batch, 1)
    for k in range(nodes):
        length = flat.read("<q", node_start + 16 * k)
        if length < 0 or length > max(rows, 0):
            raise BatchError(f"Arrow batch has a column of {length} values in a batch of "
                             f"{rows} rows", None, 400)
    if rows < 0:
        raise BatchError(f"Arrow batch declares {rows} rows", None, 400)
    compressed = flat.ref(batch, 3) is not None
    size.compressed = size.compressed or compressed
    body = msg.body
    body_len = 0 if body is None else body.size
    start, count = flat.vector(batch, 2)
    total = MESSAGE_COST + NODE_COST * nodes
    for k in range(count):
        offset = flat.read("<q", start + 16 * k)
        length = flat.read("<q", start + 16 * k + 8)
        if offset < 0 or length < 0 or offset + length > body_len:
            raise BatchError("Arrow batch has a buffer outside its message body", None, 400)
        if compressed and length >= 8:
            declared = struct.unpack_from("<q", body, offset)[0]  # type: ignore[arg-type]
            length = length - 8 if declared == -1 else declared
            if length < 0:
                raise BatchError("Arrow batch has a compressed buffer of negative length",
                                 None, 400)
        total += length
    size.decoded_bytes += total
    return rows
