"""How fast the run simulator answers a what-if: Monte Carlo trials of a preset, breakdown only.

Times ``goodlens.analysis.runsim.montecarlo.monte_carlo`` on ``--preset`` (default ``llama3-16k``:
16,384 GPUs,
54 days, ~470 interruptions and ~14,000 checkpoints per trial) for ``--trials`` trials, from a
cold start (the per-config straggler-noise Monte Carlo included), ``--reps`` times; the median
is reported. Trials are event-driven (failures, checkpoints, straggler episodes), never per
step, on one core.

Target: 1,000 trials of llama3-16k in at most 10 s.

    .venv/bin/python bench/simulate.py [--trials 1000] [--reps 1] [--preset llama3-16k]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import markdown_section, table
from goodlens.analysis.runsim import montecarlo as sim
from goodlens.analysis.runsim import trial as _simcore
from goodlens.analysis.runsim.presets import PRESETS, get_preset

TARGET_S = 10.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama3-16k", choices=list(PRESETS))
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = get_preset(args.preset)
    times, mc = [], {}
    for _ in range(args.reps):
        # cold: the per-config noise Monte Carlo is timed too
        _simcore.straggler_noise.cache_clear()
        t = time.perf_counter()
        mc = sim.monte_carlo(cfg, trials=args.trials, seed=args.seed)
        times.append(time.perf_counter() - t)
    wall = statistics.median(times)
    counts = mc["counts_mean"]
    rows = [[args.preset, f"{args.trials:,}", f"{wall:.2f}", f"{args.trials / wall:,.0f}",
             f"{1000 * wall / args.trials:.2f}", f"{mc['goodput_mean']:.4f}",
             f"{mc['goodput_p5']:.4f}-{mc['goodput_p95']:.4f}",
             f"{counts['failures']:.0f} / {counts['planned']:.0f}"]]
    headers = ["preset", "trials", "seconds", "trials/s", "ms/trial", "mean goodput",
               "p5-p95", "failures / planned"]
    scaled = wall * 1000 / args.trials
    verdict = "PASS" if scaled <= TARGET_S else "FAIL"
    gpus = cfg.nodes * cfg.gpus_per_node
    print(f"workload: {args.preset} ({gpus:,} GPUs, {cfg.duration_s / 86400:.0f} days), "
          f"{args.trials:,} trials, median of {args.reps} run(s): "
          + ", ".join(f"{x:.2f} s" for x in times))
    print()
    print(table(rows, headers))
    print()
    print(f"target: 1,000 trials in <= {TARGET_S:.0f} s; measured {scaled:.2f} s per 1,000 trials")
    print(f"RESULT: {verdict}")
    print()
    print("----- markdown for docs/benchmarks.md -----")
    print(markdown_section(
        "Run simulator (breakdown only)",
        f"`goodlens.analysis.runsim.montecarlo.monte_carlo` on the `{args.preset}` preset "
        f"({gpus:,} GPUs, "
        f"{cfg.duration_s / 86400:.0f} days; per trial ~{counts['attempts']:.0f} attempts and "
        f"~{counts['checkpoints']:,.0f} checkpoints), {args.trials:,} trials from a cold start, "
        f"one core, median of {args.reps} run(s).",
        table(rows, headers, markdown=True),
        [f"{scaled:.2f} s per 1,000 trials against a target of <= {TARGET_S:.0f} s: "
         f"**{verdict}**.",
         "Event-driven at the granularity of failures, checkpoints and straggler episodes: "
         "steps between events are counted arithmetically, never one by one."]))
    trace_generation()
    return 0 if verdict == "PASS" else 1


def trace_generation() -> None:
    """Trace mode: rank-step rows per second for demo-64 (64 GPUs, 12 h: ~2.6 M rows),
    building the tables alone and with the zstd Parquet write."""
    import tempfile

    from goodlens.analysis.runsim.tracegen import generate_trace
    cfg = get_preset("demo-64")
    built = generate_trace(cfg, 0, None, run_id="d64")
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        written = generate_trace(cfg, 0, tmp, run_id="d64")
        total = time.perf_counter() - t
    rows = [["build tables", f"{built.rows:,}", f"{built.seconds:.2f}",
             f"{built.rows_per_s:,.0f}"],
            ["build + write Parquet", f"{written.rows:,}", f"{total:.2f}",
             f"{written.rows / total:,.0f}"]]
    print()
    print("trace generation, demo-64 (64 GPUs, 12 h), seed 0:")
    print(table(rows, ["what", "rank-step rows", "seconds", "rows/s"]))
    print(table(rows, ["what", "rank-step rows", "seconds", "rows/s"], markdown=True))


if __name__ == "__main__":
    sys.exit(main())
