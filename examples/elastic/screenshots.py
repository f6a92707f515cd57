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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "img"
PAGES = {  # file: (path, selector that means "drawn", window height)
    "elastic-overview.png": ("/runs/faults", "#timeline-graph .main-svg", 1900),
    "elastic-ranks.png": ("/runs/faults/ranks?attempt=2&span=all", "#host-graph .main-svg", 1700),
}


def main(db: str) -> None:
    sys.path.insert(0, str(ROOT / "docs"))
    from screenshots import capture, wait_for  # docs/screenshots.py: one way to shoot

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "goodlens", "dashboard", "--db", db,
                             "--port", str(port)], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url + "/")
        capture(url, PAGES, OUT, settle_s=2.0)  # the last graphs settle
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / ".goodlens/faults/faults.duckdb"))
