"""Sustained end-to-end ingest through the HTTP collector, against a raw Arrow-to-DuckDB insert.

Starts ``goodlens serve`` on a fresh DuckDB file, has ``--clients`` processes pre-encode their
wire batches (``--ranks`` x ``--steps`` rows each, every column given, every key distinct),
then push them over persistent connections. Wall time runs from the first push to the last
200 (each 200 means the batch is committed). The baseline, in the same run, inserts the same
rows as pre-built Arrow tables into a fresh DuckDB file, one commit per batch. Afterwards the
collector is synced and stopped and the stored row count is checked against what was sent.

Target: >= 1,000,000 rows/s end to end.

    .venv/bin/python bench/ingest.py [--rows 5000000] [--clients 2] [--ranks 1000] [--steps 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    Collector,
    CpuMeter,
    arrow_insert_baseline,
    markdown_section,
    push,
    si,
    stored_rows,
    table,
    workdir,
    workload_arguments,
    workload_from,
)

TARGET = 1_000_000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_arguments(ap, rows=5_000_000)
    ap.add_argument("--wire", nargs="+", default=["json", "arrow"], choices=["json", "arrow"],
                    help="wire formats to measure, each against a fresh collector")
    args = ap.parse_args()
    base_w = workload_from(ap, args)
    print(f"workload: {base_w.describe()}", flush=True)
    results = {}
    with workdir(args.keep, args.tmp) as tmp:
        for wire in args.wire:
            w = dataclasses.replace(base_w, wire=wire)
            (tmp / wire).mkdir(exist_ok=True)
            server = Collector(tmp / wire).start()
            cpu = CpuMeter(server.proc.pid)
            try:
                res = push(w, server.port, before_go=cpu.start)
                use = cpu.stop()
                sync_s = server.sync()
            finally:
                rc = server.stop()
            counts = stored_rows(server.db)
            print(f"{wire}: {res.batches} pushes, {res.body_bytes / 2**20:,.0f} MiB "
                  f"({res.body_bytes / res.rows:.0f} B/row), encoded by the clients in "
                  f"{res.prepare_s:.1f} s before timing; while pushing the collector used "
                  f"{use['proc_cores']:.2f} cores, the whole machine "
                  f"{use['machine_cores']:.2f} of {os.cpu_count()}; exit status after SIGTERM "
                  f"{rc}", flush=True)
            results[wire] = (res, counts, sync_s, server.db_bytes())
        base = arrow_insert_baseline(base_w, tmp / "baseline.duckdb")

    def rows_ok(res, counts) -> bool:
        return (counts["steps"] == res.rows == res.inserted == counts["distinct_keys"]
                and res.duplicate == 0 and base["rows"] == res.rows)
    ok_rows = all(rows_ok(r, c) for r, c, _, _ in results.values())
    best = max(r.rows_per_s for r, _, _, _ in results.values())
    verdict = "PASS" if best >= TARGET and ok_rows else "FAIL"
    headers = ["path", "rows", "wall s", "rows/s", "vs baseline", "push p50 ms", "push p99 ms"]
    rows = [[f"goodlens serve, HTTP, {wire} batches", f"{r.rows:,}", f"{r.wall_s:.2f}",
             f"{r.rows_per_s:,.0f}", f"{r.rows_per_s / base['rows_per_s']:.2f}x",
             f"{r.latency_ms(50):.1f}", f"{r.latency_ms(99):.1f}"]
            for wire, (r, _, _, _) in results.items()]
    rows.append(["DuckDB Arrow insert, commit/batch (baseline)", f"{base['rows']:,}",
                 f"{base['wall_s']:.2f}", f"{base['rows_per_s']:,.0f}", "1.00x", "-", "-"])
    print()
    print(table(rows, headers))
    print()
    for wire, (r, counts, sync_s, db_bytes) in results.items():
        print(f"{wire}: stored {counts['steps']:,} step rows ({counts['distinct_keys']:,} "
              f"distinct keys, {counts['step_summaries']:,} step summaries); sent {r.rows:,}; "
              f"acknowledged inserted {r.inserted:,}, duplicate {r.duplicate:,}; 503 retries "
              f"{r.retries_503}; final /v1/sync {sync_s:.2f} s; store "
              f"{db_bytes / 2**20:,.0f} MiB -> row count "
              f"{'ok' if rows_ok(r, counts) else 'MISMATCH'}")
    print(f"target: >= {TARGET:,} rows/s end to end: best {si(best)}rows/s "
          f"({best / TARGET:.2f}x of target)")
    print(f"RESULT: {verdict}")
    print()
    print("----- markdown for docs/benchmarks.md -----")
    print(markdown_section(
        "Collector ingest throughput",
        f"{base_w.describe()}, pushed to `goodlens serve` over loopback HTTP (pre-encoded "
        "wire batches, JSON and Arrow IPC, each against a fresh collector). Wall time runs "
        "from the first push to the last 200, and a 200 means the batch is committed to "
        "DuckDB. The baseline inserts the same rows as pre-built Arrow tables straight into "
        "a fresh DuckDB file (`INSERT INTO t SELECT * FROM arrow_table`), one commit per "
        "batch, in the same run.",
        table(rows, headers, markdown=True),
        [f"End to end, best format: **{si(best)}rows/s** against a target of >= "
         f"{si(TARGET, 0)}rows/s: **{verdict}**.",
         f"Stored row counts equal rows sent: {'yes' if ok_rows else 'NO'}."]))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
