"""Regenerate the dashboard screenshots in docs/img/ (``make screenshots``).

Starts a collector on the bundled sample data (a temporary store), opens each page in
headless Chromium, waits until its graphs have drawn and saves a PNG. The README and
docs/dashboard.md link these files, so they show what the code draws today.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img"
PAGES = {  # file: (path, selector that means "drawn", window height)
    "runs.png": ("/", "#runs-table", 700),
    "overview.png": ("/runs/sim-64", "#timeline-graph .main-svg", 1900),
    "ranks.png": ("/runs/sim-64/ranks", "#host-graph .main-svg", 1700),
    "checkpoints.png": ("/runs/sim-64/checkpoints?price=2.5", "#interval-graph .main-svg",
                        1500),
    "compare.png": ("/compare?runs=sim-64@0,sim-64@2,demo-8x", "#compare-graph .main-svg",
                    1100),
    "whatif.png": ("/runs/sim-64/whatif", "#whatif-graph .main-svg", 1300),
    "cluster.png": ("/cluster", "#cluster-graph .main-svg", 1500),
}


def wait_for(url: str, tries: int = 600) -> None:
    """Until ``url`` answers (a server that is starting)."""
    for _ in range(tries):
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)


def capture(url: str, pages: dict[str, tuple[str, str, int]], out: Path = OUT,
            settle_s: float = 1.5) -> None:
    """Open each page of ``pages`` (file: (path, selector that means "drawn", window
    height)) at ``url`` in headless Chromium, wait until it drew, and save it in ``out``."""
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    out.mkdir(parents=True, exist_ok=True)
    opts = webdriver.ChromeOptions()
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--disable-background-networking", "--hide-scrollbars"):
        opts.add_argument(a)
    driver = webdriver.Chrome(options=opts)
    try:
        for name, (path, selector, height) in pages.items():
            driver.set_window_size(1400, height)
            driver.get(url + path)
            WebDriverWait(driver, 120).until(
                ec.presence_of_element_located((By.CSS_SELECTOR, selector)))
            time.sleep(settle_s)  # transitions, the last graphs settle
            driver.save_screenshot(str(out / name))
            print(f"wrote {out / name}")
    finally:
        driver.quit()


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="goodlens-shots-"))
    port = 8490
    loads = [a for s in ("demo", "sim-64", "sim-16") for a in
             ("--load", str(ROOT / "sample_data" / s))]
    proc = subprocess.Popen([str(Path(sys.executable).parent / "goodlens"), "serve", "--db",
                             str(tmp / "s.duckdb"), "--port", str(port), "--log-level",
                             "warning", *loads])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url + "/healthz")
        time.sleep(6)  # let the live detector flag the sample stragglers
        capture(url, PAGES)
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
