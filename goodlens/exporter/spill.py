"""Batches an exporter keeps on disk: its spill file (waiting for the collector) and its
dead-letter file (set aside after too many failed tries, for ``goodlens deadletter``).

Both are sequences of records: a header, then the body of one wire batch. A record's header
(``G2``) carries the content type, the batch's rows, how often sending it failed, the last
HTTP status, when it first failed and, in a dead-letter file, why it was set aside. Records
of the first format (``GL``: content type and length only) are still read. A record torn by
a crash mid-write ends the readable part of a file.

Also here: splitting a batch the collector refused into two halves, so one unstorable row
does not take the good rows of its batch with it.
"""

from __future__ import annotations

import fcntl
import glob
import json
import logging
import os
import struct
import time
from dataclasses import dataclass

from goodlens.exporter.private import UnsafePath, open_private, read_private, size_of
from goodlens.model.wire import ARROW, JSON, META_KEY, encode_arrow_batch, encode_batch

log = logging.getLogger("goodlens.exporter")

KINDS = (JSON, ARROW)
_V1 = struct.Struct(">2sBI")  # magic, format (index in KINDS), body length
_V2 = struct.Struct(">2sBBIIHdHI")  # magic, format, 0, rows, tries, status, born, note, body
DEAD = ".deadletter"


@dataclass
class Record:
    """One batch kept on disk (or about to be)."""

    kind: str
    """Content type: JSON or Arrow IPC."""
    body: bytes
    rows: int = 0
    """Step and event rows in it (0: unknown, a first-format record)."""
    tries: int = 0
    """Sends that failed with an answer saying this batch could not be stored (5xx)."""
    born: float = 0.0
    """When sending it first failed (epoch seconds; 0: not yet)."""
    status: int = 0
    """The last HTTP status it got (0: none, or no answer)."""
    note: str = ""
    """Why it was set aside (dead-letter files)."""
    offset: int = 0
    """Where its header starts in the file it was read from."""
    v2: bool = True

    def encode(self) -> bytes:
        note = self.note.encode()[:2000]
        return _V2.pack(b"G2", KINDS.index(self.kind), 0, self.rows, self.tries, self.status,
                        self.born, len(note), len(self.body)) + note + self.body


def parse(data: bytes) -> tuple[list[Record], int]:
    """The whole records at the start of ``data`` and the length they cover."""
    out, pos = [], 0
    while pos + _V1.size <= len(data):
        magic = data[pos:pos + 2]
        if magic == b"GL":
            _, kind, length = _V1.unpack_from(data, pos)
            start, rec = pos + _V1.size, None
            if kind < len(KINDS):
                rec = Record(KINDS[kind], b"", offset=pos, v2=False)
        elif magic == b"G2" and pos + _V2.size <= len(data):
            _, kind, _, rows, tries, status, born, nlen, length = _V2.unpack_from(data, pos)
            start, rec = pos + _V2.size + nlen, None
            if kind < len(KINDS):
                rec = Record(KINDS[kind], b"", rows, tries, born, status,
                             data[pos + _V2.size:start].decode("utf-8", "replace"), pos)
        else:
            break
        end = start + length
        if rec is None or end > len(data):
            break
        rec.body = data[start:end]
        out.append(rec)
        pos = end
    return out, pos


def whole_records(data: bytes) -> int:
    """Length of the prefix of spill-file bytes made of whole records (a crash mid-write
    leaves a torn last record)."""
    return parse(data)[1]


def update_header(path: str, rec: Record) -> None:
    """Write a second-format record's header again in place (its tries, status, birth)."""
    fd = open_private(path, os.O_WRONLY)
    try:
        os.pwrite(fd, rec.encode()[:_V2.size], rec.offset)
    finally:
        os.close(fd)


def append(path: str, data: bytes, lock: bool = False) -> None:
    """Append ``data`` in one write (``lock``: under the file's ``flock``, as dead-letter
    files are, which ``goodlens deadletter resend`` moves away meanwhile)."""
    while True:
        fd = open_private(path, os.O_WRONLY | os.O_APPEND, create=True)
        try:
            if lock:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    if os.fstat(fd).st_ino != os.lstat(path).st_ino:
                        continue  # moved away while we waited: append to the new one
                except FileNotFoundError:
                    continue
            os.write(fd, data)
            return
        finally:
            os.close(fd)


def rewrite(path: str, parts: list[bytes]) -> None:
    """Replace the file at ``path`` by ``parts`` (a fresh file renamed over it)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = open_private(tmp, os.O_WRONLY, create=True)
    with os.fdopen(fd, "wb") as f:
        for part in parts:
            f.write(part)
    os.replace(tmp, path)


def dead_letter_path(spill_path: str) -> str:
    """The dead-letter file beside a spill file."""
    return spill_path.removesuffix(".jsonl") + DEAD


def dead_letter_files(folder: str) -> list[str]:
    """The dead-letter files in a spill directory, by name."""
    return sorted(glob.glob(os.path.join(glob.escape(folder), "*" + DEAD)))


def take_records(path: str) -> tuple[str, list[Record]]:
    """Move a dead-letter file aside (exporters append to a new one meanwhile) and read
    it; returns the moved file's path and its records. :func:`put_back` the rest."""
    moved = f"{path}.{os.getpid()}.resend"
    fd = open_private(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.replace(path, moved)
    finally:
        os.close(fd)
    return moved, parse(read_private(moved))[0]


def put_back(path: str, moved: str, records: list[Record]) -> None:
    """Append ``records`` to the dead-letter file ``path`` again and remove ``moved``."""
    if records:
        append(path, b"".join(r.encode() for r in records), lock=True)
    os.unlink(moved)


def claim_spill(folder: str, stem: str) -> tuple[str, int | None]:
    """A spill file for one process: ``folder/stem.jsonl`` when no live process holds it
    (an ``flock`` on its ``.lock``), else ``folder/stem-<pid>.jsonl``. The winner of the
    shared name also adopts what dead processes left in ``stem-<pid>.jsonl`` files (whole
    records appended to its own file), so a restarted rank delivers its predecessors'
    leftovers. Returns the path and the lock's file descriptor (keep it open)."""
    def lock(path: str) -> int | None:
        fd = open_private(path + ".lock", os.O_RDWR, create=True)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            os.close(fd)
            return None
    shared = os.path.join(folder, f"{stem}.jsonl")
    fd = lock(shared)
    odd = os.path.islink(shared) or (os.path.lexists(shared) and not os.path.isfile(shared))
    if fd is not None and odd:
        log.warning("goodlens: %s is not a regular file; spilling to a file of this "
                    "process instead", shared)
        if fd is not None:
            os.close(fd)
        fd = None
    if fd is None:  # another live process has this rank's file: use one of our own
        own = os.path.join(folder, f"{stem}-{os.getpid()}.jsonl")
        return own, lock(own)
    pattern = os.path.join(glob.escape(folder), f"{glob.escape(stem)}-*.jsonl")
    for orphan in sorted(glob.glob(pattern)):
        if not orphan[len(shared) - len(".jsonl") + 1:-len(".jsonl")].isdigit():
            continue  # another stem that starts like ours, not a pid
        ofd = lock(orphan)
        if ofd is None:
            continue  # still alive
        try:
            data = read_private(orphan)
            append(shared, data[:whole_records(data)])
            os.remove(orphan)
            os.remove(orphan + ".lock")
        except OSError as exc:
            log.warning("goodlens: could not adopt spill file %s: %s", orphan, exc)
        finally:
            os.close(ofd)
    return shared, fd


# ----------------------------------------------------------------------------- splitting


def decode_doc(body: bytes, kind: str) -> dict:
    """A wire batch as its batch object (``steps`` as columns of lists)."""
    if kind == JSON:
        doc = json.loads(body)
    else:
        import pyarrow as pa
        table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
        doc = json.loads((table.schema.metadata or {})[META_KEY])
        if table.num_columns:
            doc["steps"] = table.to_pydict()
    if not isinstance(doc, dict):
        raise ValueError("a batch is a JSON object")
    return doc


def _length(cols: object) -> int:
    if not isinstance(cols, dict):
        return 0
    return max((len(v) for v in cols.values() if isinstance(v, list)), default=0)


def count_rows(doc: dict) -> tuple[int, int]:
    """(step rows, event rows) of a batch object."""
    return _length(doc.get("steps")), _length(doc.get("events"))


def _half(cols: dict, a: int, b: int) -> dict:
    return {k: v[a:b] if isinstance(v, list) else v for k, v in cols.items()}


def split_batch(body: bytes, kind: str, table: str | None = None) -> list[tuple[bytes, int]]:
    """Two batches holding the rows of one (steps and events apart, else each table's
    first and second half), each with the run metadata and exporter counters, encoded as
    it was; ``table`` (``steps`` or ``events``, the refused field's) is split first. Empty
    when there is nothing to split (one row, or a body that does not decode)."""
    try:
        doc = decode_doc(body, kind)
    except (ValueError, KeyError, TypeError, OSError, ImportError):
        return []
    n_steps, n_events = count_rows(doc)
    base = {k: v for k, v in doc.items() if k not in ("steps", "events")}
    if n_steps and n_events:
        parts = [{**base, "steps": doc["steps"]}, {**base, "events": doc["events"]}]
        if table == "events":
            parts.reverse()
    elif n_steps > 1 or n_events > 1:
        name, n = ("steps", n_steps) if n_steps > 1 else ("events", n_events)
        parts = [{**base, name: _half(doc[name], 0, n // 2)},
                 {**base, name: _half(doc[name], n // 2, n)}]
    else:
        return []
    encode = encode_batch if kind == JSON else encode_arrow_batch
    try:
        return [(encode(p), sum(count_rows(p))) for p in parts]
    except (ValueError, TypeError, OverflowError) as exc:
        log.debug("goodlens: could not split a batch: %s", exc)
        return []


def rows_of(rec: Record) -> int:
    """A record's rows, counted from its body when its header does not say."""
    if rec.rows or not rec.body:
        return rec.rows
    try:
        return sum(count_rows(decode_doc(rec.body, rec.kind)))
    except (ValueError, KeyError, TypeError, OSError, ImportError):
        return 0


def describe(rec: Record) -> dict:
    """What ``goodlens deadletter list/show`` print about a record."""
    info: dict = {"content_type": rec.kind, "bytes": len(rec.body), "rows": rows_of(rec),
                  "tries": rec.tries, "status": rec.status or None, "reason": rec.note,
                  "first_failed": rec.born or None,
                  "age_s": round(time.time() - rec.born, 3) if rec.born else None}
    try:
        doc = decode_doc(rec.body, rec.kind)
        steps = doc.get("steps") or {}
        info.update(run_id=doc.get("run_id"), steps=count_rows(doc)[0],
                    events=count_rows(doc)[1])
        if isinstance(steps.get("step"), list) and steps["step"]:
            info.update(first_step=min(steps["step"]), last_step=max(steps["step"]))
    except (ValueError, KeyError, TypeError, OSError, ImportError, AttributeError):
        info["undecodable"] = True
    return info


__all__ = ["KINDS", "Record", "UnsafePath", "append", "claim_spill", "count_rows",
           "dead_letter_files", "dead_letter_path", "decode_doc", "describe", "parse",
           "put_back", "rewrite", "rows_of", "size_of", "split_batch", "take_records",
           "update_header", "whole_records"]
