"""Pictures of a real fault-scenario run for docs/elastic.md: the dashboard's overview and
ranks pages over the store ``make demo-faults`` (or ``scenario.py``) left.

Why: docs/elastic.md explains the loop with what goodlens showed of a real run, not a
drawing. Same approach as docs/screenshots.py (headless Chromium, wait until the graphs
drew), over ``goodlens dashboard --db`` (read-only).

    python examples/elastic/screenshots.py .goodlens/faults/faults.duckdb
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "img"
PAGES = {  # file: (path, selector that means "drawn", window height)
    "elastic-overview.png": ("/runs/faults", "#timeline-graph .main-svg", 1900),
    "elastic-ranks.png": ("/runs/faults/ranks?attempt=2&span=all", "#host-graph .main-svg", 1700),
}


def main(db: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "goodlens", "dashboard", "--db", db,
                             "--port", str(port)], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        opts = webdriver.ChromeOptions()
        for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--hide-scrollbars"):
            opts.add_argument(a)
        driver = webdriver.Chrome(options=opts)
        try:
            for name, (path, ready, height) in PAGES.items():
                driver.set_window_size(1400, height)
                driver.get(url + path)
                WebDriverWait(driver, 60).until(
                    ec.presence_of_element_located((By.CSS_SELECTOR, ready)))
                time.sleep(2)  # the last graphs settle
                OUT.mkdir(parents=True, exist_ok=True)
                driver.save_screenshot(str(OUT / name))
                print(f"wrote {OUT / name}")
        finally:
            driver.quit()
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / ".goodlens/faults/faults.duckdb"))
