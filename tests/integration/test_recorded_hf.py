"""A recorded Hugging Face ``Trainer`` job (``examples/integrations/train_hf.py`` under
torchrun), replayed exactly (``tests/recorded.py``) and checked against the job's own clock.

Why: the Trainer owns the loop, so goodlens hooks into it (``goodlens.exporter.hf``); each
claim the other integrations make must hold when the steps, saves, evaluations and resume
are the Trainer's. The recording carries gradient accumulation (one goodlens step per
optimizer step), a data stall, a slowed rank, evaluations, checkpoints and a killed rank
resumed by ``train(resume_from_checkpoint=...)`` (``tests/record/frameworks.py``). Expected
values come from the job's clock lines and settings only.
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
    return replay("hf", tmp_path_factory.mktemp("hf"))


def test_restart_and_recompute_match_the_jobs_clock(job):
    s, rep = job.job["settings"], job.report
    buckets_sum_to_wall_clock(rep)
    assert [a["steps"]["kept"] for a in rep["attempts"]] == [s["resumed"],
                                                             s["steps"] - s["resumed"]]
    # goodlens steps are numbered by global_step, so attempt 0's steps from the resumed
    # checkpoint to the kill (redone after the resume) and the partial step are the
    # recompute. It ends at the failure instant, between the crash and the first
    # survivor's own error (its all-reduce raising when the kernel closes the dead rank's
    # sockets); restart less that latency; their sum whatever the latency
    # (tests/jobclock.restart_and_startup_match_the_jobs_clock)
    restart_and_startup_match_the_jobs_clock(job)
    # the resume's loads (weights before accelerate's wrap, optimizer and scheduler after
    # it) are restore time, never more than their spans on the job's clock (10 ms: a
    # scheduling slice); the RNG load runs inside the first step (after its fetch), so it
    # is the first step's, not restore's
    a1 = rep["attempts"][1]["restart_parts"]
    loads = [x for x in job.lines("restore", attempt=1) if x["what"] != "_load_rng_state"]
    own = union_length([(x["t0"], x["t1"]) for x in loads])
    print(f"restore {a1['restore']:.4f} s, job's clock {own:.4f} s")
    assert a1["restore"] > 0
    assert a1["restore"] <= own + 0.01


def test_the_slowed_rank_is_found_as_itself_with_its_slowdown(job):
    s = job.job["settings"]
    # the slowed rank alone (not the stall, the saves or evaluations); any other: a transient
    f = the_slowed_ranks_finding(job, s["slow_rank"], tuple(s["stall_at"]))
    assert f["action"] == "evict", f
    # what the slowed rank costs the job per step: how much later than the latest other
    # rank it reached the step's first collective (DDP's forward), on the job's own clock,
    # over the step without that; within the 20%. The last estimate is the
    # restarted attempt's, whose evidence starts again at the restart
    truth = true_lateness(job, s["slow_rank"], f["attempt"])
    print(f"job_slowdown {f['job_slowdown']:.3f}, job's clock: lateness {truth:.3f}, "
          f"planted sleep {true_slowdown(job, attempt=f['attempt']):.3f}")
    assert f["job_slowdown"] == pytest.approx(truth, rel=0.20), f


def test_a_stalled_data_loader_is_input_stall(job):
    # the shortest of the ranks' planted stalls, per stalled step: the fetch the step's
    # data wait times holds the stall, the collation and the other micro-batch (~1 ms)
    got, truth = job.report["other_parts"]["input_stall"], true_stall(job)
    print(f"input_stall {got:.4f} s, job's clock {truth:.4f} s")
    assert got == pytest.approx(truth, rel=0.10)


def test_checkpoint_stall_is_the_blocking_save(job):
    # every save is kept: attempt 0's last is before the rollback point, and a save runs
    # between steps (after on_step_end), so even one in rolled-back time would be
    # checkpoint stall, not recompute. The union over ranks of the job's own spans around
    # _save_checkpoint (rank 0 writes the model and optimizer, the others only their RNG
    # state, then wait for rank 0 in the next step's all-reduce): 5%
    got, truth = job.report["buckets"]["checkpoint_stall"], true_saves(job)
    print(f"checkpoint_stall {got:.4f} s, job's clock {truth:.4f} s")
    assert got == pytest.approx(truth, rel=0.05)


def test_evaluation_is_its_own_part(job):
    # the union over ranks of the job's own spans around evaluate() (the planted sleep and
    # the real evaluation, whose loss gather syncs the ranks), per attempt
    s = job.job["settings"]

    def evals(attempt: int) -> list[tuple[float, float]]:
        return [(x["t0"], x["t1"]) for x in job.lines("eval", attempt=attempt)]
    got = [a["other_parts"].get("eval", 0.0) for a in job.report["attempts"]]
    # attempt 1 ends cleanly: every span's end reaches the store (5%)
    print(f"eval {got}, job's clock {union_length(evals(1)):.4f} s in attempt 1")
    assert got[1] == pytest.approx(union_length(evals(1)), rel=0.05)
    # attempt 0 ends in the killed rank's os._exit, which sends nothing it still holds
    # (docs/pytorch.md), and a begun span with no end lasts until its attempt ends
    # (docs/accounting.md, "An interval with no end"). So the truth is a range: the job's
    # spans, up to the killed rank's last evaluation taken to its crash
    crash = job.lines("crash", rank=s["kill_rank"], attempt=0)[0]["t"]
    last = max(x["t0"] for x in job.lines("eval", rank=s["kill_rank"], attempt=0))
    low, high = union_length(evals(0)), union_length([*evals(0), (last, crash)])
    print(f"attempt 0: {got[0]:.4f} s, job's clock {low:.4f} to {high:.4f} s")
    assert 0.9 * low <= got[0] <= 1.1 * high, (got, low, high)
    assert job.report["other_parts"]["eval"] == pytest.approx(sum(got), rel=1e-9)
