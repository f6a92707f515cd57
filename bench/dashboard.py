"""Dashboard speed: time to a fully rendered overview in headless Chromium, and server time
per callback, for the largest sample trace and for a 16,384-rank run.

Two stores are served by a real collector process (``goodlens serve --no-detect``): the
bundled samples, and a synthetic 16,384-rank run (``--steps`` steps, rank 7 5% slow, built
like ``bench/accounting.py``'s). A real browser loads each run's overview and we time the
page from navigation until its three graphs have drawn (cold: nothing cached; warm: a
reload). Server time per callback is measured in process: what each page's callback does
(read through the store, build figures, serialise the response), cold and warm cache; for
the ranks page at 16,384 ranks, also where its cold time goes (each store read, the layout
and figures, the serialisation). The baseline row is the naive heatmap: read the attempt's
raw rank-step rows into pandas and pool them there, against the store's pooled SQL grid.

    python bench/dashboard.py [--ranks 16384] [--steps 2000]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import GOODLENS, ROOT, machine, table

sys.path.insert(0, str(ROOT))
from bench.accounting import build
from goodlens.collector.replay import import_trace
from goodlens.dashboard import pages, views
from goodlens.dashboard.data import DashConfig, RunData
from goodlens.storage.store import Store

SAMPLES = ["demo", "sim-64", "sim-16"]
OVERVIEW_READY = ["#breakdown-graph .main-svg", "#series-graph .main-svg",
                  "#timeline-graph .main-svg", "#headline-goodput"]


def _serialise(component: object) -> int:
    import plotly.io.json as pj
    return len(pj.to_json_plotly(component))


def callback_times(store: Store, run_id: str, repeats: int = 3) -> list[list[str]]:
    """Per page: cold (empty cache) and warm server time of its callback, in ms."""
    rows = []
    body = {
        "runs": lambda d: pages.runs_body(d.runs(limit=50)[0]),
        "overview": lambda d: pages.overview_body(d.overview(run_id)),
        "ranks": lambda d: pages.ranks_body(d.ranks(run_id)),
        "ranks, last 1 h window": lambda d: pages.ranks_body(d.ranks(run_id, since="-1h")),
        "overview, last 1 h window": lambda d: pages.overview_body(
            d.overview(run_id, (), "-1h", "")),
        "checkpoints (with costs at a price)": lambda d: pages.checkpoints_body(
            d.checkpoints(run_id, price=2.5)),
        "compare (the run and its attempt 0)": lambda d: views.compare_body(
            d.compare([run_id, f"{run_id}@0"])),
        "whatif": lambda d: pages.whatif_body(
            d.whatif(run_id, {"interval_s": d.whatif_calibration(run_id).config.interval_s / 2}),
            d.whatif_calibration(run_id)),
    }
    for page, fn in body.items():
        cold = []
        for _ in range(repeats):
            data = RunData(store, DashConfig())
            # the straggler scan a run no live detector saw gets (timed on its own below)
            data.findings(run_id, wait=True)
            t = time.perf_counter()
            size = _serialise(fn(data))
            cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(repeats):
            _serialise(fn(data))
        warm = (time.perf_counter() - t) / repeats
        c = min(cold)
        rows.append([page, f"{c * 1000:.0f}", f"{warm * 1000:.0f}", f"{size / 1e3:.0f}",
                     "PASS" if c <= 0.3 else "over"])
    whole = RunData(store, DashConfig())
    whole.findings(run_id, wait=True)
    t = time.perf_counter()
    size = _serialise(pages.ranks_body(whole.ranks(run_id, whole=True)))
    rows.append(["ranks, whole attempt", f"{(time.perf_counter() - t) * 1000:.0f}", "-",
                 f"{size / 1e3:.0f}", "(on demand)"])
    info = store.run(run_id)
    n = int(info["steps"]) * int(info["world_size"])
    if n <= DashConfig().detect_max_rows:
        t = time.perf_counter()
        RunData(store).findings(run_id, wait=True)
        rows.append(["batch straggler scan (no live detector)",
                     f"{(time.perf_counter() - t) * 1000:.0f}", "-", "-", "(background)"])
    return rows


def ranks_breakdown(store: Store, run_id: str, repeats: int = 5) -> list[list[str]]:
    """Where the ranks page's cold callback spends its time: each store read, the page's
    layout and figures, and the response's serialisation (ms, best of ``repeats``; each
    part's best on its own, so the parts need not add up to the best total)."""
    reads = ("run", "events", "attempts", "step_range", "heatmap", "host_compute")
    best: dict[str, float] = {}
    real = {name: getattr(store, name) for name in reads}
    spent: dict[str, float] = {}

    def timed(name: str) -> object:
        def call(*a: object, **k: object) -> object:
            t = time.perf_counter()
            try:
                return real[name](*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return call
    try:
        for name in reads:
            setattr(store, name, timed(name))
        for _ in range(repeats):
            data = RunData(store, DashConfig())
            data.findings(run_id, wait=True)
            spent.clear()
            t0 = time.perf_counter()
            rk = data.ranks(run_id)
            t1 = time.perf_counter()
            body = pages.ranks_body(rk)
            t2 = time.perf_counter()
            _serialise(body)
            t3 = time.perf_counter()
            for k, v in {**spent, "layout and figures": t2 - t1, "serialise": t3 - t2,
                         "data (all reads)": t1 - t0, "total": t3 - t0}.items():
                best[k] = min(best.get(k, v), v)
    finally:
        for name in reads:
            setattr(store, name, real[name])
    return [[k, f"{v * 1000:.1f}"] for k, v in best.items()]


def heatmap_baseline(store: Store, run_id: str, cfg: DashConfig) -> tuple[float, float]:
    """(ours, pandas) seconds to the pooled grid of the latest attempt's scan window."""
    rk = RunData(store, cfg).ranks(run_id)
    s0, s1, ranks = rk["window"]
    t = time.perf_counter()
    store.heatmap(run_id, rk["attempt"], s0, s1, min(cfg.rank_bins, ranks),
                  min(cfg.step_bins, s1 - s0 + 1))
    ours = time.perf_counter() - t
    t = time.perf_counter()
    raw = store.steps(run_id, attempt=rk["attempt"], step_min=s0, step_max=s1)
    raw["rbin"] = raw["rank"] * min(cfg.rank_bins, ranks) // ranks
    raw["sbin"] = (raw["step"] - s0) * min(cfg.step_bins, s1 - s0 + 1) // (s1 - s0 + 1)
    raw.groupby(["rbin", "sbin"]).compute_s.agg(["mean", "max"])
    pandas_s = time.perf_counter() - t
    return ours, pandas_s


def browser_times(url: str, run_ids: list[str]) -> list[list[str]]:
    """Navigation to drawn overview graphs, cold and warm, per run."""
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--disable-background-networking", "--disable-component-update",
              "--window-size=1400,1800"):
        opts.add_argument(a)
    driver = webdriver.Chrome(options=opts)
    rows = []
    try:
        for run in run_ids:
            times = []
            for _ in range(2):  # cold, then warm
                t = time.perf_counter()
                driver.get(f"{url}{pages.run_href(run)}")
                for sel in OVERVIEW_READY:
                    WebDriverWait(driver, 300).until(
                        ec.presence_of_element_located((By.CSS_SELECTOR, sel)))
                times.append(time.perf_counter() - t)
            rows.append([run, f"{times[0]:.2f}", f"{times[1]:.2f}"])
    finally:
        driver.quit()
    return rows


def serve(db: Path) -> tuple[subprocess.Popen, str]:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*GOODLENS, "serve", "--db", str(db), "--port", str(port),
                             "--no-detect", "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import urllib.request
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("collector did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=16_384)
    ap.add_argument("--steps", type=int, default=2_000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="goodlens-bench-dash-"))
    print(machine())
    try:
        samples = Store(tmp / "samples.duckdb")
        for s in SAMPLES:
            import_trace(samples, ROOT / "sample_data" / s)
        samples.summarize_dirty()
        sizes = {r["run_id"]: (int(r["steps"]), int(r["world_size"]))
                 for r in samples.runs().to_dict("records")}
        largest = max(sizes, key=lambda r: sizes[r][0] * sizes[r][1])
        print(f"largest sample: {largest} ({sizes[largest][1]} ranks x {sizes[largest][0]:,} "
              "steps)")
        rows_big = args.ranks * args.steps
        print(f"big run: {args.ranks:,} ranks x {args.steps:,} steps = {rows_big:,} rank-steps")
        big, t = build(tmp / "big.duckdb", args.ranks, args.steps)
        print(f"  built in {t['write_s'] + t['summarize_s']:.0f} s")

        print("\nServer time per callback (ms; target <= 300 ms cold)")
        for store, run in ((samples, largest), (big, "big")):
            print(f"\n{run}:")
            print(table(callback_times(store, run),
                        ["page callback", "cold ms", "warm ms", "response KB", "target"],
                        markdown=True))
        print("\nRanks page, cold: where the time goes (ms, best of 5 each)")
        print(table(ranks_breakdown(big, "big"), ["part", "ms"], markdown=True))
        print("\nHeatmap: pooled in DuckDB vs raw rows pooled in pandas")
        hrows = []
        for store, run in ((samples, largest), (big, "big")):
            ours, pd_s = heatmap_baseline(store, run, DashConfig())
            hrows.append([run, f"{ours * 1000:.0f}", f"{pd_s * 1000:.0f}",
                          f"{pd_s / ours:.1f}x"])
        print(table(hrows, ["run", "store.heatmap ms", "pandas ms", "speed-up"],
                    markdown=True))
        samples.close()
        big.close()

        print("\nBrowser: navigation to a fully drawn overview (s), headless Chromium")
        brows = []
        for db, runs in ((tmp / "samples.duckdb", [largest]), (tmp / "big.duckdb", ["big"])):
            proc, url = serve(db)
            try:
                brows += browser_times(url, runs)
            finally:
                proc.terminate()
                proc.wait(30)
        print(table(brows, ["run", "cold s", "warm s"], markdown=True))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
