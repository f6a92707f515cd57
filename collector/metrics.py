"""Prometheus exposition: what is live, formatted at scrape time with no query.

Nothing is pre-registered as module state: :func:`make_registry` builds a fresh
``CollectorRegistry`` for one collector process (and one per test). Per-run series carry a
``run`` label and exist only for runs active within the retention (live, or ended within
``--metrics-retention``, default 1 h), so the series count follows what is live; older runs
stay queryable through ``/v1/report``, the CLI and the dashboard. Their numbers come from the
:class:`~goodlens.collector.reports.ReportKeeper`, which recomputes a run's report as its
rows arrive: a scrape formats what is kept and never runs the accounting. Per-rank labels
appear only for a bounded set of flagged subjects, never one series per rank.

Names follow Prometheus's conventions: counters end in ``_total``, units are in the names
(``_seconds``, ``_ratio``, ``_timestamp_seconds``), ``quantile`` appears only on the
step-time summary, and ``goodlens_run_time_seconds{bucket}`` includes ``productive`` so its
buckets sum to ``goodlens_run_wall_clock_seconds``. The series are listed with their
meaning in ``docs/prometheus.md`` (with the alerting rules of ``contrib/prometheus/``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from goodlens.collector.reports import STATES, KeeperConfig, ReportKeeper, RunStatus
from goodlens.storage.reader import RunReader
from goodlens.storage.writer import LATENCY_BUCKETS, Writer

log = logging.getLogger("goodlens.metrics")

REJECT_REASONS = ("invalid", "auth", "too_large", "decoded_too_large", "overloaded",
                  "write_error")
"""Why pushes are refused (``goodlens_ingest_rejected_batches_total{reason}``, each always
exposed): 400/415/422, 401/403, a body over ``--max-body``, a push expanding beyond the
decoded rows/bytes limits (413), a full write queue (503), a failed write (500)."""

QUANTILES = (("0.5", "step_p50"), ("0.9", "step_p90"), ("0.99", "step_p99"))


class GoodlensCollector(Collector):
    """Per-run progress, accounting and state, flagged stragglers, and the collector's own
    health; read from the report keeper, the detection service and the writer's counters."""

    def __init__(self, keeper: ReportKeeper, writer: Writer | None = None,
                 detection: Any = None, detached: bool = False, nodes: Any = None) -> None:
        self.keeper = keeper
        self.writer = writer
        self.detection = detection
        self.detached = detached
        self.nodes = nodes  # a NodeCache (goodlens.collector.nodes): flagged hosts

    def collect(self) -> Iterator[Metric]:
        """Called by prometheus_client on every scrape."""
        if self.detached:  # no summariser feeds the keeper: bring it up to date now
            self.keeper.catch_up()
        runs = self.keeper.exported()
        yield from _progress(runs)
        yield from _accounting(runs)
        yield from _fault_tolerance(runs)
        if self.detection is not None:
            exported = {st.row.run_id for st in runs}
            yield from _stragglers(self.detection, exported)
            yield from _restores(self.detection, exported)
        yield from _loops(runs)
        if self.nodes is not None:
            yield from _nodes(self.nodes)
        if self.writer is not None:
            yield from _self_metrics(self.writer)


def _progress(runs: list[RunStatus]) -> Iterator[Metric]:
    """State, activity, steps and step times: what an alert on a run reads."""
    state = GaugeMetricFamily("goodlens_run_state", "1 for the run's current state, 0 for the "
                              "others (running, completed, failed, preempted, other)",
                              labels=["run", "state"])
    start = GaugeMetricFamily("goodlens_run_start_timestamp_seconds", "When the run started "
                              "(unix time)", labels=["run"])
    last = GaugeMetricFamily("goodlens_run_last_activity_timestamp_seconds", "The run's "
                             "latest row (unix time of its data)", labels=["run"])
    hang = GaugeMetricFamily("goodlens_run_hang_timeout_seconds", "Silence after which a run "
                             "in progress counts as hung (its step rhythm, at least the "
                             "floor)", labels=["run"])
    failures = CounterMetricFamily("goodlens_run_failures", "Attempts of the run that ended "
                                   "in a failure", labels=["run"])
    hangs = CounterMetricFamily("goodlens_run_hangs", "Hangs the collector detected in the "
                                "run", labels=["run"])
    steps = CounterMetricFamily("goodlens_run_steps", "Steps summarised for the run (all "
                                "attempts; a redone step counts again)", labels=["run"])
    last_step = GaugeMetricFamily("goodlens_run_last_step", "Latest step of the run's latest "
                                  "attempt", labels=["run"])
    attempt = GaugeMetricFamily("goodlens_run_attempt", "Latest attempt number",
                                labels=["run"])
    ranks = GaugeMetricFamily("goodlens_run_ranks_reporting", "Ranks that reported the "
                              "latest summarised step", labels=["run"])
    durations = SummaryMetricFamily("goodlens_run_step_duration_seconds", "Step time (slowest "
                                    "rank): quantiles over the latest 100 steps, sum and count "
                                    "over every step", labels=["run"])
    for st in runs:
        r, run = st.row, [st.row.run_id]
        for s in STATES:
            state.add_metric([r.run_id, s], float(s == st.state))
        if r.start is not None:
            start.add_metric(run, r.start)
        if r.last_time is not None:
            last.add_metric(run, r.last_time)
        silence = (r.report or {}).get("silence")
        if silence and st.state == "running":
            hang.add_metric(run, float(silence["timeout_s"]))
        m = r.metrics or {}
        failures.add_metric(run, float(m.get("failures") or 0))
        hangs.add_metric(run, float(m.get("hangs") or 0))
        steps.add_metric(run, float(r.steps))
        if not m:
            continue
        last_step.add_metric(run, float(m["last_step"]))
        attempt.add_metric(run, float(m["attempt"]))
        ranks.add_metric(run, float(m["ranks_reporting"]))
        durations.add_metric(run, count_value=float(m["steps"]),
                             sum_value=float(m["step_seconds"] or 0.0))
        for q, key in QUANTILES:
            if m.get(key) is not None:
                durations.samples.append(Sample(durations.name, {"run": r.run_id,
                                                                 "quantile": q}, m[key]))
    yield from (state, start, last, hang, failures, hangs, steps, last_step, attempt, ranks,
                durations)


def _accounting(runs: list[RunStatus]) -> Iterator[Metric]:
    """Where each run's wall-clock went, from its kept report."""
    ratio = GaugeMetricFamily("goodlens_run_goodput_ratio", "Productive share of the run's "
                              "wall-clock", labels=["run"])
    gpu = GaugeMetricFamily("goodlens_run_gpu_time_goodput_ratio", "Productive share of "
                            "the run's allocated GPU-time", labels=["run"])
    wall = GaugeMetricFamily("goodlens_run_wall_clock_seconds", "Wall-clock of the run so "
                             "far", labels=["run"])
    buckets = GaugeMetricFamily("goodlens_run_time_seconds", "Wall-clock by bucket, "
                                "productive included: the buckets sum to the wall-clock "
                                "(straggler_wait absent when not measured)",
                                labels=["run", "bucket"])
    parts = GaugeMetricFamily("goodlens_run_restart_seconds", "Restart time (a failure, "
                              "eviction or resize to the next step) by part",
                              labels=["run", "part"])
    startup = GaugeMetricFamily("goodlens_run_startup_seconds", "The first attempt's "
                                "start-up (its start to its first step) by part",
                                labels=["run", "part"])
    when = GaugeMetricFamily("goodlens_run_report_timestamp_seconds", "When these numbers "
                             "were computed (unix time): they follow the rows as they arrive",
                             labels=["run"])
    for st in runs:
        rep, run = st.row.report, [st.row.run_id]
        if not rep:
            continue
        ratio.add_metric(run, _f(rep.get("goodput")))
        if rep.get("gpu_time_goodput") is not None:
            gpu.add_metric(run, _f(rep["gpu_time_goodput"]))
        wall.add_metric(run, _f(rep.get("wall_clock_s")))
        for name, v in (rep.get("buckets") or {}).items():
            if v is not None:
                buckets.add_metric([st.row.run_id, name], _f(v))
        for family, key in ((parts, "restart_parts"), (startup, "startup_parts")):
            for name, v in (rep.get(key) or {}).items():
                if v is not None:
                    family.add_metric([st.row.run_id, name], _f(v))
        when.add_metric(run, _f(st.row.computed_at))
    yield from (ratio, gpu, wall, buckets, parts, startup, when)


def _fault_tolerance(runs: list[RunStatus]) -> Iterator[Metric]:
    """torchft runs only (their report's ``fault_tolerance``): the groups taking part
    against the full world, the samples view and each state's GPU-seconds; a few series
    per run, none per group or rank."""
    groups = GaugeMetricFamily("goodlens_run_ft_replica_groups", "Replica groups of the "
                               "run's full world (torchft)", labels=["run"])
    taking = GaugeMetricFamily("goodlens_run_ft_groups_participating", "Replica groups "
                               "in the latest committed step (torchft)", labels=["run"])
    samples = GaugeMetricFamily("goodlens_run_ft_sample_goodput_ratio", "Samples committed "
                                "over what the full world would have in the same steps",
                                labels=["run"])
    gpu = GaugeMetricFamily("goodlens_run_ft_gpu_seconds", "Allocated GPU-seconds of the "
                            "replica groups by state; they sum to the allocation",
                            labels=["run", "state"])
    restarts = CounterMetricFamily("goodlens_run_ft_group_restarts", "Restarts of a "
                                   "replica group (the job went on)", labels=["run"])
    for st in runs:
        ft = (st.row.report or {}).get("fault_tolerance")
        if not ft:
            continue
        run = [st.row.run_id]
        groups.add_metric(run, _f(ft.get("replica_groups")))
        part = ft.get("participation") or []
        if part:
            taking.add_metric(run, _f(part[-1].get("groups")))
        if (ft.get("samples") or {}).get("goodput") is not None:
            samples.add_metric(run, _f(ft["samples"]["goodput"]))
        for name, v in (ft.get("gpu_seconds") or {}).items():
            if name != "allocated":
                gpu.add_metric([st.row.run_id, name], _f(v))
        restarts.add_metric(run, float(len(ft.get("recoveries") or [])))
    yield from (groups, taking, samples, gpu, restarts)


def _stragglers(detection: Any, exported: set[str]) -> Iterator[Metric]:
    """Series only for open findings of exported runs (a bounded set), never one per rank;
    each in its latest state (the detector re-estimates a finding as it lasts)."""
    count = GaugeMetricFamily("goodlens_run_ranks_flagged", "Ranks covered by open "
                              "straggler findings", labels=["run"])
    slow = GaugeMetricFamily("goodlens_straggler_slowdown_ratio", "Estimated slowdown of "
                             "each flagged rank, host or switch in its time to reach the "
                             "collective, over its siblings' (a ready-time ratio: what the "
                             "detector and its evict action compare)",
                             labels=["run", "kind", "subject", "action"])
    job = GaugeMetricFamily("goodlens_straggler_job_slowdown_ratio", "What each flagged "
                            "rank, host or switch costs the job's step: how much later it "
                            "reaches the collective than the latest rank outside it, over "
                            "the step time the job would have without it",
                            labels=["run", "kind", "subject", "action"])
    part = GaugeMetricFamily("goodlens_straggler_job_slowdown_part_ratio", "Each flagged "
                             "rank, host or switch's part of what the open findings cost the "
                             "job's step together (the parts add up to "
                             "goodlens_run_straggler_joint_job_slowdown_ratio)",
                             labels=["run", "kind", "subject", "action"])
    joint = GaugeMetricFamily("goodlens_run_straggler_joint_job_slowdown_ratio", "What the "
                              "open straggler findings cost the job's step together: the "
                              "step with them against the step without any of them",
                              labels=["run"])
    cost = GaugeMetricFamily("goodlens_straggler_wait_per_hour_seconds", "Wait a flagged "
                             "subject costs per hour if left alone",
                             labels=["run", "kind", "subject"])
    waited = GaugeMetricFamily("goodlens_straggler_wait_seconds", "Wall-clock the job "
                               "has waited on a flagged subject since its onset",
                               labels=["run", "kind", "subject"])
    onset = GaugeMetricFamily("goodlens_straggler_onset_timestamp_seconds", "When the open "
                              "finding was first reported (unix time of its data)",
                              labels=["run", "kind", "subject"])
    for run_id, findings in sorted(detection.flagged().items()):
        if run_id not in exported:
            continue
        count.add_metric([run_id], float(len({r for f in findings for r in f.ranks})))
        latest = {(f.subject_kind, str(f.subject_id)): f for f in findings}  # per subject
        if findings:   # the run's figure as the finding reported last states it
            now = max(findings, key=lambda f: f.last_step)
            if now.joint_job_slowdown is not None:
                joint.add_metric([run_id], now.joint_job_slowdown)
        for (kind, subject), f in latest.items():
            slow.add_metric([run_id, kind, subject, f.action], f.slowdown)
            if f.job_slowdown is not None:
                job.add_metric([run_id, kind, subject, f.action], f.job_slowdown)
            if f.job_slowdown_part is not None:
                part.add_metric([run_id, kind, subject, f.action], f.job_slowdown_part)
            cost.add_metric([run_id, kind, subject], f.wait_per_hour_s)
            waited.add_metric([run_id, kind, subject], f.straggler_wait_s)
            t = detection.onset(run_id, f.id)
            if t is not None:
                onset.add_metric([run_id, kind, subject], t)
    yield from (count, slow, job, part, joint, cost, waited, onset)


#: Most per-rank restore series of one run (its flagged ranks first, then by rank).
MAX_RESTORE_RANK_SERIES = 64


def _restores(detection: Any, exported: set[str]) -> Iterator[Metric]:
    """Each exported running run's latest restore (:mod:`goodlens.collector.restores`):
    ranks by phase, bytes, slow and stuck ranks; per-rank bytes for at most
    ``MAX_RESTORE_RANK_SERIES`` ranks still restoring, the flagged ones first."""
    watch = getattr(detection, "restores", None)
    phases = GaugeMetricFamily("goodlens_run_restore_ranks", "Ranks of the run's latest "
                               "checkpoint restore by phase (read, load, barrier; done once "
                               "ended)", labels=["run", "phase"])
    read = GaugeMetricFamily("goodlens_run_restore_bytes_read", "Bytes its ranks have read "
                             "in the run's latest restore", labels=["run"])
    total = GaugeMetricFamily("goodlens_run_restore_bytes_total", "Bytes its ranks will "
                              "read in it, where they said", labels=["run"])
    slow = GaugeMetricFamily("goodlens_run_slow_restore_ranks", "Ranks whose restore has "
                             "taken over 2x the median rank's and goes on (slow_restore)",
                             labels=["run"])
    stuck = GaugeMetricFamily("goodlens_run_stuck_restore_ranks", "Ranks whose restore has "
                              "not moved for the hang timeout (stuck_restore)",
                              labels=["run"])
    rank_read = GaugeMetricFamily("goodlens_rank_restore_bytes_read", "Bytes a rank still "
                                  "restoring has read", labels=["run", "rank"])
    flagged = GaugeMetricFamily("goodlens_restore_flagged_seconds", "Own restore time so "
                                "far of each slow or stuck rank", labels=["run", "rank", "kind"])
    for run_id, st in sorted((watch.state() if watch is not None else {}).items()):
        if run_id not in exported:
            continue
        counts: dict[str, int] = {}
        for r in st.ranks:
            counts[r.phase] = counts.get(r.phase, 0) + 1
        for phase, n in sorted(counts.items()):
            phases.add_metric([run_id, phase], float(n))
        read.add_metric([run_id], float(sum(r.bytes_read for r in st.ranks)))
        known = [r.bytes_total for r in st.ranks if r.bytes_total is not None]
        if known:
            total.add_metric([run_id], float(sum(known)))
        kinds = [f.kind for f in st.findings]
        slow.add_metric([run_id], float(kinds.count("slow_restore")))
        stuck.add_metric([run_id], float(kinds.count("stuck_restore")))
        for f in st.findings:
            flagged.add_metric([run_id, str(f.rank), f.kind], f.restore_s)
        first = {f.rank for f in st.findings}
        shown = sorted((r for r in st.ranks if r.rank in st.open_ranks),
                       key=lambda r: (r.rank not in first, r.rank))[:MAX_RESTORE_RANK_SERIES]
        for r in shown:
            rank_read.add_metric([run_id, str(r.rank)], float(r.bytes_read))
    yield from (phases, read, total, slow, stuck, rank_read, flagged)


def _loops(runs: list[RunStatus]) -> Iterator[Metric]:
    """Each exported run's restart loop going on, from its kept report (0: none)."""
    loop = GaugeMetricFamily("goodlens_run_restart_loop_attempts", "Attempts in a row that "
                             "failed without committing a step (a restart loop from 2; 0: "
                             "none going on)", labels=["run"])
    for st in runs:
        rep = st.row.report
        if not rep or "restart_loop" not in rep:
            continue
        lp = rep.get("restart_loop") or {}
        loop.add_metric([st.row.run_id], float(lp["count"]) if lp.get("ongoing") else 0.0)
    yield loop


def _nodes(cache: Any) -> Iterator[Metric]:
    """The hosts the node table says to drain (at most ``MAX_NODE_SERIES``), and how many
    there are; nothing per healthy host."""
    from goodlens.collector.nodes import drain_rows
    t = cache.current()
    count = GaugeMetricFamily("goodlens_nodes_drain_hosts", "Hosts whose incident rate "
                              "stands out from the fleet's (verdict drain), over the node "
                              "table's window")
    drain = GaugeMetricFamily("goodlens_node_drain", "1 for a host to drain (only hosts "
                              "with that verdict, at most 50)", labels=["host"])
    ratio = GaugeMetricFamily("goodlens_node_incident_rate_ratio", "A flagged host's "
                              "incidents per hour over the fleet's", labels=["host"])
    incidents = GaugeMetricFamily("goodlens_node_incidents", "A flagged host's incidents in "
                                  "the window", labels=["host"])
    qv = GaugeMetricFamily("goodlens_node_q_value", "A flagged host's Benjamini-Hochberg "
                           "adjusted p-value", labels=["host"])
    if t is not None:
        count.add_metric([], float(len(t.drain())))
        for r in drain_rows(t):
            drain.add_metric([r["host"]], 1.0)
            ratio.add_metric([r["host"]], _f(r["rate_ratio"]))
            incidents.add_metric([r["host"]], float(r["incidents"]))
            qv.add_metric([r["host"]], _f(r["q_value"]))
    yield from (count, drain, ratio, incidents, qv)


def _self_metrics(writer: Writer) -> Iterator[Metric]:
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
        dropped = CounterMetricFamily("goodlens_exporter_dropped_rows", "Rows exporters "
                                      "reported dropping (buffer or spill full), summed over "
                                      "their latest reports")
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


def _f(v: Any) -> float:
    return math.nan if v is None else float(v)


def make_registry(store: RunReader, writer: Writer | None = None, detection: Any = None,
                  keeper: ReportKeeper | None = None, nodes: Any = None) -> CollectorRegistry:
    """A fresh registry holding the goodlens collector (and nothing process-global).

    ``keeper``: the collector's report keeper (fed by its summariser). Without one (a test,
    a tool over a store), a detached keeper exporting every run is brought up to date at
    each scrape."""
    registry = CollectorRegistry(auto_describe=False)
    detached = keeper is None
    if keeper is None:
        keeper = ReportKeeper(store, KeeperConfig(retention_s=math.inf), persist=False)
    registry.register(GoodlensCollector(keeper, writer, detection, detached=detached,
                                        nodes=nodes))
    return registry
