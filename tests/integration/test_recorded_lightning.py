"""A recorded PyTorch Lightning job (``examples/integrations/train_lightning.py``, DDP
strategy, goodlens's callback, under torchrun), replayed exactly (``tests/recorded.py``) and
checked against the job's own clock.

Why: under Lightning goodlens sees the loop only through its callback's hooks, so each claim
the DDP integration makes must hold from those hooks: a step that covers its data fetch,
DDP's exposed all-reduce wait inside that step, the blocking save around
``ModelCheckpoint``, validation as ``other.eval``, and a resumed ``fit(ckpt_path=...)`` as a
restart with its recompute. The recording carries a data stall, a slowed rank, saves and
validation, and a killed rank resumed from a checkpoint (``tests/record/frameworks.py``).
Expected values come from the job's clock lines and settings only.
"""

from __future__ import annotations

import pytest

from tests.jobclock import (
    JobResult,
    buckets_sum_to_wall_clock,
    restart_and_startup_match_the_jobs_clock,
    the_slowed_ranks_finding,
    true_lateness,
    true_saves,
    true_slowdown,
    true_stall,
    union_length,
)
from tests.recorded import replay


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> JobResult:
    return replay("lightning", tmp_path_factory.mktemp("lightning"))


def test_restart_and_recompute_match_the_jobs_clock(job):
    s, rep = job.job["settings"], job.report
    resumed = s["resumed"]
    buckets_sum_to_wall_clock(rep)
    assert [a["steps"]["kept"] for a in rep["attempts"]] == [resumed, s["steps"] - resumed]
    assert min(job.own_steps(0, 1)) == resumed  # Lightning's global_step, continued
    # recompute: the rolled-back steps and the partial step, on rank 0's clock, to the
    # failure instant, which lies between the crash and the first survivor's own error
    # (its all-reduce raising); restart the crash to the restarted attempt's first step
    # less that latency; startup from the first script start
    # (tests/jobclock.restart_and_startup_match_the_jobs_clock). No save and no validation
    # lies in the rolled-back span (both run after the step before the resumed one), so
    # none of it is checkpoint stall or eval.
    restart_and_startup_match_the_jobs_clock(job)
    # the restore: the checkpoint file's load, as the job's CheckpointIO timed it; it is
    # tens of milliseconds, so the margin is absolute: 10 ms
    own = job.lines("restore", attempt=1)
    assert {x["step"] for x in own} == {resumed - 1}
    restored = union_length([(x["t0"], x["t1"]) for x in own])
    got = rep["attempts"][1]["restart_parts"]["restore"]
    print(f"restore {got:.4f} s, job's clock {restored:.4f} s")
    assert got == pytest.approx(restored, abs=0.01)
    ev = job.events
    assert set(ev[ev.kind == "ckpt_restore_end"].step) == {resumed - 1}


def test_the_slowed_rank_is_found_as_itself_with_its_slowdown(job):
    s = job.job["settings"]
    # the slowed rank alone, never the data stall every rank had (any other: a transient).
    # One finding, or two: the detector carries a finding over the restart only when it
    # flags the rank again within 50 steps of it, else the restarted attempt opens a
    # second one; both name the slowed rank (the latest is checked)
    f = the_slowed_ranks_finding(job, s["slow_rank"], tuple(s["stall_at"]))
    assert f["action"] == "evict", f
    # what the slowed rank costs the job per step: how much later than the latest other
    # rank it reached the step's first collective, on the job's own clock, over the step
    # without that; 10%, half the 20% (the estimate's medians are over the
    # finding's recent steps, the clock's over the attempt's last 64). The finding's last
    # estimate is priced with the recent steps of the attempt it was made in, so the truth
    # is that attempt's
    truth = true_lateness(job, s["slow_rank"], f["attempt"])
    print(f"job_slowdown {f['job_slowdown']:.3f}, job's clock: lateness {truth:.3f}, "
          f"planted sleep {true_slowdown(job, attempt=f['attempt']):.3f}")
    assert f["job_slowdown"] == pytest.approx(truth, rel=0.10), f


def test_the_slowed_ranks_time_to_the_collective_holds_the_planted_sleep(job):
    """What the callback measures for the detector: a rank's step (from its fetch to the
    end of its batch) less DDP's exposed all-reduce wait. The slowed rank's, per step, over
    the median of the others', is the planted sleep: within 5% (the sleep overruns by a
    scheduling slice), in each attempt."""
    s = job.job["settings"]
    st = job.steps[job.steps.step >= s["slow_from"]]
    st = st.assign(ready=st.duration_s - st.collective_wait_s)
    for attempt in (0, 1):
        ready = st[st.attempt == attempt].pivot_table(index="step", columns="rank",
                                                      values="ready")
        others = ready.drop(columns=s["slow_rank"]).median(axis=1)
        excess = float((ready[s["slow_rank"]] - others).median())
        print(f"attempt {attempt}: excess {excess * 1e3:.2f} ms for {s['slow_ms']} planted")
        assert excess == pytest.approx(s["slow_ms"] / 1000.0, rel=0.05), (attempt, excess)


def test_a_stalled_data_loader_is_input_stall(job):
    # the shortest of the ranks' planted stalls, per stalled step (both before the rollback
    # point: kept). goodlens's data wait is the whole fetch, which also makes the batch
    # (~0.25 ms) on each of attempt 0's kept steps: 10%. Attempt 0 only: the resumed attempt's
    # first fetch is a wait every rank has too (its loader starting at the resumed step),
    # before the fetch the job's clock times
    a0, truth = job.report["attempts"][0]["other_parts"]["input_stall"], true_stall(job)
    print(f"input_stall {a0:.4f} s, job's clock {truth:.4f} s")
    assert a0 == pytest.approx(truth, rel=0.10)


def test_checkpoint_stall_is_the_blocking_save(job):
    # every save is between two steps (ModelCheckpoint saves in on_train_batch_end, after
    # the callback closed the step), and a save between steps is checkpoint stall even
    # among rolled-back steps: the union over ranks of the job's own spans around
    # ModelCheckpoint's save, both attempts: 5%
    got, truth = job.report["buckets"]["checkpoint_stall"], true_saves(job)
    print(f"checkpoint_stall {got:.4f} s, job's clock {truth:.4f} s")
    assert got == pytest.approx(truth, rel=0.05)
    ev = job.events
    saves = ev[(ev.kind == "ckpt_save_durable_end") & (ev["rank"] == 0)]
    assert (saves.bytes > 0).all() and len(saves) == len(job.lines("save", rank=0))


def test_validation_is_eval(job):
    # every validation run as the job's module timed it, union over ranks, less what
    # overlaps a save: accounting gives a blocking save priority over a labelled interval,
    # and a rank whose save ended late (rank 0 writes the file; the barrier releases the
    # ranks a scheduling slice apart) still saves while another already validates. The
    # callback's hooks run a few microseconds before the module's at both ends: 5%
    evals = [(x["t0"], x["t1"]) for x in job.lines("eval")]
    saves = [(x["t0"], x["t1"]) for x in job.lines("save")]
    own = union_length(evals + saves) - union_length(saves)
    got = job.report["other_parts"]["eval"]
    print(f"eval {got:.4f} s, job's clock {own:.4f} s")
    assert got == pytest.approx(own, rel=0.05)
