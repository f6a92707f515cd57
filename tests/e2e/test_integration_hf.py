"""End-to-end: a 3-rank Hugging Face ``Trainer`` job under torchrun with planted faults,
checked against the job's own clock (``examples/integrations/train_hf.py``).

Why: the Trainer owns the loop, so goodlens hooks into it (``goodlens.exporter.hf``); each
claim the other integrations make must hold when the steps, saves, evaluations and resume
are the Trainer's. One job carries every claim (the suite's time matters): gradient
accumulation 2 (one goodlens step per optimizer step), a data stall on all ranks at two
steps, rank 2 slowed by a planted sleep from step 5, an evaluation every 15 steps, a
checkpoint every 10, rank 1 killed at step 35 of attempt 0 and the job resumed by
``train(resume_from_checkpoint=checkpoint-30)``. Expected values come from the job's files
only (``tests/e2e/framework_jobs.py``).

Three ranks, not four: the Trainer's own CPU per step is ~10 ms a rank, and 4 ranks on 2
cores queue for the CPU. The latest of the healthy ranks then reaches the collective late
by however the scheduler interleaved them, which is what the job really waits for without
the slowed rank, so ``job_slowdown`` (measured against that latest rank) read 10-30% under
the planted sleep's cost in three 4-rank runs (0.41, 0.32 against 0.45, 0.46); at 3 ranks
it read 7% and 15% under (0.48, 0.43 against 0.52, 0.50).
"""

from __future__ import annotations

import pytest

from tests.e2e.framework_jobs import (
    buckets_sum_to_wall_clock,
    restart_and_startup_match_the_jobs_clock,
    run_job,
    the_slowed_ranks_finding,
    true_lateness,
    true_saves,
    true_slowdown,
    true_stall,
    union_length,
)

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

STEPS, CKPT, EVAL, ACCUM, COMPUTE_MS, EVAL_MS = 110, 10, 20, 2, 20.0, 150.0
# 25 ms: the slowed rank's own work is also ~2 ms slower than the others' while the other ranks poll
# for it on 2 cores (contention the planted sleep induces, outside the job's clock); against
# 15 ms that alone was +13% of the truth
SLOW_RANK, SLOW_MS, SLOW_FROM = 2, 25.0, 10
KILL_RANK, KILL_AT = 1, 55
RESUMED = 50  # checkpoint-50: the newest before the crash (steps 0-49 done)
STALL_AT, STALL_MS = (8, 9), 300.0


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf")
    return run_job(tmp, "train_hf.py", "hf", "--steps", str(STEPS),
                   "--ckpt-every", str(CKPT), "--eval-every", str(EVAL),
                   "--eval-ms", str(EVAL_MS), "--accum", str(ACCUM),
                   "--compute-ms", str(COMPUTE_MS), "--slow-rank", str(SLOW_RANK),
                   "--slow-ms", str(SLOW_MS), "--slow-from", str(SLOW_FROM),
                   "--kill-rank", str(KILL_RANK), "--kill-at", str(KILL_AT),
                   "--stall-at", ",".join(map(str, STALL_AT)), "--stall-ms", str(STALL_MS),
                   restarts=1, detect=True, nproc=3)


def test_restart_and_recompute_match_the_jobs_clock(job):
    rep = job.report
    buckets_sum_to_wall_clock(rep)
    assert [a["steps"]["kept"] for a in rep["attempts"]] == [RESUMED, STEPS - RESUMED]
    # goodlens steps are numbered by global_step, so attempt 0's steps 30-34 (redone after
    # the resume from checkpoint-30) and the partial step 35 are the recompute. It ends at
    # the failure instant, between the crash and the first survivor's own error (its
    # all-reduce raising when the kernel closes the dead rank's sockets: 0.06-0.12 s after
    # the crash for these processes on 2 loaded cores), 15% either side; restart less that
    # latency; their sum whatever the latency (framework_jobs)
    restart_and_startup_match_the_jobs_clock(job)
    # the resume's loads (weights before accelerate's wrap, optimizer and scheduler after
    # it) are restore time; the RNG load runs inside the first step (after its fetch), so
    # it is the first step's, not restore's
    a1 = rep["attempts"][1]["restart_parts"]
    loads = [x for x in job.lines("restore", attempt=1)
             if x["what"] != "_load_rng_state"]
    assert a1["restore"] > 0
    assert a1["restore"] <= union_length([(x["t0"], x["t1"]) for x in loads]) + 0.05


def test_the_slowed_rank_is_found_as_itself_with_its_slowdown(job):
    # rank 2 alone (not the stall, the saves or evaluations); any other: a transient
    f = the_slowed_ranks_finding(job, SLOW_RANK, STALL_AT)
    assert f["action"] == "evict", f
    # what rank 2 costs the job per step: how much later than the latest other rank it
    # reached the step's first collective (DDP's forward), on the job's own clock, over
    # the step without that; within the 20%. Not the planted sleep
    # over the step less it (printed): beside another worker's tests the healthy ranks'
    # own spread made that over-state the wait (0.397 against 0.262 read). The last
    # estimate is the restarted attempt's, whose evidence starts again at the restart: 60
    # steps after it (with 30 its last update read 22% low, not yet converged)
    truth = true_lateness(job, SLOW_RANK, f["attempt"])
    print(f"job_slowdown {f['job_slowdown']:.3f}, job's clock: lateness {truth:.3f}, "
          f"planted sleep {true_slowdown(job, attempt=f['attempt']):.3f}")
    assert f["job_slowdown"] == pytest.approx(truth, rel=0.20), f


def test_a_stalled_data_loader_is_input_stall(job):
    # the shortest of the 3 ranks' 300 ms stalls, per stalled step: the fetch the step's
    # data wait times holds the stall, the collation and the other micro-batch (~1 ms)
    assert job.report["other_parts"]["input_stall"] == pytest.approx(true_stall(job),
                                                                      rel=0.10)


def test_checkpoint_stall_is_the_blocking_save(job):
    # every save is kept: attempt 0's last (checkpoint-30) is before the rollback point,
    # and a save runs between steps (after on_step_end), so even one in rolled-back time
    # would be checkpoint stall, not recompute. The union over ranks of the job's own spans
    # around _save_checkpoint (rank 0 writes the model and optimizer, the others only their
    # RNG state, then wait for rank 0 in the next step's all-reduce)
    assert job.report["buckets"]["checkpoint_stall"] == pytest.approx(true_saves(job),
                                                                      rel=0.15)


def test_evaluation_is_its_own_part(job):
    # the union over ranks of the job's own spans around evaluate() (the planted 150 ms
    # and the real evaluation, whose loss gather syncs the ranks), per attempt
    def evals(attempt: int) -> list[tuple[float, float]]:
        return [(x["t0"], x["t1"]) for x in job.lines("eval", attempt=attempt)]
    got = [a["other_parts"].get("eval", 0.0) for a in job.report["attempts"]]
    # attempt 1 ends cleanly: every span's end reaches the store
    assert got[1] == pytest.approx(union_length(evals(1)), rel=0.10)
    # attempt 0 ends in rank 1's os._exit, which sends nothing it still holds
    # (docs/pytorch.md): seen beside a light load, its last 1.4 s (steps 40-54, the end of
    # the eval it began at step 40) never left it, and a begun span with no end lasts
    # until its attempt ends (docs/accounting.md, "An interval with no end"). So the truth
    # is a range: the job's spans, up to rank 1's last eval taken to its crash (read:
    # 1.077 s, for 0.365 to 1.59)
    crash = job.lines("crash", rank=KILL_RANK, attempt=0)[0]["t"]
    last = max(x["t0"] for x in job.lines("eval", rank=KILL_RANK, attempt=0))
    low, high = union_length(evals(0)), union_length([*evals(0), (last, crash)])
    assert 0.9 * low <= got[0] <= 1.1 * high, (got, low, high)
    assert job.report["other_parts"]["eval"] == pytest.approx(sum(got), rel=1e-9)
