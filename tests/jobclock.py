"""The job's own clock: what a training job wrote about itself (``--truth-dir``: one
``rank{R}-attempt{A}.jsonl`` per rank and attempt, written by ``examples/integrations/jobclock.py``
and ``examples/train_ddp.py``), and the expected values derived from it.

Why one module: a recorded run (``tests/recorded.py``), a live smoke job and the accuracy
benchmark (``bench/accuracy.py``) make the same claims, and each claim's expected value comes
from the job's clock the same way whatever the framework. The numbers here are computed from
the job's lines only; goodlens's numbers are only ever compared with them.
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


@dataclass
class JobResult:
    """What a finished job left: goodlens's side (store, report) and the job's clock."""

    db: Path
    run_id: str
    truth: dict[tuple[int, int], list[dict]]
    report: dict = field(default_factory=dict)
    job: dict = field(default_factory=dict)
    """A recorded job's settings (``job.json``; empty for a live job)."""
    actions: dict = field(default_factory=dict)
    """A replayed job's ``/v1/actions`` after its last pass (empty for a live job)."""
    run: dict = field(default_factory=dict)
    """A replayed job's ``/v1/runs/RUN`` (its state and attempts; empty for a live job)."""
    steps: Any = None
    events: Any = None
    log: str = ""

    def lines(self, kind: str, rank: int | None = None, attempt: int | None = None
              ) -> list[dict]:
        """The job's clock lines of ``kind`` (every rank and attempt unless given)."""
        return [x for (r, a), lines in sorted(self.truth.items())
                if (rank is None or r == rank) and (attempt is None or a == attempt)
                for x in lines if x["kind"] == kind]

    def own_steps(self, rank: int, attempt: int) -> dict[int, tuple[float, float]]:
        """``rank``'s own step bounds in ``attempt``: step -> (t0, t1)."""
        return {x["step"]: (x["t0"], x["t1"]) for x in self.lines("step", rank, attempt)}

    def own_ready(self, rank: int, attempt: int | None = None) -> dict[int, float]:
        """``rank``'s own instants of entering each step's first collective (``ready``
        lines; every attempt unless given): step -> t."""
        return {x["step"]: x["t"] for x in self.lines("ready", rank, attempt)}

    def findings(self) -> list[dict]:
        """The last state of each straggler finding the collector recorded."""
        ev = self.events
        flagged = ev[ev.kind == "straggler_flagged"].sort_values("seq")
        last: dict[str, dict] = {}
        for detail in flagged.detail:
            f = json.loads(detail)
            last[f["id"]] = f
        return list(last.values())


def read_truth(folder: Path) -> dict[tuple[int, int], list[dict]]:
    """(rank, attempt) -> the lines that rank wrote in that attempt."""
    out = {}
    for f in folder.glob("rank*-attempt*.jsonl"):
        rank, attempt = f.stem.removeprefix("rank").split("-attempt")
        out[int(rank), int(attempt)] = [json.loads(line) for line in f.read_text().splitlines()]
    return out



# -------------------------------------------------------------------- the job's clock's truth

def union_length(spans: list[tuple[float, float]]) -> float:
    """Total length covered by ``spans`` (overlaps once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def buckets_sum_to_wall_clock(rep: dict) -> None:
    """Every second of the wall-clock in exactly one bucket (and the parts in theirs)."""
    assert sum(rep["buckets"].values()) == pytest.approx(rep["wall_clock_s"], rel=1e-9, abs=1e-6)
    assert sum(rep["restart_parts"].values()) == pytest.approx(rep["buckets"]["restart"],
                                                               abs=1e-6)
    assert sum(rep["startup_parts"].values()) == pytest.approx(rep["buckets"]["startup"],
                                                               abs=1e-6)
    assert sum(rep["other_parts"].values()) == pytest.approx(rep["buckets"]["other"], abs=1e-6)


def true_recompute(res: JobResult) -> float:
    """The rolled-back work by the job's clock: from the start (rank 0's clock) of the first
    step attempt 1 redid to the crash instant."""
    crash = res.lines("crash")[0]
    resumed = min(res.own_steps(0, 1))
    return crash["t"] - res.own_steps(0, 0)[resumed][0]


def seen_latency(res: JobResult) -> float:
    """How long after the crash the first survivor's own code saw it (its earliest
    ``error`` line in attempt 0): no rank can date the failure earlier, so goodlens's
    failure instant lies between the crash and this. When torchrun's SIGTERM stopped every
    survivor before its code saw the error (none wrote one), the bound is the restarted
    attempt's first script start: nothing of attempt 0 is recorded after it."""
    crash = res.lines("crash")[0]["t"]
    seen = [x["t"] for x in res.lines("error", attempt=0)]
    if seen:
        return max(0.0, min(seen) - crash)
    print("no survivor saw the error before torchrun stopped it; bound: attempt 1's start")
    return min(x["t"] for x in res.lines("script_start", attempt=1)) - crash


def recompute_and_restart_match_the_jobs_clock(res: JobResult, rel: float = 0.15) -> None:
    """``recompute`` is the rolled-back steps and the partial step up to goodlens's failure
    instant, which lies between the crash and the first survivor seeing it (the job's clock,
    :func:`seen_latency`): so between those two truths, ``rel`` either side. What the
    detection latency adds to recompute it takes from restart, so ``restart`` lies between
    its truth less that latency and its truth (10%), and their sum matches the sum of the
    truths, whatever the latency, within 10%."""
    rep = res.report
    recompute, restart = rep["buckets"]["recompute"], rep["buckets"]["restart"]
    lo, late = true_recompute(res), seen_latency(res)
    print(f"recompute {recompute:.3f} s; truth {lo:.3f} s to the crash, {lo + late:.3f} s "
          f"to the first survivor's error")
    assert lo * (1 - rel) <= recompute <= (lo + late) * (1 + rel), (recompute, lo, late)
    full = true_restart(res)
    assert (full - late) * 0.9 <= restart <= full * 1.1, (restart, full, late)
    assert recompute + restart == pytest.approx(lo + full, rel=0.10)


def first_step(res: JobResult, attempt: int) -> tuple[float, float]:
    """The start of ``attempt``'s first step on rank 0's clock, and that step's excess over
    the attempt's median step (its warm-up)."""
    own = res.own_steps(0, attempt)
    durations = [b - a for _, (a, b) in sorted(own.items())]
    return own[min(own)][0], max(0.0, durations[0] - statistics.median(durations[1:]))


def true_restart(res: JobResult) -> float:
    """From the crash to the restarted attempt's first step (rank 0's clock), plus that
    step's warm-up: what the failure cost, the report's ``restart``."""
    start, warm = first_step(res, 1)
    return start - res.lines("crash")[0]["t"] + warm


def true_startup(res: JobResult) -> float:
    """The first attempt's start-up: from its earliest rank's script start to its first step
    (rank 0's clock), plus that step's warm-up, the report's ``startup``. goodlens dates the
    attempt at the process's start, a little before the script's first line (the
    interpreter's own start-up), so its value is that much longer."""
    start, warm = first_step(res, 0)
    return start - min(x["t"] for x in res.lines("script_start", attempt=0)) + warm


def restart_and_startup_match_the_jobs_clock(res: JobResult) -> None:
    """The report's ``restart`` and ``recompute`` (see
    :func:`recompute_and_restart_match_the_jobs_clock`); its ``startup`` the first
    attempt's script start to its first step (plus its warm-up), within 10% or 1 s, and
    never shorter (goodlens counts from the process's start, the interpreter's own start-up
    before the script's first line included); and only the first attempt has a start-up."""
    rep = res.report
    recompute_and_restart_match_the_jobs_clock(res)
    startup, truth = rep["buckets"]["startup"], true_startup(res)
    assert truth - 0.2 <= startup <= truth + max(1.0, 0.10 * truth), (startup, truth)
    assert [a["buckets"]["startup"] > 0 for a in rep["attempts"]] == \
        [True] + [False] * (len(rep["attempts"]) - 1)


def true_slowdown(res: JobResult, rank: int = 0, attempt: int = 0) -> float:
    """What the planted sleep costs the job per step in ``attempt`` (a finding's last state
    is priced with the steps of the attempt it was made in; the load, and so the step,
    can differ between attempts): the slow rank's extra over the step the job would have
    without it (a healthy rank's median step on its own clock, minus the planted sleep as
    long as it really took), to compare with a finding's ``job_slowdown``."""
    slow = res.lines("slow")[0]
    extra = statistics.median(x["s"] for x in res.lines("slowed", attempt=attempt))
    steps = [b - a for s, (a, b) in res.own_steps(rank, attempt).items()
             if s >= slow["start"]]
    return extra / (statistics.median(steps) - extra)


def true_lateness(res: JobResult, slow_rank: int, attempt: int, last: int = 64) -> float:
    """What the slowed rank costs the job per step as the job's own clock shows it, where
    each rank writes the instant it enters the step's first collective (``ready`` lines):
    per step, how much later the slowed rank got there than the latest other rank (the
    collective waits for it that long; never negative), over the step without that (rank
    0's own step less it); medians over the attempt's last ``last`` steps since the onset.

    Unlike :func:`true_slowdown` it does not assume the healthy ranks reach the collective
    together: where they queue for the CPU the latest of them is late by however the
    scheduler interleaved them, and the planted sleep's full length over-states what the
    job waits for."""
    start = res.lines("slow")[0]["start"]
    at: dict[int, dict[int, float]] = {}
    for r in range(max(r for r, _ in res.truth) + 1):
        for step, t in res.own_ready(r, attempt).items():
            at.setdefault(step, {})[r] = t
    own = res.own_steps(0, attempt)
    steps = sorted(s for s, v in at.items() if s >= start and s in own
                   and slow_rank in v and len(v) > 1)[-last:]
    loss = [max(0.0, at[s][slow_rank] - max(t for r, t in at[s].items() if r != slow_rank))
            for s in steps]
    base = [own[s][1] - own[s][0] - x for s, x in zip(steps, loss, strict=True)]
    return statistics.median(loss) / statistics.median(base)


def step_period_growth(res: JobResult, onset: int, attempt: int = 0, last: int = 64,
                       warmup: int = 10) -> float:
    """How much longer the job's step got after ``onset`` by its own clock: rank 0's step
    period (one step's start to the next one's), median over the attempt's last ``last``
    steps from ``onset`` on, against the median over its steps from ``warmup`` to the onset
    (the first steps are the job's warm-up: on a loaded machine 2-4x the later ones), less
    one. What a finding's ``job_slowdown`` claims: how much shorter the steps would be
    without it."""
    own = res.own_steps(0, attempt)
    period = {s: own[s + 1][0] - own[s][0] for s in own if s + 1 in own}
    before = [p for s, p in period.items() if warmup <= s < onset]
    after = [p for s, p in sorted(period.items()) if s >= onset][-last:]
    return statistics.median(after) / statistics.median(before) - 1.0


def ready_lateness(res: JobResult, slow_rank: int, onset: int,
                   ranks: int) -> dict[str, float]:
    """The job's own clock on a slowed rank (``ready`` and ``step`` lines of attempt 0):
    ``slowdown_lo`` and ``slowdown_hi``, its lateness at its ready line (against the other
    ranks' median) over the others' step less it, and over their time to their ready line
    (medians over the steps since ``onset``)."""
    at: dict[int, dict[int, tuple[float, float, float]]] = {}
    for r in range(ranks):
        ready = res.own_ready(r, 0)
        for step, (t0, t1) in res.own_steps(r, 0).items():
            if step in ready:
                at.setdefault(step, {})[r] = (ready[step], t0, t1)
    late, step, pre = [], [], []
    for s, v in at.items():
        if s >= onset and len(v) == ranks:
            others = [v[r] for r in v if r != slow_rank]
            late.append(v[slow_rank][0] - statistics.median(t for t, _, _ in others))
            step.append(statistics.median(t1 - t0 for _, t0, t1 in others) - late[-1])
            pre.append(statistics.median(t - t0 for t, t0, _ in others))
    lateness = statistics.median(late)
    return {"slowdown_lo": lateness / statistics.median(step),
            "slowdown_hi": lateness / statistics.median(pre)}


def true_straggler_wait(res: JobResult, ranks: int,
                        kept: dict[int, tuple[int, int]]) -> float:
    """The straggler wait by the job's clock: per kept step (``kept``: attempt -> the steps
    ``lo <= step < hi`` it kept) that all ``ranks`` finished, the latest rank's time from
    its own step start to its ``ready`` line less the median rank's, summed."""
    total = 0.0
    for attempt, (lo, hi) in kept.items():
        x: dict[int, list[float]] = {}
        for r in range(ranks):
            ready, own = res.own_ready(r, attempt), res.own_steps(r, attempt)
            for step, (t0, _) in own.items():
                if lo <= step < hi and step in ready:
                    x.setdefault(step, []).append(ready[step] - t0)
        total += sum(max(v) - statistics.median(v) for v in x.values() if len(v) == ranks)
    return total


def true_stall(res: JobResult) -> float:
    """The planted data-loader stall every rank had: per stalled step, the shortest of the
    ranks' stalls (what no rank could hide), summed."""
    per_step: dict[int, list[float]] = {}
    for x in res.lines("stall"):
        per_step.setdefault(x["step"], []).append(x["t1"] - x["t0"])
    return sum(min(v) for v in per_step.values())


def true_saves(res: JobResult, attempt: int | None = None) -> float:
    """The union over ranks of the job's own blocking save spans."""
    return union_length([(x["t0"], x["t1"]) for x in res.lines("save", attempt=attempt)])


def runqueue_per_step(res: JobResult, rank: int, attempt: int) -> dict[int, float]:
    """``rank``'s run-queue wait in each step of ``attempt`` (the kernel's, from the ``rq``
    of consecutive ``step`` lines): step -> seconds."""
    lines = sorted(res.lines("step", rank, attempt), key=lambda x: x["step"])
    return {b["step"]: b["rq"] - a["rq"] for a, b in itertools.pairwise(lines)
            if "rq" in a and "rq" in b and b["step"] == a["step"] + 1}


def cpu_starved_s(res: JobResult, rank: int, attempt: int, first: int, last: int,
                  exclude: int) -> float:
    """How much longer ``rank``'s main thread waited for a CPU than the other ranks' (not
    ``exclude``), per step of ``attempt`` from ``first`` to ``last``: the mean over those
    steps of its run-queue wait (the kernel's, from the ``rq`` of consecutive ``step``
    lines) less the median other rank's. NaN when no step has it."""
    mine = runqueue_per_step(res, rank, attempt)
    others = [runqueue_per_step(res, r, attempt) for (r, a) in res.truth
              if a == attempt and r not in (rank, exclude)]
    d = [mine[s] - statistics.median(o[s] for o in others if s in o)
         for s in range(first, last + 1) if s in mine and any(s in o for o in others)]
    return statistics.fmean(d) if d else float("nan")


def the_slowed_ranks_finding(res: JobResult, slow_rank: int,
                             stall_steps: tuple[int, ...] = (), minor_s: float = 0.0) -> dict:
    """The finding about the slowed rank (its latest state: two, when a starved collector
    scored a restarted attempt's steps before the rest of the first and opened a second),
    after checking that every other finding was real. A finding about another rank is
    allowed as a transient (resolved by the end), or still open where the machine really
    slowed that rank: by the kernel's count, its main thread waited for a CPU at least half
    the finding's excess per step longer than the other ranks' did. Never one begun at a
    planted stall (a stall every rank has must never flag one). On a loaded machine a rank
    can really be slower for a while: with two busy loops beside an HSDP job, rank 2's own
    work took 35-53 ms against 29 ms for its first 8 steps, flagged, then resolved; in
    another run rank 1's took 32.8 ms against 27 until the job ended, still open.

    ``minor_s``: an open finding whose excess is under this many seconds a step passes
    too, for a test whose claim is that no healthy rank is mistaken for the slowed one
    (a finding of the slowed rank's size), not that a loaded machine slows no rank at all."""
    found = res.findings()
    mine = [f for f in found if f["ranks"] == [slow_rank]]
    others = [f for f in found if f["ranks"] != [slow_rank]]
    assert mine, found
    for f in others:
        assert f["first_step"] not in stall_steps, found
        if f["status"] == "resolved":
            continue
        assert len(f["ranks"]) == 1, found  # a host or switch: no single rank to read
        first, last = f["first_step"], f["last_step"]
        excess = f["straggler_wait_s"] / max(1, last - first + 1)
        if excess < minor_s:
            continue
        starved = cpu_starved_s(res, f["ranks"][0], f["attempt"] or 0, first, last,
                                exclude=slow_rank)
        assert starved >= 0.5 * excess, (
            f"rank {f['ranks'][0]} still flagged at the end, {excess * 1e3:.1f} ms a step "
            f"over steps {first}-{last}, but it waited for a CPU only {starved * 1e3:.1f} ms "
            f"a step longer than the others", found)
    return max(mine, key=lambda x: (x["attempt"] or 0, x["last_step"]))
