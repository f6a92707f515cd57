"""The Parquet segment store: one hive-partitioned dataset that several collectors write
without coordinating and DuckDB, Spark or Trino read (``--db parquet:DIR``).

The layout, why concurrent writers need no lock (segments published by hard link, never
overwritten; readers deduplicate by key; compaction with a grace period) and how the
summary checkpoints keep an open from re-reading every raw row are in docs/scaling.md
("The Parquet dataset"). The read API is the DuckDB store's
(:class:`~goodlens.storage.queries.SqlReader` over :mod:`goodlens.storage.schema`): DuckDB
in memory with views ``steps``, ``events`` and ``runs`` over the dataset, and
``step_summaries`` kept in memory and extended with the segments not seen yet.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from goodlens.model.batch import Batch
from goodlens.model.schema import SCHEMA_VERSION
from goodlens.storage import ckptfiles, passguard, reports, summaries
from goodlens.storage.keptsteps import StepKeeper
from goodlens.storage.marks import (
    NEW_EVENTS,
    NEW_STEPS,
    Marks,
    PendingMarks,
    WriteResult,
    first_time,
)
from goodlens.storage.queries import SqlReader
from goodlens.storage.schema import (
    DERIVED,
    HIVE,
    ORDER,
    RUN_NAMES,
    compacted,
    data_tables,
    dataset_view,
    empty_view,
    version_mismatch,
)
from goodlens.storage.segments import (
    PartitionTooLong,
    SegmentWriter,
    atomic_write_bytes,
    hour_name,
    hour_of,
    partition_value,
    remove_files,
)
from goodlens.storage.store import NotAStore, Store, open_file

_TIME = {"steps": "start_time", "events": "time"}


class ParquetStore(SqlReader):
    """A goodlens Parquet dataset (``--store parquet:DIR``); see the module docstring."""

    def __init__(self, root: str | Path, *, read_only: bool = False,
                 memory_limit: str | None = None, threads: int | None = None,
                 writer_id: str | None = None, compact_min_files: int = 8,
                 compact_after_s: float = 300.0, rescan_every_s: float = 2.0,
                 grace_s: float = 60.0, summary_every_s: float = 60.0,
                 use_checkpoints: bool = True, save_after_open_s: float = 10.0,
                 init: bool = False) -> None:
        super().__init__(lambda: self._con.cursor(), retry_io=True)
        self.root = Path(root)
        self.path = f"parquet:{self.root}"
        self.read_only = read_only
        found = _open_marker(self.root, read_only, init)
        if found != SCHEMA_VERSION:
            raise version_mismatch(str(self.root), found)
        config: dict[str, Any] = {}
        if memory_limit:
            config["memory_limit"] = memory_limit
        if threads:
            config["threads"] = threads
        self._con = duckdb.connect(":memory:", config=config)
        self._con.execute(data_tables(prefix="_empty_"))
        self._segments = SegmentWriter(writer_id or (f"{socket.gethostname()}-{os.getpid()}-"
                                                     f"{uuid.uuid4().hex[:6]}"))
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._views: dict[str, bool] = {}
        self._marks = Marks(self._con)
        self.compact_min_files = compact_min_files
        self.grace_s = grace_s
        self._doomed: list[tuple[float, list[str]]] = []
        self._views_lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self.compact_after_s = compact_after_s
        self.rescan_every_s = rescan_every_s
        self._last_scan = 0.0
        self._last_compact = time.monotonic()
        self.summary_every_s = summary_every_s
        self._saved: dict[str, set[str]] = {}  # per run folder: what its last checkpoint covered
        self._summarised: dict[str, set[str]] | None = None  # what the last pass covered
        self._last_save = time.monotonic()
        self._save_s = 0.0  # how long the last save took
        #: keeps a step's figures when rows they counted are gone (docs/scaling.md)
        self._keeper = StepKeeper(self.root)
        t = time.perf_counter()
        try:
            self._define_views()
            self._con.execute(DERIVED)
            self._con.execute("INSERT INTO meta VALUES ('schema_version', ?)",
                              [str(SCHEMA_VERSION)])
            #: how this open went: the checkpoint it started from and the steps it summarised
            self.open_stats: dict[str, Any] = {"checkpoints": self._load_summaries()
                                               if use_checkpoints else 0}
            self.open_stats["steps_summarised"] = self.summarize_dirty()
        except duckdb.Error as exc:  # a segment it cannot read: one line naming it
            self._con.close()
            files = [str(p) for p in self.root.glob("*/**/*.parquet")]
            raise passguard.engine_failed(
                "DuckDB", exc, files, self.root,
                "`goodlens summarize --db parquet:DIR --verbose` shows DuckDB's error") from exc
        self.open_stats["seconds"] = round(time.perf_counter() - t, 3)
        if read_only and use_checkpoints and self.open_stats["seconds"] >= save_after_open_s:
            self.save_summaries(best_effort=True)  # spare the next reader the same wait
        self._known_runs = {r for (r,) in self._con.execute("SELECT run_id FROM runs").fetchall()}

    @property
    def writer_id(self) -> str:
        """This collector's name in its segment names."""
        return self._segments.writer_id

    # ------------------------------------------------------------------ views
    def _define_views(self, cur: duckdb.DuckDBPyConnection | None = None) -> None:
        """(Re)point ``steps``, ``events`` and ``runs`` at the dataset once it has files
        (one thread at a time: two replacing a view at once conflict in DuckDB's catalog)."""
        with self._views_lock:
            self._define_views_locked(cur or self._con)

    def _define_views_locked(self, cur: duckdb.DuckDBPyConnection) -> None:
        for table in ("steps", "events", "runs"):
            has = any((self.root / table).glob("**/*.parquet")) if self.root.exists() else False
            if self._views.get(table) == has:
                continue
            cur.execute(dataset_view(table, self._glob(table)) if has else empty_view(table))
            self._views[table] = has

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cur = super()._cursor()
        # a reader with no summariser thread of its own (goodlens dashboard or report over a
        # live dataset) picks up new segments as it reads, every ``rescan_every_s``
        if self.read_only and self.external_changes() and \
                self._refresh_lock.acquire(blocking=False):
            try:
                self.summarize_dirty(cur)
            finally:
                self._refresh_lock.release()
        return cur

    def _glob(self, table: str) -> str:
        pattern = "*.parquet" if table == "runs" else "*/*/*.parquet"
        return str(self.root / table / pattern).replace("'", "''")


    # ------------------------------------------------------------------ writes
    def run_id_refused(self, run_id: str) -> str | None:
        """Why this dataset cannot store a run id the ingest API accepts (its folder name
        would pass the file system's limit), else None; the collector refuses such a push."""
        try:
            partition_value(run_id)
        except PartitionTooLong as exc:
            return str(exc)
        return None

    def write_group(self, batches: list[Batch]) -> list[WriteResult]:
        """Write several batches as Parquet segments (one per table and partition); when it
        returns, the segments are renamed into place and fsynced."""
        if self.read_only:
            raise RuntimeError("store opened read-only")
        for b in batches:  # a run id no folder can hold fails the group before any write
            partition_value(b.run_id)
        results: list[WriteResult] = []
        pending: dict[str, list[pa.Table]] = {"steps": [], "events": [], "runs": []}
        marks = self._marks.pending()
        dirty: list[tuple[str, int, int, int]] = []
        for b in batches:
            res = WriteResult()
            if b.run or b.run_id not in self._known_runs:
                meta = b.run or {}
                pending["runs"].append(pa.table({
                    "run_id": [b.run_id], **{c: [meta.get(c)] for c in RUN_NAMES},
                    "first_seen": [first_time(b)], "written": [time.time()]}))
            if b.steps is not None and b.steps.num_rows:
                kept = self._new_rows("steps", b.run_id, b.steps, marks, pending)
                res.steps_inserted = kept.num_rows
                res.steps_duplicate = b.steps.num_rows - kept.num_rows
                if kept.num_rows:
                    pending["steps"].append(_with_run(kept, b.run_id))
                    att = kept.column("attempt").to_numpy()
                    st = kept.column("step").to_numpy()
                    for a in np.unique(att):
                        sel = st[att == a]
                        dirty.append((b.run_id, int(a), int(sel.min()), int(sel.max())))
            if b.events is not None and b.events.num_rows:
                kept = self._new_rows("events", b.run_id, b.events, marks, pending)
                res.events_inserted = kept.num_rows
                res.events_duplicate = b.events.num_rows - kept.num_rows
                if kept.num_rows:
                    pending["events"].append(_with_run(kept, b.run_id))
            results.append(res)
        written = self._flush(pending)
        # only now is it stored: advance marks, record dirty ranges and our own files
        marks.commit()
        self._known_runs.update(b.run_id for b in batches)
        # dirty first, then seen: a checkpoint lists a segment only once its steps are dirty
        if dirty:
            self._con.executemany("INSERT INTO dirty VALUES (?, ?, ?, ?)", dirty)
        reports.mark_changed(self._con, [b.run_id for b, r in zip(batches, results)
                                         if r.steps_inserted or r.events_inserted or b.run])
        with self._lock:
            self._seen.update(written)
        if written and not all(self._views.values()):
            self._define_views()
        return results

    def _new_rows(self, table: str, run_id: str, t: pa.Table, marks: PendingMarks,
                  pending: dict) -> pa.Table:
        """Rows of ``t`` (steps or events) not stored yet: all of them when each lies above
        its high-water mark (the common case), else an exact anti-join against the dataset."""
        if table == "steps":
            fast, spans = marks.check_steps(run_id, t)
            new_rows = NEW_STEPS
            params = [run_id, min(s[1] for s in spans), max(s[2] for s in spans)]
        else:
            fast, new_rows, params = marks.check_events(run_id, t), NEW_EVENTS, [run_id]
        if fast:
            return t
        self._flush(pending)  # rows gathered earlier in this group must be visible
        self._define_views()
        self._con.register("_batch", t)
        try:
            return self._con.sql(f"SELECT {new_rows}", params=params).to_arrow_table()
        finally:
            self._con.unregister("_batch")

    def _flush(self, pending: dict[str, list[pa.Table]]) -> list[str]:
        """Write what is pending as segments (and empty ``pending``); the paths written."""
        written = []
        for table in ("steps", "events"):
            if not pending[table]:
                continue
            t = pa.concat_tables(pending[table], promote_options="default")
            pending[table] = []
            hours = hour_of(t.column(_TIME[table]).to_numpy())
            runs = t.column("run_id").to_numpy(zero_copy_only=False)
            for run_id in np.unique(runs):
                for h in np.unique(hours[runs == run_id]):
                    part = t.filter(pa.array((runs == run_id) & (hours == h)))
                    part = part.drop_columns(["run_id"]).sort_by(
                        [(c, "ascending") for c in ORDER[table]])
                    folder = (self.root / table / ckptfiles.run_key(str(run_id))
                              / f"hour={hour_name(h)}")
                    written.append(self._segments.write(folder, part))
        if pending["runs"]:
            t = pa.concat_tables(pending["runs"], promote_options="default")
            pending["runs"] = []
            written.append(self._segments.write(self.root / "runs", t))
        return written


    # ------------------------------------------------------------------ summaries
    def external_changes(self) -> bool:
        """Time to look for segments other collectors wrote (the summariser asks)."""
        return time.monotonic() - self._last_scan >= self.rescan_every_s

    def _rescan(self, con: duckdb.DuckDBPyConnection | None = None) -> int:
        """Mark the step ranges of segments not seen yet (others', or written before this
        process started) dirty; returns how many segments were new. ``con``: the calling
        thread's cursor (a DuckDB connection is not shared between threads)."""
        self._last_scan = time.monotonic()
        con = con or self._con
        files = sorted(str(p) for p in (self.root / "steps").glob("*/*/*.parquet"))
        with self._lock:
            listed = set(files)
            # forget what is gone (compacted away); a segment this process wrote after the
            # listing is forgotten too and re-summarised once: harmless
            self._seen &= listed
            new = [f for f in files if f not in self._seen]
        if not new:
            return 0
        try:
            # one range per segment: a range over all of them would span the gaps between
            # (an old merged segment and today's: every step of the run)
            ranges = con.execute(
                f"SELECT run_id, attempt, min(step), max(step) FROM read_parquet($files, "
                f"{HIVE}, filename = true) GROUP BY filename, run_id, attempt",
                {"files": new}).fetchall()
        except duckdb.IOException:
            return 0  # compacted away meanwhile: the merged segment is picked up next time
        if ranges:
            con.executemany("INSERT INTO dirty VALUES (?, ?, ?, ?)", ranges)
            if not self.read_only:  # a reader keeps no reports: nothing would take them
                reports.mark_changed(con, [r[0] for r in ranges])
        with self._lock:
            self._seen.update(new)
        return len(new)

    def summarize_dirty(self, con: duckdb.DuckDBPyConnection | None = None,
                        changed: list[str] | None = None) -> int:
        """Pick up new segments, then summarise dirty ranges as the DuckDB store does (and
        compact old small segments every few minutes when writable; ``changed`` as there)."""
        self._define_views(con)
        self._rescan(con)
        covered = self._covered()  # before the pass: each is dirty or summarised already
        total = summaries.summarize_dirty(con or self._con, changed, self._keeper.guard)
        self._summarised = covered
        if not self.read_only and time.monotonic() - self._last_compact > self.compact_after_s:
            self._last_compact = time.monotonic()
            self.compact(older_than_s=self.compact_after_s, con=con)
        # at most every summary_every_s, and rarely enough that saving takes <= 2% of the
        # time (the checkpoint grows with the steps: ~64 B each)
        if not self.read_only and time.monotonic() - self._last_save >= max(
                self.summary_every_s, 50 * self._save_s):
            self.save_summaries(con)
        return total

    @property
    def warnings(self) -> list[str]:
        """One line per run some of whose steps keep earlier figures because rows they
        counted are gone (:class:`~goodlens.storage.keptsteps.StepKeeper`)."""
        return self._keeper.warnings

    def has_dirty(self) -> bool:
        """Whether some step ranges await summarising (or new segments a rescan would find)."""
        return bool(self._con.execute("SELECT count(*) FROM dirty").fetchall()[0][0]) or \
            self.external_changes()

    # ------------------------------------------------------------------ checkpoints
    def _covered(self) -> dict[str, set[str]]:
        """The step segments this store has marked dirty or summarised, by run key
        (:func:`goodlens.storage.ckptfiles.key_of` their folder)."""
        prefix = str(self.root / "steps") + os.sep
        with self._lock:
            files = [f for f in self._seen if f.startswith(prefix)]
        return ckptfiles.segments_by_run(files)

    def _present(self, key: str = "*") -> set[str]:
        return ckptfiles.present_segments(self.root, key)

    def _load_summaries(self) -> int:
        """For each run, start from the checkpoint covering the most of its step segments
        still present (a collector's or a batch job's, :mod:`goodlens.storage.ckptfiles`):
        its summaries, and its segments as seen; a run none of whose segments its
        checkpoints cover gets its newest one as the reference new summaries are compared
        with (:mod:`goodlens.storage.keptsteps`). Returns how many checkpoints were loaded
        (one per run at most)."""
        tables = []
        present = self._present()
        found = ckptfiles.list_checkpoints(self.root)
        ranked_by_run = ckptfiles.ranked_checkpoints(self.root, present, found=found)
        for key, ranked in ranked_by_run.items():
            for path, cov in ranked:
                # None: pruned by its writer meanwhile (take the next best), or saved by an
                # earlier goodlens (summary columns added since): its segments stay unseen,
                # so the rescan summarises them from the raw rows
                t = ckptfiles.read_checkpoint(path)
                if t is None:
                    continue
                tables.append(t.cast(ckptfiles.SUMMARY_SCHEMA).replace_schema_metadata())
                with self._lock:
                    self._seen |= cov
                self._saved[key] = set(cov)
                break
        self._keeper.load_references(present, found, set(self._saved))
        if tables:  # one insert: a dataset of thousands of runs opens in one statement
            self._con.register("_ckpt", pa.concat_tables(tables))
            try:
                self._con.execute("INSERT INTO step_summaries SELECT * FROM _ckpt")
            finally:
                self._con.unregister("_ckpt")
        return len(tables)

    def save_summaries(self, con: duckdb.DuckDBPyConnection | None = None,
                       best_effort: bool = False) -> list[str]:
        """Checkpoint, for each run whose covered step segments changed since its last
        checkpoint, the summaries of the last summarising pass with those segments (a run
        with nothing new is not rewritten); removes, after the grace period, that run's
        older checkpoints the new one supersedes. Returns the paths written.
        ``best_effort``: a reader on a dataset it may not write gives up quietly."""
        self._last_save = started = time.monotonic()
        covered = self._summarised or {}
        changed = {k: c for k, c in covered.items() if c != self._saved.get(k)}
        written: list[str] = []
        cur = (con or self._con).cursor()
        try:
            for key, files in sorted(changed.items()):
                t = cur.sql("SELECT * FROM step_summaries WHERE run_id = $run "
                            "ORDER BY attempt, step",
                            params={"run": ckptfiles.run_of_key(key)}).to_arrow_table()
                t = ckptfiles.as_checkpoint(t, self.root, files)
                try:
                    path = self._segments.write(self.root / "summaries" / key, t)
                except OSError:
                    if best_effort:
                        break
                    raise
                self._saved[key] = files
                written.append(path)
                if not self.read_only:
                    old = ckptfiles.superseded(self.root, key, path, files)
                    with self._lock:
                        self._doomed.append((time.monotonic(), old))
        finally:
            cur.close()
        if written:
            self._save_s = time.monotonic() - started
        return written

    # ------------------------------------------------------------------ compaction
    def compact(self, min_files: int | None = None, older_than_s: float = 0.0,
                con: duckdb.DuckDBPyConnection | None = None) -> int:
        """Merge each partition (and the run metadata) holding ``min_files`` or more
        segments, none written in the last ``older_than_s`` seconds, into one segment;
        returns the partitions merged.

        The merge streams through DuckDB's ``COPY`` (bounded by its memory limit), keeps
        the files plain (no partition columns inside), and removes the sources only
        ``grace_s`` later, so a reader that listed them a moment ago still finds them
        (until then the readers' deduplication hides the copies)."""
        min_files = min_files or self.compact_min_files
        self._remove_doomed()
        merged = 0
        now = time.time()
        folders = [(t, f) for t in ("steps", "events")
                   for f in sorted({p.parent for p in (self.root / t).glob("*/*/*.parquet")})]
        folders.append(("runs", self.root / "runs"))
        with self._lock:
            doomed = {p for _, paths in self._doomed for p in paths}
        for table, folder in folders:
            files = sorted(f for f in folder.glob("*.parquet") if str(f) not in doomed)
            if len(files) < min_files:
                continue
            try:
                if any(now - f.stat().st_mtime < older_than_s for f in files):
                    continue
            except FileNotFoundError:
                continue  # another collector is compacting it
            query = compacted(table)
            name = self._segments.name()
            tmp = folder / f".{name}.inprogress"
            cur = (con or self._con).cursor()
            try:
                cur.execute(f"COPY ({query}) TO '{str(tmp).replace(chr(39), chr(39) * 2)}' "
                            "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 1000000)",
                            {"files": [str(f) for f in files]})
            except duckdb.IOException:
                tmp.unlink(missing_ok=True)
                continue  # a source vanished (another collector compacted it): next time
            finally:
                cur.close()
            final = self._segments.publish(tmp, folder, name)
            with self._lock:
                # merged from segments all seen (their steps dirty or summarised already):
                # seen too, no need to summarise the hour again. Otherwise it is left
                # unseen, and the next rescan marks its steps dirty.
                if table == "steps" and all(str(f) in self._seen for f in files):
                    self._seen.add(final)
                self._doomed.append((time.monotonic(), [str(f) for f in files]))
            merged += 1
        return merged

    def _remove_doomed(self, everything: bool = False) -> None:
        """Remove compacted sources whose grace period is over."""
        now = time.monotonic()
        with self._lock:
            due = [d for d in self._doomed if everything or now - d[0] >= self.grace_s]
            self._doomed = [d for d in self._doomed if d not in due]
        for _, paths in due:
            remove_files(paths)

    def close(self) -> None:
        """Every acknowledged segment is already in place; a writable store summarises what
        is left and saves a last summary checkpoint (compacted sources and superseded
        checkpoints still in their grace period are removed now)."""
        if not self.read_only:
            if self.has_dirty():
                self.summarize_dirty()
            self.save_summaries()
            self._remove_doomed(everything=True)
        self._con.close()


def _open_marker(root: Path, read_only: bool, init: bool) -> Any:
    """The schema version in the dataset's marker file, creating the dataset when writable
    and ``root`` is missing or empty (or ``init``: a folder holding other files);
    :class:`NotAStore` for a folder that is not a goodlens dataset."""
    marker = root / "_goodlens.json"
    if root.exists() and not root.is_dir():
        raise NotAStore(f"{root} is a file, not a goodlens Parquet dataset folder")
    if read_only and not marker.exists():
        raise FileNotFoundError(f"no goodlens Parquet dataset at {root}")
    if not read_only and not marker.exists():
        if root.exists() and any(root.iterdir()) and not init:
            raise NotAStore(f"{root} holds files but no goodlens Parquet dataset; refusing to "
                            "add one to it: pass --init to add it anyway, or use a new folder")
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(marker, json.dumps(
            {"format": "goodlens-parquet", "schema_version": SCHEMA_VERSION}).encode())
    try:
        doc = json.loads(marker.read_text())
    except (OSError, ValueError) as exc:
        raise NotAStore(f"{marker} is not a goodlens dataset marker ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != "goodlens-parquet":
        raise NotAStore(f"{marker} is not a goodlens dataset marker")
    if not read_only:
        for sub in ("steps", "events", "runs"):
            (root / sub).mkdir(parents=True, exist_ok=True)
    return doc.get("schema_version")


def _with_run(t: pa.Table, run_id: str) -> pa.Table:
    return t.append_column("run_id", pa.array([run_id] * t.num_rows, pa.string()))



def open_store(spec: str | Path, *, read_only: bool = False, **kw: Any) -> Store | ParquetStore:
    """A store from ``--db``/``--store``: ``parquet:DIR`` for a Parquet dataset, else a
    DuckDB file path (``duckdb:PATH`` also accepted)."""
    text = str(spec)
    if text.startswith("parquet:"):
        return ParquetStore(text[len("parquet:"):], read_only=read_only, **kw)
    return open_file(text, read_only=read_only, **kw)

