"""Summarise a Parquet dataset in one batch pass, incrementally, into summary checkpoints.

Why a module of its own: a collector summarises what arrives and a reader what no
checkpoint covers when it opens, range by range in one process (about 14 minutes for a day
of a 16k-GPU job). This is the same job as a batch pass by an engine: DuckDB in this
process (:func:`duckdb_engine`), or Spark, which scales out (:mod:`goodlens.storage.spark`).
Both run the one summarising SQL text (:func:`goodlens.storage.schema.summary_select` over
:func:`~goodlens.storage.schema.deduplicated` rows), and the pass leaves what every reader
already opens: one checkpoint per run under ``DIR/summaries/``
(:mod:`goodlens.storage.ckptfiles`).

A pass, per run (only runs with step segments that its best checkpoint does not cover):

- start from the checkpoint covering the most of the run's segments still present (the
  same choice a reader makes);
- the *uncovered* segments (new ones, merged ones of a compaction) give the step ranges to
  recompute, as boxes of attempts and steps read from each segment's Parquet footer (its
  row groups' statistics: metadata, no rows);
- read the uncovered segments, and of the others only those whose footer boxes meet a box
  to recompute (rows of one step may lie in several segments); the covered rest is not
  read. When a segment beyond a call's own is read, only the rows inside its boxes count;
- the checkpoint's rows outside the boxes plus the new summaries are the run's summaries,
  saved as a new checkpoint covering every segment listed at the start; older checkpoints
  it supersedes are removed once older than the grace period (a reader that listed one a
  moment ago takes the next best when it is gone).

Exact for the reasons a reader's is: every step with a row in an uncovered segment is
summarised from every segment holding rows of it, and every other step keeps its summary
over the segments the checkpoint names. Segments written during the pass are not in the
new checkpoint's list, so the next pass (or reader) summarises their steps. An engine that
holds a step's values in memory (DuckDB's median) gets the work in calls of at most
``max_rows`` rows read, cut at segment boundaries; a step cut in two is summarised whole by
both calls, and counted once.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from goodlens.storage import ckptfiles, passguard
from goodlens.storage.schema import (
    BOX_COLUMNS,
    HIVE,
    deduplicated,
    in_boxes,
    summary_select,
)
from goodlens.storage.segments import SegmentWriter, remove_files
from goodlens.storage.summaries import merge_ranges

#: A step range of a segment: first and last attempt, first and last step.
Box = tuple[int, int, int, int]
#: A box of one run, as the engines' box relation holds it.
RunBox = tuple[str, int, int, int, int]
#: The engine: the summaries of the rows in these segments, only those inside one of the
#: boxes given (None: every row).
Summarise = Callable[[list[str], list[RunBox] | None], pa.Table]
_ALL: Box = (0, 2**63 - 1, 0, 2**63 - 1)
#: Rows a DuckDB call reads at most (its medians hold a step's values in memory).
DUCKDB_MAX_ROWS = 20_000_000


@dataclass
class RunWork:
    """One run's part of a pass."""

    key: str
    present: set[str]
    base: pa.Table | None = None
    """The summaries of the checkpoint started from (None: none, or no usable one)."""
    checkpoint: Path | None = None
    """The checkpoint a pass compares its new summaries with: the one started from, else
    the run's newest (its segments all gone: compacted, removed or lost)."""
    reference: pa.Table | None = None
    """That checkpoint's summaries (None: the run has none)."""
    covered: set[str] = field(default_factory=set)
    new: list[str] = field(default_factory=list)
    boxes: list[Box] = field(default_factory=list)
    """The merged boxes of the uncovered segments: the steps this pass recomputes."""


@dataclass
class PassStats:
    """What a pass did (``goodlens summarize --json`` prints it)."""

    engine: str = ""
    runs: int = 0
    runs_summarised: int = 0
    segments: int = 0
    segments_read: int = 0
    rows_read: int = 0
    steps_summarised: int = 0
    checkpoints_written: int = 0
    checkpoints_removed: int = 0
    engine_calls: int = 0
    seconds: float = 0.0
    engine_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


class Footers:
    """Each segment's row groups as boxes, and its rows, from its Parquet footer (read once
    per pass; no rows are read). A segment that is present but unreadable is a
    :class:`~goodlens.storage.passguard.DatasetError` (never taken as removed: its rows may
    be counted in a checkpoint)."""

    def __init__(self, root: Path | None = None) -> None:
        self._cache: dict[str, tuple[list[Box] | None, int]] = {}
        self.root = root

    def boxes(self, path: str) -> list[Box] | None:
        """The attempts and steps of each row group; None when the footer has no
        statistics (then the segment is taken to hold any step)."""
        return self._read(path)[0]

    def rows(self, path: str) -> int:
        """Rows in the segment (0 when it is gone)."""
        return self._read(path)[1]

    def _read(self, path: str) -> tuple[list[Box] | None, int]:
        if path not in self._cache:
            self._cache[path] = _footer(path, self.root or Path(path).parent)
        return self._cache[path]


def _footer(path: str, root: Path) -> tuple[list[Box] | None, int]:
    try:
        meta = pq.ParquetFile(path).metadata
    except (OSError, pa.ArrowException) as exc:
        if not os.path.exists(path):
            return [], 0  # removed meanwhile (compacted): the engine skips it too
        raise passguard.unreadable(path, exc, root) from exc
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    if "attempt" not in names or "step" not in names:
        return None, meta.num_rows
    ia, js = names.index("attempt"), names.index("step")
    boxes: list[Box] = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        if not rg.num_rows:
            continue
        a, s = rg.column(ia).statistics, rg.column(js).statistics
        if a is None or s is None or not (a.has_min_max and s.has_min_max):
            return None, meta.num_rows
        boxes.append((int(a.min), int(a.max), int(s.min), int(s.max)))
    return boxes, meta.num_rows


def _boxes_of(footers: Footers, path: str) -> list[Box]:
    """A segment's boxes; one holding any step when its footer has no statistics, none
    when it is gone (its rows are in the merged segment that replaced it)."""
    boxes = footers.boxes(path)
    return [_ALL] if boxes is None else boxes


def _meets(boxes: list[Box] | None, targets: list[Box]) -> bool:
    if boxes is None:
        return True
    return any(a0 <= b1 and b0 <= a1 and s0 <= t1 and t0 <= s1
               for a0, a1, s0, s1 in boxes for b0, b1, t0, t1 in targets)


def _merge(boxes: list[Box]) -> list[Box]:
    """Boxes of one run merged where they have the same attempts and their steps overlap
    or touch."""
    merged = merge_ranges(sorted(("", (a0, a1), s0, s1) for a0, a1, s0, s1 in boxes))
    return [(a[0], a[1], lo, hi) for _, a, lo, hi in merged]


def plan(root: Path, footers: Footers) -> list[RunWork]:
    """Each run with step segments: the checkpoint it starts from, its uncovered segments
    and the boxes to recompute (no ``new``: nothing to do)."""
    present = ckptfiles.present_segments(root)
    by_run = ckptfiles.segments_by_run(present)
    found = ckptfiles.list_checkpoints(root)
    ranked = ckptfiles.ranked_checkpoints(root, present, found=found)
    newest: dict[str, list[Path]] = {}
    for path, key, _ in found:
        newest.setdefault(key, []).append(path)
    work = []
    for key, files in sorted(by_run.items()):
        w = RunWork(key, files)
        for path, cov in ranked.get(key, []):
            t = ckptfiles.read_checkpoint(path)
            if t is not None:
                w.base, w.covered, w.checkpoint, w.reference = t, cov, path, t
                break
        if w.base is None and key in newest:  # compared with, never started from
            w.checkpoint, w.reference = ckptfiles.newest(newest[key])
        w.new = sorted(files - w.covered, key=lambda f: (min(_boxes_of(footers, f),
                                                             default=_ALL), f))
        w.boxes = _merge([b for f in w.new for b in _boxes_of(footers, f)])
        work.append(w)
    return work


def calls(todo: list[RunWork], footers: Footers, max_rows: int | None = None
          ) -> list[tuple[list[str], list[RunBox] | None]]:
    """The engine calls of a pass: per call the segments to read and, when some of them
    hold rows outside what the call recomputes, the boxes to keep. Runs share a call;
    with ``max_rows``, a call reads at most about that many rows (one segment more than it
    if a single one does), cut between a run's uncovered segments."""
    out: list[tuple[list[str], list[RunBox] | None]] = []
    files: list[str] = []
    boxes: list[RunBox] = []
    rows, filtered = 0, False
    for w in todo:
        run = ckptfiles.run_of_key(w.key)
        for group in _groups(w.new, footers, max_rows):
            own = _merge([b for f in group for b in _boxes_of(footers, f)])
            extra = [f for f in sorted(w.present - set(group)) if _meets(footers.boxes(f), own)]
            n = sum(footers.rows(f) for f in group + extra)
            if max_rows and files and rows + n > max_rows:
                out.append((files, boxes if filtered else None))
                files, boxes, rows, filtered = [], [], 0, False
            files += group + extra
            boxes += [(run, *b) for b in own]
            rows += n
            filtered = filtered or bool(extra)
    if files:
        out.append((files, boxes if filtered else None))
    return out


def _groups(new: list[str], footers: Footers, max_rows: int | None) -> list[list[str]]:
    if not max_rows:
        return [new]
    groups: list[list[str]] = [[]]
    rows = 0
    for f in new:
        n = footers.rows(f)
        if groups[-1] and rows + n > max_rows:
            groups.append([])
            rows = 0
        groups[-1].append(f)
        rows += n
    return groups


def summarize_dataset(root: str | Path, summarise: Summarise, *, engine: str = "",
                      max_rows: int | None = None, writer_id: str | None = None,
                      grace_s: float = 60.0) -> PassStats:
    """One incremental pass over the dataset at ``root`` with the engine ``summarise``
    (calls of at most ``max_rows`` rows read); writes a checkpoint per run that had new
    segments (see the module docstring)."""
    t0 = time.perf_counter()
    root = Path(root)
    footers = Footers(root)
    work = plan(root, footers)
    todo = [w for w in work if w.new]
    stats = PassStats(engine=engine, runs=len(work), runs_summarised=len(todo),
                      segments=sum(len(w.present) for w in work))
    parts, read = [], set()
    for files, boxes in calls(todo, footers, max_rows):
        t1 = time.perf_counter()
        try:
            parts.append(summarise(files, boxes))
        except passguard.DatasetError:
            raise
        except Exception as exc:  # DuckDB's and Spark's (Java) errors: one line, named
            raise passguard.engine_failed(engine, exc, files, root) from exc
        stats.engine_seconds += time.perf_counter() - t1
        stats.rows_read += sum(footers.rows(f) for f in files)
        stats.engine_calls += 1
        read |= set(files)
    stats.segments_read = len(read)
    per_run = _by_run(parts)
    _check(root, todo, per_run, footers, engine)  # before anything is written
    stats.steps_summarised = sum(t.num_rows for t in per_run.values())
    writer = SegmentWriter(writer_id or f"summarize-{socket.gethostname()}-{os.getpid()}-"
                                        f"{uuid.uuid4().hex[:6]}")
    for w in todo:
        path = writer.write(root / "summaries" / w.key, ckptfiles.as_checkpoint(
            _merged(w, per_run.get(ckptfiles.run_of_key(w.key))), root, w.present))
        stats.checkpoints_written += 1
        stats.checkpoints_removed += _prune(root, w.key, path, w.present, grace_s)
    stats.engine_seconds = round(stats.engine_seconds, 3)
    stats.seconds = round(time.perf_counter() - t0, 3)
    return stats


def _check(root: Path, todo: list[RunWork], per_run: dict[str | None, pa.Table],
           footers: Footers, engine: str) -> None:
    """The pass's result is every run's and only theirs, and replaces no checkpoint's step
    with fewer ranks (:mod:`goodlens.storage.passguard`)."""
    passguard.check_attribution(
        per_run, {ckptfiles.run_of_key(w.key): sum(footers.rows(f) for f in w.new)
                  for w in todo}, root, engine)
    for w in todo:
        run = ckptfiles.run_of_key(w.key)
        missing: list[str] = []
        if w.checkpoint is not None and w.reference is not None:
            covers = next((c for p, _, c in ckptfiles.list_checkpoints(root, w.key)
                           if p == w.checkpoint), set())
            missing = sorted(covers - w.present)
        passguard.check_sources(run, w.reference, w.boxes, per_run.get(run), missing,
                                root / "summaries" / w.key)


def _by_run(parts: list[pa.Table]) -> dict[str | None, pa.Table]:
    """Summaries of many runs split by run, each sorted by attempt and step, a step that
    two calls both summarised (whole, so alike) kept once."""
    if not parts:
        return {}
    t = pa.concat_tables([p.select(ckptfiles.SUMMARY_SCHEMA.names)
                          .cast(ckptfiles.SUMMARY_SCHEMA) for p in parts]).combine_chunks()
    t = t.take(pc.sort_indices(t, [("run_id", "ascending"), ("attempt", "ascending"),
                                   ("step", "ascending")]))
    runs = np.asarray(t.column("run_id").to_pylist(), dtype=object)  # None: no run id
    if not len(runs):
        return {}
    att, st = t.column("attempt").to_numpy(), t.column("step").to_numpy()
    again = np.zeros(len(runs), dtype=bool)
    again[1:] = (runs[1:] == runs[:-1]) & (att[1:] == att[:-1]) & (st[1:] == st[:-1])
    if again.any():
        t, runs = t.filter(pa.array(~again)), runs[~again]
    cuts = [0, *(np.flatnonzero(runs[1:] != runs[:-1]) + 1).tolist(), len(runs)]
    return {None if runs[a] is None else str(runs[a]): t.slice(a, b - a)
            for a, b in itertools.pairwise(cuts)}


def _merged(w: RunWork, fresh: pa.Table | None) -> pa.Table:
    """The run's checkpoint rows outside its boxes plus its fresh summaries, in order."""
    parts = [] if fresh is None else [fresh]
    if w.base is not None and w.base.num_rows:
        att = w.base.column("attempt").to_numpy()
        st = w.base.column("step").to_numpy()
        inside = np.zeros(len(att), dtype=bool)
        for a0, a1, s0, s1 in w.boxes:
            inside |= (att >= a0) & (att <= a1) & (st >= s0) & (st <= s1)
        parts.append(w.base.cast(ckptfiles.SUMMARY_SCHEMA).filter(pa.array(~inside)))
    if not parts:
        return ckptfiles.SUMMARY_SCHEMA.empty_table()
    t = pa.concat_tables(parts).combine_chunks()
    return t.take(pc.sort_indices(t, [("attempt", "ascending"), ("step", "ascending")]))


def _prune(root: Path, key: str, kept: str, covers: set[str], grace_s: float) -> int:
    """Remove the run's checkpoints ``kept`` supersedes that are older than ``grace_s``
    (younger ones go in a later pass)."""
    now = time.time()
    old = []
    for p in ckptfiles.superseded(root, key, kept, covers):
        try:
            if now - os.stat(p).st_mtime >= grace_s:
                old.append(p)
        except FileNotFoundError:
            continue
    remove_files(old)
    return len(old)


def duckdb_engine(threads: int | None = None, memory_limit: str | None = None) -> Summarise:
    """The DuckDB engine: each call one statement, in a connection of its own."""
    config: dict[str, Any] = {}
    if threads:
        config["threads"] = threads
    if memory_limit:
        config["memory_limit"] = memory_limit

    def summarise(files: list[str], boxes: list[RunBox] | None) -> pa.Table:
        # a segment a compaction removed since the listing is skipped (as Spark does): its
        # rows are in the merged segment, read now or summarised by the next pass
        files = [f for f in files if os.path.exists(f)]
        con = duckdb.connect(":memory:", config=config)
        try:
            source = f"read_parquet($files, {HIVE}, union_by_name = true)"
            if boxes:
                con.register("goodlens_boxes", pa.table(dict(zip(BOX_COLUMNS, zip(*boxes)))))
                source = in_boxes(source, "goodlens_boxes")
            query = summary_select(f"({deduplicated('steps', source)}) AS steps")
            return con.sql(query, params={"files": files}).to_arrow_table()
        finally:
            con.close()
    return summarise


def summarize(root: str | Path, engine: str = "duckdb", master: str | None = None,
              conf: dict[str, str] | None = None, quiet: bool = False) -> PassStats:
    """Bring the summary checkpoints of the dataset at ``root`` up to date with ``engine``:
    ``duckdb`` (this process, calls of :data:`DUCKDB_MAX_ROWS` rows) or ``spark`` (one
    call on a session on ``master``, default this machine's cores, with ``conf``; ``quiet``:
    a session it starts logs nothing, its failures come back as one-line errors)."""
    t0 = time.perf_counter()
    if engine == "duckdb":
        return summarize_dataset(root, duckdb_engine(), engine="duckdb",
                                 max_rows=DUCKDB_MAX_ROWS)
    if engine != "spark":
        raise ValueError(f"unknown engine {engine!r}: duckdb or spark")
    from goodlens.storage import spark
    with spark.spark_session(master, conf, log_level="OFF" if quiet else "ERROR") as session:
        stats = summarize_dataset(root, spark.engine(session, Path(root)), engine="spark")
    stats.seconds = round(time.perf_counter() - t0, 3)  # with the session's start-up
    return stats
