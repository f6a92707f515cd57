"""Run reports kept current as rows arrive, so reads cost what is live, not what is stored.

Why it exists: a collector runs for months and finished runs pile up. Recomputing every
run's accounting at each ``/metrics`` scrape made a scrape take 18 s at 200 runs. Here the
accounting of a run is computed when its rows change, on the summariser's thread right after
the pass that summarised them (:class:`goodlens.storage.writer.Writer`'s ``after_pass``):

- a run that ended gets its report computed once and stored (``run_reports``); it is
  computed again only if rows of it arrive later (the store marks it stale in the same
  transaction that summarises them);
- a live run is recomputed as its rows arrive, at most every few times its own accounting
  cost (so a 16,384-rank run cannot keep the thread busy), and every ``refresh_s`` while it
  is quiet (its wall-clock still grows);
- the runs active within ``retention_s`` are kept in memory with their report and their
  step-time figures: ``/metrics`` formats them, with no query at scrape time;
- runs never accounted (a store written by an earlier goodlens, an import) are indexed at
  start (the runs list's columns, one scan) and accounted in the background, a slice per
  pass, newest first.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd

from goodlens import __version__
from goodlens.analysis.accounting import ACCOUNTING_REVISION
from goodlens.analysis.report import report_dict
from goodlens.model.jsonable import plain
from goodlens.storage import reports
from goodlens.storage.reader import RunReader
from goodlens.storage.reports import ReportRow

log = logging.getLogger("goodlens.reports")
#: What stored reports are keyed on: a store whose reports another goodlens version, or
#: another accounting revision, computed has them all recomputed on the first pass.
REPORTS_KEY = f"{__version__}+accounting.{ACCOUNTING_REVISION}"

#: Seconds before a run whose accounting failed is tried again (unless rows of it arrive).
RETRY_S = 300.0

#: States a run's list row can take (``goodlens_run_state``): an ended attempt's reason
#: outside these counts as ``other``.
STATES = ("running", "completed", "failed", "preempted", "other")


@dataclass
class KeeperConfig:
    """How current the kept reports are, and what it may cost."""

    retention_s: float = 3600.0
    """Runs active within this long are kept in memory (and exported on ``/metrics``)."""
    refresh_s: float = 10.0
    """A quiet live run is recomputed this often (its wall-clock grows)."""
    cost_factor: float = 4.0
    """A live run is recomputed at most every ``cost_factor`` times its accounting cost."""
    backlog_s: float = 0.25
    """Time per pass for accounting runs that have no report yet."""
    hang_floor_s: float = 60.0
    """The hang timeout's floor (``goodlens serve --hang-floor``), for live reports."""
    window_steps: int = 100
    """Steps the step-time quantiles cover."""

    def __post_init__(self) -> None:
        for name in ("retention_s", "refresh_s", "cost_factor", "backlog_s"):
            v = getattr(self, name)
            if not v >= 0:
                raise ValueError(f"{name} must be >= 0, got {v!r}")


@dataclass
class RunStatus:
    """One run as ``/metrics`` and the runs list see it."""

    row: ReportRow
    cost_s: float = 0.0
    """How long its accounting took (the live refresh is paced by it)."""
    due: float = 0.0
    """Monotonic time before which a live run is not recomputed for new rows."""
    seen_at: float = 0.0
    """When rows of it last arrived (unix time; at start, its data's latest time)."""

    @property
    def active(self) -> float:
        """The later of its rows' arrival and their data's time: what the retention counts
        from (a replay of old data is live while it arrives)."""
        return max(self.seen_at, self.row.last_time or 0.0)

    @property
    def state(self) -> str:
        """The row's state, as one of :data:`STATES`."""
        s = self.row.state or "running"
        return s if s in STATES else "other"


class ReportKeeper:
    """Keeps every run's report current; call :meth:`after_pass` from the summariser."""

    def __init__(self, store: RunReader, config: KeeperConfig | None = None, *,
                 persist: bool = True) -> None:
        self.store = store
        self.config = config or KeeperConfig()
        self.persist = persist
        """Store the reports (a collector's keeper); else keep them in memory only."""
        self._live: dict[str, RunStatus] = {}
        self._pending: set[str] = set()  # changed runs not accounted yet (paced)
        self._seen: dict[str, float] = {}  # when rows of a run last arrived (unix time)
        self._failed: dict[str, float] = {}  # runs whose accounting failed: retry after
        self._lock = threading.Lock()
        self._started = False
        self.ready = threading.Event()
        """Set once the first pass loaded the recent runs (a scrape before it sees fewer)."""

    # ------------------------------------------------------------------ summariser thread
    def after_pass(self, con: Any, changed: list[str], urgent: bool) -> None:
        """After a summarising pass: account the runs whose rows changed (all of them when
        ``urgent``: a ``sync`` waits, or the writer stops), refresh quiet live runs, and
        work through the backlog."""
        now = time.time()
        if not self._started:
            self._start(con, now)
        self._pending.update(changed)
        self._seen.update(dict.fromkeys(changed, now))
        mono = time.monotonic()
        with self._lock:
            live = dict(self._live)
        todo = []
        for run_id in sorted(self._pending):
            st = live.get(run_id)
            if urgent or st is None or st.row.final or st.due <= mono:
                todo.append(run_id)
        horizon = now - self.config.retention_s
        for run_id, st in live.items():
            if (not st.row.final and run_id not in self._pending and st.active >= horizon
                    and st.due <= mono
                    and (st.row.computed_at or 0) + self.config.refresh_s <= now):
                todo.append(run_id)
        self._account(con, todo)
        self._backlog(con)  # stale rows (a crash, an upgrade) and runs never accounted
        self._expire(now)

    def catch_up(self) -> None:
        """Account every run active within the retention now (a keeper no summariser
        feeds: a test, a tool reading a store)."""
        runs = self.store.runs()
        horizon = time.time() - self.config.retention_s
        recent = runs[(runs.last_time >= horizon) | runs.last_time.isna() |
                      (runs.state == "running")] if len(runs) else runs
        self._account(None, list(recent.run_id))
        self.ready.set()

    def _start(self, con: Any, now: float) -> None:
        """First pass: mark every stored row stale if another goodlens version computed
        them, index runs without a row, load the recent ones and queue the live ones (the
        stale ones, rows that arrived before a crash, come first in the backlog)."""
        self._started = True
        try:
            if self.persist and reports.mark_all_stale(con, REPORTS_KEY):
                log.info("stored reports were computed by another goodlens: recomputing them "
                         "in the background, newest first")
            n = reports.index_missing(con) if self.persist else 0
            if n:
                log.info("indexed %d runs that had no stored report (accounted in the "
                         "background, newest first)", n)
            rows = reports.load(con, since=now - self.config.retention_s)
        except Exception:
            log.exception("loading stored reports failed")
            rows = []
        with self._lock:
            for row in rows:
                if row.report is not None:
                    self._live[row.run_id] = RunStatus(row)
        self._pending.update(r.run_id for r in rows if not r.final or r.report is None)
        self.ready.set()

    def _account(self, con: Any, run_ids: list[str]) -> set[str]:
        """Account ``run_ids`` and keep (and store) their rows; returns the runs done. A run
        that fails is retried after :data:`RETRY_S` (or when rows of it arrive), so one bad
        run never holds the others up."""
        if not run_ids:
            return set()
        run_ids = list(dict.fromkeys(run_ids))
        self._pending.difference_update(run_ids)
        try:
            info = {r["run_id"]: r for r in self.store.runs_of(run_ids).to_dict("records")}
            figures = self.store.run_metrics(self.config.window_steps, run_ids=run_ids)
        except Exception:
            log.exception("reading runs %s failed", run_ids[:5])
            self._failed.update(dict.fromkeys(run_ids, time.monotonic() + RETRY_S))
            return set()
        by_run = {r["run_id"]: r for r in figures.to_dict("records")}
        rows, costs = [], {}
        for run_id in run_ids:
            t0 = time.perf_counter()
            try:
                if run_id not in info:
                    raise KeyError(f"run {run_id!r} is not in the store")
                rep = report_dict(self.store, run_id, hang_floor_s=self.config.hang_floor_s)
            except Exception:
                log.exception("accounting run %s failed", run_id)
                self._failed[run_id] = time.monotonic() + RETRY_S
                continue
            self._failed.pop(run_id, None)
            costs[run_id] = time.perf_counter() - t0
            rows.append(_row(run_id, rep, info[run_id], by_run.get(run_id)))
        if self.persist and con is not None:
            try:
                reports.save(con, rows)
            except Exception:
                log.exception("storing %d reports failed", len(rows))
        mono = time.monotonic()
        with self._lock:
            for row in rows:
                cost = costs[row.run_id]
                self._live[row.run_id] = RunStatus(
                    row, cost, mono + self.config.cost_factor * cost,
                    self._seen.get(row.run_id, 0.0))
        return {row.run_id for row in rows}

    def _backlog(self, con: Any) -> None:
        """Account runs whose stored row is stale or has no report yet, newest first,
        within ``backlog_s`` of this pass."""
        deadline = time.perf_counter() + self.config.backlog_s
        while time.perf_counter() < deadline:
            mono = time.monotonic()
            try:  # runs that failed lately are left for later, not retried in a loop
                due = [r for r in reports.due(con, 8 + len(self._failed))
                       if r not in self._pending and self._failed.get(r, 0.0) <= mono]
            except Exception:
                log.exception("listing runs without a report failed")
                return
            if not due:
                return
            for run_id in due[:8]:
                self._account(con, [run_id])
                if time.perf_counter() >= deadline:
                    return

    def _expire(self, now: float) -> None:
        """Forget runs inactive for longer than the retention (a run still marked running
        that went silent that long is left to the hang detector and ``end-run``)."""
        horizon = now - self.config.retention_s
        with self._lock:
            for run_id in [r for r, st in self._live.items() if st.active < horizon]:
                del self._live[run_id]
                self._seen.pop(run_id, None)

    # ------------------------------------------------------------------ readers
    def exported(self, now: float | None = None) -> list[RunStatus]:
        """The runs active within the retention (live, or ended recently), by run id."""
        horizon = (time.time() if now is None else now) - self.config.retention_s
        with self._lock:
            return [st for _, st in sorted(self._live.items()) if st.active >= horizon]

    def live_report(self, run_id: str, max_age_s: float) -> dict[str, Any] | None:
        """The kept report of a run still in progress when it is recent: at most
        ``max_age_s`` old, or, for a run whose accounting is slow, as old as the keeper's
        pacing lets it get (two refreshes and a pass); else None (the caller computes it).
        A request never waits on an accounting the keeper is about to do anyway."""
        with self._lock:
            st = self._live.get(run_id)
        if st is None or st.row.final or st.row.report is None:
            return None
        paced = 2 * (self.config.cost_factor + 1) * st.cost_s + 2.0
        if time.time() - (st.row.computed_at or 0) > max(max_age_s, paced):
            return None
        return st.row.report


def _row(run_id: str, rep: dict[str, Any], info: dict[str, Any],
         figures: dict[str, Any] | None) -> ReportRow:
    """A stored row from a report, the run's list row and its step-time figures."""
    state = info.get("state") or "running"
    final = not rep.get("in_progress") and state != "running"
    now = time.time()
    rep = {**rep, "computed_at": now}  # a kept report says when it was computed
    return ReportRow(
        run_id=run_id, computed_at=now, final=final, state=state,
        start=_num(info.get("start")), last_time=_num(info.get("last_time")),
        attempts=int(info.get("attempts") or 0), steps=int(info.get("steps") or 0),
        last_step=None if pd.isna(info.get("last_step")) else int(info["last_step"]),
        wall_clock_s=_num(rep.get("wall_clock_s")), goodput=_num(rep.get("goodput")),
        report=plain(rep), metrics=None if figures is None else plain(figures))


def _num(v: Any) -> float | None:
    return None if v is None or pd.isna(v) else float(v)
