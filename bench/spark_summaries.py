"""Summarising a Parquet dataset: Spark local mode against DuckDB, on the same rows, in one run.

Builds a goodlens Parquet dataset of ``--rows`` step rows (one run, ``--ranks`` ranks,
realistic full-precision noise, segments of ``--segment-rows`` rows in hourly partitions, as
compacted collectors leave them), then summarises every row three times, on the same cores:

- **DuckDB, a reader's rebuild**: ``ParquetStore(DIR, read_only=True)`` with no checkpoint to
  start from (what ``goodlens report --db parquet:DIR`` does on a dataset nothing summarised:
  range by range, in statements of 4 M rows);
- **DuckDB, the batch pass**: ``goodlens summarize --engine duckdb``
  (:func:`goodlens.storage.bulk.summarize_dataset` over :func:`~goodlens.storage.bulk.
  duckdb_engine`, calls of at most 20 M rows);
- **Spark local mode**: ``goodlens summarize --engine spark``'s pass (the same function over
  :func:`goodlens.storage.spark.engine`), the session started beforehand (its start-up is
  shown apart).

All three must give the same summaries (compared to a float tolerance); then an incremental
Spark pass is timed after one more segment of steps arrives. From Spark's measured rows per
second per core it computes how many executor cores summarise a day of a 100,000-GPU job
(8.64 G rank-step rows at one step per second) in 10 minutes, assuming the rate per core
holds on a cluster; that figure is computed, not measured.

    .venv/bin/python bench/spark_summaries.py [--rows 50000000] [--ranks 4096]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import T0, machine, table, workdir
from goodlens.model.batch import validate_batch
from goodlens.storage import bulk, spark
from goodlens.storage.parquet import ParquetStore
from goodlens.storage.schema import STEP_NAMES
from goodlens.storage.segments import hour_name

RUN = "bench-spark"
DAY_100K = 100_000 * 86_400  # rank-step rows of a day of a 100k-GPU job at 1 step/s
TARGET_S = 600.0


def _rows(ranks: int, first_step: int, steps: int, seed: int) -> pa.Table:
    """``ranks`` x ``steps`` step rows from ``first_step``, step-major (as a collector's
    segments sort them), with the noise of ``bench/_common.batch_columns``."""
    n = ranks * steps
    rng = np.random.default_rng(seed)
    rank = np.tile(np.arange(ranks, dtype=np.int64), steps)
    step = np.repeat(np.arange(first_step, first_step + steps, dtype=np.int64), ranks)
    duration = 1.0 + rng.gamma(2.0, 0.01, n)
    coll = duration * rng.uniform(0.05, 0.2, n)
    data = rng.exponential(0.002, n)
    hosts = pa.array([f"node-{h:05d}" for h in range(ranks // 8 + 1)])
    cols = {"attempt": np.zeros(n, dtype=np.int64), "rank": rank,
            "host": pa.DictionaryArray.from_arrays(pa.array(rank // 8), hosts).cast(pa.string()),
            "step": step, "start_time": T0 + step * 1.05 + rng.normal(0.0, 0.0005, n),
            "duration_s": duration, "compute_s": np.maximum(duration - coll - data, 0.0),
            "collective_wait_s": coll, "data_wait_s": data,
            "tokens": pa.nulls(n, pa.int64()), "samples": pa.nulls(n, pa.int64())}
    return pa.table({c: cols[c] for c in STEP_NAMES})


def build(root: Path, rows: int, ranks: int, segment_rows: int) -> tuple[int, int, int]:
    """A dataset of about ``rows`` step rows; returns (rows, steps, segments)."""
    store = ParquetStore(root)  # the marker and the run's metadata; no steps yet
    store.write_group([validate_batch({"schema_version": 1, "run_id": RUN,
                                       "run": {"name": "bench", "world_size": ranks}})])
    store.close()
    steps_per_seg = max(1, segment_rows // ranks)
    total_steps = max(1, rows // ranks)
    written = segs = 0
    for k, first in enumerate(range(0, total_steps, steps_per_seg)):
        n = min(steps_per_seg, total_steps - first)
        t = _rows(ranks, first, n, seed=k)
        hour = int((T0 + first * 1.05) // 3600)
        folder = root / "steps" / f"run_id={RUN}" / f"hour={hour_name(hour)}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(t, folder / f"bench-00000000-{k:08d}.parquet", compression="zstd",
                       row_group_size=1_000_000)
        written += t.num_rows
        segs += 1
    return written, total_steps, segs


def compare(a: pa.Table, b: pa.Table) -> float:
    """The largest relative difference between two summary tables (same steps asserted)."""
    a = a.sort_by([("attempt", "ascending"), ("step", "ascending")])
    b = b.sort_by([("attempt", "ascending"), ("step", "ascending")])
    assert a.num_rows == b.num_rows, (a.num_rows, b.num_rows)
    worst = 0.0
    for name in a.column_names:
        x, y = a.column(name).to_numpy(zero_copy_only=False), b.column(name).to_numpy(
            zero_copy_only=False)
        if x.dtype.kind == "f":
            both = ~(np.isnan(x) | np.isnan(y))
            assert (np.isnan(x) == np.isnan(y)).all(), name
            rel = np.abs(x[both] - y[both]) / np.maximum(np.abs(x[both]), 1e-300)
            worst = max(worst, float(rel.max(initial=0.0)))
        else:
            assert list(x) == list(y), name
    return worst


def _reader_pass(root: Path, cores: int) -> tuple[float, pa.Table]:
    """DuckDB as a reader rebuilds every summary (no checkpoint to start from)."""
    t = time.perf_counter()
    store = ParquetStore(root, read_only=True, use_checkpoints=False, threads=cores,
                         save_after_open_s=math.inf)
    seconds = time.perf_counter() - t
    summaries = store._con.sql("SELECT * FROM step_summaries").to_arrow_table()
    store.close()
    return seconds, summaries


def _saved(root: Path) -> pa.Table:
    """The summaries of the checkpoints a pass saved (a reader summarises nothing)."""
    reader = ParquetStore(root, read_only=True)
    assert reader.open_stats["steps_summarised"] == 0, reader.open_stats
    t = reader._con.sql("SELECT * FROM step_summaries").to_arrow_table()
    reader.close()
    return t


def _add_steps(root: Path, ranks: int, first: int, steps: int) -> int:
    """One more segment of ``steps`` steps after the last; its rows."""
    extra = _rows(ranks, first, steps, seed=10**6)
    hour = hour_name(int((T0 + first * 1.05) // 3600))
    folder = root / "steps" / f"run_id={RUN}" / f"hour={hour}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(extra, folder / "bench-00000000-99999999.parquet")
    return extra.num_rows


def _peak_rss_mib() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=50_000_000, help="step rows in the dataset")
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--segment-rows", type=int, default=4_000_000)
    ap.add_argument("--extra-steps", type=int, default=100,
                    help="steps arriving after the first pass (the incremental one)")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                    help="cores each engine may use (DuckDB threads, Spark local[N])")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    print(machine())
    with workdir(args.keep, args.tmp) as tmp:
        root = tmp / "dataset"
        t = time.perf_counter()
        rows, steps, segs = build(root, args.rows, args.ranks, args.segment_rows)
        gb = sum(p.stat().st_size for p in root.rglob("*.parquet")) / 1e9
        print(f"dataset: {rows:,} step rows ({args.ranks:,} ranks x {steps:,} steps) in {segs} "
              f"segments, {gb:.2f} GB, built in {time.perf_counter() - t:.0f} s", flush=True)
        reader_s, want = _reader_pass(root, args.cores)
        print(f"DuckDB reader: {reader_s:.1f} s (peak RSS {_peak_rss_mib():,.0f} MiB)",
              flush=True)
        duck = bulk.summarize_dataset(root, bulk.duckdb_engine(threads=args.cores),
                                      engine="duckdb", max_rows=bulk.DUCKDB_MAX_ROWS)
        print(f"DuckDB pass: {duck.as_dict()} (peak RSS {_peak_rss_mib():,.0f} MiB)",
              flush=True)
        worst = compare(want, _saved(root))
        shutil.rmtree(root / "summaries")
        conf = {"spark.driver.memory": args.driver_memory,
                "spark.sql.shuffle.partitions": str(max(4 * args.cores, rows // 2_000_000))}
        t = time.perf_counter()
        with spark.spark_session(f"local[{args.cores}]", conf) as session:
            start_s = time.perf_counter() - t
            stats = bulk.summarize_dataset(root, spark.engine(session, root), engine="spark")
            print(f"Spark pass: {stats.as_dict()}", flush=True)
            worst = max(worst, compare(want, _saved(root)))
            added = _add_steps(root, args.ranks, steps, args.extra_steps)
            inc = bulk.summarize_dataset(root, spark.engine(session, root), engine="spark")
        _report(args, rows, reader_s, duck, stats, start_s, worst, added, inc)
    return 0


def _report(args, rows, reader_s, duck, stats, start_s, worst, added, inc) -> None:
    cores = args.cores
    rate = {"reader": rows / reader_s, "duckdb": duck.rows_read / duck.engine_seconds,
            "spark": stats.rows_read / stats.engine_seconds}
    cells = [
        ["DuckDB, a reader's rebuild (`goodlens report` with no checkpoint)", rows, reader_s,
         rate["reader"]],
        ["DuckDB, `goodlens summarize` (batch pass)", duck.rows_read, duck.engine_seconds,
         rate["duckdb"]],
        [f"Spark local[{cores}], `goodlens summarize --engine spark`", stats.rows_read,
         stats.engine_seconds, rate["spark"]],
    ]
    print()
    print(table([[name, f"{n:,}", f"{sec:.1f}", f"{r / 1e6:.2f} M", f"{r / cores / 1e6:.3f} M",
                  f"{r / rate['duckdb']:.2f}x"] for name, n, sec, r in cells],
                ["engine", "rows", "seconds", "rows/s", "rows/s per core", "vs DuckDB pass"],
                markdown=True))
    print()
    per_core = rate["spark"] / cores
    need = DAY_100K / TARGET_S
    print(f"- Measured: Spark session start-up {start_s:.1f} s (not in the table); the whole "
          f"Spark pass (plan, footers, engine, checkpoint) {stats.seconds:.1f} s; the DuckDB "
          f"pass {duck.seconds:.1f} s in {duck.engine_calls} call(s)")
    print(f"- Measured: summaries equal on all three, {stats.steps_summarised:,} steps, "
          f"largest relative difference {worst:.1e}")
    print(f"- Measured: after {args.extra_steps} more steps ({added:,} rows, one new segment) "
          f"the next Spark pass read {inc.segments_read} of {inc.segments} segments "
          f"({inc.rows_read:,} rows) in {inc.seconds:.1f} s")
    print(f"- Computed: a day of a 100,000-GPU job is {DAY_100K / 1e9:.2f} G rows; in "
          f"{TARGET_S / 60:.0f} minutes that is {need / 1e6:.1f} M rows/s: "
          f"{math.ceil(need / per_core):,} executor cores at Spark's measured "
          f"{per_core / 1e6:.3f} M rows/s per core, if the per-core rate holds on a cluster "
          f"(DuckDB's batch pass per core, for scale: {rate['duckdb'] / cores / 1e6:.3f} M)")


if __name__ == "__main__":
    raise SystemExit(main())
