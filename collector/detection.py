"""Streaming straggler detection inside the collector.

The detectors (``detectors/``) are pure statistics; this service feeds them as data arrives
and acts on what they find, so a launcher can evict a slow node while the run goes on:

- every ``interval_s`` it reads, per run and attempt, the per-rank compute of the steps that
  completed since its last pass (through the store's read API, on its own thread) and
  updates one :class:`~detectors.stragglers.StragglerDetector` per (run, attempt);
- each new finding is stored as a ``straggler_flagged`` event (through the single writer;
  its key is derived from the finding, so a restarted collector re-finding it adds nothing),
  shown on ``/metrics`` (series only for flagged subjects: a bounded set), and pushed once
  to an optional webhook (JSON POST) and an optional Python callback.

A step is processed once a later step has been summarised (its ranks have reported); ranks
still missing then are treated as not reporting (NaN), which the detector tolerates.
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

from collector.ingest import validate_batch
from collector.store import Store
from collector.writer import Writer
from detectors.stragglers import Finding, StragglerConfig, StragglerDetector, Topology
from goodlens.model import SCHEMA_VERSION

log = logging.getLogger("goodlens.detection")


class DetectionService:
    """Runs the straggler detector over live runs and publishes its findings."""

    def __init__(self, store: Store, writer: Writer | None, *, interval_s: float = 2.0,
                 config: StragglerConfig | None = None, webhook: str | None = None,
                 callback: Callable[[str, Finding], None] | None = None) -> None:
        self.store = store
        self.writer = writer
        self.interval_s = interval_s
        self.config = config or StragglerConfig()
        self.webhook = webhook
        self.callback = callback
        self.findings: dict[str, list[Finding]] = {}
        """Findings so far, per run (read by /metrics)."""
        self._state: dict[tuple[str, int], tuple[StragglerDetector, int]] = {}
        self._lock = threading.Lock()
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

    def flagged(self) -> dict[str, list[Finding]]:
        """A copy of the findings per run."""
        with self._lock:
            return {r: list(f) for r, f in self.findings.items()}

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll_once()
            except Exception:  # the service must outlive one bad pass
                log.exception("detection pass failed")

    def poll_once(self) -> list[tuple[str, Finding]]:
        """One pass over every run's newly completed steps; returns the new findings."""
        new: list[tuple[str, Finding]] = []
        runs = self.store.runs()
        for run_id, tags in zip(runs.run_id, runs.tags):
            summaries = self.store.step_summaries(run_id)
            if not len(summaries):
                continue
            for attempt, s in summaries.groupby("attempt"):
                new += [(run_id, f) for f in self._advance(run_id, int(attempt), s, tags)]
        for run_id, f in new:
            self._publish(run_id, f)
        return new

    def _advance(self, run_id: str, attempt: int, summaries: Any, tags: Any) -> list[Finding]:
        done_through = int(summaries.step.max()) - 1  # the newest step may still be arriving
        det, last = self._state.get((run_id, attempt), (None, -1))
        if done_through <= last:
            return []
        rows = self.store.steps(run_id, attempt=attempt, step_min=last + 1,
                                step_max=done_through)
        if not len(rows) or rows.compute_s.isna().all():
            self._state[(run_id, attempt)] = (det, done_through)  # no split: nothing to score
            return []
        n_ranks = int(rows["rank"].max()) + 1
        if det is None or n_ranks > det.n:
            det = StragglerDetector(self.config, n_ranks, self._topology(rows, n_ranks, tags))
        found: list[Finding] = []
        dur = dict(zip(summaries.step, summaries.duration_median))
        for step, g in rows.groupby("step", sort=True):
            compute = np.full(det.n, np.nan)
            compute[g["rank"].to_numpy()] = g.compute_s.to_numpy(dtype=float)
            found += det.update(int(step), compute, step_time_s=dur.get(step),
                                attempt=attempt)
        self._state[(run_id, attempt)] = (det, done_through)
        return found

    @staticmethod
    def _topology(rows: Any, n_ranks: int, tags: Any) -> Topology | None:
        if rows.host.isna().any():
            return None
        try:
            meta = json.loads(tags) if isinstance(tags, str) else {}
        except ValueError:
            meta = {}
        per_switch = meta.get("nodes_per_switch") if isinstance(meta, dict) else None
        hosts = rows.groupby("rank").host.first()
        return Topology.from_hosts([hosts.get(r, f"rank-{r}") for r in range(n_ranks)],
                                   int(per_switch) if per_switch else None)

    def _publish(self, run_id: str, f: Finding) -> None:
        with self._lock:
            self.findings.setdefault(run_id, []).append(f)
        body = dataclasses.asdict(f)
        if self.writer is not None:
            source = f"detector/{f.attempt}/{f.subject_kind}/{f.subject_id}/{f.first_step}"
            event = {"source": source, "seq": [0], "kind": ["straggler_flagged"],
                     "time": [self._time_of(run_id, f)], "attempt": f.attempt or 0,
                     "step": [f.first_step], "label": [f"{f.subject_kind}:{f.subject_id}"],
                     "detail": [json.dumps(body, default=float)]}
            if f.subject_kind == "rank":
                event["rank"] = [int(f.subject_id)]
            elif f.subject_kind == "host":
                event["host"] = [str(f.subject_id)]
            try:
                self.writer.submit(validate_batch({"schema_version": SCHEMA_VERSION,
                                                   "run_id": run_id, "events": event}))
            except Exception:
                log.exception("storing a finding of run %s failed", run_id)
        if self.callback is not None:
            try:
                self.callback(run_id, f)
            except Exception:
                log.exception("straggler callback failed")
        if self.webhook:
            try:
                req = urllib.request.Request(
                    self.webhook, data=json.dumps({"run": run_id, **body}, default=float)
                    .encode(), headers={"Content-Type": "application/json"}, method="POST")
                urllib.request.urlopen(req, timeout=5).close()
            except Exception as exc:  # a launcher being down must not stop detection
                log.warning("straggler webhook %s failed: %s", self.webhook, exc)

    def _time_of(self, run_id: str, f: Finding) -> float:
        s = self.store.step_summaries(run_id, attempt=f.attempt)
        row = s[s.step == f.detected_step]
        return float(row.step_end.iloc[0]) if len(row) else float(s.step_end.max())
