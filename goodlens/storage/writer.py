"""The single writer thread: a queue of validated batches and group commits; a summariser.

DuckDB serialises writers anyway; funnelling every write through one thread lets us commit
many HTTP pushes in one transaction (group commit) and acknowledge each push only after its
transaction committed, which is what makes "acknowledged means stored" true. The queue is
bounded in rows, so a collector that cannot keep up answers 503 (the exporter backs off and
spills) instead of growing without limit. No SQL here: the thread calls the store (a
:class:`~goodlens.storage.store.Store` or a :class:`~goodlens.storage.parquet.ParquetStore`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from goodlens.model.batch import Batch
from goodlens.storage.marks import WriteResult
from goodlens.storage.parquet import ParquetStore
from goodlens.storage.store import Store

log = logging.getLogger("goodlens.writer")

#: Upper bounds (seconds) of the commit-latency histogram exposed on /metrics.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


#: Most distinct sources the per-source rejection counts keep (then ``other``).
MAX_REJECT_SOURCES = 256


#: Called on the summariser's thread after each pass (also an idle one) with its cursor, the
#: runs whose rows changed since the previous pass, and whether it is urgent (a ``sync``
#: waits for the pass, or the writer is stopping).
AfterPass = Callable[[Any, list[str], bool], None]


class Overloaded(RuntimeError):
    """The write queue is full; the client should retry later."""


@dataclass
class WriterStats:
    """Counters read by /metrics; updated under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    steps_inserted: int = 0
    steps_duplicate: int = 0
    events_inserted: int = 0
    events_duplicate: int = 0
    batches_committed: int = 0
    batches_failed: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    """Batches refused before the queue, by reason (invalid, auth, too_large, overloaded)."""
    rejected_by_source: dict[tuple[str, str], int] = field(default_factory=dict)
    """Batches refused, by (source, reason): the sender's claimed source (its run and rank),
    at most :data:`MAX_REJECT_SOURCES` of them (the rest count as ``other``)."""
    exporter_dropped: dict[str, int] = field(default_factory=dict)
    """Latest dropped-row count reported by each exporter source."""
    commits: int = 0
    commit_seconds_sum: float = 0.0
    commit_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    summaries_seconds_sum: float = 0.0
    queued_rows: int = 0

    def reject(self, reason: str, source: str | None = None) -> None:
        """Count a batch refused before it reached the queue (and by its source, bounded:
        a sender names itself, so the label set must not grow without limit)."""
        with self.lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
            src = source or "unknown"
            by = self.rejected_by_source
            if (src, reason) not in by and len({k for k, _ in by}) >= MAX_REJECT_SOURCES \
                    and src not in {k for k, _ in by}:
                src = "other"
            by[(src, reason)] = by.get((src, reason), 0) + 1


_SYNC = object()
_STOP = object()


class Writer:
    """Owns the store's write side. ``submit`` from any thread; one thread writes."""

    def __init__(self, store: Store | ParquetStore, *, max_queue_rows: int = 4_000_000,
                 max_group_rows: int = 500_000, summarize_interval_s: float = 1.0,
                 after_pass: AfterPass | None = None) -> None:
        self.store = store
        self.max_queue_rows = max_queue_rows
        self.max_group_rows = max_group_rows
        self.summarize_interval_s = summarize_interval_s
        self.stats = WriterStats()
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="goodlens-writer", daemon=True)
        self._summarizer = _Summarizer(store, self.stats, summarize_interval_s, after_pass)

    def start(self) -> Writer:
        """Start the writer and summariser threads; returns self."""
        self._summarizer.start()
        self._thread.start()
        return self

    def submit(self, batch: Batch) -> Future:
        """Queue a batch; the future resolves to a :class:`WriteResult` once committed.

        Raises :class:`Overloaded` when the queue holds ``max_queue_rows`` already.
        """
        rows = max(batch.rows, 1)
        with self.stats.lock:
            if self.stats.queued_rows + rows > self.max_queue_rows and self.stats.queued_rows:
                raise Overloaded(f"write queue full ({self.stats.queued_rows} rows)")
            self.stats.queued_rows += rows
            exp = batch.exporter
            if exp.get("source") and "dropped_rows" in exp:
                self.stats.exporter_dropped[exp["source"]] = exp["dropped_rows"]
        fut: Future = Future()
        self._q.put((batch, fut, rows))
        return fut

    def sync(self, timeout: float | None = 30.0) -> None:
        """Wait until everything queued so far is committed and summarised."""
        done = threading.Event()
        self._q.put((_SYNC, done, 0))
        if not done.wait(timeout):
            raise TimeoutError("writer did not catch up in time")

    def stop(self, timeout: float | None = 30.0) -> None:
        """Write what is queued, summarise, and stop the threads."""
        if self._thread.is_alive():
            self._q.put((_STOP, None, 0))
            self._thread.join(timeout)
        self._summarizer.stop(timeout)

    @property
    def queue_rows(self) -> int:
        """Rows waiting to be written."""
        return self.stats.queued_rows

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._q.get()
            items, syncs, rows = [], [], 0
            item = first
            while True:
                kind = item[0]
                if kind is _STOP:
                    stopping = True
                elif kind is _SYNC:
                    syncs.append(item[1])
                else:
                    items.append(item)
                    rows += item[2]
                if rows >= self.max_group_rows or stopping:
                    break
                try:
                    item = self._q.get_nowait()
                except queue.Empty:
                    break
            if items:
                self._write(items)
            for ev in syncs:  # everything before the marker is committed: summarise it
                self._summarizer.request(ev)
        # drain anything submitted after the stop marker
        rest = []
        while not self._q.empty():
            item = self._q.get_nowait()
            if item[0] is _SYNC:
                self._summarizer.request(item[1])
            elif item[0] is not _STOP:
                rest.append(item)
        if rest:
            self._write(rest)

    def _write(self, items: list) -> None:
        t0 = time.perf_counter()
        try:
            results: list[WriteResult | BaseException] = list(
                self.store.write_group([b for b, _, _ in items]))
        except Exception:
            # one bad batch must not sink the group: retry each alone
            log.exception("group commit failed; retrying %d batches one by one", len(items))
            results = []
            for b, _, _ in items:
                try:
                    results.append(self.store.write_group([b])[0])
                except Exception as exc:
                    results.append(exc)
        dt = time.perf_counter() - t0
        st = self.stats
        with st.lock:
            st.commits += 1
            st.commit_seconds_sum += dt
            for i, ub in enumerate(LATENCY_BUCKETS):
                if dt <= ub:
                    st.commit_buckets[i] += 1
                    break
            for (batch, _, rows), res in zip(items, results):
                st.queued_rows -= rows
                if isinstance(res, BaseException):
                    st.batches_failed += 1
                else:
                    st.batches_committed += 1
                    st.steps_inserted += res.steps_inserted
                    st.steps_duplicate += res.steps_duplicate
                    st.events_inserted += res.events_inserted
                    st.events_duplicate += res.events_duplicate
                    if res.steps_inserted or res.events_inserted or batch.run:
                        self._summarizer.poke()  # new summaries, or a report to redo
        for (_, fut, _), res in zip(items, results):
            if isinstance(res, BaseException):
                fut.set_exception(res)
            else:
                fut.set_result(res)



class _Summarizer:
    """Re-summarises dirty step ranges on its own thread and DuckDB cursor, so the writer
    keeps inserting meanwhile (DuckDB's MVCC: it deletes only the dirty rows it read); after
    each pass, ``after_pass`` gets the cursor and the runs whose rows changed (the collector
    recomputes their reports there, before a waiting ``sync`` returns)."""

    def __init__(self, store: Store | ParquetStore, stats: WriterStats, interval_s: float,
                 after_pass: AfterPass | None = None) -> None:
        self.store = store
        self.stats = stats
        self.interval_s = interval_s
        self.after_pass = after_pass
        self._wake = threading.Event()
        self._stop = False
        self._waiting: list[threading.Event] = []
        self._lock = threading.Lock()
        self._dirty = store.has_dirty()
        self._thread = threading.Thread(target=self._run, name="goodlens-summarizer",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        """New rows were committed: summarise within the interval."""
        self._dirty = True

    def request(self, done: threading.Event) -> None:
        """Summarise everything committed so far now, then set ``done``."""
        with self._lock:
            self._waiting.append(done)
        self._wake.set()

    def stop(self, timeout: float | None) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        con = self.store.cursor()
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            with self._lock:
                waiting, self._waiting = self._waiting, []
            stopping = self._stop
            changed: list[str] = []
            if self._dirty or waiting or stopping or self.store.external_changes():
                self._dirty = False
                self._summarize(con, changed)
            if self.after_pass is not None:
                try:
                    self.after_pass(con, changed, bool(waiting) or stopping)
                except Exception:
                    log.exception("the step after summarising failed")
            for ev in waiting:
                ev.set()
            if stopping:
                con.close()
                return

    def _summarize(self, con: object, changed: list[str]) -> None:
        t0 = time.perf_counter()
        for attempt in range(3):
            try:
                self.store.summarize_dirty(con, changed)
                break
            except Exception:
                if attempt == 2:
                    log.exception("summarising dirty steps failed")
                    self._dirty = True
        with self.stats.lock:
            self.stats.summaries_seconds_sum += time.perf_counter() - t0
