"""What a live summariser does when rows a step's summary counted are gone.

Why a module of its own: a batch pass that would summarise a step again from fewer ranks
than its checkpoint counted refuses (:func:`goodlens.storage.passguard.check_sources`). A
collector cannot refuse: it must go on ingesting. So the summariser of a Parquet dataset
(:class:`goodlens.storage.parquet.ParquetStore`'s, a collector's or a reader's) applies the
same comparison (:func:`~goodlens.storage.passguard.fewer_ranks`) to every pass, and a step
it would count fewer ranks of keeps its earlier figures: the summary held in memory (from a
checkpoint or an earlier pass) or, for a run whose checkpoints cover none of the segments
left, its newest checkpoint's. It says so once per run (the log, :attr:`StepKeeper.warnings`).
Rows only vanish from a dataset when removed by hand or unreadable: a compaction's merged
segment holds every row of its sources.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from goodlens.storage import ckptfiles, passguard

log = logging.getLogger("goodlens.parquet")
#: A dirty step range: run, attempt, first and last step.
Range = tuple[str, int, int, int]


class StepKeeper:
    """One store's rule and what it kept (``root``: the dataset, named in the warnings)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()  # /healthz reads the warnings from another thread
        #: per run whose checkpoints cover no segment left: its newest checkpoint's rows
        #: (compared with, never shown)
        self._reference: dict[str, pa.Table] = {}
        self._kept: dict[str, set[tuple[int, int]]] = {}  # steps whose earlier figures stay
        self._first: dict[str, str] = {}  # per run: the first steps found, as text

    def load_references(self, present: set[str], found: list[tuple[Path, str, set[str]]],
                        loaded: set[str]) -> None:
        """For each run with segments among ``present`` that no checkpoint was loaded for
        (``loaded``: run keys) though it has some (``found``:
        :func:`goodlens.storage.ckptfiles.list_checkpoints`), its newest checkpoint."""
        paths: dict[str, list[Path]] = {}
        for path, key, _ in found:
            if key not in loaded:
                paths.setdefault(key, []).append(path)
        for key in sorted(paths.keys() & ckptfiles.segments_by_run(present).keys()):
            _, t = ckptfiles.newest(paths[key])
            if t is not None:
                self._reference[ckptfiles.run_of_key(key)] = t.cast(
                    ckptfiles.SUMMARY_SCHEMA).replace_schema_metadata()

    def guard(self, con: duckdb.DuckDBPyConnection, ranges: list[Range]) -> Callable[[], None]:
        """A pass's guard (:data:`goodlens.storage.summaries.Guard`): before the pass, the
        summaries it may replace; after, each step it counts fewer ranks of gets them back."""
        box = pa.table({"run_id": pa.array([r[0] for r in ranges], pa.string()),
                        "attempt": pa.array([r[1] for r in ranges], pa.int64()),
                        "lo": pa.array([r[2] for r in ranges], pa.int64()),
                        "hi": pa.array([r[3] for r in ranges], pa.int64())})

        def inside(columns: str) -> pa.Table:
            con.register("_goodlens_ranges", box)
            try:
                return con.sql(f"SELECT {columns} FROM step_summaries s JOIN _goodlens_ranges "
                               "r USING (run_id, attempt) WHERE s.step BETWEEN r.lo AND r.hi"
                               ).to_arrow_table()
            finally:
                con.unregister("_goodlens_ranges")
        old = inside("s.*")
        old = old.cast(ckptfiles.SUMMARY_SCHEMA) if old.num_rows else None
        runs = {r[0] for r in ranges}
        refs = [_in_ranges(self._reference[r], [x for x in ranges if x[0] == r])
                for r in sorted(runs & self._reference.keys())]
        refs = [t for t in refs if t.num_rows]
        if not refs and old is None:
            return lambda: None  # nothing summarised before: the common case
        base = _with_reference(old, refs)
        return lambda: self._restore_fewer(con, ranges, base, inside(
            "s.run_id, s.attempt, s.step, s.ranks"))

    def _restore_fewer(self, con: duckdb.DuckDBPyConnection, ranges: list[Range],
                       base: pa.Table, fresh: pa.Table) -> None:
        """Put back ``base``'s rows of the steps ``fresh`` counts fewer ranks of."""
        kept = []
        base_runs = base.column("run_id").to_numpy(zero_copy_only=False)
        fresh_runs = fresh.column("run_id").to_numpy(zero_copy_only=False)
        for run in sorted(set(base_runs.tolist())):
            boxes = [(a, a, lo, hi) for r, a, lo, hi in ranges if r == run]
            mine = base.filter(pa.array(base_runs == run))
            fewer, was, now = passguard.fewer_ranks(
                mine, boxes, fresh.filter(pa.array(fresh_runs == run)))
            if not fewer:
                continue
            keys = set(fewer)
            keep = np.array([(int(a), int(s)) in keys for a, s in zip(
                mine.column("attempt").to_numpy(), mine.column("step").to_numpy())], bool)
            kept.append(mine.filter(pa.array(keep)))
            self._note(run, fewer, was, now)
        if not kept:
            return
        rows = pa.concat_tables(kept)
        con.executemany("DELETE FROM step_summaries WHERE run_id = ? AND attempt = ? AND "
                        "step = ?", list(zip(rows.column("run_id").to_pylist(),
                                             rows.column("attempt").to_pylist(),
                                             rows.column("step").to_pylist())))
        con.register("_goodlens_kept", rows)
        try:
            con.execute("INSERT INTO step_summaries SELECT * FROM _goodlens_kept")
        finally:
            con.unregister("_goodlens_kept")

    def _note(self, run: str, fewer: list[tuple[int, int]], was: passguard.Steps,
              now: passguard.Steps) -> None:
        with self._lock:
            first = run not in self._kept
            self._kept.setdefault(run, set()).update(fewer)
            if first:  # the first steps found name the case; the count grows
                self._first[run] = passguard.fewer_text(run, fewer, was, now, "than before")
            text = self._warning(run)
        if first:
            log.warning("%s", text)

    def _warning(self, run: str) -> str:
        return (f"{self._first[run]}: rows counted before are gone (a step segment removed "
                f"by hand, or unreadable); kept the earlier figures of "
                f"{len(self._kept[run]):,} step(s), without the rows that came since: restore "
                "the rows, or, if they were removed on purpose, stop the collector, delete "
                f"{self.root / 'summaries' / ckptfiles.run_key(run)} and start it again")

    @property
    def warnings(self) -> list[str]:
        """One line per run some of whose steps keep earlier figures; empty on a healthy
        dataset."""
        with self._lock:
            return [self._warning(r) for r in sorted(self._first)]


def _in_ranges(t: pa.Table, ranges: list[Range]) -> pa.Table:
    """The rows of ``t`` (one run's summaries) inside ``(run, attempt, lo, hi)`` ranges."""
    att, st = t.column("attempt").to_numpy(), t.column("step").to_numpy()
    inside = np.zeros(len(att), dtype=bool)
    for _, a, lo, hi in ranges:
        inside |= (att == a) & (st >= lo) & (st <= hi)
    return t.filter(pa.array(inside))


def _with_reference(old: pa.Table | None, refs: list[pa.Table]) -> pa.Table:
    """``old`` (summaries now held) plus the reference rows of steps it lacks."""
    parts = [old] if old is not None else []
    held = set() if old is None else set(zip(
        old.column("run_id").to_pylist(), old.column("attempt").to_pylist(),
        old.column("step").to_pylist()))
    for t in refs:
        keep = [(r, a, s) not in held for r, a, s in zip(
            t.column("run_id").to_pylist(), t.column("attempt").to_pylist(),
            t.column("step").to_pylist())]
        parts.append(t.filter(pa.array(keep, pa.bool_())))
    return pa.concat_tables(parts)
