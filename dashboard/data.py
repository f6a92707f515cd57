"""What each dashboard page shows, loaded through the store's read API and cached per run.

Callbacks stay thin: they ask this module for a page's data and hand it to the figure
builders. Every loader is cached by the run's *version* (steps summarised, last activity,
attempts): a live refresh of an unchanged run costs one small query, and a run that moved
on is re-read once, whatever the number of browser tabs watching it.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from goodlens.analysis.accounting import account_run
from goodlens.analysis.checkpoints import checkpoint_table
from goodlens.analysis.findings import detect_run, finding_dicts, run_tags, stored_findings
from goodlens.analysis.report import fill_goodput, report_dict, run_goodput
from goodlens.analysis.window import resolve_window, window_of
from goodlens.detectors.stragglers import StragglerConfig
from goodlens.detectors.topology import Topology
from goodlens.model.jsonable import is_missing
from goodlens.model.schema import EventKind
from goodlens.storage.reader import RunReader


@dataclass
class DashConfig:
    """How the dashboard behaves."""

    title: str = "goodlens"
    refresh_s: float = 5.0
    """Live refresh period (pages of a run still receiving data re-read it this often)."""
    rank_bins: int = 128
    """Heatmap rows at most (ranks are max-pooled into this many bins)."""
    step_bins: int = 300
    """Heatmap columns at most (steps pooled likewise)."""
    heatmap_max_rows: int = 8_000_000
    """Rank-step records the heatmap scans by default: longer attempts show their latest
    steps (at 16,384 ranks, about the last 500), which keeps a cold redraw near 0.2 s."""
    heatmap_all_rows: int = 200_000_000
    """The most the "whole attempt" choice scans (about 2 s on two cores)."""
    detect_max_rows: int = 5_000_000
    """A run no live detector has seen is scanned on the ranks page up to this many
    rank-steps (a batch pass); larger ones show only what the collector flagged."""
    whatif_trials: int = 40
    """Monte Carlo trials per what-if (the same seeds for the baseline and the change)."""
    series_points: int = 150
    """Points of the rolling goodput curve."""
    gpu_hour_price: float | None = None
    """Price of one GPU-hour (any currency) for the checkpoint costs; a page's ``?price=``
    overrides it (``--gpu-hour-price`` of ``goodlens serve`` and ``dashboard`` sets it)."""
    live_detection: bool = False
    """A live detector runs in this process (``goodlens serve``): its stored findings are
    the answer, and no batch scan is made for runs it has not flagged."""
    detection_read: Callable[[str], bool] | None = None
    """Whether the live detector has read a run yet (``DetectionService.has_read``): until
    it has, the ranks page says detection is running instead of showing no straggler."""
    straggler: StragglerConfig | None = None
    """The detector's settings for a batch scan (None: its defaults; ``--threshold``,
    ``--min-slowdown`` and ``--evict-at`` of ``goodlens serve`` and ``dashboard``)."""


class RunData:
    """Cached page data over a store's read API (:class:`goodlens.storage.reader.RunReader`)."""

    def __init__(self, store: RunReader, config: DashConfig | None = None,
                 max_entries: int = 64) -> None:
        self.store = store
        self.config = config or DashConfig()
        self._cache: OrderedDict[tuple, Any] = OrderedDict()
        # batch straggler scans run here, one at a time, off the callback threads
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="goodlens-scan")
        self._scans: dict[str, tuple[tuple | None, Future]] = {}
        self._lock = threading.Lock()
        self._max = max_entries

    # -- cache ---------------------------------------------------------------
    def version(self, run_id: str) -> tuple | None:
        """What changes when a run receives data (None: no such run). A run in progress
        also changes with the clock (its wall-clock runs to now even while it is silent):
        one step per refresh period."""
        return self._version_of(self.store.run(run_id))

    def _version_of(self, info: dict[str, Any] | None) -> tuple | None:
        """:meth:`version` from the run's row (``RunReader.run``), read once by the caller."""
        if info is None:
            return None
        v = (int(info.get("steps") or 0), _f(info.get("last_time")),
             int(info.get("attempts") or 0), str(info.get("state")))
        if v[3] == "running":
            v += (int(time.time() // self.config.refresh_s),)
        return v

    def data_version(self, run_id: str) -> tuple | None:
        """:meth:`version` without the clock: changes only when data arrives."""
        v = self.version(run_id)
        return None if v is None else v[:4]

    def _cached(self, key: tuple, build: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        value = build()
        with self._lock:
            self._cache[key] = value
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return value

    # -- pages ---------------------------------------------------------------
    def runs(self, limit: int | None = None, offset: int = 0, sort: str = "start",
             descending: bool = True, state: str | None = None, text: str | None = None
             ) -> tuple[list[dict[str, Any]], int]:
        """A page of the runs list (sorted and filtered by the store) and how many runs
        match: id, state, ranks, GPUs, attempts, steps, start, duration, goodput. A run no
        collector has accounted yet (a file of imported traces) gets its goodput computed
        here (cached): for the rows of the page, or, sorting by goodput, for every run that
        matches, since the order depends on all of them."""
        kw = {"sort": sort, "descending": descending, "state": state, "text": text}
        df, total = self.store.runs_page(limit=limit, offset=offset, **kw)
        def unknown_after() -> bool:  # the store sorts runs without a goodput last
            return offset + len(df) < total and is_missing(self.store.runs_page(
                limit=1, offset=total - 1, **kw)[0].goodput.iloc[0])
        rows = fill_goodput(df.to_dict("records"), self._account_row,
                            every=lambda: self.store.runs_page(**kw)[0].to_dict("records"),
                            unknown_after=unknown_after, by_goodput=sort == "goodput",
                            descending=descending, offset=offset, limit=limit)
        return [self._run_row(r) for r in rows], total

    def _account_row(self, r: dict[str, Any]) -> dict[str, Any]:
        """The goodput of a runs-list row no collector accounted (cached per version)."""
        v = (int(r.get("steps") or 0), _f(r.get("last_time")), int(r.get("attempts") or 0),
             str(r.get("state")))
        return {"goodput": self._cached(("goodput", r["run_id"], v),
                                        lambda: run_goodput(self.store, r["run_id"])[0])}

    def _run_row(self, r: dict[str, Any]) -> dict[str, Any]:
        start, last = _f(r.get("start")), _f(r.get("last_time"))
        ws, gpr = r.get("world_size"), r.get("gpus_per_rank")
        wall = None if is_missing(r.get("wall_clock_s")) else float(r["wall_clock_s"])
        return {"run_id": r["run_id"], "name": r.get("name"), "state": r.get("state"),
                "ranks": _int(ws), "gpus": (_int(ws) or 0) * (_int(gpr) or 1) or None,
                "attempts": int(r.get("attempts") or 0), "steps": int(r.get("steps") or 0),
                "start": start, "duration_s": wall if wall is not None else (
                    (last - start) if not (math.isnan(start) or math.isnan(last)) else None),
                "goodput": None if is_missing(r.get("goodput")) else float(r["goodput"])}

    def overview(self, run_id: str, exclude: tuple[str, ...] = (), since: str = "",
                 until: str = "") -> dict[str, Any] | None:
        """Headline, breakdown, per-attempt rows, rolling goodput and the timeline's data;
        ``exclude``: named parts taken out of the wall-clock (as ``report --exclude``);
        ``since``/``until``: the window the breakdown covers, as ``report --since --until``
        reads them (the attempts table stays the whole run's, as the report's)."""
        v = self.version(run_id)
        if v is None:
            return None
        ex = tuple(sorted({x for x in exclude if x}))
        return self._cached(("overview", run_id, v, ex, since or "", until or ""),
                            lambda: self._overview(run_id, ex, since or "", until or ""))

    def _overview(self, run_id: str, exclude: tuple[str, ...] = (), since: str = "",
                  until: str = "") -> dict[str, Any]:
        acc = account_run(self.store, run_id)
        try:
            lo, hi = resolve_window(since, until, acc.start, acc.end)
            error = None
        except ValueError as exc:
            lo = hi = None
            error = str(exc)
        rep = acc.breakdown(lo, hi, exclude=exclude).as_dict()
        rep["attempts"] = [b.as_dict() for b in acc.by_attempt(exclude)]
        rep["excludable"] = excludable(acc.breakdown().as_dict())
        rep["window"] = {"since": lo, "until": hi, "error": error, "run_start": acc.start,
                         "run_end": acc.end}
        series = acc.goodput_series(points=self.config.series_points, exclude=exclude)
        events = self.store.events(run_id, kinds=[
            EventKind.FAILURE_DETECTED, EventKind.ATTEMPT_END, EventKind.PREEMPTED,
            EventKind.RANK_EVICTED, EventKind.RANK_JOINED, EventKind.WORLD_RESIZED,
            EventKind.STRAGGLER_FLAGGED, EventKind.CKPT_SAVE_START, EventKind.GROUP_START,
            EventKind.GROUP_END, EventKind.STEP_DISCARDED])
        info = self.store.run(run_id)
        ft = self._fault_tolerance(run_id, info, lo, hi, exclude)
        if ft is not None:  # as /v1/report: a torchft run's GPU-time is its groups'
            rep["gpu_time_goodput"] = ft["gpu_time_goodput"]
        return {"run": run_id, "info": info, "report": rep, "ft": ft,
                "series": series, "attempts": self.store.attempts(run_id),
                "events": _timeline_events(events)}

    def _fault_tolerance(self, run_id: str, info: dict[str, Any] | None, lo: float | None,
                         hi: float | None, exclude: tuple[str, ...]) -> dict[str, Any] | None:
        """A torchft run's ``fault_tolerance`` section for the window (None for any other
        run), taken from :func:`goodlens.analysis.report.report_dict` itself so the page
        shows what ``/v1/report`` and ``goodlens report --json`` say."""
        from goodlens.analysis.ft import is_ft_run
        if not is_ft_run(run_tags(info)):
            return None
        return report_dict(self.store, run_id, since=lo, until=hi,
                           exclude=exclude).get("fault_tolerance")

    def compare(self, items: list[str]) -> list[dict[str, Any]]:
        """Breakdowns side by side: each item is a run id, or ``RUN@ATTEMPT`` for one
        attempt of it (as ``report``'s ``attempts`` rows). An item naming nothing comes back
        with ``error`` set."""
        out = []
        for item in items:
            run_id, _, att = item.rpartition("@") if "@" in item else (item, "", "")
            v = self.version(run_id)
            if v is None or (att and not att.isdigit()):
                out.append({"item": item, "error": f"no run {run_id!r}" if v is None
                            else f"not an attempt: {att!r}"})
                continue

            def build(r: str = run_id, a: str = att) -> dict[str, Any]:
                acc = account_run(self.store, r)
                try:
                    b = acc.breakdown(attempt=int(a) if a else None)
                except KeyError as exc:
                    return {"error": str(exc).strip("'\"")}
                return b.as_dict()
            out.append({"item": item, "run": run_id,
                        "attempt": int(att) if att else None,
                        **self._cached(("compare", run_id, v, att), build)})
        return out

    def compare_choices(self) -> list[tuple[str, str]]:
        """What the comparison can pick: ``(value, label)`` for every run and each attempt of
        a run with more than one."""
        df = self.store.runs()
        out = []
        for r in df.to_dict("records"):
            rid = str(r["run_id"])
            out.append((rid, rid))
            n = int(r.get("attempts") or 0)
            if n > 1:
                att = self.store.attempts(rid)
                out += [(f"{rid}@{int(a)}", f"{rid}, attempt {int(a)}") for a in att.attempt]
        return out

    def checkpoints(self, run_id: str, since: str = "", until: str = "",
                    price: float | None = None, retained: int = 2) -> dict[str, Any] | None:
        """Each checkpoint's stall, write time and size (those starting in the window), what
        they cost (GPU-hours, money at ``price`` per GPU-hour, bandwidth, storage for
        ``retained`` copies) and the measured plan."""
        v = self.version(run_id)  # the plan reads the wall-clock: it follows the clock too
        if v is None:
            return None
        price = self.config.gpu_hour_price if price is None else price
        return self._cached(("checkpoints", run_id, v, since, until, price, retained),
                            lambda: self._checkpoints(run_id, since, until, price, retained))

    def _checkpoints(self, run_id: str, since: str = "", until: str = "",
                     price: float | None = None, retained: int = 2) -> dict[str, Any]:
        from goodlens.analysis.ckptcost import run_checkpoint_cost
        from goodlens.analysis.measured import measure_run
        table = checkpoint_table(self.store.events(run_id, kinds=[
            EventKind.CKPT_SAVE_START, EventKind.CKPT_SAVE_BLOCKING_END,
            EventKind.CKPT_SAVE_DURABLE_END]))
        m = measure_run(self.store, run_id)
        error = None
        if (since or until) and len(table):
            try:
                info = self.store.run(run_id) or {}
                first = np.nanmin([float(table.start.min()), _f(info.get("start"))])
                last = np.nanmax([float(table.start.max()), _f(info.get("last_time"))])
                lo, hi = resolve_window(since, until, float(first), float(last))
                keep = np.ones(len(table), dtype=bool)
                if lo is not None:
                    keep &= table.start.to_numpy(float) >= lo
                if hi is not None:
                    keep &= table.start.to_numpy(float) <= hi
                table = table[keep].reset_index(drop=True)
            except ValueError as exc:
                error = str(exc)
        md = m.as_dict()
        cost = run_checkpoint_cost(table, md["gpus"], md.get("interval_s"), retained, price,
                                   md)
        return {"run": run_id, "table": table, "measured": md, "cost": cost,
                "window_error": error}

    def ranks(self, run_id: str, attempt: int | None = None, whole: bool = False,
              since: str = "", until: str = "") -> dict[str, Any] | None:
        """The rank x step heatmap of one attempt (default: the latest with steps in the
        window), the host roll-up over the same steps, and the run's findings. ``since`` /
        ``until``: the window (as ``report --since --until`` reads it) whose steps the grid
        and the hosts cover. The grid is re-read only when data arrives (not with the
        clock), unless a window is read against a live run's moving end. ``version``: what
        the answer was drawn for."""
        info = self.store.run(run_id)
        v = self._version_of(info)
        if v is None:
            return None
        since, until = since or "", until or ""
        key = v if (since or until) else v[:4]
        grid = self._cached(("ranks", run_id, key, attempt, whole, since, until),
                            lambda: self._ranks(run_id, info, attempt, whole, since, until))
        found, source = self.findings(run_id, info=info)
        return {**grid, "findings": found, "findings_source": source, "version": key}

    def _ranks(self, run_id: str, info: dict[str, Any], attempt: int | None,
               whole: bool = False, since: str = "", until: str = "") -> dict[str, Any]:
        cfg = self.config
        attempts = self.store.attempts(run_id)
        known = [int(a) for a in attempts.attempt] if len(attempts) else []
        out: dict[str, Any] = {"run": run_id, "attempt": attempt, "attempts": known,
                               "grid": None, "hosts": None, "window": None,
                               "since": None, "until": None, "window_error": None,
                               "picked": attempt in known}
        try:
            out["since"], out["until"] = lo, hi = window_of(since, until, attempts)
        except ValueError as exc:
            lo = hi = None
            out["window_error"] = str(exc)
        span = None
        if out["picked"]:
            span = self.store.step_range(run_id, attempt, lo, hi)
        else:  # the latest attempt with steps (in the window)
            attempt = known[-1] if known else 0
            for a in reversed(known):
                span = self.store.step_range(run_id, a, lo, hi)
                if span is not None:
                    attempt = a
                    break
        out["attempt"] = attempt
        if span is not None:
            s0, s1, ranks = span
            # long attempts: the latest steps that fit the scan budget
            budget = cfg.heatmap_all_rows if whole else cfg.heatmap_max_rows
            s0 = max(s0, s1 - max(budget // max(ranks, 1), 1) + 1)
            out["grid"] = self.store.heatmap(run_id, attempt, s0, s1, min(cfg.rank_bins, ranks),
                                             min(cfg.step_bins, s1 - s0 + 1))
            out["window"] = (s0, s1, ranks)
            out["clipped"] = s0 > span[0]
            hosts = self.store.host_compute(run_id, attempt, s0, s1)
            out["hosts"] = _host_rollup(hosts, run_tags(info))
        return out

    def findings(self, run_id: str, wait: bool = False, info: dict[str, Any] | None = None
                 ) -> tuple[list[dict[str, Any]], str]:
        """``(findings, source)``: what the live detector stored (``live``; ``detecting``
        while it has not read the run yet), else a batch pass over the step records run on
        a background thread (``batch`` once done, ``pending`` meanwhile, unless ``wait``),
        or ``too-large`` for a run over ``detect_max_rows``. ``info``: the run's row when
        the caller has read it."""
        found = stored_findings(self.store, run_id)
        if found or self.config.live_detection:
            read = self.config.detection_read
            return found, "detecting" if not found and read and not read(run_id) else "live"
        info = self.store.run(run_id) if info is None else info
        v = self._version_of(info)
        v = None if v is None else v[:4]
        info = info or {}
        rows = int(info.get("steps") or 0) * int(info.get("world_size") or 1)
        if rows > self.config.detect_max_rows:
            return [], "too-large"
        with self._lock:
            # one scan per run: a newer version waits for the running one to finish
            # rather than queueing behind it (a watched live run would pile them up)
            seen, fut = self._scans.get(run_id, (None, None))
            if fut is None or (seen != v and fut.done()):
                fut = self._pool.submit(lambda: _batch_findings(self.store, run_id,
                                                                self.config.straggler))
                self._scans[run_id] = (v, fut)
                while len(self._scans) > self._max:
                    self._scans.pop(next(iter(self._scans)))
        if not wait and not fut.done():
            return [], "pending"
        return fut.result(), "batch"

    def whatif_calibration(self, run_id: str) -> Any:
        """The simulator calibrated to the run (cached per version)."""
        from goodlens.analysis.whatif import calibrate
        v = self.version(run_id)
        if v is None:
            return None

        def build() -> Any:
            return calibrate(self.store, run_id, findings=self.findings(run_id, wait=True)[0])
        return self._cached(("calibration", run_id, v), build)

    def whatif(self, run_id: str, changes: dict[str, Any]) -> dict[str, Any] | None:
        """Simulated breakdown of the run as it was and with ``changes`` (cached)."""
        from goodlens.analysis.whatif import what_if
        cal = self.whatif_calibration(run_id)
        if cal is None:
            return None
        key = ("whatif", run_id, self.version(run_id), tuple(sorted(changes.items())))
        return self._cached(key, lambda: what_if(cal, changes, self.config.whatif_trials))


def _batch_findings(store: Any, run_id: str, config: StragglerConfig | None = None
                    ) -> list[dict[str, Any]]:
    """A batch detection pass as dicts; none for a run whose rank ids are too sparse to
    lay out (``goodlens detect`` says why)."""
    try:
        return finding_dicts(detect_run(store, run_id, config))
    except ValueError:
        return []


def excludable(rep: dict[str, Any]) -> list[str]:
    """The named parts of a run's breakdown that an exclusion can take out of its
    wall-clock: the startup's, restart's and other's parts that hold time (``queue``, a custom
    label such as ``maintenance``...), in the report's order, each name once (``init``
    takes out the first start-up's and the restarts')."""
    parts = [*rep.get("startup_parts", {}).items(), *rep.get("restart_parts", {}).items(),
             *rep.get("other_parts", {}).items()]
    return list(dict.fromkeys(name for name, v in parts if v and name != "unattributed"))


def _timeline_events(ev: pd.DataFrame) -> pd.DataFrame:
    """One marker per job-level happening: checkpoints and failures once per save/attempt,
    not once per rank."""
    if not len(ev):
        return ev
    ckpt = ev[ev.kind == EventKind.CKPT_SAVE_START].drop_duplicates(["attempt", "step", "tier"])
    fail = ev[ev.kind == EventKind.FAILURE_DETECTED].drop_duplicates(["attempt"])
    rest = ev[~ev.kind.isin([EventKind.CKPT_SAVE_START, EventKind.FAILURE_DETECTED,
                             EventKind.ATTEMPT_END])]
    # an attempt that ended with a cause other than completing (a crash it reported itself);
    # a clean end is the attempt bar's end, not a marker that reads like a failure
    ends = ev[(ev.kind == EventKind.ATTEMPT_END) & ev.cause.notna()
              & ~ev.cause.isin(["completed", "ended"])].drop_duplicates(["attempt"])
    return pd.concat([ckpt, fail, rest, ends]).sort_values("time").reset_index(drop=True)


def _host_rollup(hosts: pd.DataFrame, tags: dict[str, Any]) -> pd.DataFrame | None:
    """Hosts with their compute relative to the median host (and switch when known)."""
    if not len(hosts):
        return None
    med = float(np.median(hosts["mean"]))
    h = hosts.assign(relative=hosts["mean"] / med - 1 if med > 0 else 0.0,
                     worst_relative=hosts.worst_rank_mean / med - 1 if med > 0 else 0.0)
    # the detector's rule (a map, else nodes_per_switch over host names in natural order),
    # so a host's switch here is the one its findings name
    topo = Topology.from_run([str(x) for x in h.host], tags)
    if topo.host_switch is not None:
        h["switch"] = [str(topo.switch_name(int(topo.host_switch[i]))) for i in topo.rank_host]
    return h.reset_index(drop=True)


def _f(v: Any) -> float:
    try:
        return float(v) if v is not None and v is not pd.NA else math.nan
    except (TypeError, ValueError):
        return math.nan


def _int(v: Any) -> int | None:
    f = _f(v)
    return None if math.isnan(f) else int(f)
