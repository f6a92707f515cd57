"""Which estimates each recorded job's recipe has, and the job's-clock truth of each, for
``bench/accuracy.py``.

One function per family of recipes (``tests/record``), registered with :func:`family`
under the recipe names it serves (shell patterns); a recipe no pattern names gets
:func:`framework_job`, which reads what the job's clock says was planted (a crash, a slowed
rank, a data stall, saves, evaluations), so a new recipe is picked up without an entry
here. Each function takes what the live job left (:class:`tests.jobclock.JobResult`: the
report, the stored events with the live detector's findings, the job's clock and settings)
and returns goodlens's value and the truth side by side. Every truth comes from the job's
clock lines or settings through :mod:`tests.jobclock` (or the recorded-DDP test's clock
reading), never from goodlens code.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tests.jobclock import (
    JobResult,
    seen_latency,
    true_lateness,
    true_recompute,
    true_restart,
    true_saves,
    true_slowdown,
    true_stall,
    true_startup,
    true_straggler_wait,
    union_length,
)

Truth = float | tuple[float, float]


@dataclass(frozen=True)
class Estimate:
    """One of goodlens's numbers beside its truth.

    ``truth`` is a value, or ``(lo, hi)`` where the job's clock bounds it from both sides
    (an estimate inside scores 0). ``unit``: ``rel`` (error relative to the truth),
    ``steps`` (a step number's difference), ``s`` (seconds) or ``n`` (a count; truth 0).
    ``value`` None: goodlens produced none (a finding missed, say)."""

    name: str
    value: float | None
    truth: Truth
    unit: str = "rel"

    @property
    def error(self) -> float | None:
        """Signed error: above the truth (its upper bound) positive, below it negative."""
        if self.value is None:
            return None
        lo, hi = self.truth if isinstance(self.truth, tuple) else (self.truth, self.truth)
        v = self.value
        if lo <= v <= hi:
            return 0.0
        ref = hi if v > hi else lo
        if self.unit == "rel":
            return (v - ref) / ref if ref else math.copysign(math.inf, v - ref)
        return v - ref


#: what each estimate is compared with (the legend under the table)
AGAINST: dict[str, str] = {
    "restart": "crash -> restarted attempt's first step + its warm-up, less the first "
               "survivor's detection latency (range)",
    "recompute": "first redone step's start -> crash, up to the first survivor's error "
                 "(range)",
    "restart+recompute": "the sum of the two truths (the latency cancels)",
    "startup": "first attempt's earliest script start -> first step + its warm-up "
               "(goodlens adds the interpreter's start-up)",
    "straggler_wait": "per kept step, the latest rank's time to its ready line less the "
                      "median rank's, summed",
    "slowdown": "slowed rank's lateness at its ready line over the others' work (range: "
                "their step less it .. their time to the line)",
    "job_slowdown": "true_lateness: slowed rank's lateness behind the latest other rank "
                    "over the step less it, attempt 0 up to the finding's last state there "
                    "(share-*: true_slowdown, the planted sleep over the step less it)",
    "onset": "earliest finding's first_step - planted onset (steps)",
    "detection_delay": "earliest finding's detected_step - planted onset (steps; the "
                       "detector promises <= 30)",
    "other_ranks_flagged": "findings about a healthy rank still open at the end (count)",
    "eviction_delay": "first evict line's step - the slowed node's slow_onset step (steps)",
    "other_nodes_evicted": "nodes evicted other than the slowed one (count)",
    "input_stall": "attempt 0: per stalled step, the shortest rank's planted stall, summed",
    "checkpoint_stall": "union over ranks of the job's blocking save spans",
    "eval": "union over ranks of the job's eval spans less saves (up to the crash for the "
            "crashed rank's last one: range)",
    "hang_last_seen": "hang finding's last_seen - the latest step end on the job's clock "
                      "(s)",
    "hang_called_after": "hang finding's silent_s - the recipe's hang floor (s)",
    "ft_detected": "torchft: the killed group's recovery `detected` - the survivors' own end "
                   "of the step they discarded (s)",
    "ft_restarted": "torchft: `restarted` - the restarted group's process start (s)",
    "ft_rejoined": "torchft: `rejoined` - its own start of its first step taking part (s)",
    "ft_samples": "torchft: samples committed against each group's own count of the steps "
                  "it took part in, times the batch",
    "ft_short_steps": "torchft: steps run short - committed steps fewer groups took part "
                      "in (count)",
    "other_groups_evicted": "torchft: groups evicted other than the slowed one (count)",
}

Check = Callable[[str, JobResult], list[Estimate]]
_FAMILIES: list[tuple[tuple[str, ...], Check]] = []


def family(*patterns: str) -> Callable[[Check], Check]:
    """Register a check for the recipes whose names match ``patterns`` (first match wins,
    in registration order)."""
    def add(fn: Check) -> Check:
        _FAMILIES.append((patterns, fn))
        return fn
    return add


def checks_for(name: str) -> Check:
    """The check of recipe ``name``: its family's, else :func:`framework_job`."""
    for patterns, fn in _FAMILIES:
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return fn
    return framework_job


# ------------------------------------------------------------------------------- pieces


def _attempts(res: JobResult) -> set[int]:
    return {a for _, a in res.truth}


def _crashed(res: JobResult) -> bool:
    """A planted crash the job restarted from."""
    return bool(res.lines("crash")) and 1 in _attempts(res)


def crash_estimates(res: JobResult) -> list[Estimate]:
    """restart, recompute, their sum and startup against the job's clock
    (``tests.jobclock.recompute_and_restart_match_the_jobs_clock``'s truths)."""
    b = res.report["buckets"]
    lo, late, full = true_recompute(res), seen_latency(res), true_restart(res)
    return [Estimate("restart", b["restart"], (full - late, full)),
            Estimate("recompute", b["recompute"], (lo, lo + late)),
            Estimate("restart+recompute", b["restart"] + b["recompute"], lo + full),
            Estimate("startup", b["startup"], true_startup(res))]


def _findings_about(res: JobResult, rank: int) -> list[dict]:
    """The last state of each finding about ``rank`` alone, by onset."""
    return sorted((f for f in res.findings() if f["ranks"] == [rank]),
                  key=lambda f: f["first_step"])


def _latest_in(res: JobResult, rank: int, attempt: int) -> dict | None:
    """The latest state, made in ``attempt``, of a finding about ``rank`` alone (a finding
    carried over a restart has later states in the next attempt, priced there on the few
    steps it has seen by then)."""
    ev = res.events
    states = [json.loads(d) for d in
              ev[ev.kind == "straggler_flagged"].sort_values("seq").detail]
    mine = [f for f in states if f["ranks"] == [rank] and (f["attempt"] or 0) == attempt]
    return max(mine, key=lambda f: f["last_step"]) if mine else None


def _others_open(res: JobResult, rank: int) -> int:
    return sum(1 for f in res.findings() if f["ranks"] != [rank] and f["status"] != "resolved")


def with_planted_slow(res: JobResult, rank: int, start: int) -> JobResult:
    """``res`` with a ``slow`` line for a job that plants its slow rank by setting but does
    not write one (``examples/train_ddp.py``): the onset from the job's settings, which
    is what :func:`tests.jobclock.true_lateness` reads of that line."""
    truth = {k: list(v) for k, v in res.truth.items()}
    truth.setdefault((rank, 0), []).insert(0, {"kind": "slow", "start": start})
    return replace(res, truth=truth)


def until_step(res: JobResult, attempt: int, last: int) -> JobResult:
    """``res`` with ``attempt``'s step-numbered clock lines after step ``last`` left out:
    the job's clock over the steps a finding's state had seen."""
    truth = {(r, a): [x for x in v if a != attempt or x.get("step", -1) <= last]
             for (r, a), v in res.truth.items()}
    return replace(res, truth=truth)


def slow_rank_estimates(res: JobResult, rank: int, onset: int,
                        loses: Callable[[JobResult, int], float] | None = None
                        ) -> list[Estimate]:
    """The live findings about the slowed rank: ``job_slowdown`` of the latest state made
    in the first attempt (where the slowdown began), against what the job lost per step
    over the steps that state had seen (``loses(window, rank)``; by default
    :func:`tests.jobclock.true_lateness` of attempt 0), the onset and detection delay of
    the earliest finding, and how many findings about other ranks stayed open. A missed
    rank scores None."""
    found = _findings_about(res, rank)
    first = found[0] if found else None
    state = _latest_in(res, rank, 0)
    window = until_step(res, 0, state["last_step"]) if state else res
    loses = loses or (lambda r, slow: true_lateness(r, slow, 0))
    return [
        Estimate("job_slowdown", state and state.get("job_slowdown"), loses(window, rank)),
        Estimate("onset", first and first["first_step"], onset, "steps"),
        Estimate("detection_delay", first and first["detected_step"], onset, "steps"),
        Estimate("other_ranks_flagged", _others_open(res, rank), 0, "n"),
    ]


def _kept(res: JobResult, steps: int) -> dict[int, tuple[int, int]]:
    """attempt -> the steps it kept: attempt 1 resumes at its first step on rank 0."""
    if 1 not in _attempts(res):
        return {0: (0, steps)}
    resumed = min(res.own_steps(0, 1))
    return {0: (0, resumed), 1: (resumed, steps)}


# ------------------------------------------------------------------------------ families


@family("ddp-slow")
def ddp_slow(name: str, res: JobResult) -> list[Estimate]:
    """``examples/train_ddp.py``, one rank slowed by a planted percentage (hook timing):
    the finding's ``slowdown`` and ``job_slowdown``, onset, straggler wait."""
    from tests.jobclock import ready_lateness
    s, ranks = res.job["settings"], res.job["ranks"]
    rank, onset = s["slow_rank"], s["onset"]
    planted = with_planted_slow(res, rank, onset)
    state = _latest_in(res, rank, 0)
    bounds = ready_lateness(res, rank, onset, ranks)
    return [Estimate("slowdown", state and state["slowdown"],
                     (bounds["slowdown_lo"], bounds["slowdown_hi"])),
            *slow_rank_estimates(planted, rank, onset),
            Estimate("straggler_wait", res.report["buckets"]["straggler_wait"],
                     true_straggler_wait(res, ranks, _kept(res, s["steps"])))]


@family("ddp-crash", "ddp-launched")
def ddp_crash(name: str, res: JobResult) -> list[Estimate]:
    """``examples/train_ddp.py`` with a rank killed and the job restarted from its
    checkpoint: restart, recompute, startup; with a slowed rank too, its finding and the
    straggler wait over the kept steps."""
    s, ranks = res.job["settings"], res.job["ranks"]
    out = crash_estimates(res) if _crashed(res) else []
    if s.get("slow_rank") is not None:
        rank, onset = s["slow_rank"], s["slow_from"]
        out += slow_rank_estimates(with_planted_slow(res, rank, onset), rank, onset)
        out.append(Estimate("straggler_wait", res.report["buckets"]["straggler_wait"],
                            true_straggler_wait(res, ranks, _kept(res, s["steps"]))))
    return out


@family("ddp-hang")
def ddp_hang(name: str, res: JobResult) -> list[Estimate]:
    """A rank stops in a step and the job goes silent: the live collector's hang finding
    dates the silence from the last step it stored (against the latest step end on the
    job's clock) and says how long the job had been silent when it called it (against the
    hang floor the recipe set: the excess is the detection passes' cadence and the load;
    the adaptive timeout lies above the floor only where a step interval passed a third
    of it)."""
    s = res.job["settings"]
    ev = res.events
    hang = ev[(ev.kind == "failure_detected") & (ev.cause == "hang")].sort_values("seq")
    d = json.loads(hang.detail.iloc[0]) if len(hang) else {}
    last_end = max(x["t1"] for x in res.lines("step", attempt=0))
    return [Estimate("hang_last_seen", d.get("last_seen"), last_end, "s"),
            Estimate("hang_called_after", d.get("silent_s"), s["hang_floor_s"], "s")]


@family("share-*")
def share(name: str, res: JobResult) -> list[Estimate]:
    """``train_ddp_share.py``: one rank slowed by a planted sleep, the collective a set
    share of the step. ``job_slowdown`` against the planted sleep as it really slept over
    a healthy rank's step less it (:func:`tests.jobclock.true_slowdown`, as the replay
    test: this job writes no ready lines)."""
    line = res.lines("slow")[0]
    rank = next(r for (r, _), v in res.truth.items() if line in v)
    return slow_rank_estimates(res, rank, line["start"],
                               lambda r, _: true_slowdown(r, rank=0, attempt=0))


@family("elastic")
def elastic(name: str, res: JobResult) -> list[Estimate]:
    """The elastic scenario: the slowed node's ranks write ``slow_onset`` and every rank
    ``evict`` when the job acts on the collector's eviction; how many steps after the
    onset it acted (the replay test claims <= 60) and whether any other node was
    evicted."""
    s = res.job["settings"]
    attempt, start = min((a, x["step"]) for (r, a), lines in res.truth.items()
                         for x in lines if x["kind"] == "slow_onset")
    evicted = [x for (r, a), lines in res.truth.items() if a == attempt for x in lines
               if x["kind"] == "evict"]
    return [Estimate("eviction_delay", min(x["step"] for x in evicted) if evicted else None,
                     start, "steps"),
            Estimate("other_nodes_evicted",
                     len({x["host"] for x in res.lines("evict")} - {s["slow_node"]}), 0, "n")]


@family("torchft*")
def torchft(name: str, res: JobResult) -> list[Estimate]:
    """The torchft scenario (``tests/record/ft.py``): the killed group's recovery against
    its own and the survivors' clocks, the samples and short steps against each group's
    own participation, and the eviction."""
    s = res.job["settings"]
    ft = res.report.get("fault_tolerance") or {}
    killed = int(s["killed"].removeprefix("g"))
    rec = next((r for r in ft.get("recoveries", []) if r["group"] == s["killed"]), {})
    gave_up, took_part = [], {}
    for (rank, attempt), lines in res.truth.items():
        steps = [x for x in lines if x["kind"] == "step"]
        for prev, x in zip([{"discarded": 0, "committed": 0}, *steps], steps):
            if rank != killed and attempt == 0 and x["discarded"] > prev["discarded"]:
                gave_up.append(x["end"])
            if x["committed"] > prev["committed"] and x.get("participating"):
                took_part[x["step"]] = took_part.get(x["step"], 0) + 1
    started = res.lines("process_start", rank=killed, attempt=1)
    back = res.lines("rejoined", rank=killed, attempt=1)
    first = [x["start"] for x in res.lines("step", rank=killed, attempt=1)
             if back and x["step"] == back[0]["step"]]
    committed = set(took_part) | {x["step"] for x in res.lines("step")
                                  if x["committed"] > 0}
    short = sum(1 for n in committed if took_part.get(n, 0) < s["groups"])
    onset = res.lines("slow_onset")
    left = res.lines("evicted")
    out = [Estimate("ft_detected", rec.get("detected"), min(gave_up), "s") if gave_up else None,
           Estimate("ft_restarted", rec.get("restarted"), started[0]["at"], "s")
           if started else None,
           Estimate("ft_rejoined", rec.get("rejoined"), first[0], "s") if first else None,
           Estimate("ft_samples", (ft.get("samples") or {}).get("committed"),
                    sum(took_part.values()) * s["batch"]),
           Estimate("ft_short_steps", (ft.get("steps") or {}).get("short", 0) - short, 0, "n"),
           Estimate("eviction_delay", left[0]["step"] if left else None,
                    onset[0]["step"], "steps") if onset else None,
           Estimate("other_groups_evicted",
                    len({g["group"] for g in ft.get("groups", []) if g["evicted"]}
                        - {s["slow"]}), 0, "n")]
    return [e for e in out if e is not None]


def framework_job(name: str, res: JobResult) -> list[Estimate]:
    """A job writing ``examples/integrations/jobclock.py``'s lines (FSDP2, HSDP,
    Lightning, the HF Trainer, and any recipe no family names): each estimate whose
    fault the clock recorded."""
    out = crash_estimates(res) if _crashed(res) else []
    slow = [(r, x) for (r, a), lines in sorted(res.truth.items()) for x in lines
            if x["kind"] == "slow"]
    if slow and res.lines("ready"):
        rank, line = slow[0]
        out += slow_rank_estimates(res, rank, line["start"])
    if res.lines("stall"):
        out.append(Estimate("input_stall",
                            res.report["attempts"][0]["other_parts"].get("input_stall", 0.0),
                            true_stall(res)))
    if res.lines("save"):
        out.append(Estimate("checkpoint_stall", res.report["buckets"]["checkpoint_stall"],
                            true_saves(res)))
    if res.lines("eval"):
        out.append(Estimate("eval", res.report["other_parts"].get("eval", 0.0),
                            _eval_truth(res)))
    return out


def _eval_truth(res: JobResult) -> Truth:
    """The union over ranks of the job's eval spans less what overlaps a save (a blocking
    save has priority). Where a rank was killed, its last evaluation's end may not have
    left it (a begun span with no end lasts until its attempt ends), so the truth is a
    range up to that evaluation taken to the crash."""
    evals = [(x["t0"], x["t1"]) for x in res.lines("eval")]
    saves = [(x["t0"], x["t1"]) for x in res.lines("save")]
    low = union_length(evals + saves) - union_length(saves)
    crash = res.lines("crash")
    if not crash:
        return low
    killed = [x["t0"] for (r, a), lines in res.truth.items() if a == 0 for x in lines
              if x["kind"] == "eval" and any(c in lines for c in crash)]
    if not killed:
        return low
    open_span = (max(killed), crash[0]["t"])
    high = union_length([*evals, open_span, *saves]) - union_length(saves)
    return (low, high)


def describe(job: dict[str, Any]) -> str:
    """A recipe's settings in one short line (the workload header)."""
    s = job.get("settings", {})
    return ", ".join(f"{k}={v}" for k, v in sorted(s.items()))
