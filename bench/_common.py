"""Shared parts of the benchmarks: the collector as a subprocess, wire batches, parallel pushers.

Not part of the package: the scripts next to this file import it (``sys.path[0]`` is
``bench/`` when a script runs). Processes, ports and HTTP come from the tests' harness
(``tests/harness.py``), so a benchmark runs goodlens exactly as the tests do.
"""

from __future__ import annotations

import contextlib
import http.client as httpclient
import multiprocessing as mp
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import harness  # noqa: E402 (the tests' harness: one way to run goodlens)
from tests.harness import GOODLENS, free_port, http  # noqa: E402, F401

RUN_ID = "bench-run"
T0 = 1_750_000_000.0  # epoch seconds of step 0

# ----------------------------------------------------------------------------- formatting


def machine() -> str:
    """One line describing where the numbers come from."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 2**20:.0f} GiB RAM"
    import duckdb
    return (f"{cpu}, {os.cpu_count()} cores{mem}; Python {platform.python_version()}, "
            f"DuckDB {duckdb.__version__}")


def table(rows: list[list[Any]], headers: list[str], markdown: bool = False) -> str:
    """A plain-text (or markdown) table; the first column is left-aligned, the rest right."""
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def fmt(r: list[str]) -> str:
        parts = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        return ("| " + " | ".join(parts) + " |") if markdown else "  ".join(parts)

    if markdown:
        rule = "|" + "|".join("-" * (w + 1) + (":" if i else "-")
                              for i, w in enumerate(widths)) + "|"
    else:
        rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(cells[0]), rule, *(fmt(r) for r in cells[1:])])


def command_line() -> str:
    """How this script was invoked, relative to the repository root."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    return " ".join([".venv/bin/python", script, *sys.argv[1:]])


def markdown_section(title: str, intro: str, md_table: str, notes: list[str]) -> str:
    """The block to paste into docs/benchmarks.md."""
    lines = [f"### {title}", "", intro, "", f"Command: `{command_line()}`  ",
             f"Machine: {machine()}", "", md_table, ""]
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines)


def si(x: float, digits: int = 2) -> str:
    """1234567 -> '1.23 M'."""
    for div, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(x) >= div:
            return f"{x / div:.{digits}f}{suffix}"
    return f"{x:.{digits}f}"


# ----------------------------------------------------------------------------- the collector


def http_json(port: int, method: str, path: str, body: bytes | None = None,
              timeout: float = 60.0) -> tuple[int, Any]:
    """One request to a loopback port; (status, decoded JSON body or text)."""
    return http(method, f"http://127.0.0.1:{port}{path}", body, timeout=timeout)


def Collector(folder: Path, extra_args: list[str] | tuple[str, ...] = (),
              db: str | None = None) -> harness.Collector:
    """The tests' collector process (``tests/harness.py``) on ``folder/collector.duckdb``
    (or ``db``, e.g. ``parquet:DIR``), logging to ``folder/collector.log``."""
    return harness.Collector(db or folder / "collector.duckdb", *extra_args,
                             log=folder / "collector.log")


@contextlib.contextmanager
def workdir(keep: bool = False, base: str | None = None):
    """A temporary folder for databases and logs, removed afterwards unless ``keep``."""
    path = Path(tempfile.mkdtemp(prefix="goodlens-bench-", dir=base))
    try:
        yield path
    finally:
        if keep:
            print(f"(kept {path})", file=sys.stderr)
        else:
            shutil.rmtree(path, ignore_errors=True)


def stored_rows(db: Path) -> dict[str, int]:
    """Row counts in a store file no process holds (opened read-only)."""
    import duckdb
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
               for t in ("steps", "step_summaries")}
        out["distinct_keys"] = con.execute(
            "SELECT count(*) FROM (SELECT DISTINCT run_id, attempt, rank, step FROM steps)"
        ).fetchone()[0]
        return out
    finally:
        con.close()


# ----------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    """``batches`` batches of ``ranks`` x ``steps`` step rows, split over ``clients`` pushers.

    Client ``c`` owns ranks ``[c*ranks, (c+1)*ranks)`` (like one aggregator per slice of the
    job) and walks steps upwards, ``steps`` per batch, so every key is distinct and every
    batch arrives above its high-water marks (the store's insert fast path).
    """

    rows: int
    ranks: int = 1000
    steps: int = 10
    clients: int = 2
    connections: int = 1
    """Concurrent connections (threads) per client process, like many exporters at once."""
    wire: str = "json"
    """Wire format of the pushes: ``json`` or ``arrow`` (Arrow IPC)."""

    @property
    def batch_rows(self) -> int:
        return self.ranks * self.steps

    @property
    def batches(self) -> int:
        return max(1, round(self.rows / self.batch_rows))

    @property
    def total_rows(self) -> int:
        return self.batches * self.batch_rows

    @property
    def pushers(self) -> int:
        """Independent senders (client processes x connections), each owning its ranks."""
        return self.clients * self.connections

    def client_batches(self, pusher: int) -> list[int]:
        """Batch numbers (0, 1, 2, ...) of one pusher (a connection of a client process)."""
        n = self.batches // self.pushers + (1 if pusher < self.batches % self.pushers else 0)
        return list(range(n))

    def describe(self) -> str:
        return (f"{self.total_rows:,} step rows in {self.batches:,} batches of "
                f"{self.batch_rows:,} ({self.ranks:,} ranks x {self.steps} steps, all 9 "
                f"columns), {self.clients} client process(es) x {self.connections} "
                f"connection(s)")


def batch_columns(w: Workload, client: int, k: int) -> dict[str, Any]:
    """Columns of client ``client``'s ``k``-th batch as numpy arrays / lists (row = step-major).

    Values are deterministic in (client, k); durations have realistic full-precision noise.
    """
    rank = np.tile(np.arange(w.ranks, dtype=np.int64) + client * w.ranks, w.steps)
    step = np.repeat(np.arange(w.steps, dtype=np.int64) + k * w.steps, w.ranks)
    rng = np.random.default_rng(client * 1_000_003 + k)
    n = w.batch_rows
    duration = 1.0 + rng.gamma(2.0, 0.01, n)
    coll = duration * rng.uniform(0.05, 0.2, n)
    data = rng.exponential(0.002, n)
    compute = np.maximum(duration - coll - data, 0.0)
    start = T0 + step * 1.05 + rng.normal(0.0, 0.0005, n)
    return {"attempt": np.zeros(n, dtype=np.int64), "rank": rank,
            "host": [f"node-{r // 8:05d}" for r in rank.tolist()], "step": step,
            "start_time": start, "duration_s": duration, "compute_s": compute,
            "collective_wait_s": coll, "data_wait_s": data}


def workload_arguments(ap: Any, rows: int) -> None:
    """The workload and temp-folder options shared by the ingest benchmarks."""
    ap.add_argument("--rows", type=int, default=rows, help="step rows to push in total")
    ap.add_argument("--clients", type=int, default=2, help="pushing processes")
    ap.add_argument("--connections", type=int, default=8,
                    help="concurrent connections per process (each its own exporter)")
    ap.add_argument("--ranks", type=int, default=1000, help="ranks per batch")
    ap.add_argument("--steps", type=int, default=10, help="steps per rank per batch")
    ap.add_argument("--tmp", default=None, help="folder for the temporary databases")
    ap.add_argument("--keep", action="store_true", help="keep the databases and server log")


def workload_from(ap: Any, args: Any) -> Workload:
    """The Workload the parsed options describe (refusing one with fewer batches than
    clients)."""
    w = Workload(rows=args.rows, ranks=args.ranks, steps=args.steps, clients=args.clients,
                 connections=args.connections)
    if w.batches < w.clients:
        ap.error("fewer batches than clients: raise --rows or lower --clients")
    return w


def encode_wire(cols: dict[str, Any], run_id: str = RUN_ID, wire: str = "json") -> bytes:
    """A wire batch (JSON, or Arrow IPC) with every column as a list."""
    doc = {"schema_version": 1, "run_id": run_id, "steps": cols,
           "exporter": {"source": "bench", "dropped_rows": 0}}
    if wire == "arrow":
        from goodlens.model.wire import encode_arrow_batch
        doc["steps"] = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in cols.items()}
        return encode_arrow_batch(doc)
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


CONTENT_TYPES = {"json": "application/json", "arrow": "application/vnd.apache.arrow.stream"}


def arrow_table(cols: dict[str, Any], run_id: str = RUN_ID):
    """The same rows as an Arrow table with the store's ``steps`` columns (for baselines)."""
    import pyarrow as pa
    n = len(cols["step"])
    arrays = {"run_id": pa.array([run_id]).take(pa.array(np.zeros(n, dtype=np.int64)))}
    for name, values in cols.items():
        arrays[name] = pa.array(values)
    arrays["tokens"] = pa.nulls(n, pa.int64())
    arrays["samples"] = pa.nulls(n, pa.int64())
    return pa.table(arrays)


STEPS_DDL = """CREATE TABLE t (run_id VARCHAR, attempt BIGINT, rank BIGINT, host VARCHAR,
  step BIGINT, start_time DOUBLE, duration_s DOUBLE, compute_s DOUBLE,
  collective_wait_s DOUBLE, data_wait_s DOUBLE, tokens BIGINT, samples BIGINT)"""


# ----------------------------------------------------------------------------- pushing


@dataclass
class PushResult:
    """What the clients saw: wall time first push to last 200, per-push latencies."""

    rows: int
    batches: int
    body_bytes: int
    wall_s: float
    latencies_s: np.ndarray
    retries_503: int
    inserted: int
    duplicate: int
    prepare_s: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.wall_s

    def latency_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1e3)


def push_connection(port: int) -> httpclient.HTTPConnection:
    """A persistent loopback connection to a collector (or relay), Nagle off."""
    conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def post_ingest(conn: httpclient.HTTPConnection, body: bytes,
                headers: dict[str, str]) -> tuple[float, int, bytes]:
    """One push, retried after a tenth of ``Retry-After`` on 429/503 (the queue is full):
    (seconds the accepted try took, retries, the answer's body)."""
    retries = 0
    while True:
        t = time.perf_counter()
        conn.request("POST", "/v1/ingest", body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        dt = time.perf_counter() - t
        if resp.status in (429, 503):
            retries += 1
            time.sleep(float(resp.getheader("Retry-After", "1")) / 10)
            continue
        if resp.status != 200:
            raise RuntimeError(f"push answered {resp.status}: {data[:300]!r}")
        return dt, retries, data


def _send_all(port: int, bodies: list[bytes], sink: list, wire: str = "json") -> None:
    """Push ``bodies`` in order over one persistent connection; results appended to sink."""
    conn = push_connection(port)
    headers = {"Content-Type": CONTENT_TYPES[wire]}
    lat, retries, inserted, dup, nbytes = [], 0, 0, 0, 0
    for body in bodies:
        dt, tries, data = post_ingest(conn, body, headers)
        retries += tries
        r = orjson.loads(data)
        inserted += r["steps_inserted"]
        dup += r["steps_duplicate"]
        nbytes += len(body)
        lat.append(dt)
    conn.close()
    sink.append((lat, retries, inserted, dup, nbytes))


def _client(w: Workload, client: int, port: int, ready: Any, go: Any, out: Any) -> None:
    import threading
    try:
        t = time.perf_counter()
        # connection i of this client is pusher p: it owns ranks [p*ranks, (p+1)*ranks) and
        # sends its batches in step order, like one exporter (or one host aggregator)
        pushers = [client * w.connections + i for i in range(w.connections)]
        bodies = {p: [encode_wire(batch_columns(w, p, k), wire=w.wire)
                      for k in w.client_batches(p)] for p in pushers}
        prep = time.perf_counter() - t
        sink: list = []
        errors: list = []

        def run(i: int) -> None:
            try:
                _send_all(port, bodies[pushers[i]], sink, w.wire)
            except BaseException as exc:
                errors.append(exc)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(w.connections)]
        ready.wait()
        go.wait()
        first = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        last = time.perf_counter()
        if errors:
            raise errors[0]
        lat = [x for r in sink for x in r[0]]
        out.put((client, None, first, last, lat, sum(r[1] for r in sink),
                 sum(r[2] for r in sink), sum(r[3] for r in sink), sum(r[4] for r in sink),
                 prep, sum(len(b) for b in bodies.values())))
    except BaseException as exc:  # report, never hang the parent
        import traceback
        out.put((client, f"{exc!r}\n{traceback.format_exc()}", 0, 0, [], 0, 0, 0, 0, 0, 0))
        with contextlib.suppress(Exception):
            ready.abort()


def push(w: Workload, port: int | list[int], before_go: Any = None) -> PushResult:
    """Encode every batch in ``w.clients`` processes, then push them all at once (client
    ``c`` to ``port[c % len(port)]`` when given several collectors' ports).

    Each process pre-encodes its batches and opens one persistent connection before the
    clock starts; ``before_go()`` (if given) runs once all are ready, just before the start.
    Wall time runs from the first push sent to the last 200 received (monotonic clock,
    shared by the processes); every 200 means the batch was committed.
    """
    ctx = mp.get_context("fork")
    ready = ctx.Barrier(w.clients + 1)
    go = ctx.Event()
    out = ctx.Queue()
    ports = port if isinstance(port, list) else [port]
    procs = [ctx.Process(target=_client, args=(w, c, ports[c % len(ports)], ready, go, out),
                         daemon=True) for c in range(w.clients)]
    t = time.perf_counter()
    for p in procs:
        p.start()
    try:
        ready.wait(timeout=1800)
    except Exception:
        pass  # a client failed while preparing; its report follows
    prepare = time.perf_counter() - t
    if before_go is not None:
        before_go()
    go.set()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    errors = [r[1] for r in results if r[1]]
    if errors:
        raise RuntimeError("client failed:\n" + errors[0])
    lat = np.concatenate([np.asarray(r[4]) for r in results])
    return PushResult(
        rows=sum(r[10] for r in results) * w.batch_rows, batches=sum(r[10] for r in results),
        body_bytes=sum(r[8] for r in results),
        wall_s=max(r[3] for r in results) - min(r[2] for r in results), latencies_s=lat,
        retries_503=sum(r[5] for r in results), inserted=sum(r[6] for r in results),
        duplicate=sum(r[7] for r in results), prepare_s=prepare)


# ----------------------------------------------------------------------------- baseline


def arrow_insert_baseline(w: Workload, path: Path, prebuild: bool = True) -> dict[str, float]:
    """The same rows as pre-built Arrow tables into a fresh DuckDB file, one commit per batch.

    With ``prebuild`` every table is built before the clock starts (the insert alone is
    timed); without it each batch is built, inserted and dropped (bounded memory).
    """
    import duckdb
    jobs = [(p, k) for p in range(w.pushers) for k in w.client_batches(p)]
    con = duckdb.connect(str(path))
    con.execute(STEPS_DDL)
    tables = [arrow_table(batch_columns(w, c, k)) for c, k in jobs] if prebuild else None
    t = time.perf_counter()
    for i, (c, k) in enumerate(jobs):
        tbl = tables[i] if tables is not None else arrow_table(batch_columns(w, c, k))
        con.register("arrow_table", tbl)
        con.execute("BEGIN TRANSACTION")
        con.execute("INSERT INTO t SELECT * FROM arrow_table")
        con.execute("COMMIT")
        con.unregister("arrow_table")
    wall = time.perf_counter() - t
    rows = con.execute("SELECT count(*) FROM t").fetchone()[0]
    con.close()
    return {"rows": rows, "wall_s": wall, "rows_per_s": rows / wall,
            "file_bytes": path.stat().st_size}


# ----------------------------------------------------------------------------- memory


def rss_bytes(pid: int) -> int:
    """Resident set size of one process (children not included)."""
    import psutil
    return psutil.Process(pid).memory_info().rss


class RssSampler:
    """Samples a process's RSS every ``interval`` seconds in a thread; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        import threading
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while True:
            with contextlib.suppress(Exception):
                self.samples.append((time.monotonic() - t0, rss_bytes(self.pid)))
            if self._stop.wait(self.interval):
                return

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (a no-op when never started or already stopped)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()

    @property
    def peak(self) -> int:
        return max((r for _, r in self.samples), default=0)


class CpuMeter:
    """CPU seconds a process (and the whole machine) spent between ``start`` and ``stop``."""

    def __init__(self, pid: int) -> None:
        import psutil
        self._proc = psutil.Process(pid)
        self._psutil = psutil

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._p0 = self._proc.cpu_times()
        self._m0 = self._psutil.cpu_times()

    def stop(self) -> dict[str, float]:
        p1, m1 = self._proc.cpu_times(), self._psutil.cpu_times()
        wall = time.perf_counter() - self._t0
        proc = (p1.user - self._p0.user) + (p1.system - self._p0.system)
        busy = (m1.user - self._m0.user) + (m1.system - self._m0.system)
        return {"wall_s": wall, "proc_cores": proc / wall, "machine_cores": busy / wall}


def peak_rss_bytes(pid: int) -> int | None:
    """The kernel's high-water mark of the process's RSS (VmHWM), if readable."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def _baseline_child(w: Workload, path: str, out: Any) -> None:
    try:
        res = arrow_insert_baseline(w, Path(path), prebuild=False)
        res["rss_after"] = rss_bytes(os.getpid())
        res["rss_peak"] = peak_rss_bytes(os.getpid()) or 0
        out.put(res)
    except BaseException as exc:
        out.put({"error": repr(exc)})


def arrow_insert_baseline_process(w: Workload, path: Path) -> dict[str, float]:
    """:func:`arrow_insert_baseline` (tables built per batch) in a fresh interpreter, with
    that process's peak and final RSS, so its memory can be compared with the collector's."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_baseline_child, args=(w, str(path), out))
    proc.start()
    res = out.get()
    proc.join()
    if "error" in res:
        raise RuntimeError(f"baseline process failed: {res['error']}")
    return res


def checkpointed_bytes(db: Path) -> int:
    """Size of a store file after folding its write-ahead log in (``CHECKPOINT``)."""
    import duckdb
    con = duckdb.connect(str(db))
    try:
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return db.stat().st_size
