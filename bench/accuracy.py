"""Accuracy under load: each estimate's error against the job's own clock, over live runs
of the recorded jobs, on a quiet machine and beside busy loops.

The replay tests (``tests/integration/test_recorded_*.py``) check goodlens's estimates on
recorded runs, which do not move, with the margins the estimators claim. This measures how
far the same estimates spread when the jobs run live: every recipe of ``tests/record``
(``--only`` picks some) runs its real job (torchrun, gloo ranks, a real collector) ``--runs``
times in each condition, ``quiet`` and ``busy`` (beside ``--busy`` processes spinning
``while True: pass``, started and killed here), the conditions taking turns run by run so
drift hits both alike. Each run's estimates are read from what the live collector
computed (its report of the store, its detector's ``straggler_flagged`` findings) and
compared with the job's clock (``tests/jobclock.py``); which estimates each recipe has
and the truth of each are ``bench/_accuracy_checks.py`` (a new recipe is picked up by
what its clock recorded). Errors are relative to the truth, or in steps (a finding's
onset), seconds (a hang's detection) or a count (healthy ranks flagged); a truth the
clock bounds from both sides (a range) scores 0 inside it.

The table gives, per recipe, estimate and condition: runs, misses (no estimate made,
a finding not raised), the median and p90 of |error|, the worst error and the median
error (signed: + above the truth). An estimator change is judged on this table, quiet and
busy, before and after. A run takes 15-40 s for most recipes on 2 cores (the elastic
scenario ~100 s, more beside busy loops): run it on an otherwise quiet machine. Every
process it starts (busy loops, collectors, torchrun and its ranks) is killed by the
time it exits, on Ctrl-C and SIGTERM too.

    .venv/bin/python bench/accuracy.py [--only NAME ...] [--runs 3] [--busy 2]
        [--conditions quiet,busy] [--json PATH|-] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._accuracy_checks import AGAINST, Estimate, checks_for, describe
from bench._common import machine, markdown_section, table

CONDITIONS = ("quiet", "busy")
BUSY_LOOP = "while True: pass"


# ------------------------------------------------------------------------- processes


class Reaper:
    """Everything this script starts ends with it: this process adopts orphaned
    descendants (``PR_SET_CHILD_SUBREAPER``: a rank whose torchrun died stays in the
    tree), and :meth:`sweep` kills, by pid, whatever descendant is still running."""

    def __init__(self) -> None:
        import psutil
        self.me = psutil.Process()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER

    def sweep(self, keep: set[int] | frozenset[int] = frozenset()) -> int:
        """SIGKILL every descendant but ``keep`` and reap it; how many there were."""
        import psutil
        left = [p for p in self.me.children(recursive=True) if p.pid not in keep]
        for p in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(left, timeout=10)
        return len(left)


class BusyLoops:
    """``k`` processes spinning a core each, started and killed here."""

    def __init__(self, k: int) -> None:
        self.procs: list[subprocess.Popen] = []
        try:
            for _ in range(k):
                self.procs.append(subprocess.Popen([sys.executable, "-c", BUSY_LOOP],
                                                   start_new_session=True,
                                                   stdin=subprocess.DEVNULL))
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> set[int]:
        return {p.pid for p in self.procs}

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(10)
        self.procs = []


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM as Ctrl-C: the ``finally`` blocks (collectors, busy loops, sweep) run."""
    raise KeyboardInterrupt


# ------------------------------------------------------------------------------ runs


@dataclass
class Run:
    """One live run of one recipe in one condition."""

    recipe: str
    condition: str
    index: int
    seconds: float = 0.0
    estimates: list[Estimate] = field(default_factory=list)
    job: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    left_behind: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "condition": self.condition, "run": self.index,
                "seconds": round(self.seconds, 2), "error": self.error or None,
                "left_behind": self.left_behind, "job": self.job,
                "estimates": [{"name": e.name, "unit": e.unit, "value": e.value,
                               "truth": list(e.truth) if isinstance(e.truth, tuple)
                               else e.truth, "error": e.error} for e in self.estimates]}


def live_result(cap: Any) -> Any:
    """What the live job left, as the checks read it: the collector's store (report,
    steps, events with the live detector's findings) and the job's clock."""
    from goodlens.analysis.report import report_dict
    from goodlens.storage.store import Store
    from tests.jobclock import JobResult, read_truth
    store = Store(cap.db, read_only=True)
    try:
        return JobResult(cap.db, cap.run_id, read_truth(cap.truth_dir),
                         report=report_dict(store, cap.run_id), job=cap.job,
                         steps=store.steps(cap.run_id), events=store.events(cap.run_id))
    finally:
        store.close()


def has_clock(name: str) -> bool | None:
    """Whether recipe ``name``'s recording (``tests/fixtures/runs``) has the job's clock;
    None where it has not been recorded (then the first run tells)."""
    from tests.recorded import CLOCK, FIXTURES, JOB
    path = FIXTURES / name
    if not (path / JOB).exists():
        return None
    rows = json.loads((path / JOB).read_text()).get("rows", {})
    return (path / CLOCK).exists() and rows.get("clock_lines", 1) > 0


def run_once(name: str, condition: str, index: int, reaper: Reaper,
             keep: set[int], keep_dir: Path | None = None) -> Run:
    """Run recipe ``name`` live once and compare its estimates with its clock (the run's
    folder, with the collector's store and the job's clock, kept under ``keep_dir``)."""
    from tests.record import RECIPES
    run = Run(name, condition, index)
    if keep_dir is not None:
        tmp = keep_dir / f"{name}-{condition}-{index}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    else:
        tmp = Path(tempfile.mkdtemp(prefix=f"goodlens-accuracy-{name}-"))
    t = time.monotonic()
    try:
        cap = RECIPES[name](tmp)
        run.seconds = time.monotonic() - t
        run.job = cap.job
        if cap.truth_dir is not None:
            run.estimates = checks_for(name)(name, live_result(cap))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # a failed job (pytest.fail too) is a result
        run.seconds = run.seconds or time.monotonic() - t
        run.error = f"{type(e).__name__}: {str(e).strip()[:300]}"
        traceback.print_exc(limit=3, file=sys.stderr)
    finally:
        run.left_behind = reaper.sweep(keep)
        if keep_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return run


# --------------------------------------------------------------------------- summary


def _fmt(x: float | None, unit: str, signed: bool = False) -> str:
    if x is None or x != x:
        return "-"
    if x == 0:
        return "0"   # inside the truth's range, or exact
    if unit == "rel":
        digits = 2 if abs(x) < 0.001 else 1
        return f"{100 * x:+.{digits}f}%" if signed else f"{100 * x:.{digits}f}%"
    if unit == "s":
        v, u = (1000 * x, "ms") if abs(x) < 1 else (x, "s")
        return f"{v:+.1f} {u}" if signed else f"{v:.1f} {u}"
    return f"{x:+g}" if signed else f"{x:g}"


def _p90(xs: list[float]) -> float:
    """The 90th percentile, nearest rank (a value some run had)."""
    s = sorted(xs)
    return s[max(0, -(-9 * len(s) // 10) - 1)]


def summarise(runs: list[Run]) -> list[dict[str, Any]]:
    """Per recipe x estimate x condition: n, misses, median / p90 |error|, worst."""
    groups: dict[tuple[str, str, str], list[Estimate]] = {}
    for r in runs:
        for e in r.estimates:
            groups.setdefault((r.recipe, e.name, r.condition), []).append(e)
    rows = []
    for (recipe, name, cond), es in groups.items():
        errs = [e.error for e in es if e.error is not None]
        mags = [abs(x) for x in errs]
        rows.append({"recipe": recipe, "estimate": name, "condition": cond,
                     "unit": es[0].unit, "n": len(errs), "missed": len(es) - len(errs),
                     "median": statistics.median(mags) if mags else None,
                     "p90": _p90(mags) if mags else None,
                     "worst": max(errs, key=abs) if errs else None,
                     "bias": statistics.median(errs) if errs else None})
    # recipes by name, each one's estimates in its check's order, quiet before busy
    seen = list(dict.fromkeys(key[:2] for key in groups))
    rows.sort(key=lambda x: (x["recipe"], seen.index((x["recipe"], x["estimate"])),
                             CONDITIONS.index(x["condition"])))
    return rows


def table_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    return [[r["recipe"], r["estimate"], r["condition"], r["n"], r["missed"] or "",
             _fmt(r["median"], r["unit"]), _fmt(r["p90"], r["unit"]),
             _fmt(r["worst"], r["unit"], signed=True), _fmt(r["bias"], r["unit"], True)]
            for r in rows]


HEADERS = ["recipe", "estimate", "condition", "n", "missed", "median abs err", "p90 abs err",
           "worst err", "median err"]


def workload(args: argparse.Namespace, names: list[str], runs: list[Run],
             elapsed: float) -> list[str]:
    """The workload, stated above the table: each recipe's job, and the runs made."""
    lines = [f"workload: {len(names)} recipe(s), {args.runs} run(s) each per condition "
             f"({', '.join(args.conditions)}), busy = {args.busy} x `python -c "
             f"'{BUSY_LOOP}'`; {os.cpu_count()} CPUs; {elapsed:.0f} s in all",
             f"machine: {machine()}"]
    for name in names:
        mine = [r for r in runs if r.recipe == name]
        job = next((r.job for r in mine if r.job), {})
        secs = {c: [r.seconds for r in mine if r.condition == c and not r.error]
                for c in args.conditions}
        took = ", ".join(f"{c} {statistics.median(v):.0f} s" for c, v in secs.items() if v)
        if not job:
            lines.append(f"  {name}: no run finished")
            continue
        lines.append(f"  {name}: {job.get('ranks', '?')} ranks, {describe(job)}; "
                     f"one run: {took or '-'}")
    return lines


def report(args: argparse.Namespace, names: list[str], runs: list[Run],
           elapsed: float, skipped: dict[str, str]) -> dict[str, Any]:
    rows = summarise(runs)
    head = workload(args, names, runs, elapsed)
    out = sys.stderr if args.json == "-" else sys.stdout
    print("\n" + "\n".join(head), file=out)
    print(table(table_rows(rows), HEADERS), file=out)
    used = dict.fromkeys(r["estimate"] for r in rows)
    notes = [f"{n}: {AGAINST.get(n, '(see bench/_accuracy_checks.py)')}" for n in used]
    notes.append("errors relative to the truth unless marked (steps, s, a count); a truth "
                 "that is a range scores 0 inside it; worst and median err signed "
                 "(+ above the truth); p90 nearest-rank (with n < 10 it is the worst)")
    for name, why in skipped.items():
        notes.append(f"{name}: {why}")
    failed = [r for r in runs if r.error]
    for r in failed:
        notes.append(f"{r.recipe} {r.condition} run {r.index}: FAILED ({r.error})")
    leaked = sum(r.left_behind for r in runs)
    if leaked:
        notes.append(f"{leaked} process(es) a recipe left behind were killed after it")
    for n in notes:
        print(f"- {n}", file=out)
    print("\n----- markdown for docs/benchmarks.md -----", file=out)
    intro = "\n".join([head[0] + ":", "", *(f"- {x.strip()}" for x in head[2:])])
    print(markdown_section("Accuracy under load", intro,
                           table(table_rows(rows), HEADERS, markdown=True), notes), file=out)
    return {"workload": {"recipes": names, "runs": args.runs, "busy": args.busy,
                         "conditions": list(args.conditions), "cpus": os.cpu_count(),
                         "machine": machine(), "seconds": round(elapsed, 1)},
            "summary": rows, "runs": [r.as_dict() for r in runs], "skipped": skipped}


# ------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--only", nargs="+", metavar="NAME", help="recipes to run (default all)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each recipe per condition")
    ap.add_argument("--busy", type=int, default=2, help="busy loops beside the busy runs")
    ap.add_argument("--conditions", default=",".join(CONDITIONS),
                    type=lambda s: [c for c in s.split(",") if c],
                    help="comma-separated subset of quiet,busy")
    ap.add_argument("--json", metavar="PATH", help="also write the raw errors of every run "
                    "as JSON to PATH ('-': to stdout, the table to stderr)")
    ap.add_argument("--keep", metavar="DIR", type=Path,
                    help="keep each run's folder (store, job clock, logs) under DIR")
    args = ap.parse_args(argv)
    if set(args.conditions) - set(CONDITIONS) or not args.conditions:
        ap.error(f"--conditions: a subset of {','.join(CONDITIONS)}")
    from tests.record import RECIPES, _load_recipes
    _load_recipes()
    names = args.only or sorted(RECIPES)
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        ap.error(f"unknown recipe(s) {unknown}; known: {' '.join(sorted(RECIPES))}")
    skipped: dict[str, str] = {n: "its recording has no job clock: nothing to compare "
                               "with (not run)" for n in names if has_clock(n) is False}
    signal.signal(signal.SIGTERM, _interrupt)
    reaper = Reaper()
    runs: list[Run] = []
    t0 = time.monotonic()
    code = 0
    log = sys.stderr
    print(f"accuracy: {names} x {args.runs} run(s) x {args.conditions}, busy {args.busy}, "
          f"{os.cpu_count()} CPUs", file=log, flush=True)
    busy: BusyLoops | None = None
    try:
        for i in range(args.runs):
            k = i % len(args.conditions)   # the conditions take turns going first
            for cond in args.conditions[k:] + args.conditions[:k]:
                busy = BusyLoops(args.busy) if cond == "busy" else None
                try:
                    for name in names:
                        if name in skipped:
                            continue
                        run = run_once(name, cond, i, reaper, busy.pids if busy else set(),
                                       args.keep)
                        runs.append(run)
                        errs = ", ".join(f"{e.name} {_fmt(e.error, e.unit, True)}"
                                         for e in run.estimates)
                        print(f"{name} {cond} run {i}: {run.seconds:.0f} s"
                              f"{'; FAILED: ' + run.error if run.error else ''}"
                              f"{'; ' + errs if errs else ''}", file=log, flush=True)
                        if not run.error and not run.estimates:
                            skipped[name] = ("no estimate to check: run once, not repeated "
                                             "(a family in bench/_accuracy_checks.py adds one)")
                finally:
                    if busy is not None:
                        busy.stop()
                        busy = None
    except KeyboardInterrupt:
        print("interrupted: the runs so far", file=log)
        code = 130
    finally:
        if busy is not None:
            busy.stop()
        reaper.sweep()
    result = report(args, names, runs, time.monotonic() - t0, skipped)
    if args.json == "-":
        print(json.dumps(result, indent=1, default=float))
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=float) + "\n")
    if code == 0 and any(r.error for r in runs):
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
