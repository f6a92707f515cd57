"""The one harness of the tests and the benchmarks: real goodlens processes on free loopback
ports (and the collector's app in this process, :class:`AppCollector`), HTTP without extra
dependencies, wire batches, waiting without sleeps, a real Prometheus. No pytest here
(``bench/`` imports it too); fixtures are in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOODLENS = [sys.executable, "-m", "goodlens"]
"""How every test and benchmark starts the CLI: the installed package, as ``goodlens``."""
#: On a torchrun job's ``PYTHONPATH`` (:func:`job_env`): its processes exit without a last
#: garbage collection (``tests/e2e/job_site/sitecustomize.py`` says why).
JOB_SITE = ROOT / "tests" / "e2e" / "job_site"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None,
         timeout: float = 30) -> tuple[int, dict | str]:
    """(status, parsed JSON or text) of one request; never raises on HTTP errors."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    if body is not None and "Content-Type" not in (headers or {}):
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


class ServerProcess:
    """A real goodlens server process on a free loopback port: started and waited for
    until it answers its health check, killed (a crash) or stopped (SIGTERM)."""

    what = "server"
    log: Path
    proc: subprocess.Popen | None = None
    cwd: Path = ROOT
    env: dict[str, str] | None = None
    """The child's environment (None: this process's)."""

    def command(self) -> list[str]:
        raise NotImplementedError

    def healthy(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 120.0) -> Any:
        """Start the process and wait until it answers. ``timeout`` is a deadline, not a
        claim: pinned to one core beside 16 exporter processes, a collector restarting on
        its store took over 30 s to answer."""
        log = open(self.log, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(self.command(), cwd=self.cwd, env=self.env,
                                     stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.what} exited: {self.log.read_text()}")
            try:
                if self.healthy():
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.what} did not start")

    def kill(self) -> None:
        """SIGKILL: no flush, no cleanup (a crash)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait: the graceful path (the exit code; killed after ``timeout``)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return None if self.proc is None else self.proc.returncode


class Collector(ServerProcess):
    """A real `goodlens serve` process on a free loopback port (``log``: its output file,
    by default beside the store)."""

    what = "collector"

    def __init__(self, db: Path | str, *extra: str, log: Path | None = None) -> None:
        self.db = db  # a DuckDB file, or "parquet:DIR"
        self.extra = extra
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        where = Path(str(db).removeprefix("parquet:"))
        self.log = log or where.with_name(f"{where.stem}-{self.port}.log")

    def command(self) -> list[str]:
        return [*GOODLENS, "serve", "--db", str(self.db), "--port", str(self.port),
                "--log-level", "warning", *self.extra]

    def healthy(self) -> bool:
        return http("GET", self.url + "/healthz", timeout=1)[0] == 200

    def start(self, timeout: float = 120.0) -> Collector:
        return super().start(timeout)

    def http(self, method: str, path: str, body: bytes | None = None,
             headers: dict | None = None, timeout: float = 30) -> tuple[int, dict | str]:
        """:func:`http` of ``self.url + path`` (as :meth:`AppCollector.http`)."""
        return http(method, self.url + path, body, headers, timeout)

    def sync(self, timeout: float = 600.0, detect: bool = False) -> float:
        """POST /v1/sync (everything queued is committed and summarised; with ``detect``,
        then a detection pass over it, its findings stored); seconds taken."""
        t = time.perf_counter()
        status, body = http("POST", self.url + "/v1/sync" + ("?detect=1" if detect else ""),
                            b"", timeout=timeout)
        if status != 200:
            raise RuntimeError(f"/v1/sync answered {status}: {body!r:.300}")
        return time.perf_counter() - t

    def db_bytes(self) -> int:
        """Size of the DuckDB file plus its write-ahead log, if any."""
        total = 0
        db = Path(str(self.db))
        for p in (db, db.with_name(db.name + ".wal")):
            with contextlib.suppress(FileNotFoundError):
                total += p.stat().st_size
        return total


class AppCollector:
    """The collector of ``goodlens serve`` in this process, without a port: the store, report
    keeper, writer, detection service and ASGI app that
    :func:`goodlens.collector.server.serve` builds from a
    :class:`~goodlens.collector.server.ServerConfig` (``config``: its fields, e.g.
    ``token``, ``max_body_bytes``, ``detect``), driven through Starlette's ``TestClient``.
    For what the app answers; what needs a socket or a process (the CLI's ``--url``, an
    exporter's transport, signals, slow connections) stays with :class:`Collector`."""

    url = "http://127.0.0.1"
    """The client's base URL: a loopback Host, which a token-less collector answers."""

    def __init__(self, db: Path | str, *, detection_thread: bool = True, **config: Any) -> None:
        """``detection_thread``: False leaves the detection service's passes to the caller
        (``self.detection.poll_once(now=...)``), as a replay on a recorded clock does."""
        from starlette.testclient import TestClient

        from goodlens.collector.reports import KeeperConfig, ReportKeeper
        from goodlens.collector.server import ServerConfig, create_app
        from goodlens.storage.parquet import open_store
        from goodlens.storage.writer import Writer

        self.db = db
        self.config = cfg = ServerConfig(db=str(db), **config)
        self.store = open_store(cfg.db, memory_limit=cfg.memory_limit, init=cfg.init)
        keeper = ReportKeeper(self.store, KeeperConfig(retention_s=cfg.metrics_retention_s,
                                                       hang_floor_s=cfg.hang_floor_s))
        self.writer = Writer(self.store, max_queue_rows=cfg.max_queue_rows,
                             summarize_interval_s=cfg.summarize_interval_s,
                             after_pass=keeper.after_pass).start()
        self.detection = None
        if cfg.detect:
            from goodlens.collector.detection import DetectionService
            from goodlens.detectors.hangs import HangConfig
            self.detection = DetectionService(
                self.store, self.writer, config=cfg.straggler, webhook=cfg.webhook,
                hang_config=HangConfig(min_timeout_s=cfg.hang_floor_s))
            if detection_thread:
                self.detection.start()
        self.app = app = create_app(self.store, self.writer, cfg, self.detection, None, keeper)
        self.client = TestClient(app, base_url=self.url)
        self.client.__enter__()  # one event loop for every request, as a server has

    def http(self, method: str, path: str, body: bytes | None = None,
             headers: dict | None = None) -> tuple[int, dict | str]:
        """What :func:`http` returns for ``url + path``: (status, parsed JSON or text)."""
        headers = dict(headers or {})
        if body is not None and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
        r = self.client.request(method, path, content=body, headers=headers)
        try:
            return r.status_code, json.loads(r.content)
        except ValueError:
            return r.status_code, r.content.decode("utf-8", "replace")

    def sync(self, timeout: float = 600.0, detect: bool = False) -> float:
        """POST /v1/sync, as :meth:`Collector.sync` (``timeout``: unused, the call runs in
        this process); seconds taken."""
        t = time.perf_counter()
        status, body = self.http("POST", "/v1/sync" + ("?detect=1" if detect else ""), b"")
        if status != 200:
            raise RuntimeError(f"/v1/sync answered {status}: {body!r:.300}")
        return time.perf_counter() - t

    def stop(self) -> None:
        """What ``serve`` does on SIGTERM once the server stopped: the detection service
        stops, the writer drains its queue and summarises, the store is closed."""
        self.client.__exit__(None, None, None)
        self.app.close()
        try:
            if self.detection is not None:
                self.detection.stop()
            self.writer.stop()
        finally:
            self.store.close()


class Relay(ServerProcess):
    """A real `goodlens relay` process on a free loopback port."""

    what = "relay"

    def __init__(self, tmp_path: Path, upstream: str, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"relay-{self.port}.log"
        self.args = ["relay", "--upstream", upstream, "--port", str(self.port), *extra]

    def command(self) -> list[str]:
        return [*GOODLENS, *self.args]

    def healthy(self) -> bool:
        status, body = http("GET", self.url + "/healthz", timeout=0.5)
        return status == 200 and isinstance(body, dict) and body.get("relay") is True

    def start(self, timeout: float = 120.0) -> Relay:
        return super().start(timeout)

    def health(self) -> dict:
        status, body = http("GET", self.url + "/healthz")
        assert status == 200
        return body


def step_batch(run_id: str, rank: int, steps: list[int], attempt: int = 0, **extra) -> dict:
    """A valid wire batch for one rank."""
    n = len(steps)
    doc = {"schema_version": 1, "run_id": run_id,
           "steps": {"attempt": attempt, "rank": rank, "host": f"node-{rank // 8}",
                     "step": steps, "start_time": [1000.0 + s for s in steps],
                     "duration_s": [1.0] * n, "compute_s": [0.6 + 0.01 * rank] * n,
                     "collective_wait_s": [0.38 - 0.01 * rank] * n, "data_wait_s": [0.02] * n}}
    doc.update(extra)
    return doc


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process, everything it started and its process group. torchrun's workers
    run in sessions of their own: killing torchrun's group alone left them (a hung rank and
    its peers waiting in a collective) running after the test."""
    import psutil
    if proc.poll() is None:
        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        for p in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        psutil.wait_procs(family, timeout=10)


class WaitSink:
    """Stands in for the exporter in the collective-timing tests: keeps ``add_wait``
    calls (the waits a timer reports), ignores events."""

    enabled = True

    def __init__(self) -> None:
        self.waits: list[float] = []

    def add_wait(self, kind: str, seconds: float) -> None:
        assert kind == "collective"
        self.waits.append(seconds)

    def event(self, kind: str, **fields: Any) -> None:
        pass


def push_steps(c: Collector, run: str, steps: list[int], attempt: int = 0,
               ranks: int = 4) -> None:
    """Push ``steps`` of ``ranks`` ranks to collector ``c`` (JSON) and wait until stored."""
    for rank in range(ranks):
        body = json.dumps(step_batch(run, rank, steps, attempt=attempt)).encode()
        assert http("POST", c.url + "/v1/ingest", body)[0] == 200
    c.sync()


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a torchrun job a test starts: this process's, with ``extra``, and
    :data:`JOB_SITE` first on the ``PYTHONPATH``."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(JOB_SITE), env.get("PYTHONPATH"))
                                        if p)
    return env


def wait_until(pred: Callable[[], Any], timeout: float = 30.0) -> bool:
    """Poll ``pred`` until it is true (True) or ``timeout`` seconds pass (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.3)
    return False


#: Sets a text box's whole content in one ``input`` event, as a paste does (React reads the
#: value through the native setter, not the one it wraps).
_SET_TEXT = """
const box = arguments[0];
Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, "value").set.call(box, arguments[1]);
box.dispatchEvent(new Event("input", {bubbles: true}));
"""


def enter_text(br: Any, box: Any, text: str) -> None:
    """Replace the content of the dashboard text box ``box`` (a WebElement of dash's
    browser ``br``) with ``text`` in one input event, as a paste does, then press Enter.

    Why not key by key: Dash 4.4's ``dcc.Input(debounce=True)`` puts the caret back, from a
    ``setTimeout(0)`` set at each keystroke, where that keystroke left it; on a loaded
    machine such a timer can fire after later keys, which then go in at the old place. One
    input event leaves one such timer, and it puts the caret at the end."""
    br.driver.execute_script(_SET_TEXT, box, text)
    assert box.get_attribute("value") == text, (box.get_attribute("value"), text)
    box.send_keys("\n")


H = 3600.0
#: A small simulator configuration that exercises everything at once (frequent failures,
#: planned interruptions, tiers, stragglers, spares, evictions, wide failures).
STRESS = dict(nodes=6, gpus_per_node=1, duration_s=6 * H, step_s=3.0, node_mtbf_s=6 * 0.4 * H,
              planned_per_day=6, interval_s=240, write_s=50, snapshot_s=3, restore_s=60,
              queue_s=200, init_s=90, warmup_s=40, detect_crash_s=20, detect_hang_s=300,
              straggler_per_node_day=6, straggler_duration_median_s=900, memory_interval_s=60,
              memory_stall_s=2, memory_restore_s=8, nodes_per_switch=3, spares=2,
              evict_delay_steps=10, wide_failure_fraction=0.4, repair_s=H, shrink_max_nodes=2,
              compute_noise_sigma=0.05)


class Prometheus:
    """A real Prometheus (Debian's package) scraping one target every second, on loopback."""

    def __init__(self, tmp_path: Path, target_port: int) -> None:
        import shutil
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed; `make test` installs Debian's "
                               "package")
        self.port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: goodlens
    static_configs:
      - targets: ['127.0.0.1:{target_port}']
""")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query_until(self, promql: str, accept, timeout: float = 45) -> list:
        """Poll the HTTP API until ``accept(result)`` holds; the result ([] if never)."""
        import urllib.parse
        q = urllib.parse.quote(promql)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status, body = http("GET", f"http://127.0.0.1:{self.port}/api/v1/query?query={q}",
                                    timeout=2)
            except OSError:
                status, body = 0, None
            if status == 200 and body["data"]["result"] and accept(body["data"]["result"]):
                return body["data"]["result"]
            time.sleep(0.5)
        return []

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
