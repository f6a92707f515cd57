"""Idempotent writes: the high-water marks and the exact check both stores dedupe with.

Why a module of its own: a step row's key is (run_id, attempt, rank, step) and an event's is
(run_id, source, seq), and both the DuckDB file and the Parquet dataset must add nothing
when a batch is re-sent or a spill file replayed. Each keeps a high-water mark per key
prefix (the largest step per rank of an attempt, the largest seq per source), loaded from
the stored rows on first use; a batch whose rows all lie above their marks is stored as it
is, anything else takes the exact anti-join against the stored rows (:data:`NEW_STEPS`,
:data:`NEW_EVENTS`). Marks a write group advances become the store's only once the group
is stored (:meth:`PendingMarks.commit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
import numpy as np

from goodlens.storage.schema import EVENT_NAMES, STEP_NAMES

if TYPE_CHECKING:  # the written rows' types only: a store opened to read loads no pyarrow
    import pyarrow as pa

    from goodlens.model.batch import Batch

#: The rows of a registered batch ``_batch`` that are not stored yet (each key once): the
#: exact check when a batch does not lie above its high-water marks. Parameters: run id,
#: then (steps) the batch's lowest and highest step.
NEW_STEPS = (f"{', '.join(STEP_NAMES)} FROM (SELECT DISTINCT ON (attempt, rank, step) * "
             "FROM _batch) b ANTI JOIN (SELECT attempt, rank, step FROM steps WHERE "
             "run_id = ? AND step BETWEEN ? AND ?) s USING (attempt, rank, step)")
NEW_EVENTS = (f"{', '.join(EVENT_NAMES)} FROM (SELECT DISTINCT ON (source, seq) * FROM "
              "_batch) b ANTI JOIN (SELECT source, seq FROM events WHERE run_id = ?) e "
              "USING (source, seq)")


@dataclass(frozen=True)
class RankMarks:
    """The largest stored step of each rank of one (run, attempt), as sorted rank ids and
    their marks: memory follows the ranks seen, never the value of a rank id (one push
    from rank 16,777,215 once grew a dense array to 128 MiB, kept for good)."""

    ranks: np.ndarray
    steps: np.ndarray

    @classmethod
    def empty(cls) -> RankMarks:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))

    def lookup(self, rank: np.ndarray) -> np.ndarray:
        """Each rank's mark, -1 for a rank not seen."""
        if not len(self.ranks):
            return np.full(len(rank), -1, np.int64)
        i = np.minimum(np.searchsorted(self.ranks, rank), len(self.ranks) - 1)
        return np.where(self.ranks[i] == rank, self.steps[i], -1)

    def advanced(self, rank: np.ndarray, step: np.ndarray) -> RankMarks:
        """These marks raised to ``step`` for each (unique) ``rank``."""
        ranks = np.union1d(self.ranks, rank)
        steps = np.full(len(ranks), -1, np.int64)
        steps[np.searchsorted(ranks, self.ranks)] = self.steps
        at = np.searchsorted(ranks, rank)
        steps[at] = np.maximum(steps[at], step)
        return RankMarks(ranks, steps)


@dataclass
class WriteResult:
    """What one batch changed: rows inserted and rows recognised as already stored."""

    steps_inserted: int = 0
    steps_duplicate: int = 0
    events_inserted: int = 0
    events_duplicate: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain dict (the ingest endpoint's response body)."""
        return dict(self.__dict__)


class Marks:
    """A store's committed high-water marks, loaded lazily from the rows ``con`` reads (so
    they are as durable as the rows): per (run, attempt) the largest step of each rank (-1:
    none), per (run, source) the largest event seq."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con
        self.steps: dict[tuple[str, int], RankMarks] = {}
        self.events: dict[tuple[str, str], int] = {}

    def stored_steps(self, run_id: str, attempt: int) -> RankMarks:
        """Largest stored step per rank of (run, attempt)."""
        rows = self._con.execute("SELECT rank, max(step) FROM steps WHERE run_id = ? AND "
                                 "attempt = ? GROUP BY rank ORDER BY rank",
                                 [run_id, attempt]).fetchall()
        return RankMarks(np.array([r for r, _ in rows], np.int64),
                         np.array([m for _, m in rows], np.int64))

    def stored_event(self, run_id: str, source: str) -> int:
        """Largest stored event seq of a source, -1 when none."""
        row = self._con.execute("SELECT max(seq) FROM events WHERE run_id = ? AND source = ?",
                                [run_id, source]).fetchall()[0]
        return -1 if row[0] is None else int(row[0])

    def pending(self) -> PendingMarks:
        """The marks of a new write group."""
        return PendingMarks(self)


class PendingMarks:
    """One write group's marks: they start from the committed ones and replace them when
    the group is stored (:meth:`commit`); a failed group just drops them."""

    def __init__(self, marks: Marks) -> None:
        self.marks = marks
        self.steps: dict[tuple[str, int], RankMarks] = {}
        self.events: dict[tuple[str, str], int] = {}

    def check_steps(self, run_id: str, t: pa.Table) -> tuple[bool, list[tuple[int, int, int]]]:
        """Check the step rows ``t`` of a run against the marks of each attempt, and advance
        them: ``(whether every row lies above its rank's mark and no key repeats, each
        attempt's (attempt, lowest step, highest step))``."""
        att = t.column("attempt").to_numpy()
        rank = t.column("rank").to_numpy()
        step = t.column("step").to_numpy()
        one = att.min() == att.max()
        fast = True
        spans = []
        for a in (att[:1] if one else np.unique(att)):
            sel = slice(None) if one else att == a
            r, s = rank[sel], step[sel]
            key = (run_id, int(a))
            marks = self.steps.get(key)
            if marks is None:
                marks = self.marks.steps.get(key)
                marks = self.marks.stored_steps(*key) if marks is None else marks
            above, top_r, top_s = check_marks(marks, r, s)
            self.steps[key] = marks.advanced(top_r, top_s)  # top_r is unique
            fast = fast and above
            spans.append((int(a), int(s.min()), int(s.max())))
        return fast, spans

    def check_events(self, run_id: str, t: pa.Table) -> bool:
        """Check the event rows ``t`` of a run against the marks of their sources, and
        advance them: whether every row lies above its source's mark."""
        fast = True
        for src, q in zip(t.column("source").to_pylist(), t.column("seq").to_pylist()):
            key = (run_id, src)
            if key not in self.events:
                mark = self.marks.events.get(key)
                self.events[key] = self.marks.stored_event(*key) if mark is None else mark
            if q <= self.events[key]:
                fast = False
            self.events[key] = max(self.events[key], q)
        return fast

    def commit(self) -> None:
        """The group is stored: its marks are now true."""
        self.marks.steps.update(self.steps)
        self.marks.events.update(self.events)


def check_marks(marks: RankMarks, rank: np.ndarray, step: np.ndarray
                ) -> tuple[bool, np.ndarray, np.ndarray]:
    """The high-water-mark check of one (run, attempt)'s step rows: ``(whether every row
    lies above its rank's mark and no (rank, step) repeats, the ranks present, each one's
    largest step)``. Marks are not advanced."""
    above = not np.any(step <= marks.lookup(rank))
    order = np.lexsort((step, rank))
    rs, ss = rank[order], step[order]
    same = rs[1:] == rs[:-1]
    above = above and not np.any(same & (ss[1:] <= ss[:-1]))  # a (rank, step) twice
    last = np.flatnonzero(np.r_[~same, True])  # each rank's largest step
    return above, rs[last], ss[last]


def first_time(b: Batch) -> float | None:
    """The earliest step start or event time of a batch (a new run's ``first_seen``)."""
    times = []
    if b.steps is not None and b.steps.num_rows:
        times.append(float(np.min(b.steps.column("start_time").to_numpy())))
    if b.events is not None and b.events.num_rows:
        times.append(float(np.min(b.events.column("time").to_numpy())))
    return min(times) if times else None
