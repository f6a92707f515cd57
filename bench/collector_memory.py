"""Memory of the collector process while it ingests many rows, and the store's size on disk.

Starts ``goodlens serve`` on a fresh DuckDB file and pushes ``--rows`` step rows through
HTTP exactly as ``bench/ingest.py`` does. The collector's RSS (that process only, no
children) is read before the pushes, every ``--interval`` seconds during them (peak), and
after the last push plus ``POST /v1/sync``; the kernel's high-water mark (VmHWM) is read
too. Then the collector is stopped (SIGTERM) and the file measured, as left and after a
``CHECKPOINT``. Baseline, in the same run: a fresh Python process that inserts the same rows
as Arrow tables straight into DuckDB (one commit per batch): its peak RSS and file size.

    .venv/bin/python bench/collector_memory.py [--rows 10000000] [--clients 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    Collector,
    RssSampler,
    arrow_insert_baseline_process,
    checkpointed_bytes,
    markdown_section,
    peak_rss_bytes,
    push,
    rss_bytes,
    stored_rows,
    table,
    workdir,
    workload_arguments,
    workload_from,
)

MIB = 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_arguments(ap, rows=10_000_000)
    ap.add_argument("--interval", type=float, default=0.5, help="RSS sampling period (s)")
    args = ap.parse_args()
    w = workload_from(ap, args)
    print(f"workload: {w.describe()}", flush=True)

    with workdir(args.keep, args.tmp) as tmp:
        server = Collector(tmp).start()
        pid = server.proc.pid
        rss: dict[str, int] = {"started": rss_bytes(pid)}
        sampler = RssSampler(pid, args.interval)

        def before_go() -> None:
            rss["before"] = rss_bytes(pid)
            sampler.start()

        try:
            res = push(w, server.port, before_go=before_go)
            sync_s = server.sync()
            rss["after"] = rss_bytes(pid)
            sampler.stop()
            rss["peak"] = max(sampler.peak, rss["after"])
            rss["hwm"] = peak_rss_bytes(pid) or 0
            time.sleep(2 * args.interval)
            rss["idle"] = rss_bytes(pid)
        finally:
            sampler.stop()
            rc = server.stop()
        left_bytes = server.db_bytes()
        counts = stored_rows(server.db)
        ckpt_bytes = checkpointed_bytes(server.db)
        print(f"collector: {res.rows:,} rows in {res.wall_s:.1f} s ({res.rows_per_s:,.0f} rows/s), "
              f"sync {sync_s:.2f} s, {len(sampler.samples)} RSS samples; exit status after "
              f"SIGTERM {rc}",
              flush=True)
        base = arrow_insert_baseline_process(w, tmp / "baseline.duckdb")

    ok_rows = counts["steps"] == res.rows == res.inserted
    n = res.rows
    headers = ["", "goodlens serve", "DuckDB Arrow insert (baseline)"]
    rows = [
        ["RSS before ingest (after start)", f"{rss['before'] / MIB:,.0f} MiB", "-"],
        [f"RSS peak (sampled every {args.interval:g} s)", f"{rss['peak'] / MIB:,.0f} MiB", "-"],
        ["RSS peak (kernel VmHWM)", f"{rss['hwm'] / MIB:,.0f} MiB",
         f"{base['rss_peak'] / MIB:,.0f} MiB"],
        ["RSS after ingest + sync", f"{rss['after'] / MIB:,.0f} MiB",
         f"{base['rss_after'] / MIB:,.0f} MiB"],
        [f"RSS {2 * args.interval:g} s later, idle", f"{rss['idle'] / MIB:,.0f} MiB", "-"],
        ["file as left (db + wal)", f"{left_bytes / MIB:,.0f} MiB",
         f"{base['file_bytes'] / MIB:,.0f} MiB"],
        ["file after CHECKPOINT", f"{ckpt_bytes / MIB:,.0f} MiB", "-"],
        ["bytes per row on disk (checkpointed)", f"{ckpt_bytes / n:.1f}",
         f"{base['file_bytes'] / base['rows']:.1f}"],
        ["rows/s (baseline builds each table in its loop)", f"{res.rows_per_s:,.0f}",
         f"{base['rows_per_s']:,.0f}"],
    ]
    print()
    print(table(rows, headers))
    print()
    growth = (rss["peak"] - rss["before"]) / n
    curve = []
    if sampler.samples:
        end = sampler.samples[-1][0]
        for q in (0.25, 0.5, 0.75, 1.0):
            t, r = next(x for x in sampler.samples if x[0] >= q * end)
            curve.append(f"{t:.0f} s {r / MIB:,.0f} MiB")
    print(f"RSS while ingesting (time since first push): {'; '.join(curve)}")
    print(f"RSS growth before -> peak: {(rss['peak'] - rss['before']) / MIB:,.0f} MiB "
          f"({growth:.1f} B per row ingested); stored {counts['steps']:,} rows of {n:,} sent "
          f"-> {'ok' if ok_rows else 'MISMATCH'}")
    print()
    print("----- markdown for docs/benchmarks.md -----")
    print(markdown_section(
        "Collector memory and storage",
        f"{w.describe()}, pushed to `goodlens serve` over loopback HTTP. RSS is the "
        "collector process only. The baseline is a fresh Python process inserting the same "
        "rows as Arrow tables straight into DuckDB (one commit per batch), same run.",
        table(rows, headers, markdown=True),
        [f"Collector RSS grew {(rss['peak'] - rss['before']) / MIB:,.0f} MiB from before to "
         f"peak ({growth:.1f} B per row ingested); the store takes "
         f"{ckpt_bytes / n:.1f} B per step row once checkpointed (steps plus summaries and "
         "bookkeeping tables).",
         "The baseline's \"after\" RSS is taken after it closed its connection (DuckDB "
         "releases its buffer pool then); the collector keeps its store open.",
         f"Stored row count equals rows sent: {'yes' if ok_rows else 'NO'}."]))
    return 0 if ok_rows else 1


if __name__ == "__main__":
    sys.exit(main())
