"""Straggler detector evaluation on traces from an independent noise model.

The traces come from ``bench/_evalgen.py``, written for this evaluation and independent of
the project's trace generator (``goodlens/analysis/runsim/tracegen.py``) and of
``bench/detectors.py``. Per step and rank the detector sees the *ready* time (compute + data
wait + anything before the all-reduce) and the step's duration, fed step by step to
``StragglerDetector.update`` exactly as a live run would.

Noise model (``bench/_evalgen.py`` has the details; every parameter drawn per trace): base
compute 0.5-1.5 s per step; shared per-step jitter (lognormal CV 2-5%); independent per-rank
noise (lognormal CV 1-3%, one per trace or one per rank); an evaluation step every 200-500
steps making that step 2-4x longer on every rank; single-rank spikes (1e-4 per rank-step,
1.3-2x for 1-3 steps, half in compute, half as extra data wait); clock noise N(0, 0.25-0.75
ms) with occasional 1 ms rounding and a few coarse-clock ranks; a 0.1-1 ms data wait on every
rank. 8 ranks per host (``node-0007``), 4 hosts per switch (``switchrdzv`` and
``switchuneven`` change the layout; the detector gets the topology from each trace's tags,
as from a run's). Cases: ``healthy`` and the
planted ones in ``_evalgen.CASES`` (onset uniform in [100, 300]; slowdowns multiply the ready
time, the data-starved ones add 5% / 20% of the base compute to one rank's data wait; nested
plants a switch 5%, a host in it 6% more, a rank in it 10% more, at onsets A < B < C;
halfswitch slows a random half of the switches 8%, one subject per switch).

Matching rules (per planted subject, over every seed):

- recall: a ``new`` finding with the subject's exact kind and id, detected at or after its
  onset; ``any``: some ``new`` finding whose ranks overlap the subject's, at or after onset;
- right subject: of the subjects some overlapping finding reached, the share named exactly;
- false: ``new`` findings matching no planted subject exactly, or matching one before its
  onset (in nested only the three planted subjects match: any other subject in the chain,
  e.g. another rank of the slow host or the slow host's ranks reported one by one, is false);
  ``dup``: further ``new`` findings for a subject already found;
- delay: detected step - onset of the first exact match;
- estimate: the subject's slowdown 100 steps after detection (from ``det.active()`` when the
  detector has it, else its latest ``new``/``update`` finding), relative error |est - truth|
  / truth against its own extra factor (nested: 10% rank, 6% host, 5% switch); no estimate
  (resolved, or not open) counts as outside 20%;
- NVIDIA's rule (``nvidia_rule_matrix``, ``--window`` steps per window) on the same traces:
  a subject is found when any of its ranks is flagged in a window ending at or after its
  onset; a false flag is any other (rank, window) flag;
- healthy: ``--healthy-rank-steps`` rank-steps of long healthy traces (with spikes), split
  evenly over the sizes, generated and scored in chunks (never the whole matrix); every
  ``new`` finding is false.

The streaming cost is the median wall time of one ``update`` (measured inside the runs, with
``--jobs`` processes side by side) and, alone, over ``--cost-steps`` updates at
``--cost-ranks`` on a ``rank5`` trace (spikes included, so roll-up work is counted).
Targets (from the issue) are printed with PASS/MISS; the exit code is 0.

    .venv/bin/python bench/detector_eval.py [--ranks 256,2048] [--seeds 3] [--steps 1200]
        [--healthy-rank-steps 1e8] [--healthy-steps 20000] [--window 100]
        [--cost-ranks 16384] [--cost-steps 300] [--jobs 2] [--quick]
        [--cases rank2,healthy] [--set threshold_h=20 --set drift_k_sigmas=0.3]
        [--subjects]

``--set`` overrides a ``StragglerConfig`` field for every run (the trade-off between finding
weak stragglers sooner and false findings is measured that way, with the same traces).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import markdown_section, table
from bench._evalgen import CASES, PLANTED, Subject, Trace
from goodlens.detectors.stragglers import (
    StragglerConfig,
    StragglerDetector,
    Topology,
    nvidia_rule_matrix,
)

ESTIMATE_AFTER = 100
BIG_CASES = ("rank5", "rank20", "host5", "data5", "data20", "nested", "halfswitch",
             "intermittent")
SMALL_CASES = ("rank2", "switch3", "switchrdzv", "switchuneven")
TARGET_DELAY, SMALL_WITHIN, EST_REL, TARGET_MS, HEALTHY_MIN = 30, 150, 0.20, 2.0, 1e8
DEFAULTS = dict(ranks="256,2048", seeds=3, steps=1200, healthy_rank_steps=1e8,
                healthy_steps=20000, cost_ranks=16384, cost_steps=300)
QUICK = dict(ranks="128", seeds=1, steps=800, healthy_rank_steps=2e6, healthy_steps=5000,
             cost_ranks=16384, cost_steps=100)


# ----------------------------------------------------------------------------- scoring
def _key(f) -> tuple[str, int | str]:
    sid = f.subject_id   # (a host's name, a switch's name from a map, else a number)
    return (str(f.subject_kind), sid if isinstance(sid, str) else int(sid))


@dataclass
class SubjectResult:
    subject: Subject
    found_step: int | None = None     # first exact new finding at/after onset
    overlap_step: int | None = None   # first overlapping new finding at/after onset
    first_named: tuple | None = None  # that finding's (kind, id)
    estimate: float | None = None
    nvidia: bool = False

    @property
    def delay(self) -> int | None:
        return None if self.found_step is None else self.found_step - self.subject.onset

    @property
    def rel_err(self) -> float | None:
        if self.estimate is None:
            return None
        return abs(self.estimate - self.subject.slowdown) / self.subject.slowdown


@dataclass
class TraceResult:
    case: str
    n: int
    seed: int
    rank_steps: int
    subjects: list[SubjectResult]
    false: list[tuple] = field(default_factory=list)   # (kind, id, step, slowdown)
    dups: int = 0
    nvidia_false: int = 0
    update_s: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    wall_s: float = 0.0


class Tracker:
    """Matches one trace's findings against its planted subjects as they stream in."""

    def __init__(self, truth: list[Subject], det: StragglerDetector, steps: int) -> None:
        self.det, self.steps = det, steps
        self.res = [SubjectResult(s) for s in truth]
        self.by_key = {s.key: i for i, s in enumerate(truth)}
        self.rank_sets = [set(s.ranks) for s in truth]
        self.latest: dict[tuple, object] = {}
        self.due: dict[int, list[int]] = {}
        self.false: list[tuple] = []
        self.dups = 0

    def feed(self, step: int, findings: list) -> None:
        for f in findings:
            status, key = getattr(f, "status", "new"), _key(f)
            if status == "resolved":
                self.latest.pop(key, None)
                continue
            self.latest[key] = f
            if status == "new":
                self._new(step, f, key)
        for i in self.due.pop(step, ()):
            self.res[i].estimate = self._estimate(self.res[i].subject.key)

    def _new(self, step: int, f, key: tuple) -> None:
        ranks = set(int(r) for r in f.ranks)
        for i, r in enumerate(self.res):
            if r.overlap_step is None and step >= r.subject.onset and ranks & self.rank_sets[i]:
                r.overlap_step, r.first_named = step, key
        i = self.by_key.get(key)
        if i is None or step < self.res[i].subject.onset:
            self.false.append((key[0], key[1], step, round(float(f.slowdown), 4)))
            return
        r = self.res[i]
        if r.found_step is not None:
            self.dups += 1
            return
        r.found_step = step
        self.due.setdefault(min(step + ESTIMATE_AFTER, self.steps - 1), []).append(i)

    def _estimate(self, key: tuple) -> float | None:
        if hasattr(self.det, "active"):
            for f in self.det.active():
                if _key(f) == key:
                    return float(f.slowdown)
            return None
        f = self.latest.get(key)
        return None if f is None else float(f.slowdown)

    def nvidia(self, flags: list) -> int:
        """Mark the subjects NVIDIA's rule found; the number of its false flags."""
        false = 0
        for fl in flags:
            hit = False
            for i, r in enumerate(self.res):
                if fl.rank in self.rank_sets[i] and fl.last_step >= r.subject.onset:
                    r.nvidia = hit = True
            false += not hit
        return false


def run_trace(case: str, n: int, steps: int, seed: int, window: int,
              overrides: tuple = ()) -> TraceResult:
    """Generate one trace in chunks and feed it to a fresh detector step by step
    (``overrides``: ``StragglerConfig`` fields as (name, value) pairs)."""
    t0 = time.perf_counter()
    trace = Trace(case, n, steps, seed)
    topo = Topology.from_run(trace.hosts, trace.tags)
    det = StragglerDetector(StragglerConfig(**dict(overrides)), n, topo)
    tr = Tracker(trace.truth, det, steps)
    upd = np.empty(steps, np.float32)
    chunk = max(window, (2**21 // n) // window * window)
    flags: list = []
    clock = time.perf_counter
    for s0, ready, dur in trace.chunks(chunk):
        for i in range(len(ready)):
            step = s0 + i
            t = clock()
            out = det.update(step, ready[i], step_time_s=float(dur[i]))
            upd[step] = clock() - t
            if out or step in tr.due:
                tr.feed(step, out)
        flags += nvidia_rule_matrix(ready, np.arange(s0, s0 + len(ready)), window)
    nv_false = tr.nvidia(flags)
    return TraceResult(case, n, seed, n * steps, tr.res, tr.false, tr.dups, nv_false, upd,
                       time.perf_counter() - t0)


def _job(spec: tuple) -> TraceResult:
    return run_trace(*spec)


# ----------------------------------------------------------------------------- plan & run
def jobs_for(args, sizes: list[int]) -> list[tuple]:
    """The trace specs, largest first: per size, healthy traces of about
    ``--healthy-steps`` steps making up its share of ``--healthy-rank-steps``, and every
    planted case at every seed."""
    specs = []
    for n in sizes:
        budget = args.healthy_rank_steps / len(sizes)
        k = max(1, round(budget / (n * args.healthy_steps)))
        length = max(1, math.ceil(budget / (n * k)))
        if "healthy" in args.cases:
            specs += [("healthy", n, length, 10_000 + i, args.window, args.overrides)
                      for i in range(k)]
        specs += [(c, n, args.steps, s, args.window, args.overrides) for c in PLANTED
                  if c in args.cases for s in range(args.seeds)]
    specs.sort(key=lambda s: -s[1] * s[2])
    return specs


def run_all(specs: list[tuple], jobs: int) -> list[TraceResult]:
    out: list[TraceResult] = []
    done = 0

    def note(r: TraceResult) -> None:
        nonlocal done
        done += 1
        print(f"[{done}/{len(specs)}] {r.case} n={r.n} seed={r.seed} "
              f"{r.rank_steps / 1e6:.1f} M rank-steps {r.wall_s:.1f} s", file=sys.stderr)
        out.append(r)

    if jobs <= 1:
        for s in specs:
            note(_job(s))
        return out
    with ProcessPoolExecutor(jobs) as ex:
        for fut in as_completed([ex.submit(_job, s) for s in specs]):
            note(fut.result())
    return out


def cost(n: int, steps: int, overrides: tuple = ()) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per ``update`` at ``n`` ranks on a rank5 trace (alone in this process): wall
    and this process's CPU time (another job on the machine moves the first, not the second)."""
    trace = Trace("rank5", n, steps, 99)
    det = StragglerDetector(StragglerConfig(**dict(overrides)), n,
                            Topology.from_run(trace.hosts, trace.tags))
    ts, cpu = [], []
    for s0, ready, dur in trace.chunks(steps):
        for i in range(len(ready)):
            t, c = time.perf_counter(), time.process_time()
            det.update(s0 + i, ready[i], step_time_s=float(dur[i]))
            ts.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
    return np.asarray(ts), np.asarray(cpu)


# ----------------------------------------------------------------------------- report
def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _frac(num: int, den: int) -> float | None:
    return num / den if den else None


@dataclass
class CaseStats:
    """One case at one size, over every seed."""

    subjects: int
    found: int
    overlap: int
    false: int
    dups: int
    delays: list[int]
    errs: list[float | None]
    nvidia: int
    nvidia_false: int

    @property
    def recall(self) -> float | None:
        return _frac(self.found, self.subjects)

    @property
    def right(self) -> float | None:
        return _frac(self.found, self.overlap)

    @property
    def within_est(self) -> float | None:
        return _frac(sum(e is not None and e <= EST_REL for e in self.errs), len(self.errs))

    def within(self, steps: int) -> float | None:
        return _frac(sum(d <= steps for d in self.delays), self.subjects)


def case_stats(results: list[TraceResult]) -> CaseStats:
    subs = [s for r in results for s in r.subjects]
    found = [s for s in subs if s.found_step is not None]
    return CaseStats(len(subs), len(found), sum(s.overlap_step is not None for s in subs),
                     sum(len(r.false) for r in results), sum(r.dups for r in results),
                     [s.delay for s in found], [s.rel_err for s in found],
                     sum(s.nvidia for s in subs), sum(r.nvidia_false for r in results))


def planted_table(results: list[TraceResult], sizes: list[int]) -> tuple[str, dict]:
    stats: dict[tuple[str, int], CaseStats] = {}
    rows = []
    for case in PLANTED:
        for n in sizes:
            got = [r for r in results if r.case == case and r.n == n]
            if not got:   # (a case left out by --cases)
                continue
            st = case_stats(got)
            stats[(case, n)] = st
            errs = [e for e in st.errs if e is not None]
            rows.append([case, f"{n:,}", st.subjects, _fmt(st.recall),
                         _fmt(_frac(st.overlap, st.subjects)), _fmt(st.right), st.false,
                         st.dups, _fmt(float(np.median(st.delays)) if st.delays else None,
                                       ".0f"),
                         _fmt(max(st.delays) if st.delays else None, "d"),
                         _fmt(float(np.median(errs)) if errs else None),
                         _fmt(st.within_est), _fmt(_frac(st.nvidia, st.subjects)),
                         st.nvidia_false])
    head = ["case", "ranks", "subjects", "recall", "any", "right", "false", "dup",
            "delay med", "delay max", "est err med", "est <=20%", "NVIDIA recall",
            "NVIDIA false"]
    return table(rows, head, markdown=True), stats


def healthy_table(results: list[TraceResult], sizes: list[int], all_results: list[TraceResult]
                  ) -> tuple[str, int, int]:
    rows, total, false_total = [], 0, 0
    for n in sizes:
        rs = [r for r in results if r.n == n]
        if not rs:   # (no healthy traces run: --cases)
            continue
        rank_steps = sum(r.rank_steps for r in rs)
        false = sum(len(r.false) for r in rs)
        total, false_total = total + rank_steps, false_total + false
        upd = np.concatenate([r.update_s for r in all_results if r.n == n])
        rows.append([f"{n:,}", len(rs), f"{rs[0].rank_steps // n:,}" if rs else "-",
                     f"{rank_steps:,}", false, _fmt(false / rank_steps * 1e6, ".3f"),
                     _fmt(sum(r.nvidia_false for r in rs) / rank_steps * 1e6, ".3f"),
                     _fmt(float(np.median(upd)) * 1e3, ".3f")])
    head = ["ranks", "traces", "steps each", "rank-steps", "false findings", "per 1e6",
            "NVIDIA false flags per 1e6", "update ms (median, all runs)"]
    return table(rows, head, markdown=True), total, false_total


def _every(stats: dict, cases: tuple, sizes: list[int], ok) -> tuple[bool, str] | None:
    """Whether ``ok`` holds for every case run (None: none of them was)."""
    run = [(c, n) for c in cases for n in sizes if (c, n) in stats]
    bad = [f"{c}@{n}" for c, n in run if not ok(stats[(c, n)])]
    if not run:
        return None
    return not bad, "all" if not bad else "not: " + ", ".join(bad)


def targets(stats: dict, sizes: list[int], healthy_total: int, healthy_false: int,
            cost_ms: float | None, cost_ranks: int) -> str:
    rows = []

    def add(name: str, cases: str, res: tuple[bool, str] | None) -> None:
        if res is not None:   # (None: no case of it was run)
            rows.append([name, cases, res[1], "PASS" if res[0] else "MISS"])

    add("healthy with spikes: 0 false findings over >= 1e8 rank-steps", "healthy",
        (healthy_false == 0 and healthy_total >= HEALTHY_MIN,
         f"{healthy_false} over {healthy_total:,} rank-steps") if healthy_total else None)

    def big(st: CaseStats) -> bool:
        return st.recall == 1.0 and float(np.median(st.delays)) <= TARGET_DELAY

    add(f">= 5%: recall 1.0, median delay <= {TARGET_DELAY} steps", ", ".join(BIG_CASES),
        _every(stats, BIG_CASES, sizes, big))
    add(f"2-3%: every subject found within {SMALL_WITHIN} steps", ", ".join(SMALL_CASES),
        _every(stats, SMALL_CASES, sizes, lambda st: st.within(SMALL_WITHIN) == 1.0))
    add("right subject in every case (right = 1.0)", "all planted",
        _every(stats, PLANTED, sizes, lambda st: st.right == 1.0))
    add(f"estimate {ESTIMATE_AFTER} steps after detection within {EST_REL:.0%} relative",
        "all planted (every found subject)",
        _every(stats, PLANTED, sizes, lambda st: st.within_est == 1.0))
    if cost_ms is not None:
        add(f"update <= {TARGET_MS} ms/step at {cost_ranks:,} ranks (median)", "cost",
            (cost_ms <= TARGET_MS and cost_ranks >= 16384, f"{cost_ms:.3f} ms"))
    return table(rows, ["target", "cases", "result", "verdict"], markdown=True)


def subjects_table(results: list[TraceResult]) -> str:
    """One row per planted subject: what was named first over its ranks, when, and the
    findings outside every planted subject in its trace (``--subjects``)."""
    rows = []
    for r in sorted(results, key=lambda r: (list(CASES).index(r.case), r.n, r.seed)):
        for s in r.subjects:
            first = "-" if s.first_named is None else f"{s.first_named[0]} {s.first_named[1]}"
            after = None if s.overlap_step is None else s.overlap_step - s.subject.onset
            rows.append([r.case, f"{r.n:,}", r.seed, f"{s.subject.kind} {s.subject.id}",
                         s.subject.onset, first, _fmt(after, "d"),
                         "yes" if s.first_named == s.subject.key else "no",
                         _fmt(s.delay, "d"), len(r.false)])
    head = ["case", "ranks", "seed", "planted", "onset", "first named", "after onset",
            "exact", "delay (exact)", "false in trace"]
    return table(rows, head, markdown=True)


def false_examples(results: list[TraceResult], limit: int = 12) -> list[str]:
    out = []
    for r in results:
        for kind, sid, step, slow in r.false:
            planted = "; planted: " + ", ".join(f"{s.subject.kind} {s.subject.id} @"
                                                f"{s.subject.onset}" for s in r.subjects)
            out.append(f"{r.case} n={r.n} seed={r.seed}: {kind} {sid} at step {step}, "
                       f"slowdown {slow:+.3f}{planted if r.subjects else ''}")
            if len(out) >= limit:
                return out
    return out


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", help=f"comma-separated sizes, multiples of 32 "
                                    f"(default {DEFAULTS['ranks']})")
    ap.add_argument("--seeds", type=int, help="traces per planted case and size (default 3)")
    ap.add_argument("--steps", type=int, help="steps per planted trace (default 1200)")
    ap.add_argument("--healthy-rank-steps", type=float,
                    help="rank-steps of healthy traces in total, split over sizes (1e8)")
    ap.add_argument("--healthy-steps", type=int, help="target length of one healthy trace")
    ap.add_argument("--cost-ranks", type=int, help="size of the cost run (16384; 0: none)")
    ap.add_argument("--cost-steps", type=int, help="updates timed in the cost run (300)")
    ap.add_argument("--window", type=int, default=100, help="NVIDIA rule window in steps")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="processes running traces side by side")
    ap.add_argument("--quick", action="store_true", help="a smoke size: " + ", ".join(
        f"{k}={v}" for k, v in QUICK.items()))
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma-separated cases to run (default: all, healthy included)")
    ap.add_argument("--subjects", action="store_true",
                    help="also list every planted subject: what was named first, and when")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a StragglerConfig field for every run, e.g. threshold_h=20")
    args = ap.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if unknown := sorted(set(args.cases) - set(CASES)):
        ap.error(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(CASES)})")
    args.overrides = _overrides(ap, args.set)
    for k, v in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    sizes = [int(x) for x in str(args.ranks).split(",") if x.strip()]
    if not sizes or any(n < 64 or n % 32 for n in sizes):
        ap.error("--ranks: sizes must be multiples of 32, at least 64")
    if args.cost_ranks and args.cost_ranks % 32:
        ap.error("--cost-ranks must be a multiple of 32")
    args.sizes = sizes
    return args


def _overrides(ap: argparse.ArgumentParser, items: list[str]) -> tuple:
    """``--set`` pairs as ((field, value), ...), typed by the CLI's own ``--set`` parser and
    checked by building a config."""
    import click

    from goodlens.cli.common import overrides
    try:
        out = overrides(tuple(items), StragglerConfig)
        StragglerConfig(**out)
    except click.BadParameter as e:
        ap.error(f"--set: {e.format_message()}")
    except (TypeError, ValueError) as e:
        ap.error(f"--set: {e}")
    return tuple(out.items())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    sizes = args.sizes
    specs = jobs_for(args, sizes)
    results = run_all(specs, args.jobs)
    cost_s, cost_cpu = cost(args.cost_ranks, args.cost_steps, args.overrides) \
        if args.cost_ranks else (None, None)
    wall = time.perf_counter() - t0

    planted, stats = planted_table([r for r in results if r.case != "healthy"], sizes)
    hres = [r for r in results if r.case == "healthy"]
    htable, htotal, hfalse = healthy_table(hres, sizes, results)
    notes = [f"{args.seeds} seed(s) per case and size, {args.steps} steps per trace; "
             f"NVIDIA window {args.window} steps; detector "
             + (f"StragglerConfig({', '.join(f'{k}={v}' for k, v in args.overrides)})"
                if args.overrides else "defaults (StragglerConfig())") + ".",
             "recall: exact kind+id at/after onset; any: an overlapping finding; right: "
             "exact / overlapping; false and dup are counts of `new` findings over the seeds; "
             f"est err: |estimate {ESTIMATE_AFTER} steps after detection - truth| / truth.",
             f"Wall time {wall:.0f} s with {args.jobs} process(es)."]
    print(markdown_section("Straggler detector, independent noise model (bench/detector_eval.py)",
                           "Planted cases: " + "; ".join(f"`{c}` {d}" for c, d in CASES.items()
                                                         if c != "healthy") + ".",
                           planted, notes))
    if args.subjects:
        print("\n#### Every planted subject\n")
        print(subjects_table([r for r in results if r.case != "healthy"]))
    if hres:   # (left out by --cases: no section)
        print(f"\n#### Healthy traces with spikes ({htotal:,} rank-steps in total)\n")
        print(htable)
    ex = false_examples(hres) + false_examples([r for r in results if r.case != "healthy"])
    if ex:
        print("\nFalse findings (first few):\n")
        print("\n".join(f"- {e}" for e in ex))
    cost_ms = None
    if cost_s is not None:
        cost_ms = float(np.median(cost_s)) * 1e3
        print(f"\n#### Streaming cost at {args.cost_ranks:,} ranks (alone, a `rank5` trace "
              f"with spikes, {args.cost_steps} updates)\n")
        print(table([[f"{args.cost_ranks:,}", len(cost_s), f"{cost_ms:.3f}",
                      f"{np.percentile(cost_s, 90) * 1e3:.3f}",
                      f"{cost_s.max() * 1e3:.3f}", f"{np.median(cost_cpu) * 1e3:.3f}"]],
                    ["ranks", "updates", "median ms", "p90 ms", "max ms", "CPU median ms"],
                    markdown=True))
    print("\n#### Targets\n")
    print(targets(stats, sizes, htotal, hfalse, cost_ms, args.cost_ranks or 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
