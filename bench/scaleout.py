"""Scale-out ingest: 1, 2 and 4 collector processes writing one Parquet dataset, against
one collector on a DuckDB file; and bytes per rank-step on disk for each backend.

Each configuration starts N ``goodlens serve --db parquet:DIR`` processes on a fresh
dataset (and, as the baseline in the same run, one ``goodlens serve --db FILE``); pusher
processes own disjoint ranks and send pre-encoded Arrow batches, client ``c`` to collector
``c % N``. Wall time runs from the first push to the last 200 (a 200 means the segment is
renamed into place and fsynced). Then the collectors are stopped (each saves a summary
checkpoint), the dataset is opened with :class:`goodlens.storage.parquet.ParquetStore`, once
summarising every raw segment and once from the checkpoints, its (deduplicated) row count
checked against what was sent, and its size on disk measured before and after compaction.

On this 2-core machine the collectors and the pushers share the same two cores, so more
collectors cannot add CPU; the table shows what they cost and that nothing is lost.

    .venv/bin/python bench/scaleout.py [--rows 4000000] [--collectors 1 2 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    Collector,
    machine,
    push,
    stored_rows,
    table,
    workdir,
    workload_arguments,
    workload_from,
)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*.parquet"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_arguments(ap, rows=4_000_000)
    ap.add_argument("--collectors", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    base_w = dataclasses.replace(workload_from(ap, args), wire="arrow")
    print(machine())
    print(f"workload: {base_w.describe()}, Arrow IPC", flush=True)
    rows, sizes, opens = [], [], []
    with workdir(args.keep, args.tmp) as tmp:
        (tmp / "duckdb").mkdir()
        single = Collector(tmp / "duckdb", ["--no-detect"]).start()
        try:
            res = push(base_w, single.port)
            single.sync()
        finally:
            single.stop()
        counts = stored_rows(single.db)
        base_rate = res.rows_per_s
        rows.append(["1 collector, DuckDB file (baseline)", f"{res.rows:,}", f"{res.wall_s:.2f}",
                     f"{res.rows_per_s:,.0f}", "1.00x", "ok" if counts["steps"] == res.rows
                     else "MISMATCH"])
        sizes.append(["DuckDB file", f"{single.db_bytes() / res.rows:.1f}"])
        for n in args.collectors:
            w = dataclasses.replace(base_w, clients=max(base_w.clients, n))
            dataset = tmp / f"parquet-{n}"
            procs = []
            for i in range(n):
                (tmp / f"c{n}-{i}").mkdir()
                c = Collector(tmp / f"c{n}-{i}", ["--no-detect"],
                              db=f"parquet:{dataset}")
                procs.append(c.start())
            try:
                res = push(w, [c.port for c in procs])
            finally:
                for c in procs:
                    c.stop()
            import time

            from goodlens.storage.parquet import ParquetStore
            t = time.perf_counter()  # the baseline: summarise every raw segment
            ParquetStore(dataset, read_only=True, use_checkpoints=False).close()
            open_s = time.perf_counter() - t
            t = time.perf_counter()  # from the collectors' summary checkpoints
            store = ParquetStore(dataset)
            ckpt_s = time.perf_counter() - t
            redone = store.open_stats["steps_summarised"]
            stored = store.row_counts()["steps"]
            files = len(list((dataset / "steps").rglob("*.parquet")))
            before = _dir_bytes(dataset)
            store.compact(min_files=2)
            store.close()  # the compacted sources go now (not after their grace period)
            after = _dir_bytes(dataset)
            rows.append([f"{n} collector(s), one Parquet dataset", f"{res.rows:,}",
                         f"{res.wall_s:.2f}", f"{res.rows_per_s:,.0f}",
                         f"{res.rows_per_s / base_rate:.2f}x",
                         "ok" if stored == res.rows else f"MISMATCH ({stored:,})"])
            sizes.append([f"Parquet, {n} collector(s), {files} segments",
                          f"{before / res.rows:.1f}"])
            sizes.append([f"Parquet, {n} collector(s), compacted", f"{after / res.rows:.1f}"])
            opens.append([f"{n} collector(s)", f"{res.rows:,}", f"{open_s:.2f}",
                          f"{res.rows / open_s:,.0f}", f"{ckpt_s:.2f}", f"{redone:,}",
                          f"{open_s / ckpt_s:.0f}x"])
    print()
    print(table(rows, ["configuration", "rows", "wall s", "rows/s", "vs DuckDB",
                       "stored = sent"], markdown=True))
    print()
    print(table(sizes, ["backend", "bytes per rank-step"], markdown=True))
    print()
    print("Opening the dataset: summarising every segment (baseline) vs starting from the "
          "summary checkpoints the collectors saved when they stopped:")
    print(table(opens, ["dataset written by", "rows", "full open s", "rows/s",
                        "checkpoint open s", "steps recomputed", "speed-up"], markdown=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
