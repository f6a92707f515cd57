"""How long a push waits for the relay's answer when the collector is slow, against pushing
to that collector directly.

``goodlens relay --help`` promises: every push is answered within 4.5 s of arriving (the
exporters give up at 5 s); one that waited behind a slow forward gets 503 (retry) rather
than a late answer. This measures that promise as a distribution, under load or not.

Workload, per upstream delay D (``--delays``, default 0.5, 1.5, 3.0, 6.0 s): a fake
collector (a threaded HTTP server in its own process) answers every push 200 after D
seconds. ``--pushers`` processes (8: the ranks of one host), each one rank with its own
exporter source, push one pre-encoded Arrow IPC batch of ``--rows`` steps per round, on a
fresh loopback connection, staggered: in a round pusher i sends at
``i * stagger + uniform(0, stagger)`` s (``--stagger`` 0.25 s, so the 8 pushes arrive over
about 2 s and some arrive while a forward is in flight). Rounds start together once every
push of the previous one was answered; ``--rounds`` R of them, the same arrival times in
each path. With ``--refuse-merged`` the fake collector answers 422 to a batch of
several ranks, so the relay forwards that batch's pushes one by one. Paths: straight to
the fake collector (the baseline), through a fresh ``goodlens relay --window 0``, and
through one with the default window (100 ms); the relay keeps its default ``--timeout
2s``. Clients wait up to 60 s, so a late answer is timed rather than cut off at the
exporters' 5 s.

Reported per D and path: the answers by status, the answer time (request sent to answer
read, as an exporter sees it) median, p90 and worst, how many took over 4.5 s (the promise)
and over 5 s (the exporter gave up and will re-send), the relay's median and worst as a
ratio of the direct ones, and the requests the fake collector received. ``--busy K`` runs
beside K busy loops (started and killed here).

    .venv/bin/python bench/relay_slow.py [--delays 0.5 1.5 3 6] [--pushers 8] [--rounds 5]
        [--stagger 0.25] [--refuse-merged] [--busy 2] [--json PATH|-]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client as httpclient
import http.server as hs
import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import CONTENT_TYPES, Workload, markdown_section, table, workdir
from bench.accuracy import BUSY_LOOP, BusyLoops
from bench.relay import bodies_for
from tests.harness import Relay

PROMISE_S = 4.5  # `goodlens relay --help`: every push answered within this of arriving
EXPORTER_TIMEOUT_S = 5.0  # the exporters' HTTP timeout: later answers are lost, re-sent
CLIENT_TIMEOUT_S = 60.0  # this benchmark's: long enough to time a late answer
PATHS = {"direct": None, "relay --window 0": ["--window", "0"], "relay (100ms window)": []}


# ----------------------------------------------------------------------------- fake collector


def _ranks(body: bytes) -> int:
    """Distinct ranks in an Arrow IPC push."""
    import pyarrow as pa
    return len(set(pa.ipc.open_stream(body).read_all().column("rank").to_pylist()))


def _serve_slow(delay_s: float, refuse_merged: bool, port_out: Any, requests: Any) -> None:
    """A collector stand-in that answers every POST 200 after ``delay_s`` (forked process);
    with ``refuse_merged``, 422 to a batch of several ranks (a merged one)."""
    class Slow(hs.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers["Content-Length"]))
            with requests.get_lock():
                requests.value += 1
            time.sleep(delay_s)
            refuse = refuse_merged and _ranks(data) > 1
            body = b'{"error": "refused", "field": "steps"}' if refuse else b'{"ok": true}'
            self.send_response(422 if refuse else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = hs.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    srv.daemon_threads = True
    port_out.put(srv.server_address[1])
    srv.serve_forever()


class SlowCollector:
    """:func:`_serve_slow` in its own process; ``requests``: POSTs it received."""

    def __init__(self, delay_s: float, refuse_merged: bool = False) -> None:
        ctx = mp.get_context("fork")
        self.requests = ctx.Value("q", 0)
        port_out = ctx.Queue()
        self.proc = ctx.Process(target=_serve_slow, args=(delay_s, refuse_merged, port_out,
                                                              self.requests),
                                daemon=True)
        self.proc.start()
        self.port = port_out.get(timeout=60)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.join(10)


# ----------------------------------------------------------------------------- pushers


def _push_once(port: int, body: bytes) -> tuple[int, float]:
    """(status, seconds from connecting to the answer read) of one push; status 0 when the
    connection failed or nothing answered within the client timeout."""
    t = time.perf_counter()
    conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    try:
        conn.request("POST", "/v1/ingest", body=body,
                     headers={"Content-Type": CONTENT_TYPES["arrow"]})
        resp = conn.getresponse()
        resp.read()
        status = resp.status
    except (OSError, httpclient.HTTPException):
        status = 0
    finally:
        conn.close()
    return status, time.perf_counter() - t


def _pusher(i: int, port: int, bodies: list[bytes], offsets: np.ndarray, barrier: Any,
            start: Any, out: Any) -> None:
    try:
        got = []
        for r, body in enumerate(bodies):
            barrier.wait(timeout=300)  # the round starts once every pusher is here
            time.sleep(max(0.0, start.value + offsets[r, i] - time.perf_counter()))
            got.append(_push_once(port, body))
        out.put((i, None, got))
    except BaseException as exc:  # report, never hang the parent
        out.put((i, repr(exc), []))
        with contextlib.suppress(Exception):
            barrier.abort()


def push_rounds(port: int, bodies: list[list[bytes]], offsets: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Every pusher's pushes, round by round: (statuses, answer times in s)."""
    n = len(bodies)
    ctx = mp.get_context("fork")
    start = ctx.Value("d", 0.0)

    def go() -> None:  # run by the last pusher to arrive: the round's time zero
        start.value = time.perf_counter() + 0.05

    barrier = ctx.Barrier(n, action=go)
    out = ctx.Queue()
    procs = [ctx.Process(target=_pusher, args=(i, port, bodies[i], offsets, barrier, start,
                                               out), daemon=True) for i in range(n)]
    for p in procs:
        p.start()
    results = sorted(out.get() for _ in procs)
    for p in procs:
        p.join()
    errors = [r[1] for r in results if r[1]]
    if errors:
        raise RuntimeError("pusher failed: " + errors[0])
    got = np.array([r[2] for r in results], dtype=float)  # pusher x round x (status, s)
    return got[..., 0].astype(int).ravel(), got[..., 1].ravel()


# ----------------------------------------------------------------------------- one case


@dataclass
class PathResult:
    """What one path (direct or through one relay) measured at one upstream delay."""

    delay_s: float
    path: str
    statuses: np.ndarray
    answer_s: np.ndarray
    upstream_requests: int

    def stats(self) -> dict[str, Any]:
        a = self.answer_s
        codes, counts = np.unique(self.statuses, return_counts=True)
        return {"delay_s": self.delay_s, "path": self.path, "pushes": int(a.size),
                "statuses": {str(c): int(k) for c, k in zip(codes, counts)},
                "median_s": float(np.median(a)), "p90_s": float(np.percentile(a, 90)),
                "worst_s": float(a.max()), "over_promise": int((a > PROMISE_S).sum()),
                "over_exporter_timeout": int((a > EXPORTER_TIMEOUT_S).sum()),
                "upstream_requests": self.upstream_requests}


def run_delay(delay_s: float, bodies: list[list[bytes]], offsets: np.ndarray,
              tmp: Path, refuse_merged: bool = False) -> list[PathResult]:
    """The three paths against one fake collector answering after ``delay_s``."""
    upstream = SlowCollector(delay_s, refuse_merged)
    out = []
    try:
        for path, extra in PATHS.items():
            before = upstream.requests.value
            relay = None if extra is None else Relay(tmp, upstream.url, *extra).start()
            try:
                port = upstream.port if relay is None else relay.port
                statuses, answer_s = push_rounds(port, bodies, offsets)
            finally:
                if relay is not None:
                    relay.stop()
            out.append(PathResult(delay_s, path, statuses, answer_s,
                                  upstream.requests.value - before))
            s = out[-1].stats()
            print(f"  D={delay_s:g} s {path}: {s['statuses']}, median {s['median_s']:.2f} s, "
                  f"worst {s['worst_s']:.2f} s", flush=True)
    finally:
        upstream.stop()
    return out


# ----------------------------------------------------------------------------- report


def table_rows(results: list[PathResult]) -> list[list[str]]:
    """One row per delay and path; the relay's median and worst as a ratio of direct."""
    rows = []
    direct: dict[float, dict[str, Any]] = {}
    for r in results:
        s = r.stats()
        if r.path == "direct":
            direct[r.delay_s] = s
        d = direct[r.delay_s]
        rows.append([f"{r.delay_s:g} s", r.path,
                     ", ".join(f"{k} x{v}" for k, v in s["statuses"].items()),
                     f"{s['median_s']:.2f}", f"{s['p90_s']:.2f}", f"{s['worst_s']:.2f}",
                     str(s["over_promise"]), str(s["over_exporter_timeout"]),
                     "" if r.path == "direct" else f"{s['median_s'] / d['median_s']:.2f}x",
                     "" if r.path == "direct" else f"{s['worst_s'] / d['worst_s']:.2f}x",
                     str(s["upstream_requests"])])
    return rows


HEADERS = ["collector delay", "path", "answers", "median s", "p90 s", "worst s", "> 4.5 s",
           "> 5 s", "median / direct", "worst / direct", "collector requests"]


def verdicts(results: list[PathResult]) -> list[str]:
    """The promise, per delay and relay path: kept, or broken with by how much."""
    out = []
    for r in results:
        if r.path == "direct":
            continue
        s = r.stats()
        if s["over_promise"] == 0 and not (r.statuses == 0).any():
            out.append(f"D={r.delay_s:g} s, {r.path}: kept (worst {s['worst_s']:.2f} s)")
        else:
            out.append(f"D={r.delay_s:g} s, {r.path}: BROKEN, {s['over_promise']} of "
                       f"{s['pushes']} answers after {PROMISE_S} s, "
                       f"{s['over_exporter_timeout']} after the exporters' "
                       f"{EXPORTER_TIMEOUT_S:g} s (worst {s['worst_s']:.2f} s)"
                       + (f", {(r.statuses == 0).sum()} unanswered" if (r.statuses == 0).any()
                          else ""))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delays", type=float, nargs="+", default=[0.5, 1.5, 3.0, 6.0],
                    help="seconds the fake collector takes to answer, one case each")
    ap.add_argument("--pushers", type=int, default=8, help="pushing processes (ranks of a host)")
    ap.add_argument("--rounds", type=int, default=5, help="pushes per pusher per path")
    ap.add_argument("--stagger", type=float, default=0.25,
                    help="seconds between the pushers' send slots within a round")
    ap.add_argument("--rows", type=int, default=10, help="step rows per push")
    ap.add_argument("--refuse-merged", action="store_true",
                    help="the fake collector answers 422 to batches of several ranks (the "
                         "relay then forwards their pushes one by one)")
    ap.add_argument("--busy", type=int, default=0, help="busy loops to run beside (0: quiet)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the arrival times")
    ap.add_argument("--json", default=None, metavar="PATH|-", help="also write the numbers")
    ap.add_argument("--tmp", default=None, help="folder for the relays' logs")
    args = ap.parse_args()
    w = Workload(rows=args.pushers * args.rounds * args.rows, ranks=1, steps=args.rows,
                 clients=args.pushers, connections=1, wire="arrow")
    bodies = [bodies_for(w, i, args.rounds) for i in range(args.pushers)]
    rng = np.random.default_rng(args.seed)
    offsets = (np.arange(args.pushers) * args.stagger
               + rng.uniform(0, args.stagger, (args.rounds, args.pushers)))
    condition = f"beside {args.busy} busy loops" if args.busy else "quiet"
    if args.refuse_merged:
        condition += ", merged batches refused"
    print(f"relay_slow: {args.pushers} pushers x {args.rounds} rounds, {condition}", flush=True)
    busy = BusyLoops(args.busy) if args.busy else None
    results: list[PathResult] = []
    try:
        with workdir(False, args.tmp) as tmp:
            for d in args.delays:
                results += run_delay(d, bodies, offsets, tmp, args.refuse_merged)
    finally:
        if busy is not None:
            busy.stop()
    rows, notes = table_rows(results), verdicts(results)
    print()
    print(table(rows, HEADERS))
    print()
    for line in notes:
        print(line)
    if args.json:
        doc = {"workload": vars(args), "promise_s": PROMISE_S,
               "results": [r.stats() for r in results]}
        text = json.dumps(doc, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    print(f"machine: {os.cpu_count()} cores; every process shares them")
    print()
    print("----- markdown for docs/benchmarks.md -----")
    busy_text = f" beside {args.busy} x `python -c '{BUSY_LOOP}'`" if args.busy else ", quiet"
    print(markdown_section(
        f"Relay under a slow collector ({condition})",
        f"{args.pushers} pushers, one push of {args.rows} rows each per round, staggered "
        f"over {args.pushers * args.stagger:g} s, {args.rounds} rounds, against a fake "
        f"collector answering after D{' (422 to a merged batch)' if args.refuse_merged else ''}"
        "; straight to it, then through `goodlens relay` "
        f"(`--timeout 2s`){busy_text}. Answer time: request sent to answer read.",
        table(rows, HEADERS, markdown=True), notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
