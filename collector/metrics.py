"""Prometheus exposition: a custom collector that reads current aggregates at scrape time.

Nothing is pre-registered as module state: :func:`make_registry` builds a fresh
``CollectorRegistry`` for one collector process (and one per test). Per-run series carry a
``run`` label; per-rank labels appear only for a bounded set of flagged ranks (added by the
detectors), never one series per rank of a 16k-rank job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from goodlens.analysis.accounting import account_run
from goodlens.storage.reader import RunReader
from goodlens.storage.writer import LATENCY_BUCKETS, Writer

log = logging.getLogger("goodlens.metrics")

REJECT_REASONS = ("invalid", "auth", "too_large", "decoded_too_large", "overloaded",
                  "write_error")
"""Why pushes are refused (``goodlens_ingest_rejected_batches{reason}``, each always
exposed): 400/415/422, 401/403, a body over ``--max-body``, a push expanding beyond the
decoded rows/bytes limits (413), a full write queue (503), a failed write (500). Not per
source: a refused push's source id is whatever the sender claims (or unknown when the body
does not decode), so it would make the label set the sender's to grow; exporters report
their own refused batches (``exporter.rejected_batches``)."""


class GoodlensCollector(Collector):
    """Per-run progress and step-time quantiles, plus the collector's own health."""

    def __init__(self, store: RunReader, writer: Writer | None = None, window_steps: int = 100,
                 accounting_ttl_s: float = 10.0, detection: Any = None) -> None:
        self.store = store
        self.writer = writer
        self.detection = detection
        self.window_steps = window_steps
        self.accounting_ttl_s = accounting_ttl_s
        self._acc_cache: dict[str, tuple[float, Any]] = {}

    def collect(self) -> Iterator[Metric]:
        """Called by prometheus_client on every scrape."""
        yield from self._runs()
        yield from self._goodput()
        if self.detection is not None:
            yield from self._stragglers(self.detection.flagged())
        if self.writer is not None:
            yield from self._self_metrics(self.writer)

    def _runs(self) -> Iterator[Metric]:
        steps = CounterMetricFamily("goodlens_run_steps", "Steps summarised for the run "
                                    "(all attempts; a redone step counts again)", labels=["run"])
        last = GaugeMetricFamily("goodlens_run_last_step", "Latest step of the run's latest "
                                 "attempt", labels=["run"])
        attempt = GaugeMetricFamily("goodlens_run_attempt", "Latest attempt number",
                                    labels=["run"])
        ranks = GaugeMetricFamily("goodlens_run_ranks_reporting", "Ranks that reported the "
                                  "latest summarised step", labels=["run"])
        qs = GaugeMetricFamily("goodlens_run_step_duration_seconds", "Step time (slowest "
                               "rank) quantiles over the latest steps", labels=["run", "quantile"])
        try:
            df = self.store.run_metrics(self.window_steps)
        except Exception:
            log.exception("reading run metrics failed")
            return
        for r in df.itertuples(index=False):
            steps.add_metric([r.run_id], float(r.steps))
            last.add_metric([r.run_id], float(r.last_step))
            attempt.add_metric([r.run_id], float(r.attempt))
            ranks.add_metric([r.run_id], float(r.ranks_reporting))
            for q, v in (("0.5", r.step_p50), ("0.9", r.step_p90), ("0.99", r.step_p99)):
                qs.add_metric([r.run_id, q], float(v))
        yield from (steps, last, attempt, ranks, qs)

    def _goodput(self) -> Iterator[Metric]:
        ratio = GaugeMetricFamily("goodlens_run_goodput_ratio", "Productive share of the run's "
                                  "wall-clock", labels=["run"])
        gpu = GaugeMetricFamily("goodlens_run_gpu_time_goodput_ratio", "Productive share of "
                                "the run's allocated GPU-time", labels=["run"])
        wall = GaugeMetricFamily("goodlens_run_wall_clock_seconds", "Wall-clock of the run so "
                                 "far", labels=["run"])
        bad = GaugeMetricFamily("goodlens_run_badput_seconds", "Wall-clock lost, by bucket "
                                "(straggler_wait absent when not measured)",
                                labels=["run", "bucket"])
        part = GaugeMetricFamily("goodlens_run_restart_seconds", "Restart time by part",
                                 labels=["run", "part"])
        try:
            run_ids = list(self.store.runs().run_id)
        except Exception:
            log.exception("listing runs failed")
            return
        now = time.monotonic()
        for run_id in run_ids:
            cached = self._acc_cache.get(run_id)
            if cached is None or cached[0] < now:
                try:
                    b = account_run(self.store, run_id).breakdown()
                except Exception:
                    log.exception("accounting run %s failed", run_id)
                    continue
                cached = self._acc_cache[run_id] = (now + self.accounting_ttl_s, b)
            b = cached[1]
            ratio.add_metric([run_id], b.goodput)
            if b.gpu_time_goodput is not None:
                gpu.add_metric([run_id], b.gpu_time_goodput)
            wall.add_metric([run_id], b.wall_clock_s)
            for name, v in b.buckets.items():
                if name != "productive" and v is not None:
                    bad.add_metric([run_id, name], v)
            for name, v in b.restart_parts.items():
                part.add_metric([run_id, name], v)
        yield from (ratio, gpu, wall, bad, part)

    def _stragglers(self, flagged: dict) -> Iterator[Metric]:
        """Series only for open findings (a bounded set), never one per rank; each in its
        latest state (the detector re-estimates a finding as it lasts)."""
        count = GaugeMetricFamily("goodlens_run_ranks_flagged", "Ranks covered by open "
                                  "straggler findings", labels=["run"])
        slow = GaugeMetricFamily("goodlens_straggler_slowdown_ratio", "Estimated slowdown of "
                                 "each flagged rank, host or switch",
                                 labels=["run", "kind", "subject", "action"])
        cost = GaugeMetricFamily("goodlens_straggler_wait_per_hour_seconds", "Wait a flagged "
                                 "subject costs per hour if left alone",
                                 labels=["run", "kind", "subject"])
        waited = GaugeMetricFamily("goodlens_straggler_wait_seconds", "Wall-clock the job "
                                   "has waited on a flagged subject since its onset",
                                   labels=["run", "kind", "subject"])
        for run_id, findings in flagged.items():
            count.add_metric([run_id], float(len({r for f in findings for r in f.ranks})))
            latest = {(f.subject_kind, str(f.subject_id)): f for f in findings}  # per subject
            for f in latest.values():
                slow.add_metric([run_id, f.subject_kind, str(f.subject_id), f.action], f.slowdown)
                cost.add_metric([run_id, f.subject_kind, str(f.subject_id)], f.wait_per_hour_s)
                waited.add_metric([run_id, f.subject_kind, str(f.subject_id)],
                                  f.straggler_wait_s)
        yield from (count, slow, cost, waited)

    def _self_metrics(self, writer: Writer) -> Iterator[Metric]:
        st = writer.stats
        with st.lock:
            rows = CounterMetricFamily("goodlens_ingest_rows", "Rows stored", labels=["table"])
            rows.add_metric(["steps"], st.steps_inserted)
            rows.add_metric(["events"], st.events_inserted)
            dup = CounterMetricFamily("goodlens_ingest_duplicate_rows", "Rows received again "
                                      "and ignored (re-sent batches)", labels=["table"])
            dup.add_metric(["steps"], st.steps_duplicate)
            dup.add_metric(["events"], st.events_duplicate)
            rej = CounterMetricFamily("goodlens_ingest_rejected_batches", "Batches refused, "
                                      "by reason", labels=["reason"])
            for reason in (*REJECT_REASONS, *sorted(set(st.rejected) - set(REJECT_REASONS))):
                n = st.rejected.get(reason, 0) + (st.batches_failed if reason == "write_error"
                                                  else 0)
                rej.add_metric([reason], n)
            by_src = CounterMetricFamily(
                "goodlens_ingest_rejected_source_batches", "Batches refused, by the source "
                "the sender named (X-Goodlens-Source: its run and rank; at most 256 sources, "
                "then other) and reason", labels=["source", "reason"])
            for (src, reason), n in sorted(st.rejected_by_source.items()):
                by_src.add_metric([src, reason], n)
            batches = CounterMetricFamily("goodlens_ingest_batches", "Batches committed")
            batches.add_metric([], st.batches_committed)
            dropped = GaugeMetricFamily("goodlens_exporter_dropped_rows", "Rows exporters "
                                        "reported dropping (buffer or spill full), summed")
            dropped.add_metric([], float(sum(st.exporter_dropped.values())))
            depth = GaugeMetricFamily("goodlens_writer_queue_rows", "Rows waiting to be written")
            depth.add_metric([], st.queued_rows)
            cum, buckets = 0, []
            for ub, n in zip(LATENCY_BUCKETS, st.commit_buckets):
                cum += n
                buckets.append((repr(ub), cum))
            buckets.append(("+Inf", st.commits))
            lat = HistogramMetricFamily("goodlens_writer_commit_seconds", "Time to write and "
                                        "commit one group of batches", buckets=buckets,
                                        sum_value=st.commit_seconds_sum)
            summ = CounterMetricFamily("goodlens_writer_summarize_seconds", "Time spent "
                                       "summarising steps")
            summ.add_metric([], st.summaries_seconds_sum)
        yield from (rows, dup, rej, by_src, batches, dropped, depth, lat, summ)


def make_registry(store: RunReader, writer: Writer | None = None,
                  detection: Any = None) -> CollectorRegistry:
    """A fresh registry holding the goodlens collector (and nothing process-global)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GoodlensCollector(store, writer, detection=detection))
    return registry
