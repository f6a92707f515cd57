"""Streaming straggler and hang detection inside the collector.

The detectors (``detectors/``) are pure statistics; this service feeds them as data arrives
and acts on what they find, so a launcher can evict a slow node while the run goes on.
Every ``interval_s`` it reads each run's newly completed steps (a live step once every
rank seen in its attempt has reported it, or ``late_grace_s`` of data later), updates one
:class:`~goodlens.detectors.stragglers.StragglerDetector` per run and world (reset per
attempt; a new one where ranks moved to other hosts, the old world's open findings resolved
at its end, as ``goodlens detect`` does), and publishes each finding it emits: stored as
a ``straggler_flagged`` event keyed by the finding's id and emission number (a restarted
collector adds nothing), served on ``/metrics`` and ``/v1/actions`` while open, and pushed
to the webhook and callback only when its event was new to the store. A live run whose
every rank goes silent past the adaptive timeout gets a ``failure_detected`` with cause
``hang``. The rules, and why each is so: docs/detectors.md ("Inside the collector").
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from goodlens.analysis.findings import end_world
from goodlens.collector.restores import RestoreWatch
from goodlens.detectors.hangs import HangConfig, HangDetector, HangFinding
from goodlens.detectors.restore import RestoreConfig
from goodlens.detectors.stragglers import (
    Finding,
    StragglerConfig,
    StragglerDetector,
    Topology,
    ready_column,
)
from goodlens.detectors.topology import new_world
from goodlens.model.batch import validate_batch
from goodlens.model.schema import SCHEMA_VERSION, EventKind
from goodlens.storage.queries import rank_id_limit
from goodlens.storage.reader import RunReader
from goodlens.storage.writer import Writer

log = logging.getLogger("goodlens.detection")


def _ft_width(tags: Any) -> int:
    """A torchft run's ranks per replica group (0 for any other run)."""
    try:
        meta = json.loads(tags) if isinstance(tags, str) else {}
    except ValueError:
        return 0
    if not isinstance(meta, dict) or meta.get("fault_tolerance") != "torchft":
        return 0
    try:
        return max(1, int(meta.get("group_world_size") or 1))
    except (TypeError, ValueError):
        return 1


def scored_through(summaries: Any, last: int, grace_s: float,
                   expected: np.ndarray | None = None) -> int:
    """The last step of a live attempt that can be scored now, given its step summaries
    (``step``, ``ranks``, ``step_end``, in step order) and the last step already scored: the
    steps after ``last`` up to the first one that some rank seen in the attempt has not
    reported yet, unless the attempt's data has moved ``grace_s`` past that step's end (its
    missing ranks are then taken as not reporting). ``expected``: per step, the ranks known
    to have run it (a torchft step committed without the groups out of its quorum); a step
    that many ranks reported is complete. ``last`` when nothing more can be."""
    steps = summaries.step.to_numpy()
    ranks = summaries.ranks.to_numpy()
    ends = summaries.step_end.to_numpy(dtype=float)
    ready = (ranks >= ranks.max()) | (ends < np.nanmax(ends) - grace_s)
    if expected is not None:
        ready |= ranks >= expected
    waiting = steps[(steps > last) & ~ready]
    if not len(waiting):
        return int(steps.max())
    before = steps[steps < waiting.min()]
    return max(last, int(before.max())) if len(before) else last


class DetectionService:
    """Runs the straggler detector over live runs and publishes its findings."""

    def __init__(self, store: RunReader, writer: Writer | None, *, interval_s: float = 2.0,
                 config: StragglerConfig | None = None, webhook: str | None = None,
                 callback: Callable[[str, Any], None] | None = None,
                 hang_config: HangConfig | None = None, live_window_s: float = 3600.0,
                 late_grace_s: float = 30.0, restore_config: RestoreConfig | None = None
                 ) -> None:
        self.store = store
        self.writer = writer
        self.interval_s = interval_s
        self.config = config or StragglerConfig()
        self.webhook = webhook
        self.callback = callback
        self.findings: dict[str, dict[str, Finding]] = {}
        """Per run, each finding's state by its id (read by ``/metrics`` and
        ``/v1/actions``): an open one as of the detector's last scored step, refreshed at
        every pass (see :meth:`_refresh`), not only when it is emitted."""
        self._seq: dict[tuple[str, str], int] = {}  # emissions so far per (run, finding id)
        self._onset: dict[tuple[str, str], float] = {}  # first report's time, same key
        self.hang_config = hang_config or HangConfig()
        self.live_window_s = live_window_s
        self.late_grace_s = late_grace_s
        self._state: dict[tuple[str, int], int] = {}  # last step read per (run, attempt)
        self._detectors: dict[str, StragglerDetector] = {}  # one per run, reset per attempt
        self._hangs: dict[tuple[str, int], HangDetector] = {}
        self._hung: set[tuple[str, int]] = set()
        self._finished: dict[str, Any] = {}  # ended runs read to their end: at which activity
        self._sparse: set[str] = set()  # runs whose rank ids are too sparse to detect on
        self._closed: set[tuple[str, int]] = set()  # ended attempts whose findings are final
        self._read: set[str] = set()  # runs a finished pass has read (their findings stored)
        self._lock = threading.Lock()
        self._pass = threading.Lock()   # one pass at a time: the thread's or run_pass's
        self.restores = RestoreWatch(store, self.hang_config, restore_config, live_window_s)
        """Each running run's latest restore: slow and stuck ranks, ranks still moving."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="goodlens-detection",
                                        daemon=True)

    def start(self) -> DetectionService:
        """Start the polling thread; returns self."""
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop polling (a pass in progress finishes)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def onset(self, run_id: str, finding_id: str) -> float | None:
        """When a finding was first reported (the unix time of the step it was reported
        at), or None when this service has not reported it."""
        with self._lock:
            return self._onset.get((run_id, finding_id))

    def has_read(self, run_id: str) -> bool:
        """Whether a pass has read the run's stored steps and stored what it found. Until
        then an empty findings list means "not looked yet", not "no straggler": at a
        collector's start the ended runs wait for passes with time to spare."""
        with self._lock:
            return run_id in self._read

    def flagged(self) -> dict[str, list[Finding]]:
        """Per run, the open findings (not resolved) in their latest state."""
        with self._lock:
            return {r: [f for f in fs.values() if f.status != "resolved"]
                    for r, fs in self.findings.items()}

    def run_pass(self, budget_s: float | None = None) -> list[tuple[str, Any]]:
        """One pass now, after any pass in progress; returns the new findings. The thread's
        passes give ended runs ``budget_s``; ``POST /v1/sync?detect=1`` gives them no limit,
        so a job that ended has its last steps' findings stored before the answer."""
        with self._pass:
            return self.poll_once(budget_s=budget_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_pass(budget_s=max(1.0, self.interval_s))
            except Exception:  # the service must outlive one bad pass
                log.exception("detection pass failed")

    def poll_once(self, now: float | None = None, budget_s: float | None = None
                  ) -> list[tuple[str, Any]]:
        """One pass over every run's newly completed steps (and, for live runs, a hang
        check at ``now``, default the wall clock); returns the new findings.

        Runs in progress go first, every pass. Ended runs not yet read to their end (at a
        collector's start: every stored run) follow, newest first, for at most ``budget_s``
        (None: all of them); the rest wait for the next pass, so a store of thousands of
        old runs does not hold live runs' findings back for the minutes it takes to read
        them."""
        import time
        now = time.time() if now is None else now
        deadline = None if budget_s is None else time.monotonic() + budget_s
        new: list[tuple[str, Any]] = []
        visited: list[str] = []
        runs = self.store.runs()
        # what marks new data: an attempt, a later activity, or more steps (a run recorded as
        # hung whose ranks went on has its attempt's end, and so its last_time, fixed)
        activity = (list(zip(runs.attempts, runs.last_time, runs.steps)) if "last_time" in runs
                    else [None] * len(runs))
        rows = sorted(zip(runs.run_id, runs.tags, runs.state, activity),
                      key=lambda r: r[2] != "running")   # stable: newest first within each
        for run_id, tags, state, seen in rows:
            if run_id in self._finished and self._finished[run_id] == seen:
                continue  # ended, read to its end, nothing new since (a restart is new)
            if state != "running" and deadline is not None and time.monotonic() > deadline:
                break   # the remaining ended runs: next pass
            summaries = self.store.step_summaries(run_id)
            if not len(summaries):
                continue
            before = len(new)
            visited.append(run_id)
            for attempt, s in summaries.groupby("attempt"):
                new += [(run_id, f) for f in self._advance(
                    run_id, int(attempt), s, tags,
                    final=state != "running" or int(attempt) < int(summaries.attempt.max()))]
            if state != "running" and len(new) == before:
                self._finished[run_id] = seen  # ended and read to its end
            latest = int(summaries.attempt.max())
            if state == "running":
                new += [(run_id, h) for h in self._check_hang(run_id, latest, now)]
        for run_id, f in new:
            self._publish(run_id, f)
        self.restores.poll([r for r, _, state, _ in rows if state == "running"], now,
                           self._hang_timeouts())
        self._refresh(visited)
        with self._lock:
            self._read.update(visited)
        return new

    def _refresh(self, run_ids: list[str]) -> None:
        """Each open finding of these runs with its numbers now (confidence, wait,
        slowdowns, ``last_step``: the detector's last scored step), kept in
        :attr:`findings` without emitting anything. The detector emits an update when its
        estimate, action or wait moves by 10% (every 10 steps at most), while its
        confidence and wait grow at every slow step: the state at its last emission lags
        (a finding whose estimate settles would keep serving the confidence it was first
        confirmed at, and a job asking for more would refuse it for the rest of the run).
        Its ``action`` and ``status`` stay those of its last emission: a job acts
        on an ``evict`` that is on record as an event, never on one the detector has not
        reported yet (updates are at least ``update_every`` steps apart)."""
        for run_id in run_ids:
            det = self._detectors.get(run_id)
            if det is None:
                continue
            live = det.active()
            with self._lock:
                mine = self.findings.get(run_id, {})
                for f in live:
                    old = mine.get(f.id)
                    if old is not None and old.status != "resolved":
                        mine[f.id] = dataclasses.replace(f, action=old.action,
                                                         status=old.status)

    def _hang_timeouts(self) -> dict[str, float]:
        """Each run's hang timeout now: its latest attempt's watch (a restore at an
        attempt's start, before any step, is judged by the previous attempt's rhythm)."""
        out: dict[str, tuple[int, float]] = {}
        for (run_id, attempt), hd in list(self._hangs.items()):
            if run_id not in out or attempt > out[run_id][0]:
                out[run_id] = (attempt, hd.timeout_s)
        return {r: t for r, (_, t) in out.items()}

    def _check_hang(self, run_id: str, attempt: int, now: float) -> list[HangFinding]:
        hd = self._hangs.get((run_id, attempt))
        if hd is None or (run_id, attempt) in self._hung:
            return []
        last = hd.last_report
        if last is None or now - last > self.live_window_s:  # a replay or a stale run
            return []
        found = [h for h in hd.check(now) if h.subject_kind == "job"]
        if found:
            self._hung.add((run_id, attempt))
        return found

    def _advance(self, run_id: str, attempt: int, summaries: Any, tags: Any,
                 final: bool = False) -> list[Finding]:
        last = self._state.get((run_id, attempt), -1)
        newest = int(summaries.step.max())
        if newest <= last:
            return self._close(run_id, attempt) if final else []
        rows = self.store.steps(run_id, attempt=attempt, step_min=last + 1, step_max=newest)
        hd = self._hangs.setdefault((run_id, attempt), HangDetector(self.hang_config))
        if len(rows):   # every step end is news to the hang watch, complete step or not
            ends = (rows.start_time + rows.duration_s).to_numpy()
            for rank, t in zip(rows["rank"].to_numpy(), ends):
                hd.observe(int(rank), float(t))
        ft = _ft_width(tags)
        expected = self._ft_expected(run_id, summaries, ft) if ft and not final else None
        done_through = newest if final else scored_through(summaries, last, self.late_grace_s,
                                                           expected)
        if done_through <= last:
            return []
        det = self._detectors.get(run_id)
        rows = rows[rows.step <= done_through]
        ready = ready_column(rows) if len(rows) else None
        if ready is None or ready.isna().all():
            self._state[(run_id, attempt)] = done_through  # no split: nothing to score
            return []
        n_ranks = int(rows["rank"].max()) + 1
        if n_ranks > rank_id_limit(int(rows["rank"].nunique())):
            # rank ids far sparser than the ranks reporting (a typo, a hostile push): the
            # detector's state is sized by the largest id, so it is not run for this run
            if run_id not in self._sparse:
                self._sparse.add(run_id)
                log.warning("run %s: rank ids up to %d for %d reporting ranks: straggler "
                            "detection skipped", run_id, n_ranks - 1, rows["rank"].nunique())
            self._state[(run_id, attempt)] = done_through
            return []
        if ft and det is not None and det.topology is not None:
            # a group out of the quorum sends nothing: its ranks keep their hosts
            known = {r: det.topology.host_names[det.topology.rank_host[r]]
                     for r in range(len(det.topology.rank_host))}
            seen = set(rows["rank"].astype(int))
            extra = pd.DataFrame({"rank": [r for r in known if r not in seen],
                                  "host": [h for r, h in known.items() if r not in seen]})
            rows_t = pd.concat([rows[["rank", "host"]], extra], ignore_index=True)
        else:
            rows_t = rows
        topo = self._topology(rows_t, n_ranks, tags)
        found: list[Finding] = []
        if det is None or new_world(det.topology, det.n, topo, n_ranks):
            # a new world (an elastic restart put other hosts on these ranks): new
            # subjects; the old world's open findings end with it (they name its hosts)
            found += end_world(det.active()) if det is not None else []
            det = self._detectors[run_id] = StragglerDetector(self.config, n_ranks, topo)
        dur = dict(zip(summaries.step, summaries.duration_median))
        start = dict(zip(summaries.step, summaries.ref_start))   # (the step period)
        rows = rows.assign(ready_s=ready)
        for step, g in rows.groupby("step", sort=True):
            vec = np.full(det.n, np.nan)
            vec[g["rank"].to_numpy()] = g.ready_s.to_numpy(dtype=float)
            found += det.update(int(step), vec, step_time_s=dur.get(step), attempt=attempt,
                                step_start_s=start.get(step))
        self._state[(run_id, attempt)] = done_through
        return found + (self._close(run_id, attempt) if final else [])

    def _close(self, run_id: str, attempt: int) -> list[Finding]:
        """Once an attempt's data has ended (read to its end): each open finding's state at
        its last step, emitted as an update where its last report was earlier
        (:meth:`StragglerDetector.flush`), so the stored record of an ended attempt ends
        with what the finding finally cost, as ``goodlens detect`` reports it."""
        if (run_id, attempt) in self._closed:
            return []
        self._closed.add((run_id, attempt))
        det = self._detectors.get(run_id)
        return det.flush() if det is not None and det.attempt == attempt else []

    def _ft_expected(self, run_id: str, summaries: Any, width: int) -> np.ndarray:
        """Per summarised step of a torchft run, the ranks that ran it: the participating
        groups of the latest ``quorum`` event at or before it, times the group's ranks
        (0 where no quorum is known yet: the step waits as any other)."""
        q = self.store.events(run_id, kinds=[EventKind.QUORUM])
        steps = summaries.step.to_numpy()
        if not len(q):
            return np.zeros(len(steps))
        q = q[q.step.notna() & q.world_size.notna()].sort_values(["step", "time"])
        if not len(q):
            return np.zeros(len(steps))
        at = np.searchsorted(q.step.to_numpy(dtype=float), steps, side="right") - 1
        groups = q.world_size.to_numpy(dtype=float)
        return np.where(at >= 0, groups[np.clip(at, 0, None)] * width, 0.0)

    @staticmethod
    def _topology(rows: Any, n_ranks: int, tags: Any) -> Topology | None:
        if rows.host.isna().any():
            return None
        try:
            meta = json.loads(tags) if isinstance(tags, str) else {}
        except ValueError:
            meta = {}
        hosts = rows.groupby("rank").host.first()
        return Topology.from_run([hosts.get(r, f"rank-{r}") for r in range(n_ranks)],
                                 meta if isinstance(meta, dict) else {})

    def _publish(self, run_id: str, f: Any) -> None:
        body = dataclasses.asdict(f)
        if isinstance(f, HangFinding):
            self._publish_hang(run_id, f, body)
            return
        with self._lock:
            self.findings.setdefault(run_id, {})[f.id] = f
            seq = self._seq.get((run_id, f.id), -1) + 1
            self._seq[(run_id, f.id)] = seq
        when = self._time_of(run_id, f)
        with self._lock:
            self._onset.setdefault((run_id, f.id), when)
        event = {"source": f"detector/{f.id}", "seq": [seq],
                 "kind": [EventKind.STRAGGLER_FLAGGED], "time": [when],
                 "attempt": f.attempt or 0, "step": [f.last_step],
                 "label": [f"{f.subject_kind}:{f.subject_id}"],
                 "detail": [json.dumps(body, default=float)]}
        if f.subject_kind == "rank":
            event["rank"] = [int(f.subject_id)]
            if f.host is not None:   # where it ran in the finding's world
                event["host"] = [str(f.host)]
        elif f.subject_kind == "host":
            event["host"] = [str(f.subject_id)]
        if self._store(run_id, event):
            self._notify(run_id, f, body)

    def _publish_hang(self, run_id: str, f: HangFinding, body: dict) -> None:
        attempt = max(a for r, a in self._hung if r == run_id)
        event = {"source": f"detector/hang/{attempt}", "seq": [0],
                 "kind": [EventKind.FAILURE_DETECTED], "time": [f.last_seen + f.timeout_s],
                 "attempt": attempt, "cause": ["hang"],
                 "detail": [json.dumps(body, default=float)]}
        if self._store(run_id, event):
            log.warning("run %s attempt %d: no rank has finished a step for %.0f s (timeout "
                        "%.0f s): recorded as a hang", run_id, attempt, f.silent_s,
                        f.timeout_s)
            self._notify(run_id, f, {"kind": "hang", "attempt": attempt, **body})

    def _store(self, run_id: str, event: dict) -> bool:
        """Store a finding's event (keyed by the finding) and say whether it is new: a
        restarted collector re-finding what it stored before, or a second collector on
        the same dataset storing it after the first, pushes nothing again. Without a
        writer, or when the store cannot say, every finding counts as new."""
        if self.writer is None:
            return True
        try:
            fut = self.writer.submit(validate_batch({"schema_version": SCHEMA_VERSION,
                                                     "run_id": run_id, "events": event}))
            return fut.result(timeout=30).events_inserted > 0
        except Exception:
            log.exception("storing a finding of run %s failed", run_id)
            return True

    def _notify(self, run_id: str, f: Any, body: dict) -> None:
        if self.callback is not None:
            try:
                self.callback(run_id, f)
            except Exception:
                log.exception("detection callback failed")
        if self.webhook:
            try:
                req = urllib.request.Request(
                    self.webhook, data=json.dumps({"run": run_id, **body}, default=float)
                    .encode(), headers={"Content-Type": "application/json"}, method="POST")
                urllib.request.urlopen(req, timeout=5).close()
            except Exception as exc:  # a launcher being down must not stop detection
                log.warning("detection webhook %s failed: %s", self.webhook, exc)

    def _time_of(self, run_id: str, f: Finding) -> float:
        s = self.store.step_summaries(run_id, attempt=f.attempt)
        row = s[s.step == f.last_step]
        return float(row.step_end.iloc[0]) if len(row) else float(s.step_end.max())
