"""The job's own clock and planted faults, shared by the framework jobs in this folder.

Why it exists: goodlens is a measuring instrument, so the integrations (FSDP2, Lightning,
Hugging Face ``Trainer``) are checked against timestamps the *job* writes itself, never
against goodlens's numbers. Every job here takes the same fault flags and writes the same
JSON lines, so one test harness (``tests/e2e/framework_jobs.py``) checks all of them:

- ``script_start`` (before the heavy imports, passed in), ``step`` (``step``, ``t0``, ``t1``:
  the job's own bounds of an optimizer step; ``rq``: the seconds the rank's main thread has
  waited for a CPU since it started, the kernel's ``/proc/self/schedstat``, read as the line
  is written), ``crash`` (``t``, ``step``), ``restore``
  (``t0``, ``t1``, ``step``: the checkpoint load), ``save`` (``t0``, ``t1``, ``step``: the
  blocking part of a checkpoint save), ``stall`` (``t0``, ``t1``, ``step``: a planted
  data-loader stall), ``slow`` (``ms``, ``start``: the planted sleep per step on the slow
  rank, from step ``start``), ``slowed`` (``step``, ``s``: each planted sleep as long as
  it really took), ``ready`` (``step``, ``t``: the instant a rank is about to enter the
  step's first collective, where a job writes it), ``eval`` (``t0``, ``t1``), ``error``
  (``t``, ``what``: the instant the rank's own code first saw an exception end its training,
  e.g. a survivor's collective raising after a peer was killed; a rank that torchrun's
  SIGTERM stops first writes none).

Faults (flags from :func:`add_fault_args`): ``--slow-rank R --slow-ms X --slow-from S``
sleeps X ms more in rank R's step from step S (every attempt); ``--kill-rank R --kill-at
S`` exits rank R abruptly (``os._exit``) at step S of attempt 0; ``--stall-at S,...
--stall-ms X`` sleeps X ms in every rank's data loader when it fetches the batch of those
steps (first attempt only).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any


def add_fault_args(p: argparse.ArgumentParser) -> None:
    """The planted faults and the truth folder, the same flags for every framework job."""
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-from", type=int, default=0)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--stall-at", default="", help="comma-separated steps whose batch stalls")
    p.add_argument("--stall-ms", type=float, default=0.0)
    p.add_argument("--truth-dir", default=None,
                   help="every rank appends its own clock readings here (tests)")


def attempt() -> int:
    """The attempt number as torchrun counts it."""
    return int(os.environ.get("GOODLENS_ATTEMPT")
               or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def runqueue_s() -> float:
    """Seconds this process's main thread has been runnable but waiting for a CPU (the
    kernel's scheduler statistics), or NaN where the kernel does not keep them. How much a
    loaded machine slowed a rank, which no clock inside the job can tell apart from work."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


class JobClock:
    """The job's own clock: JSON lines appended (and flushed) as things happen, so a rank
    killed mid-run leaves every line it wrote. A no-op without a folder."""

    def __init__(self, folder: str | None, rank: int, script_start: float) -> None:
        self.f = None
        self.rank = rank
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            name = f"rank{rank}-attempt{attempt()}.jsonl"
            self.f = open(Path(folder) / name, "a")  # noqa: SIM115 - kept open on purpose
            self.write("script_start", t=script_start)

    def write(self, kind: str, **values: Any) -> None:
        if self.f is not None:
            if kind == "step":
                values["rq"] = runqueue_s()
            self.f.write(json.dumps({"kind": kind, **values}) + "\n")
            self.f.flush()

    def error(self, exc: BaseException) -> None:
        """An exception is ending this rank's training: when its own code saw it (no rank
        can know of a peer's crash before its collective raises)."""
        self.write("error", t=time.time(), what=type(exc).__name__)


class Faults:
    """The faults of :func:`add_fault_args` for one rank, with the clock that records them."""

    def __init__(self, args: argparse.Namespace, rank: int, clock: JobClock) -> None:
        self.args = args
        self.rank = rank
        self.clock = clock
        self.stall_steps = {int(s) for s in args.stall_at.split(",") if s.strip()}
        if rank == args.slow_rank and args.slow_ms > 0:
            clock.write("slow", ms=args.slow_ms, start=args.slow_from)

    def slow(self, step: int) -> None:
        """In the step's compute: the planted straggler sleep."""
        a = self.args
        if self.rank == a.slow_rank and step >= a.slow_from and a.slow_ms > 0:
            t0 = time.perf_counter()
            time.sleep(a.slow_ms / 1000.0)  # (a loaded machine sleeps longer: measured)
            self.clock.write("slowed", step=step, s=time.perf_counter() - t0)

    def crash(self, step: int) -> None:
        """In the step: the planted crash of attempt 0 (no flush, no cleanup)."""
        a = self.args
        if attempt() == 0 and self.rank == a.kill_rank and step == a.kill_at:
            self.clock.write("crash", t=time.time(), step=step)
            os._exit(1)

    def stall(self, step: int) -> None:
        """In the data loader, fetching step ``step``'s batch: the planted stall."""
        if attempt() == 0 and step in self.stall_steps and self.args.stall_ms > 0:
            t0 = time.time()
            time.sleep(self.args.stall_ms / 1000.0)
            self.clock.write("stall", t0=t0, t1=time.time(), step=step)
