"""Eight pushers straight to the collector against the same eight through one per-host relay.

Models one 8-GPU host: ``--pushers`` processes, each one rank of one run, push
``--pushes`` pre-encoded Arrow IPC batches of ``--rows`` consecutive steps (all 9 step
columns, every key distinct) over one persistent connection each, the next as soon as the
previous one is acknowledged (closed loop, like an exporter that has a backlog). Each
workload runs twice against a fresh ``goodlens serve``: the pushers send to the collector
directly, then to one ``goodlens relay`` (``--window``) in front of it. A 200 means the rows
are committed in both cases (the relay acknowledges only after the collector did).

Reported per mode: rows/s (first push to last 200), the requests the collector received
(``goodlens_ingest_batches_total``) and per second, rows per collector request, and push
latency. Stored rows are checked against rows sent.

    .venv/bin/python bench/relay.py [--pushers 8] [--pushes 200] [--rows 10 500] [--window 100ms]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    CONTENT_TYPES,
    GOODLENS,
    RUN_ID,
    Collector,
    CpuMeter,
    Workload,
    batch_columns,
    free_port,
    http_json,
    markdown_section,
    post_ingest,
    push_connection,
    si,
    stored_rows,
    table,
    workdir,
)
from goodlens.model.units import parse_duration
from goodlens.model.wire import encode_arrow_batch


@dataclass
class ModeResult:
    """What one mode (direct or through the relay) measured."""

    rows: int
    pushes: int
    wall_s: float
    collector_requests: int
    latencies_s: np.ndarray
    retries: int
    stored: int
    collector_cores: float
    relay_cores: float | None

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.wall_s

    @property
    def requests_per_s(self) -> float:
        return self.collector_requests / self.wall_s


def bodies_for(w: Workload, pusher: int, pushes: int) -> list[bytes]:
    """Pusher ``pusher``'s batches: its own rank, steps upwards, its own exporter source."""
    out = []
    for k in range(pushes):
        cols = batch_columns(w, pusher, k)
        doc = {"schema_version": 1, "run_id": RUN_ID,
               "steps": {n: (v.tolist() if hasattr(v, "tolist") else v) for n, v in cols.items()},
               "exporter": {"source": f"bench/{pusher}", "dropped_rows": 0}}
        out.append(encode_arrow_batch(doc))
    return out


def _pusher(port: int, bodies: list[bytes], ready: Any, go: Any, out: Any) -> None:
    try:
        conn = push_connection(port)
        headers = {"Content-Type": CONTENT_TYPES["arrow"]}
        lat, retries = [], 0
        ready.wait()
        go.wait()
        first = time.perf_counter()
        for body in bodies:
            dt, tries, _ = post_ingest(conn, body, headers)
            lat.append(dt)
            retries += tries
        out.put((None, first, time.perf_counter(), lat, retries))
        conn.close()
    except BaseException as exc:  # report, never hang the parent
        out.put((repr(exc), 0.0, 0.0, [], 0))
        with contextlib.suppress(Exception):
            ready.abort()


def collector_requests(port: int) -> int:
    """``goodlens_ingest_batches_total`` of the collector (batches it received and stored)."""
    status, body = http_json(port, "GET", "/metrics")
    text = body.decode() if isinstance(body, bytes) else str(body)
    for line in text.splitlines():
        if line.startswith("goodlens_ingest_batches_total"):
            return int(float(line.split()[-1]))
    raise RuntimeError(f"no ingest counter on /metrics ({status})")


def start_relay(upstream: str, window: float, workdir_: Path) -> tuple[subprocess.Popen, int]:
    """``goodlens relay`` on a free port in front of ``upstream``; (process, port)."""
    port = free_port()
    log = open(workdir_ / f"relay-{port}.log", "wb")  # noqa: SIM115 (the child owns it)
    proc = subprocess.Popen([*GOODLENS, "relay", "--upstream", upstream, "--port",
                             str(port), "--window", f"{window}s"], stdout=log,
                            stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"relay exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            if http_json(port, "GET", "/healthz", timeout=2)[0] == 200:
                return proc, port
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("relay did not answer /healthz within 60 s")


def run_mode(w: Workload, pushes: int, relay: bool, window: float, tmp: Path) -> ModeResult:
    """One fresh collector, optionally one relay in front of it, the pushers, the count."""
    folder = tmp / f"{'relay' if relay else 'direct'}-{w.steps}"
    folder.mkdir()
    server = Collector(folder).start()
    relay_proc = None
    try:
        port = server.port
        if relay:
            relay_proc, port = start_relay(server.url, window, folder)
        before = collector_requests(server.port)
        ctx = mp.get_context("fork")
        ready = ctx.Barrier(w.clients + 1)
        go = ctx.Event()
        out = ctx.Queue()
        procs = [ctx.Process(target=_pusher, args=(port, bodies_for(w, p, pushes), ready, go,
                                                   out), daemon=True)
                 for p in range(w.clients)]
        for p in procs:
            p.start()
        with contextlib.suppress(Exception):
            ready.wait(timeout=600)
        cpu = CpuMeter(server.proc.pid)
        rcpu = CpuMeter(relay_proc.pid) if relay_proc else None
        cpu.start()
        if rcpu:
            rcpu.start()
        go.set()
        results = [out.get() for _ in procs]
        use = cpu.stop()
        ruse = rcpu.stop() if rcpu else None
        for p in procs:
            p.join()
        errors = [r[0] for r in results if r[0]]
        if errors:
            raise RuntimeError("pusher failed: " + errors[0])
        requests = collector_requests(server.port) - before
        server.sync()
    finally:
        if relay_proc is not None:
            relay_proc.terminate()
            relay_proc.wait(60)
        server.stop()
    wall = max(r[2] for r in results) - min(r[1] for r in results)
    return ModeResult(rows=w.clients * pushes * w.steps, pushes=w.clients * pushes, wall_s=wall,
                      collector_requests=requests,
                      latencies_s=np.concatenate([np.asarray(r[3]) for r in results]),
                      retries=sum(r[4] for r in results), stored=stored_rows(server.db)["steps"],
                      collector_cores=use["proc_cores"],
                      relay_cores=ruse["proc_cores"] if ruse else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pushers", type=int, default=8, help="pushing processes (ranks of a host)")
    ap.add_argument("--pushes", type=int, default=200, help="pushes per pusher")
    ap.add_argument("--rows", type=int, nargs="+", default=[10, 500],
                    help="step rows per push, one workload each (10: about an exporter's "
                         "second of steps)")
    ap.add_argument("--window", default="100ms", help="the relay's --window")
    ap.add_argument("--tmp", default=None, help="folder for the temporary databases")
    ap.add_argument("--keep", action="store_true", help="keep the databases and logs")
    args = ap.parse_args()
    window = parse_duration(args.window)
    headers = ["workload", "path", "rows/s", "collector req", "collector req/s",
               "rows/req", "push p50 ms", "push p99 ms", "collector cores", "relay cores"]
    rows, notes, ok = [], [], True
    with workdir(args.keep, args.tmp) as tmp:
        for n in args.rows:
            w = Workload(rows=args.pushers * args.pushes * n, ranks=1, steps=n,
                         clients=args.pushers, connections=1, wire="arrow")
            label = f"{args.pushers} x {args.pushes} pushes of {n} rows"
            print(f"workload: {label} ({w.clients * args.pushes * n:,} rows, Arrow IPC)",
                  flush=True)
            res = {mode: run_mode(w, args.pushes, mode == "relay", window, tmp)
                   for mode in ("direct", "relay")}
            for mode, r in res.items():
                ok = ok and r.stored == r.rows
                rows.append([label, "direct" if mode == "direct" else
                             f"one relay ({args.window} window)",
                             f"{r.rows_per_s:,.0f}", f"{r.collector_requests:,}",
                             f"{r.requests_per_s:,.0f}", f"{r.rows / r.collector_requests:,.0f}",
                             f"{np.percentile(r.latencies_s, 50) * 1e3:.1f}",
                             f"{np.percentile(r.latencies_s, 99) * 1e3:.1f}",
                             f"{r.collector_cores:.2f}",
                             "-" if r.relay_cores is None else f"{r.relay_cores:.2f}"])
            d, v = res["direct"], res["relay"]
            fewer = d.collector_requests / v.collector_requests
            rows.append([label, "relay / direct", f"{v.rows_per_s / d.rows_per_s:.2f}x",
                         f"{v.collector_requests / d.collector_requests:.3f}x",
                         f"{v.requests_per_s / d.requests_per_s:.3f}x",
                         f"{fewer * v.rows / d.rows:.1f}x", "", "", "", ""])
            notes.append(f"{label}: the collector received {fewer:.1f}x fewer requests "
                         f"through the relay ({si(v.rows_per_s)}rows/s against "
                         f"{si(d.rows_per_s)}rows/s direct); stored rows equal rows sent: "
                         f"{'yes' if d.stored == d.rows and v.stored == v.rows else 'NO'}; "
                         f"503 retries {d.retries} direct, {v.retries} relay")
    print()
    print(table(rows, headers))
    print()
    for line in notes:
        print(line)
    print(f"machine: {os.cpu_count()} cores; every process (collector, relay, pushers) shares them")
    print()
    print("----- markdown for docs/benchmarks.md -----")
    print(markdown_section(
        "Per-host relay",
        f"{args.pushers} pusher processes (the ranks of one host), each pushing "
        f"{args.pushes} pre-encoded Arrow IPC batches of one rank's consecutive steps over one "
        "persistent connection, closed loop, to a fresh `goodlens serve`: directly, then "
        f"through one `goodlens relay --window {args.window}`. Collector requests are "
        "`goodlens_ingest_batches_total`; a 200 means committed in both paths.",
        table(rows, headers, markdown=True), notes))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
