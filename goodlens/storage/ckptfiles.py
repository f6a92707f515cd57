"""Summary checkpoint files: the one format every summariser writes and every reader opens.

Why a module of its own: a Parquet dataset's per-step summaries are saved under
``DIR/summaries/run_id=<run>/`` by two kinds of writer, a collector or reader
(:class:`goodlens.storage.parquet.ParquetStore`, summarising with DuckDB) and a batch job
(:mod:`goodlens.storage.bulk`, summarising with Spark); both must write files the other
reads. A checkpoint is one run's ``step_summaries`` rows, with the step segments they cover
named in the file's metadata (paths relative to the dataset, zlib-compressed JSON) and the
schema version, so a reader starts from the checkpoint covering the most segments still
present and summarises only the others.
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.parquet as pq

from goodlens.model.schema import SCHEMA_VERSION
from goodlens.storage.schema import SUMMARY_COLUMNS
from goodlens.storage.segments import partition_value

COVERS = b"goodlens.covers"  # a summary checkpoint's step segments (zlib, base64 JSON)
VERSION = b"goodlens.schema_version"
_ARROW = {"VARCHAR": pa.string(), "BIGINT": pa.int64(), "DOUBLE": pa.float64()}
#: A checkpoint's columns and types (the ``step_summaries`` table's).
SUMMARY_SCHEMA = pa.schema([(name, _ARROW[kind]) for name, kind, _, _ in SUMMARY_COLUMNS])


def run_key(run_id: str) -> str:
    """A run's folder name under ``steps/`` and ``summaries/`` (``run_id=<encoded id>``,
    :func:`goodlens.storage.segments.partition_value`)."""
    return f"run_id={partition_value(str(run_id), check=False)}"


def run_of_key(key: str) -> str:
    """The run id of a run folder name (either encoding: today's, or the percent-encoded
    UTF-8 of earlier versions)."""
    return unquote(key.split("=", 1)[1])


def key_of(folder: str) -> str:
    """The run key of a run folder name: the folder itself, or today's name of a folder an
    earlier goodlens named (a run's segments in both count as one run's)."""
    return run_key(run_of_key(folder))


def folders(key: str) -> list[str]:
    """The folder names a run key's files may lie in: the key, and the name earlier
    versions gave it when that differs (a non-ASCII run id)."""
    if key == "*":
        return [key]
    legacy = f"run_id={quote(run_of_key(key), safe='')}"
    # a name longer than a file name may be (255 bytes) is no folder: never look it up
    return [key] if legacy == key or len(legacy) > 255 else [key, legacy]


def present_segments(root: Path, key: str = "*") -> set[str]:
    """The step segments of run key ``key`` (default all runs) now in the dataset."""
    return {str(p) for k in folders(key) for p in (root / "steps").glob(f"{k}/*/*.parquet")}


def segments_by_run(paths: Iterable[str]) -> dict[str, set[str]]:
    """Step segment paths grouped by run key (:func:`key_of` their run folder)."""
    out: dict[str, set[str]] = {}
    names: dict[str, str] = {}
    for f in paths:
        folder = Path(f).parent.parent.name
        key = names.get(folder) or names.setdefault(folder, key_of(folder))
        out.setdefault(key, set()).add(f)
    return out


def list_checkpoints(root: Path, key: str = "*") -> list[tuple[Path, str, set[str]]]:
    """Each readable summary checkpoint (of run key ``key``, default all): its path, its
    run key and the step segments (absolute paths) it covers; unreadable or other-version
    ones are skipped."""
    found = []
    paths = sorted(p for k in folders(key) for p in (root / "summaries").glob(f"{k}/*.parquet"))
    for path in paths:
        try:
            meta = pq.read_schema(path).metadata or {}
            if meta.get(VERSION) != str(SCHEMA_VERSION).encode():
                continue
            names = json.loads(zlib.decompress(base64.b64decode(meta[COVERS])))
        except (OSError, KeyError, ValueError, zlib.error, pa.ArrowException):
            continue  # removed meanwhile, torn by hand, or not ours
        found.append((path, key_of(path.parent.name), {str(root / n) for n in names}))
    return found


def ranked_checkpoints(root: Path, present: set[str], key: str = "*",
                       found: list[tuple[Path, str, set[str]]] | None = None
                       ) -> dict[str, list[tuple[Path, set[str]]]]:
    """Per run folder (``key``: one, default all), its checkpoints that cover some of the
    ``present`` segments, best first (most covered, then the latest name): each with the
    present segments it covers (``found``: :func:`list_checkpoints`' answer, if read)."""
    by_run: dict[str, list[tuple[int, str, Path, set[str]]]] = {}
    for path, folder, cov in list_checkpoints(root, key) if found is None else found:
        hits = cov & present
        if hits:
            by_run.setdefault(folder, []).append((len(hits), path.name, path, hits))
    return {key: [(path, cov) for _, _, path, cov in sorted(ranked, reverse=True)]
            for key, ranked in by_run.items()}


def read_checkpoint(path: Path) -> pa.Table | None:
    """A checkpoint's summaries; None when it is gone (pruned meanwhile) or was saved by an
    earlier goodlens with other summary columns (its run is then summarised from the
    segments)."""
    try:
        t = pq.ParquetFile(path).read()  # one file: without the dataset layer's overhead
    except (OSError, pa.ArrowException):
        return None
    return t if t.column_names == SUMMARY_SCHEMA.names else None


def newest(paths: Iterable[Path]) -> tuple[Path | None, pa.Table | None]:
    """The most recently written of these checkpoints that can be read, and its rows (a run
    whose checkpoints cover no segment left is compared with it, never started from)."""
    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return -1.0
    for p in sorted(paths, key=mtime, reverse=True):
        t = read_checkpoint(p)
        if t is not None:
            return p, t
    return None, None


def best_checkpoint(root: Path, run_id: str) -> pa.Table | None:
    """The summaries a reader of the dataset at ``root`` starts from for ``run_id`` (its
    best usable checkpoint), or None when it has none."""
    key = run_key(run_id)
    present = present_segments(root, key)
    for path, _ in ranked_checkpoints(root, present, key).get(key, []):
        t = read_checkpoint(path)
        if t is not None:
            return t
    return None


def as_checkpoint(t: pa.Table, root: Path, covers: Iterable[str]) -> pa.Table:
    """``t`` (one run's summaries) with the metadata naming the step segments ``covers``
    (absolute paths under ``root``) and the schema version."""
    names = sorted(os.path.relpath(f, root) for f in covers)
    return t.replace_schema_metadata({
        VERSION: str(SCHEMA_VERSION).encode(),
        COVERS: base64.b64encode(zlib.compress(json.dumps(names).encode()))})


def superseded(root: Path, key: str, kept: str, covers: set[str]) -> list[str]:
    """The checkpoints of run folder ``key`` other than ``kept`` that cover nothing present
    beyond ``covers`` (a newer checkpoint made them useless)."""
    present = present_segments(root, key)
    return [str(p) for p, _, cov in list_checkpoints(root, key)
            if str(p) != kept and (cov & present) <= covers]
