"""End-to-end: a 4-rank DDP job under torchrun with a straggler, a crash and a restart from
a DCP checkpoint, checked against the job's own clock.

Why: the restart is where goodlens lost rows (SIGTERM to the surviving workers) and time
(nothing dated the failure or the restarted processes' start-up). Every rank of
``examples/train_ddp.py --truth-dir`` appends its own clock readings (script start, each
step, the restore, the crash instant), flushed line by line; expected values come from
those files, never from goodlens (the resume point and the steps each attempt keeps by
hand from the job's settings). Margins are relative to the job's clock, and absolute
ones only where 4 ranks and a collector on 2 loaded cores make a few tens of milliseconds
of scheduling noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.framework_jobs import (
    JobResult,
    first_step,
    restart_and_startup_match_the_jobs_clock,
    true_straggler_wait,
)
from tests.e2e.test_torch_e2e import report, torchrun
from tests.harness import Collector

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

STEPS, CKPT, COMPUTE_MS = 170, 20, 20.0
SLOW_RANK, SLOW_PCT, SLOW_FROM = 2, 30.0, 50
KILL_RANK, KILL_AT = 1, 130


def truth(folder: Path) -> dict[tuple[int, int], list[dict]]:
    """(rank, attempt) -> the lines that rank wrote in that attempt."""
    out = {}
    for f in folder.glob("rank*-attempt*.jsonl"):
        rank, attempt = f.stem.removeprefix("rank").split("-attempt")
        out[int(rank), int(attempt)] = [json.loads(line) for line in f.read_text().splitlines()]
    return out


def steps_of(lines: list[dict]) -> dict[int, tuple[float, float]]:
    return {x["step"]: (x["t0"], x["t1"]) for x in lines if x["kind"] == "step"}


def run_job(tmp_path: Path, run_id: str, *extra: str, launcher: str = "torch.distributed.run",
            env: dict[str, str] | None = None, steps: int = STEPS,
            kill_at: int = KILL_AT) -> tuple[Path, dict]:
    c = Collector(tmp_path / f"{run_id}.duckdb").start()
    if env is not None and "GOODLENS_URL" in env:  # the launcher reads it
        env = {**env, "GOODLENS_URL": c.url}
    try:
        torchrun(tmp_path, c.url, run_id, "--steps", str(steps), "--ckpt-every", str(CKPT),
                 "--compute-ms", str(COMPUTE_MS), "--kill-rank", str(KILL_RANK),
                 "--kill-at", str(kill_at), "--truth-dir", str(tmp_path / "truth"), *extra,
                 restarts=1, timeout=240, launcher=launcher, env=env)
        c.sync()
    finally:
        c.stop()
    return c.db, truth(tmp_path / "truth")


def stored(db: Path, run_id: str) -> tuple:
    from goodlens.storage.store import Store
    store = Store(db, read_only=True)
    try:
        return store.steps(run_id), store.events(run_id)
    finally:
        store.close()


def test_a_crash_under_plain_torchrun_matches_the_jobs_own_clock(tmp_path):
    db, t = run_job(tmp_path, "crash", "--slow-rank", str(SLOW_RANK), "--slow-pct",
                    str(SLOW_PCT), "--slow-from", str(SLOW_FROM))
    steps, ev = stored(db, "crash")
    rep = report(db, "crash")
    crash = next(x for x in t[KILL_RANK, 0] if x["kind"] == "crash")
    restore = next(x for x in t[0, 1] if x["kind"] == "restore")
    resumed = restore["step"] + 1
    # 0. by hand: saves after steps 19, 39, ..., 119 (every CKPT); the crash at step 130
    # rolls back to the save of step 119, so attempt 1 resumes at 120, attempt 0 keeps
    # steps 0-119 and attempt 1 steps 120-169
    assert restore["step"] == 119 and resumed == 120
    assert sorted(steps.attempt.unique()) == [0, 1]
    assert steps[steps.attempt == 1].step.min() == 120
    assert set(ev[ev.kind == "ckpt_restore_end"].step) == {119}
    assert [a["steps"]["kept"] for a in rep["attempts"]] == [120, 50]
    # 1. no step row lost on the ranks that did not crash: every step they finished (their
    # own files) is stored, the last ones before torchrun's SIGTERM included
    for rank in range(4):
        mine = set(steps_of(t[rank, 0]))
        got = set(steps[(steps.attempt == 0) & (steps["rank"] == rank)].step)
        if rank != KILL_RANK:
            assert mine <= got, (rank, sorted(mine - got))
    # rolled back: the steps from 120 on that every survivor reported before the crash are
    # recomputed, and at most every step from 120 that attempt 0 stored (the killed rank
    # leaves by os._exit: the rows it buffered since its last flush go with it)
    redone = steps[(steps.attempt == 0) & (steps.step >= 120)]
    full = redone[redone["rank"] != KILL_RANK].groupby("step")["rank"].nunique()
    full = full[full == 3].index
    assert len(full) > 0 and full.max() < KILL_AT, sorted(full)
    assert len(full) <= rep["steps"]["recomputed"] <= redone.step.nunique()
    # 2. the failure instant: recorded by the survivors whose collective raised just after
    # the crash, before the restarted processes started. torchrun's SIGTERM to them (its
    # monitor wakes every 0.1 s) races that error: a survivor it reaches first records the
    # error as a detection of unknown instant, and where it reached every one first (once
    # in CI, on a loaded machine) no instant is known, the report says the step in flight
    # was estimated, and recompute below still holds. Never an instant far from the crash.
    failures = ev[(ev.kind == "failure") & (ev.attempt == 0)]
    first_new = min(x["t"] for (r, a), lines in t.items() if a == 1
                    for x in lines if x["kind"] == "script_start")
    print(f"failure instants recorded: {len(failures)}, partial steps {rep['partial_steps']}")
    if len(failures):
        t_fail = float(failures.time.min())
        assert crash["t"] <= t_fail <= crash["t"] + 1.0 and t_fail < first_new
        assert rep["partial_steps"]["recorded"] == 1
    else:
        assert rep["partial_steps"]["estimated"] == 1, rep["partial_steps"]
    detected = ev[(ev.kind == "failure_detected") & (ev.attempt == 0)]
    assert len(detected) and crash["t"] <= float(detected.time.min()) < first_new
    # 3. recompute: the rolled-back steps and the partial step, on rank 0's clock, to the
    # failure instant, which lies between the crash and the first survivor's own error
    # (its all-reduce raising; 15% either side). 4. restart: from the crash to the
    # restarted attempt's first step, plus that step's excess over the attempt's median
    # step, less that detection latency (10%); their sum, which the latency does not move
    # (10%). It is the whole restart bucket: the first attempt's start-up is startup's,
    # not this failure's (goodlens #28). Beside a second pytest worker, the survivors'
    # failure instants came 74 ms after the crash and recompute read 0.459 s, 0.386 to it.
    # 6. startup: the first attempt's earliest script start to its first step (rank 0's
    # clock), plus that step's warm-up; within 10% or 1 s, and never shorter: goodlens
    # dates the attempt at the process's start, before the script's first line; and only
    # the first attempt has one (all three: tests/e2e/framework_jobs.py)
    res = JobResult(db, "crash", t, report=rep)
    restart_and_startup_match_the_jobs_clock(res)
    new = steps_of(t[0, 1])
    first = min(new)
    a0, a1 = rep["attempts"]
    parts1 = a1["restart_parts"]
    # 5. the parts: nothing unattributed; init covers the restarted processes' start-up
    # (script start to first step, less the restore), at least half of it
    assert rep["restart_parts"]["unattributed"] <= 0.10 * rep["buckets"]["restart"]
    startup = new[first][0] - first_new - (restore["t1"] - restore["t0"])
    assert parts1["init"] >= 0.5 * startup
    assert parts1["restore"] > 0
    first_script = min(x["t"] for x in res.lines("script_start", attempt=0))
    assert rep["start"] <= first_script
    assert a0["startup_parts"]["init"] >= 0.5 * (first_step(res, 0)[0] - first_script)
    # 7. restore bytes: what each rank read, the whole model under DDP, the same everywhere
    restored = ev[ev.kind == "ckpt_restore_end"]
    assert len(restored) == 4 and restored.bytes.nunique() == 1
    assert int(restored.bytes.iloc[0]) >= (32 * 64 + 64 + 64 + 1) * 4  # the MLP's floats
    # 8. straggler wait with the default (exposed) timing, over the kept steps (rolled-back
    # ones are recompute): per step, the latest rank's time to its ``ready`` line less the
    # median rank's, on the job's own clock; within 15%. Not the planted sleep (printed):
    # on a loaded machine the healthy ranks' own lateness is straggler wait too (a clean
    # clone beside a Spark job read 0.843 s against 0.72 s planted)
    kept = (resumed - SLOW_FROM) + (STEPS - resumed)
    injected = kept * COMPUTE_MS / 1000 * SLOW_PCT / 100
    truth = true_straggler_wait(res, 4, {0: (0, resumed), 1: (resumed, STEPS)})
    sw = rep["buckets"]["straggler_wait"]
    print(f"straggler_wait {sw:.3f} s; job's clock {truth:.3f} s; planted {injected:.3f} s")
    assert sw == pytest.approx(truth, rel=0.15)


def test_the_launcher_and_the_dying_process_record_the_failure(tmp_path):
    """With ``python -m goodlens.exporter.launch`` (torchrun's arguments) and a crash by an
    unhandled exception: the dying process records its own failure (cause and rank) at the
    instant it raised, and the elastic agent records the failed rank's exit. Only failure
    records are checked, so the job is short: the crash at step 30 of 60."""
    run_id = "launched"
    db, t = run_job(tmp_path, run_id, "--kill-how", "raise",
                    launcher="goodlens.exporter.launch",
                    env={"GOODLENS_URL": "", "GOODLENS_RUN_ID": run_id}, steps=60, kill_at=30)
    _, ev = stored(db, run_id)
    crash = next(x for x in t[KILL_RANK, 0] if x["kind"] == "crash")
    failures = ev[(ev.kind == "failure") & (ev.attempt == 0)]
    own = failures[failures.cause == "exception:RuntimeError"]
    assert list(own["rank"]) == [KILL_RANK]
    assert crash["t"] <= float(own.time.iloc[0]) <= crash["t"] + 1.0
    launcher = failures[failures.cause == "exit:1"]
    assert KILL_RANK in set(launcher["rank"]), list(failures.cause)
    assert crash["t"] <= float(launcher.time.min()) <= crash["t"] + 5.0
    assert len(ev[(ev.kind == "failure_detected") & (ev.cause == "launcher")]) >= 1
