"""Parquet segment files: written whole, made durable, never overwritten.

Why a module of its own: the Parquet dataset's correctness without coordination rests on how
its files appear (see :mod:`goodlens.storage.parquet`): every collector names its files
``<writer id>-<process token>-<sequence>.parquet`` and publishes them with a hard link, which
fails rather than replace an existing name; a segment is written to a hidden temporary name,
fsynced, then linked into place, and the directories are fsynced (new partition folders
included), so a reader sees a whole segment or none, and an acknowledged segment survives a
power loss. This module is that file discipline and nothing else.
"""

from __future__ import annotations

import itertools
import os
import string
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def hour_of(t: np.ndarray) -> np.ndarray:
    """Hours since the epoch of epoch seconds (named ``YYYYMMDDHH`` UTC on disk)."""
    return np.floor(np.asarray(t, dtype=float) / 3600).astype("int64")


def hour_name(h: int) -> str:
    """The partition folder name of an hour since the epoch: ``YYYYMMDDHH`` (UTC)."""
    return time.strftime("%Y%m%d%H", time.gmtime(int(h) * 3600))


#: ASCII characters a partition folder keeps as they are (the ones ``urllib.parse.quote``
#: leaves alone, so an ASCII run id's folder is the one earlier goodlens versions wrote).
_PLAIN = frozenset(string.ascii_letters + string.digits + "_.-~")
#: The partition value Hive, Spark and DuckDB read as null.
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
#: The longest partition value (bytes) a folder ``run_id=<value>`` fits in (NAME_MAX 255).
MAX_PARTITION_BYTES = 255 - len("run_id=")


def partition_value(value: str, *, check: bool = True) -> str:
    """``value`` as a partition folder value that DuckDB, Spark and Hive/Trino all decode
    back to ``value``: each ASCII character outside letters, digits and ``_.-~`` as ``%XX``,
    every other character as itself (UTF-8 in the name). Spark and Hive decode each ``%XX``
    as one character, so a non-ASCII character written as its UTF-8 percent codes (what
    ``quote`` does, and earlier goodlens versions did) reads as several Latin-1 ones there; raw,
    it reads the same in every engine. The one value they all read as null is escaped too.
    ``check``: :class:`PartitionTooLong` when the folder name would exceed NAME_MAX."""
    out = "".join(c if c in _PLAIN or ord(c) > 0x7F else f"%{ord(c):02X}" for c in value)
    if out == _HIVE_NULL:
        out = "%5F" + out[1:]
    size = len(out.encode("utf-8"))
    if check and size > MAX_PARTITION_BYTES:
        raise PartitionTooLong(
            f"run id {value[:40]!r}... is {size} bytes as a folder name (at most "
            f"{MAX_PARTITION_BYTES}: the file system's limit on a name); a Parquet dataset "
            "cannot store it: use a shorter run id")
    return out


class PartitionTooLong(ValueError):
    """A value too long for a partition folder name."""


class SegmentWriter:
    """Writes one process's segments under names no other writer (nor this writer id in
    another process) ever takes."""

    def __init__(self, writer_id: str) -> None:
        self.writer_id = writer_id
        self._seq = itertools.count()
        # the process token keeps a reused --writer-id from reaching an earlier name
        self._token = uuid.uuid4().hex[:8]

    def name(self) -> str:
        """The next segment name."""
        return f"{self.writer_id}-{self._token}-{next(self._seq):08d}.parquet"

    def write(self, folder: Path, t: pa.Table) -> str:
        """Write ``t`` as a new segment in ``folder`` (created durably); the final path."""
        _makedirs_durable(folder)
        name = self.name()
        tmp = folder / f".{name}.inprogress"
        pq.write_table(t, tmp, compression="zstd", row_group_size=1_000_000)
        return self.publish(tmp, folder, name)

    def publish(self, tmp: Path, folder: Path, name: str) -> str:
        """Make the finished ``tmp`` visible as ``folder/name`` without ever replacing an
        existing segment (a hard link fails when the name is taken: take the next one), then
        fsync the folder. Returns the final path."""
        _fsync(tmp)
        while True:
            final = folder / name
            try:
                os.link(tmp, final)
                break
            except FileExistsError:
                name = self.name()
        tmp.unlink()
        _fsync(folder)
        return str(final)


def remove_files(paths: Iterable[str]) -> None:
    """Remove segments of one folder (missing ones are fine) and fsync the folder."""
    paths = list(paths)
    for f in paths:
        Path(f).unlink(missing_ok=True)
    if paths:
        _fsync(Path(paths[0]).parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once, durably."""
    tmp = path.with_name(f".{path.name}.inprogress")
    tmp.write_bytes(data)
    _fsync(tmp)
    os.replace(tmp, path)
    _fsync(path.parent)


def _makedirs_durable(folder: Path) -> None:
    """Create ``folder`` and its missing parents, fsyncing each parent whose entry was
    created, so a segment acknowledged in a new partition survives a power loss."""
    missing = []
    p = folder
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue  # another collector made it: it fsyncs the parent
        _fsync(d.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
