"""Recipes: ``examples/train_ddp.py`` under torchrun (4 gloo ranks), its faults planted."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.e2e.framework_jobs import torchrun_ddp
from tests.harness import Collector, http, kill_tree
from tests.record import Capture, recipe

#: ddp-slow: rank 2 computes 30% longer from step 100 (hook timing: the whole all-reduce
#: is the collective wait, so a rank's ready time is its planted compute)
SLOW = {"steps": 250, "onset": 100, "pct": 30.0, "compute_ms": 40.0, "slow_rank": 2}
#: ddp-crash: rank 1 exits at step 130, saves every 20 steps, rank 2 30% slow from step 50
CRASH = {"steps": 170, "ckpt_every": 20, "compute_ms": 20.0, "slow_rank": 2, "slow_pct": 30.0,
         "slow_from": 50, "kill_rank": 1, "kill_at": 130}
#: ddp-launched: under goodlens.exporter.launch, rank 1 raises at step 30 of 60
LAUNCHED = {"steps": 60, "ckpt_every": 20, "compute_ms": 20.0, "kill_rank": 1, "kill_at": 30}
#: ddp-hang: rank 3 stops at step 60; the collector's hang floor 3 s
HANG = {"steps": 500, "compute_ms": 10.0, "hang_rank": 3, "hang_at": 60, "hang_floor_s": 3.0}
#: ddp-loop: saves every 5 steps; rank 1 raises at step 11 in attempt 0 and again at the
#: first step after every restore (``--kill-after-restore``); torchrun restarts twice
LOOP = {"steps": 14, "ckpt_every": 5, "compute_ms": 10.0, "kill_rank": 1, "kill_at": 11,
        "restarts": 2}


@recipe("ddp-slow")
def slow(tmp: Path) -> Capture:
    c = Collector(tmp / "s.duckdb").start()
    try:
        torchrun_ddp(tmp, c.url, "slow", "--steps", str(SLOW["steps"]),
                     "--compute-ms", str(SLOW["compute_ms"]),
                     "--slow-rank", str(SLOW["slow_rank"]), "--slow-pct", str(SLOW["pct"]),
                     "--slow-from", str(SLOW["onset"]), "--collectives", "hook",
                     "--truth-dir", str(tmp / "truth"), timeout=120)
        c.sync()
    finally:
        c.stop()
    return Capture(Path(c.db), "slow", tmp / "truth", {"settings": SLOW, "ranks": 4})


def _crash(tmp: Path, run_id: str, s: dict, *extra: str, launcher: str = "torch.distributed.run",
           env: dict[str, str] | None = None) -> Capture:
    c = Collector(tmp / f"{run_id}.duckdb").start()
    if env is not None:
        env = {**env, "GOODLENS_URL": c.url}   # the launcher reads it
    try:
        torchrun_ddp(tmp, c.url, run_id, "--steps", str(s["steps"]),
                     "--ckpt-every", str(s["ckpt_every"]), "--compute-ms", str(s["compute_ms"]),
                     "--kill-rank", str(s["kill_rank"]), "--kill-at", str(s["kill_at"]),
                     "--truth-dir", str(tmp / "truth"), *extra, restarts=1, timeout=240,
                     launcher=launcher, env=env)
        c.sync()
    finally:
        c.stop()
    return Capture(Path(c.db), run_id, tmp / "truth", {"settings": s, "ranks": 4})


@recipe("ddp-crash")
def crash(tmp: Path) -> Capture:
    return _crash(tmp, "crash", CRASH, "--slow-rank", str(CRASH["slow_rank"]),
                  "--slow-pct", str(CRASH["slow_pct"]), "--slow-from", str(CRASH["slow_from"]))


@recipe("ddp-launched")
def launched(tmp: Path) -> Capture:
    return _crash(tmp, "launched", LAUNCHED, "--kill-how", "raise",
                  launcher="goodlens.exporter.launch", env={"GOODLENS_RUN_ID": "launched"})


@recipe("ddp-hang")
def hang(tmp: Path) -> Capture:
    """Recorded until the live collector has called the hang (then the job is killed):
    what it had stored by then, which is all the replay needs to call it again."""
    c = Collector(tmp / "h.duckdb", "--hang-floor", f"{HANG['hang_floor_s']}s").start()
    run = torchrun_ddp(tmp, c.url, "hang", "--steps", str(HANG["steps"]),
                       "--compute-ms", str(HANG["compute_ms"]), "--hang-rank",
                       str(HANG["hang_rank"]), "--hang-at", str(HANG["hang_at"]),
                       "--truth-dir", str(tmp / "truth"), wait=False)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            time.sleep(1)
            status, body = http("GET", c.url + "/v1/runs/hang")
            if status == 200 and body["attempts"] and \
                    body["attempts"][-1]["end_reason"] == "failed":
                break
        else:
            raise RuntimeError("the live collector never called the hang")
        assert run.poll() is None, "torchrun ended instead of hanging"
    finally:
        kill_tree(run)
        c.stop()
    return Capture(Path(c.db), "hang", tmp / "truth", {"settings": HANG, "ranks": 4})


@recipe("ddp-loop")
def loop(tmp: Path) -> Capture:
    """A restart loop: every attempt after the first fails right after its restore, so
    torchrun gives up after its restarts (the job fails)."""
    s = LOOP
    c = Collector(tmp / "l.duckdb").start()
    run = torchrun_ddp(tmp, c.url, "loop", "--steps", str(s["steps"]),
                       "--ckpt-every", str(s["ckpt_every"]), "--compute-ms", str(s["compute_ms"]),
                       "--kill-rank", str(s["kill_rank"]), "--kill-at", str(s["kill_at"]),
                       "--kill-how", "raise", "--kill-after-restore",
                       "--truth-dir", str(tmp / "truth"), restarts=s["restarts"], wait=False)
    try:
        if run.wait(180) == 0:
            raise RuntimeError("torchrun ended cleanly: " + (tmp / "loop.log").read_text()[-3000:])
        c.sync()
    finally:
        kill_tree(run)
        c.stop()
    return Capture(Path(c.db), "loop", tmp / "truth",
                   {"settings": s, "ranks": 4, "host": socket.gethostname()})
