"""What recording one step costs the training loop, against a Prometheus histogram.

Times ``with exp.step(n): pass`` on a live :class:`~goodlens.exporter.recorder.RankExporter` (its
background thread stopped, so only the recording is measured) against
``prometheus_client.Histogram.observe`` on a fresh registry, measured in the same run, with
an empty loop as the floor. Each case runs ``--iters`` iterations per repetition; the cases
take turns within each repetition and the median over ``--reps`` repetitions is reported.

Target: step <= 0.5 x Histogram.observe (both net of the empty loop) and < 1000 ns per step
(including the loop).

    .venv/bin/python bench/exporter_hot_path.py [--reps 11] [--iters 200000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from time import perf_counter_ns

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry, Histogram

from bench._common import markdown_section, table
from collector import exporter as exporter_mod
from goodlens.exporter.recorder import RankExporter


def loop_empty(ctx: dict, iters: int) -> int:
    t = perf_counter_ns()
    for _n in range(iters):
        pass
    return perf_counter_ns() - t


def loop_observe(ctx: dict, iters: int) -> int:
    h, v = ctx["hist"], ctx["value"]
    t = perf_counter_ns()
    for _n in range(iters):
        h.observe(v)
    return perf_counter_ns() - t


def loop_hist_time(ctx: dict, iters: int) -> int:
    h = ctx["hist_time"]
    t = perf_counter_ns()
    for _n in range(iters):
        with h.time():
            pass
    return perf_counter_ns() - t


def loop_step(ctx: dict, iters: int) -> int:
    exp = ctx["exp"]
    t = perf_counter_ns()
    for n in range(iters):
        with exp.step(n):
            pass
    return perf_counter_ns() - t


def loop_step_phase(ctx: dict, iters: int) -> int:
    exp = ctx["exp"]
    t = perf_counter_ns()
    for n in range(iters):
        with exp.step(n):  # noqa: SIM117 (nested, as written in a training loop)
            with exp.phase("collective"):
                pass
    return perf_counter_ns() - t


def loop_step_py(ctx: dict, iters: int) -> int:
    exp = ctx["exp_py"]
    t = perf_counter_ns()
    for n in range(iters):
        with exp.step(n):
            pass
    return perf_counter_ns() - t


def loop_disabled(ctx: dict, iters: int) -> int:
    exp = ctx["disabled"]
    t = perf_counter_ns()
    for n in range(iters):
        with exp.step(n):
            pass
    return perf_counter_ns() - t


CASES: list[tuple[str, str, Callable[[dict, int], int]]] = [
    ("empty", "empty loop (floor)", loop_empty),
    ("observe", "Histogram.observe(v) (baseline)", loop_observe),
    ("hist_time", "with Histogram.time() (info)", loop_hist_time),
    ("step", "with exp.step(n)", loop_step),
    ("step_phase", 'with exp.step(n) + exp.phase("collective")', loop_step_phase),
    ("disabled", "with exp.step(n), enabled=False", loop_disabled),
    ("step_py", "with exp.step(n), pure-Python scope (info)", loop_step_py),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=11, help="repetitions (median; >= 7)")
    ap.add_argument("--iters", type=int, default=200_000, help="iterations per repetition")
    ap.add_argument("--value", type=float, default=0.3,
                    help="value observed by the histogram (bucket scan depth depends on it)")
    ap.add_argument("--no-gc", action="store_true",
                    help="disable the cyclic GC while timing (default: enabled, as in training)")
    args = ap.parse_args()
    if args.reps < 1 or args.iters < 1:
        ap.error("--reps and --iters must be positive")

    def live_exporter() -> RankExporter:
        e = RankExporter(run_id="bench", url="http://127.0.0.1:9", spill_dir=None,
                         heartbeat_interval_s=0)
        e._stop.set()
        e._thread.join()
        assert e.enabled and not e._thread.is_alive()
        return e

    exp = live_exporter()
    scope_impl = type(exp._scope).__module__ + "." + type(exp._scope).__name__
    # the same exporter with the pure-Python step scope (what runs when the optional C
    # extension collector/_hotpath.c was not built)
    exp_py = live_exporter()
    exp_py._scope = exporter_mod._StepScope(exp_py._steps.append, exp_py._index.__next__)
    if "step" in vars(exp_py):
        exp_py.step = exp_py._scope.arm
    disabled = RankExporter(run_id="bench", url="http://127.0.0.1:9", enabled=False)
    ctx = {
        "exp": exp, "exp_py": exp_py, "disabled": disabled, "value": args.value,
        "hist": Histogram("bench_step_seconds", "step time", registry=CollectorRegistry()),
        "hist_time": Histogram("bench_block_seconds", "block", registry=CollectorRegistry()),
    }

    def reset() -> None:
        for e in (exp, exp_py):
            e._steps.clear()
            e._marks.clear()
        gc.collect()
        if args.no_gc:
            gc.disable()

    per_op: dict[str, list[float]] = {k: [] for k, _, _ in CASES}
    for rep in range(args.reps + 1):  # repetition 0 warms up and is discarded
        for key, _, fn in CASES:
            reset()
            ns = fn(ctx, args.iters)
            if key == "step":
                recorded = len(exp._steps)
                assert recorded == args.iters, f"recorded {recorded} rows, not {args.iters}"
            if rep:
                per_op[key].append(ns / args.iters)
    reset()  # leave nothing for the exit-time flush (it would try port 9)

    med = {k: statistics.median(v) for k, v in per_op.items()}
    floor = med["empty"]
    net = {k: max(med[k] - floor, 0.0) for k in med}
    ratio = net["step"] / net["observe"] if net["observe"] else float("inf")
    ok_ratio = ratio <= 0.5
    ok_abs = med["step"] < 1000
    verdict = "PASS" if ok_ratio and ok_abs else "FAIL"

    rows = []
    for key, label, _ in CASES:
        vs = "-" if key == "empty" else f"{net[key] / net['observe']:.2f}x"
        spread = f"{min(per_op[key]):.1f}-{max(per_op[key]):.1f}"
        rows.append([label, f"{med[key]:.1f}", f"{net[key]:.1f}", spread, vs])
    headers = ["case", "ns/op", "net ns/op", "min-max", "net vs observe"]

    print(f"workload: {args.reps} repetitions x {args.iters:,} iterations per case "
          f"(median reported; histogram observes {args.value}); "
          f"GC {'disabled' if args.no_gc else 'enabled'}; step scope: {scope_impl}")
    print()
    print(table(rows, headers))
    print()
    print("target: step <= 0.5 x Histogram.observe (net of the empty loop) and < 1000 ns")
    print(f"  step net {net['step']:.1f} ns vs observe net {net['observe']:.1f} ns -> "
          f"{ratio:.2f}x ({'ok' if ok_ratio else 'too slow'}); step {med['step']:.1f} ns "
          f"incl. loop ({'ok' if ok_abs else 'too slow'})")
    print(f"RESULT: {verdict}")
    print()
    print("----- markdown for docs/benchmarks.md -----")
    print(markdown_section(
        "Exporter hot path",
        f"Cost of recording one step on the training thread, median of {args.reps} "
        f"repetitions x {args.iters:,} iterations; the baseline is "
        "`prometheus_client.Histogram.observe` on a fresh `CollectorRegistry`, measured in "
        "the same run. \"net\" subtracts the empty loop.",
        table(rows, headers, markdown=True),
        [f"step / Histogram.observe (net): **{ratio:.2f}x**; target <= 0.5x and < 1000 ns "
         f"per step: **{verdict}**.",
         "The exporter's background thread is stopped so only recording is timed; its "
         "buffer is cleared between repetitions. `with Histogram.time()` is for reference.",
         f"Step scope measured: `{scope_impl}`; the pure-Python row is the fallback used "
         "when the optional C extension is not built."]))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
