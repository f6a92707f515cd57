"""Benchmark: `goodlens report` on a very large run, and against plain pandas.

1. A run of RANKS x STEPS rank-steps (default 16,384 x 20,000 = 328M) is written into a
   fresh store through the store's own write path (Arrow batches), summarised by the store's
   summariser, then accounted: the report must take at most 1 s, because it reads the
   per-step summaries, never the raw rows.
2. A 10-million-row run (1,000 ranks x 10,000 steps), side by side: our report (summaries
   already maintained at ingest; and, for honesty, also including the summarising of the
   raw rows) against a plain pandas implementation that computes the same productive and
   straggler-wait seconds from the raw rows (groupby step, median and max compute).

    .venv/bin/python bench/accounting.py                      # full size (minutes, ~10 GB)
    .venv/bin/python bench/accounting.py --ranks 2048 --steps 2000   # quick
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from goodlens.analysis.accounting import account_run
from goodlens.model.batch import Batch, validate_batch
from goodlens.storage.store import Store

T0 = 1_767_225_600.0


def synth_chunk(rng: np.random.Generator, ranks: int, first: int, n: int) -> pa.Table:
    """n steps x ranks rows; rank 7 computes 5% slower; values rounded to 0.1 ms."""
    step = np.repeat(np.arange(first, first + n, dtype=np.int64), ranks)
    rank = np.tile(np.arange(ranks, dtype=np.int64), n)
    compute = np.round(0.8 + 0.01 * rng.standard_normal(n * ranks), 4)
    compute[rank == 7] *= 1.05
    dur = np.round(np.repeat(compute.reshape(n, ranks).max(axis=1) + 0.2, ranks), 4)
    start = T0 + 60 + step * 1.05 + np.round(rng.uniform(-0.05, 0.05, ranks)[rank], 4)
    nulls = pa.nulls(n * ranks, pa.float64())
    return pa.table({
        "attempt": pa.array(np.zeros(n * ranks, dtype=np.int64)), "rank": rank,
        "host": pa.array([f"node-{r // 8}" for r in range(ranks)]).take(pa.array(rank)),
        "step": step, "start_time": start, "duration_s": dur, "compute_s": compute,
        "collective_wait_s": np.round(dur - compute, 4), "data_wait_s": nulls,
        "tokens": pa.nulls(n * ranks, pa.int64()), "samples": pa.nulls(n * ranks, pa.int64())})


def build(path: Path, ranks: int, steps: int, chunk_rows: int = 4_000_000) -> tuple[Store, dict]:
    store = Store(path)
    store.write_group([validate_batch({
        "schema_version": 1, "run_id": "big", "run": {"world_size": ranks, "gpus_per_rank": 1},
        "events": {"source": "bench", "seq": [0, 1], "kind": ["attempt_start", "attempt_end"],
                   "time": [T0, T0 + 60 + steps * 1.05 + 5], "attempt": 0,
                   "cause": [None, "completed"]}})])
    rng = np.random.default_rng(0)
    per = max(1, chunk_rows // ranks)
    t = time.perf_counter()
    for first in range(0, steps, per):
        n = min(per, steps - first)
        store.write_group([Batch(run_id="big", steps=synth_chunk(rng, ranks, first, n))])
        print(f"\r  wrote {min(first + n, steps) * ranks:,} rows", end="", file=sys.stderr)
    write_s = time.perf_counter() - t
    t = time.perf_counter()
    store.summarize_dirty()
    summarize_s = time.perf_counter() - t
    print(file=sys.stderr)
    return store, {"write_s": write_s, "summarize_s": summarize_s}


def time_report(store: Store, repeats: int = 5) -> float:
    best = []
    for _ in range(repeats):
        t = time.perf_counter()
        account_run(store, "big").breakdown()
        best.append(time.perf_counter() - t)
    return float(np.median(best))


def pandas_report(raw: pd.DataFrame) -> dict[str, float]:
    """The plain way: from raw per-rank rows, group by step, then sum the buckets."""
    g = raw.groupby(["attempt", "step"])
    per = g.agg(start=("start_time", "min"), dur=("duration_s", "median"),
                cmed=("compute_s", "median"), cmax=("compute_s", "max"))
    sw = (per.cmax - per.cmed).clip(lower=0)
    return {"productive": float((per.dur - sw).sum()), "straggler_wait": float(sw.sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=16_384)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--cmp-ranks", type=int, default=1_000)
    ap.add_argument("--cmp-steps", type=int, default=10_000)
    ap.add_argument("--dir", default=None, help="where to put the stores (default: a temp dir)")
    args = ap.parse_args()
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="goodlens-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        rows = args.ranks * args.steps
        print(f"1) report on {args.ranks:,} ranks x {args.steps:,} steps = {rows:,} rank-steps")
        store, t = build(tmp / "big.duckdb", args.ranks, args.steps)
        rep = time_report(store)
        b = account_run(store, "big").breakdown()
        size = (tmp / "big.duckdb").stat().st_size
        store.close()
        print(f"   write {t['write_s']:.1f} s ({rows / t['write_s']:,.0f} rows/s), summarise "
              f"{t['summarize_s']:.1f} s, file {size / 1e9:.2f} GB")
        print(f"   report: {rep * 1000:.1f} ms (target <= 1000 ms: "
              f"{'PASS' if rep <= 1.0 else 'FAIL'}); goodput {b.goodput:.4f}")

        crow = args.cmp_ranks * args.cmp_steps
        print(f"2) {crow:,} rows ({args.cmp_ranks:,} ranks x {args.cmp_steps:,} steps): "
              "ours vs plain pandas")
        store, t = build(tmp / "cmp.duckdb", args.cmp_ranks, args.cmp_steps)
        ours = time_report(store)
        raw = store.steps("big")
        store.close()
        t0 = time.perf_counter()
        pd_out = pandas_report(raw)
        pandas_s = time.perf_counter() - t0
        ours_b = account_run(Store(tmp / "cmp.duckdb", read_only=True), "big").breakdown()
        agree = abs(pd_out["straggler_wait"] - ours_b.buckets["straggler_wait"]) < 1e-6 * crow
        print("| what | time | speed-up over pandas |\n|---|---|---|")
        print(f"| goodlens report (summaries maintained at ingest) | {ours * 1000:.1f} ms | "
              f"{pandas_s / ours:.0f}x |")
        print(f"| goodlens summarise + report (all raw rows) | "
              f"{(t['summarize_s'] + ours) * 1000:.0f} ms | "
              f"{pandas_s / (t['summarize_s'] + ours):.1f}x |")
        print(f"| plain pandas groupby over raw rows | {pandas_s * 1000:.0f} ms | 1x |")
        print(f"   straggler wait agrees with pandas: {agree} "
              f"({ours_b.buckets['straggler_wait']:.3f} vs {pd_out['straggler_wait']:.3f} s)")
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
