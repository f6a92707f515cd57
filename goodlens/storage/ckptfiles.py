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

COVERS = b"goodlens.covers"  # a summary checkpoint's step segments (zlib, base64 JSON)
VERSION = b"goodlens.schema_version"
_ARROW = {"VARCHAR": pa.string(), "BIGINT": pa.int64(), "DOUBLE": pa.float64()}
#: A checkpoint's columns and types (the ``step_summaries`` table's).
SUMMARY_SCHEMA = pa.schema([(name, _ARROW[kind]) for name, kind, _, _ in SUMMARY_COLUMNS])


def run_key(run_id: str) -> str:
    """A run's folder name under ``steps/`` and ``summaries/`` (``run_id=<encoded id>``)."""
    return f"run_id={quote(str(run_id), safe='')}"


def run_of_key(key: str) -> str:
    """The run id of a run folder name."""
    return unquote(key.split("=", 1)[1])


def present_segments(root: Path, key: str = "*") -> set[str]:
    """The step segments of run folder ``key`` (default all runs) now in the dataset."""
    return {str(p) for p in (root / "steps").glob(f"{key}/*/*.parquet")}


def list_checkpoints(root: Path, key: str = "*") -> list[tuple[Path, str, set[str]]]:
    """Each readable summary checkpoint (of run folder ``key``, default all): its path, its
    run folder and the step segments (absolute paths) it covers; unreadable or other-version
    ones are skipped."""
    found = []
    for path in sorted((root / "summaries").glob(f"{key}/*.parquet")):
        try:
            meta = pq.read_schema(path).metadata or {}
            if meta.get(VERSION) != str(SCHEMA_VERSION).encode():
                continue
            names = json.loads(zlib.decompress(base64.b64decode(meta[COVERS])))
        except (OSError, KeyError, ValueError, zlib.error, pa.ArrowException):
            continue  # removed meanwhile, torn by hand, or not ours
        found.append((path, path.parent.name, {str(root / n) for n in names}))
    return found


def ranked_checkpoints(root: Path, present: set[str], key: str = "*"
                       ) -> dict[str, list[tuple[Path, set[str]]]]:
    """Per run folder (``key``: one, default all), its checkpoints that cover some of the
    ``present`` segments, best first (most covered, then the latest name): each with the
    present segments it covers."""
    by_run: dict[str, list[tuple[int, str, Path, set[str]]]] = {}
    for path, folder, cov in list_checkpoints(root, key):
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
