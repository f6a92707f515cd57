"""Recipe: ``tests/record/restore_job.py`` under torchrun (4 gloo ranks): a DCP restore at
each attempt's start, one rank's read slowed in attempt 0, one rank's read stopped in
attempt 1 (recorded until the live collector calls it ``stuck_restore``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.harness import ROOT, Collector, http, job_env, kill_tree
from tests.record import Capture, recipe

#: restore: rank 2 reads 60 items 0.15 s apart in attempt 0 (9 s against ~0.1 s); rank 1
#: exits after step 10; in attempt 1 rank 3 stops after 10 items; hang floor 5 s
RESTORE = {"items": 60, "slow_rank": 2, "item_delay": 0.15, "steps": 10, "kill_rank": 1,
           "stuck_rank": 3, "stop_after": 10, "hang_floor_s": 5.0}
JOB = ROOT / "tests" / "record" / "restore_job.py"


@recipe("restore")
def restore(tmp: Path) -> Capture:
    from tests.record.restore_job import write_checkpoint
    s = RESTORE
    write_checkpoint(tmp / "ckpt")
    c = Collector(tmp / "r.duckdb", "--hang-floor", f"{s['hang_floor_s']}s").start()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
           "--max-restarts=1", str(JOB), "--url", c.url, "--run-id", "restore",
           "--ckpt", str(tmp / "ckpt"), "--truth-dir", str(tmp / "truth"),
           "--steps", str(s["steps"]), "--slow-rank", str(s["slow_rank"]),
           "--item-delay", str(s["item_delay"]), "--kill-rank", str(s["kill_rank"]),
           "--stuck-rank", str(s["stuck_rank"]), "--stop-after", str(s["stop_after"])]
    log = open(tmp / "restore.log", "wb")  # noqa: SIM115
    run = subprocess.Popen(cmd, cwd=tmp, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True,
                           env=job_env({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(1)
            status, body = http("GET", c.url + "/v1/actions?run=restore")
            if status == 200 and body.get("stuck_restore"):
                break
            if run.poll() is not None:
                raise RuntimeError("the job ended: " + (tmp / "restore.log").read_text()[-3000:])
        else:
            raise RuntimeError("the live collector never called the stuck restore: "
                               + (tmp / "restore.log").read_text()[-3000:])
        time.sleep(1.0)   # what the ranks sent since
        c.sync()
    finally:
        kill_tree(run)
        log.close()
        c.stop()
    return Capture(Path(c.db), "restore", tmp / "truth",
                   {"settings": s, "ranks": 4, "live_stuck": body["stuck_restore"]})
