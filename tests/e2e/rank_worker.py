"""One fake training rank for the end-to-end tests: steps with a sleep, events, then close.

Usage: python tests/rank_worker.py URL RUN_ID RANK STEPS [--resend] [--json]
Prints the exporter's stats as JSON on the last line.
"""

from __future__ import annotations

import json
import sys
import time

from goodlens.exporter.recorder import RankExporter
from goodlens.exporter.transport import Transport


def main() -> None:
    url, run_id, rank, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if "--resend" in sys.argv:  # deliver every batch twice, as a confused network might
        post = Transport._post

        def twice(self, body, *args):
            first = post(self, body, *args)
            return post(self, body, *args) if first == "ok" else first
        Transport._post = twice
    wire = "json" if "--json" in sys.argv else "arrow"
    exp = RankExporter(run_id=run_id, url=url, rank=rank, world_size=16, host=f"n{rank // 4}",
                       wire=wire,
                       flush_interval_s=0.1, batch_rows=40, heartbeat_interval_s=0.5,
                       timeout_s=2.0)
    exp.event("attempt_start", world_size=16)
    for n in range(steps):
        with exp.step(n):
            with exp.phase("data"):
                time.sleep(0.0005)
            time.sleep(0.002)
            with exp.phase("collective"):
                time.sleep(0.0005)
        if n % 100 == 99:
            exp.event("ckpt_save_start", step=n + 1, tier="durable")
    ok = exp.close(timeout=60)
    print(json.dumps({"ok": ok, **exp.stats}), flush=True)


if __name__ == "__main__":
    main()
