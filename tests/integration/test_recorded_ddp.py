"""Recorded DDP jobs (``examples/train_ddp.py``, 4 gloo ranks under torchrun), replayed
exactly (``tests/recorded.py``) and checked against each job's own clock.

The recordings are ``tests/fixtures/runs/ddp-*`` (``tests/record/ddp.py`` says what was
planted in each); the expected values come from the jobs' clock lines and settings only.
A recorded run does not move, so the margins are what the estimator claims, not what a
loaded machine needs: ``bench/accuracy.py`` measures how the same estimates spread when the
jobs run live, quiet and beside busy loops.
"""

from __future__ import annotations

import json

import pytest

from tests.jobclock import (
    JobResult,
    buckets_sum_to_wall_clock,
    first_step,
    ready_lateness,
    restart_and_startup_match_the_jobs_clock,
    step_period_growth,
    true_straggler_wait,
)
from tests.recorded import replay


@pytest.fixture(scope="module")
def slow(tmp_path_factory) -> JobResult:
    return replay("ddp-slow", tmp_path_factory.mktemp("ddp-slow"))


@pytest.fixture(scope="module")
def crash(tmp_path_factory) -> JobResult:
    return replay("ddp-crash", tmp_path_factory.mktemp("ddp-crash"))


def test_the_slow_rank_is_one_finding_about_rank_2_from_its_onset(slow):
    s = slow.job["settings"]
    ev = slow.events[slow.events.kind == "straggler_flagged"].sort_values("seq")
    assert len(ev), "no straggler flagged"
    # one finding (a first report and its updates, one source), about the planted rank only
    last = ev.groupby("source").tail(1)
    assert len(last) == 1, list(ev.detail)
    f, first = json.loads(last.detail.iloc[0]), json.loads(ev.detail.iloc[0])
    assert f["ranks"] == [s["slow_rank"]] and first["status"] == "new" and f["id"] == first["id"]
    assert f["action"] == "evict"
    # dated at the planted onset (a few noisy steps either side) and reported within the
    # 30 steps the detector promises
    assert s["onset"] - 5 <= f["first_step"] <= s["onset"] + 5, f
    assert s["onset"] <= f["detected_step"] <= s["onset"] + 30, f
    # the slowdown against the job's clock: rank 2's lateness at its ready line over the
    # other ranks' own work, which lies between their time to that line and their step
    # less the lateness; 5% either side of those bounds
    truth = ready_lateness(slow, s["slow_rank"], s["onset"], slow.job["ranks"])
    assert 0.95 * truth["slowdown_lo"] <= f["slowdown"] <= 1.05 * truth["slowdown_hi"], \
        (f["slowdown"], truth)


def test_the_straggler_wait_is_the_lateness_on_the_jobs_clock(slow):
    """Per step, the latest rank's time from its own step start to its ``ready`` line less
    the median rank's, summed (whatever part of it the planted sleep was): 5%."""
    buckets_sum_to_wall_clock(slow.report)
    waited = true_straggler_wait(slow, slow.job["ranks"], {0: (0, slow.job["settings"]["steps"])})
    assert slow.report["buckets"]["straggler_wait"] == pytest.approx(waited, rel=0.05)


def test_the_job_slowdown_is_what_the_jobs_step_grew(slow):
    """What rank 2 costs the job: rank 0's step period over the last 64 steps against the
    steps before the onset, by the job's clock (``step_period_growth``): within 10%. The
    ready times alone read 20% more (the others' work after the collective ran while rank 2
    was late); the step's own growth bounds it (``test_recorded_jobcost.py``)."""
    s = slow.job["settings"]
    (f,) = [f for f in slow.findings() if f["ranks"] == [s["slow_rank"]]]
    truth = step_period_growth(slow, s["onset"])
    print(f"job_slowdown {f['job_slowdown']:.3f} (ready {f['job_slowdown_ready']:.3f}), "
          f"job's step grew {truth:.3f}")
    assert f["job_slowdown"] == pytest.approx(truth, rel=0.10), (f, truth)


# ------------------------------------------------------------- a crash and a restart (DCP)

def test_the_restart_resumes_from_the_last_save_before_the_crash(crash):
    """By hand from the settings: saves after steps 19, 39, ..., 119 (every 20); the crash
    at step 130 rolls back to step 119's save, so attempt 1 resumes at 120, attempt 0 keeps
    steps 0-119 and attempt 1 steps 120-169."""
    s, steps, ev, rep = crash.job["settings"], crash.steps, crash.events, crash.report
    restore = crash.lines("restore", rank=0, attempt=1)[0]
    assert restore["step"] == 119
    assert sorted(steps.attempt.unique()) == [0, 1]
    assert steps[steps.attempt == 1].step.min() == 120
    assert set(ev[ev.kind == "ckpt_restore_end"].step) == {119}
    assert [a["steps"]["kept"] for a in rep["attempts"]] == [120, s["steps"] - 120]
    buckets_sum_to_wall_clock(rep)


def test_no_step_of_a_surviving_rank_is_lost_and_the_rollback_is_recompute(crash):
    s, steps, rep = crash.job["settings"], crash.steps, crash.report
    # every step a surviving rank finished (its own file) is stored, the last ones before
    # torchrun's SIGTERM included
    for rank in range(crash.job["ranks"]):
        if rank != s["kill_rank"]:
            mine = set(crash.own_steps(rank, 0))
            got = set(steps[(steps.attempt == 0) & (steps["rank"] == rank)].step)
            assert mine <= got, (rank, sorted(mine - got))
    # the steps from 120 that every survivor reported before the crash are recomputed, and
    # at most every step from 120 attempt 0 stored (the killed rank leaves by os._exit: the
    # rows it buffered since its last flush go with it)
    redone = steps[(steps.attempt == 0) & (steps.step >= 120)]
    full = redone[redone["rank"] != s["kill_rank"]].groupby("step")["rank"].nunique()
    full = full[full == crash.job["ranks"] - 1].index
    assert len(full) > 0 and full.max() < s["kill_at"], sorted(full)
    assert len(full) <= rep["steps"]["recomputed"] <= redone.step.nunique()


def test_the_failure_is_dated_between_the_crash_and_the_restart(crash):
    """The survivors whose collective raised record the failure instant, before the
    restarted processes start; torchrun's SIGTERM can reach a survivor first, which then
    records a detection of unknown instant (and where it reached every one first, the
    report says the step in flight was estimated)."""
    ev, rep = crash.events, crash.report
    t_crash = crash.lines("crash")[0]["t"]
    first_new = min(x["t"] for x in crash.lines("script_start", attempt=1))
    failures = ev[(ev.kind == "failure") & (ev.attempt == 0)]
    if len(failures):
        t_fail = float(failures.time.min())
        assert t_crash <= t_fail <= t_crash + 1.0 and t_fail < first_new
        assert rep["partial_steps"]["recorded"] == 1
    else:
        assert rep["partial_steps"]["estimated"] == 1, rep["partial_steps"]
    detected = ev[(ev.kind == "failure_detected") & (ev.attempt == 0)]
    assert len(detected) and t_crash <= float(detected.time.min()) < first_new


def test_restart_recompute_and_startup_match_the_jobs_clock(crash):
    """recompute: the rolled-back steps and the partial step on rank 0's clock, to the
    failure instant, which lies between the crash and the first survivor's own error (15%
    either side); restart: the crash to the restarted attempt's first step plus its
    warm-up, less that detection latency (10%); their sum (10%); startup: the first
    attempt's earliest script start to its first step plus its warm-up (10% or 1 s, never
    shorter); only the first attempt has one (tests/jobclock.py)."""
    restart_and_startup_match_the_jobs_clock(crash)
    rep = crash.report
    a0, a1 = rep["attempts"]
    # the parts: nothing unattributed to speak of; init covers the restarted processes'
    # start-up (script start to first step, less the restore), at least half of it
    restore = crash.lines("restore", rank=0, attempt=1)[0]
    new = crash.own_steps(0, 1)
    first_new = min(x["t"] for x in crash.lines("script_start", attempt=1))
    assert rep["restart_parts"]["unattributed"] <= 0.10 * rep["buckets"]["restart"]
    assert a1["restart_parts"]["init"] >= 0.5 * (new[min(new)][0] - first_new
                                                 - (restore["t1"] - restore["t0"]))
    assert a1["restart_parts"]["restore"] > 0
    first_script = min(x["t"] for x in crash.lines("script_start", attempt=0))
    assert rep["start"] <= first_script
    assert a0["startup_parts"]["init"] >= 0.5 * (first_step(crash, 0)[0] - first_script)


def test_each_rank_restored_the_whole_model(crash):
    """Under DDP every rank reads the whole MLP: the same bytes everywhere, at least its
    floats (32x64 + 64 + 64 + 1, 4 bytes each)."""
    restored = crash.events[crash.events.kind == "ckpt_restore_end"]
    assert len(restored) == crash.job["ranks"] and restored.bytes.nunique() == 1
    assert int(restored.bytes.iloc[0]) >= (32 * 64 + 64 + 64 + 1) * 4


def test_the_straggler_wait_over_the_kept_steps_is_the_jobs_lateness(crash):
    """The default (exposed) timing, over the kept steps (rolled-back ones are recompute):
    per step the latest rank's time to its ``ready`` line less the median rank's; 5%."""
    steps = crash.job["settings"]["steps"]
    truth = true_straggler_wait(crash, crash.job["ranks"], {0: (0, 120), 1: (120, steps)})
    assert crash.report["buckets"]["straggler_wait"] == pytest.approx(truth, rel=0.05)


def test_the_launcher_and_the_dying_process_record_the_failure(tmp_path):
    """Under ``python -m goodlens.exporter.launch`` with a crash by an unhandled exception:
    the dying process records its own failure (cause, rank) at the instant it raised, and
    the elastic agent the failed rank's exit."""
    res = replay("ddp-launched", tmp_path)
    kill_rank = res.job["settings"]["kill_rank"]
    t_crash = res.lines("crash", rank=kill_rank, attempt=0)[0]["t"]
    ev = res.events
    failures = ev[(ev.kind == "failure") & (ev.attempt == 0)]
    own = failures[failures.cause == "exception:RuntimeError"]
    assert list(own["rank"]) == [kill_rank]
    assert t_crash <= float(own.time.iloc[0]) <= t_crash + 1.0
    launcher = failures[failures.cause == "exit:1"]
    assert kill_rank in set(launcher["rank"]), list(failures.cause)
    assert t_crash <= float(launcher.time.min()) <= t_crash + 5.0
    assert len(ev[(ev.kind == "failure_detected") & (ev.cause == "launcher")]) >= 1


# ----------------------------------------------------------------------------- a hang

def test_a_hung_rank_is_called_a_hang_once_the_adaptive_timeout_has_passed(tmp_path):
    """Rank 3 stops at step 60 and every rank waits in the all-reduce. The timeout is the
    collector's floor, 3 s (3x the longest step interval, ~40 ms by the job's clock, is
    less); a detection pass runs every 2 s of the job's time, so the hang is called 3-5 s
    after the last step ended, at the first pass past the timeout."""
    window_s = 2.0
    res = replay("ddp-hang", tmp_path, hang_floor_s=3.0, tail_s=30.0, window_s=window_s)
    s = res.job["settings"]
    steps, ev = res.steps, res.events
    assert steps.step.max() == s["hang_at"] - 1
    assert max(x["step"] for x in res.lines("step", rank=s["hang_rank"])) == s["hang_at"] - 1
    longest = max(b["t1"] - a["t1"] for r in range(res.job["ranks"])
                  for a, b in zip(res.lines("step", r), res.lines("step", r)[1:]))
    assert 3 * longest < s["hang_floor_s"]
    hang = ev[ev.kind == "failure_detected"]
    assert list(hang.cause) == ["hang"]
    detail = json.loads(hang.detail.iloc[0])
    last_end = float((steps.start_time + steps.duration_s).max())
    assert detail["timeout_s"] == s["hang_floor_s"] and detail["last_seen"] == last_end
    assert last_end + 3.0 <= float(hang.time.iloc[0]) <= last_end + 3.0 + window_s
    assert [a["end_reason"] for a in res.run["attempts"]] == ["failed"]
