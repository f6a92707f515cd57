"""End-to-end: a 3-rank FSDP2 (``fully_shard``) job under torchrun with planted faults,
checked against the job's own clock (``examples/integrations/train_fsdp2.py``).

Why: under FSDP2 a rank waits for a slow peer in whichever all-gather or reduce-scatter
comes next, not in one all-reduce at the end of backward; the integration must count every
such wait, so that a rank's time to reach the collective (what the straggler detector and
the straggler bucket read) means what it means under DDP. One job carries every claim (the
suite's time matters): a data stall on all ranks early, a planted slow reduce-scatter on
every rank on alternate steps, rank 2 slowed by a planted sleep from step 50, checkpoints every
20 steps, rank 1 killed at step 110 and the job resumed from step 100's checkpoint.
Expected values come from the job's files only (``tests/e2e/framework_jobs.py``).

Three ranks and one sharded block (plus the root), not four and three: FSDP2 on CPU costs
~33 ms of CPU a rank a step at three blocks, so 4 ranks queued for 2 cores, and the ranks'
own queueing, spread over a dozen collectives a step, became part of each rank's time to
reach the collective. ``job_slowdown`` (the slowed rank's time over the latest other
rank's, per step) then read 27% and 43% under what the job's clock shows in two runs
(0.070 against 0.096; 0.050 against 0.082). At 3 ranks and 2 units (6 collectives a step)
it read 0.144, 0.185 against 0.132, 0.188, and 0.242 against 0.215 with two busy loops
beside the job. The HSDP job keeps 4 ranks: its 2x2 mesh needs them, and its claim is the
ranks' ready times, not the job-level cost.
"""

from __future__ import annotations

import statistics

import pytest

from tests.e2e.framework_jobs import (
    buckets_sum_to_wall_clock,
    restart_and_startup_match_the_jobs_clock,
    run_job,
    runqueue_per_step,
    the_slowed_ranks_finding,
    true_lateness,
    true_saves,
    true_slowdown,
    true_stall,
)

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

STEPS, CKPT, COMPUTE_MS = 130, 20, 20.0
SLOW_RANK, SLOW_MS, SLOW_FROM = 2, 12.0, 50
KILL_RANK, KILL_AT = 1, 110
STALL_AT, STALL_MS = (5, 6), 300.0
RS_MS, RS_STEPS = 100.0, (8, 48)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp2")
    return run_job(tmp, "train_fsdp2.py", "fsdp2", "--steps", str(STEPS),
                   "--ckpt-every", str(CKPT), "--compute-ms", str(COMPUTE_MS),
                   "--slow-rank", str(SLOW_RANK), "--slow-ms", str(SLOW_MS),
                   "--slow-from", str(SLOW_FROM), "--kill-rank", str(KILL_RANK),
                   "--kill-at", str(KILL_AT), "--stall-at", ",".join(map(str, STALL_AT)),
                   "--stall-ms", str(STALL_MS), "--rs-delay-ranks", "0,1,2", "--layers", "1",
                   "--rs-delay-ms", str(RS_MS), "--rs-delay-steps", f"{RS_STEPS[0]}:{RS_STEPS[1]}",
                   restarts=1, detect=True, nproc=3)


def test_restart_and_recompute_match_the_jobs_clock(job):
    rep = job.report
    buckets_sum_to_wall_clock(rep)
    assert [a["steps"]["kept"] for a in rep["attempts"]] == [100, STEPS - 100]
    # recompute: the rolled-back steps and the partial step, on rank 0's clock, to the
    # failure instant, which lies between the crash and the first survivor's own error
    # (its all-gather raising: 4 s late once under load); 15% as for DDP; restart less
    # that latency; startup (framework_jobs.restart_and_startup_match_the_jobs_clock)
    restart_and_startup_match_the_jobs_clock(job)
    assert rep["attempts"][1]["restart_parts"]["restore"] > 0


def test_the_slowed_rank_is_found_as_itself_with_its_slowdown(job):
    # rank 2 alone (not the stall, not the slow reduce-scatter); any other: a transient
    f = the_slowed_ranks_finding(job, SLOW_RANK, STALL_AT)
    assert f["action"] == "evict", f
    # what rank 2 costs the job per step: how much later than the latest other rank it
    # entered each step's first collective, on the job's own clock, over the step without
    # that; within the 20%. Not the planted 12 ms over the step less it (printed),
    # which over-states the wait by the healthy ranks' own spread where they queue for
    # the CPU (beside another worker's tests, say)
    truth = true_lateness(job, SLOW_RANK, f["attempt"])
    print(f"job_slowdown {f['job_slowdown']:.3f}, job's clock: lateness {truth:.3f}, "
          f"planted sleep {true_slowdown(job, attempt=f['attempt']):.3f}")
    assert f["job_slowdown"] == pytest.approx(truth, rel=0.20), f
    # the ready-time ratio (``slowdown``) is several times that here: the collectives are
    # most of a step on 2 loaded cores
    assert f["slowdown"] > f["job_slowdown"]


def test_a_stalled_data_loader_is_input_stall(job):
    # the shortest of the 3 ranks' 300 ms stalls, per stalled step; the data phase also
    # times the batch's making (~0.1 ms), and a rank's stall it could not hide is at most
    # a scheduling slice over the job's own reading
    assert job.report["other_parts"]["input_stall"] == pytest.approx(true_stall(job),
                                                                      rel=0.10)


def test_checkpoint_stall_is_the_blocking_save(job):
    # every save was before the rollback point (the last one of attempt 0 at step 99) or in
    # attempt 1, so all are kept: the union over ranks of the job's own spans around the
    # save call, which also holds the state_dict() call goodlens does not see (~ms)
    assert job.report["buckets"]["checkpoint_stall"] == pytest.approx(true_saves(job),
                                                                      rel=0.15)


def test_a_delayed_reduce_scatter_is_exposed_wait_of_its_amount(job):
    """Every rank enters the root's reduce-scatter 100 ms late, inside the call, on the even
    steps of [8, 48): each is blocked in that collective 100 ms longer, plus however long
    the last rank to wake waits for a core (3 ranks waking at once on 2 cores: a few ms,
    which is why the delay is 100 ms and not 50, where it was 20% of it). Per rank, the
    median over the steps of (even step's collective wait - the next odd step's) is the
    planted sleep as that rank measured it, within the issue's 20%; and the time to reach
    the collective (step - wait) does not move by more than a fifth of it: the delay is
    not taken for compute. (A delay planted on one rank alone is not this: its peers'
    extra wait is shortened by however late they reached the collective themselves, tens
    of ms on ranks sharing 2 cores.)"""
    steps = job.steps[job.steps.attempt == 0]
    for rank in range(3):
        planted = statistics.median(x["s"] for x in job.lines("rs_delay", rank=rank))
        mine = steps[steps["rank"] == rank].set_index("step")
        ready = mine.duration_s - mine.collective_wait_s
        pairs = range(*RS_STEPS, 2)
        wait = statistics.median(mine.collective_wait_s[s] - mine.collective_wait_s[s + 1]
                                 for s in pairs)
        moved = statistics.median(ready[s] - ready[s + 1] for s in pairs)
        assert wait == pytest.approx(planted, rel=0.20), (rank, wait, planted)
        assert abs(moved) <= 0.2 * planted, (rank, moved)
    # not a straggler: no rank's time to reach the collective changed
    the_slowed_ranks_finding(job, SLOW_RANK, STALL_AT)


@pytest.fixture(scope="module")
def hsdp_job(tmp_path_factory):
    """HSDP on a (2, 2) mesh: ranks 0-1 and 2-3 shard, 0-2 and 1-3 replicate. Rank 0 slowed
    from step 20; no restart (the restart path is the 1-D job's)."""
    tmp = tmp_path_factory.mktemp("hsdp")
    return run_job(tmp, "train_fsdp2.py", "hsdp", "--hsdp", "--steps", "90",
                   "--compute-ms", str(COMPUTE_MS), "--slow-rank", "0", "--slow-ms",
                   str(SLOW_MS), "--slow-from", "20", detect=True)


def test_hsdp_times_the_replicate_all_reduce_too(hsdp_job):
    """Rank 2 never shares a shard group with rank 0: it waits for it only in the replicate
    all-reduce (and rank 3 waits for rank 1, which waits for rank 0, there too). Were that
    wait not timed, ranks 2 and 3 would look as slow as rank 0 and the job's median would
    move with them; timed, rank 0 is found with its cost, and no other rank with anything
    near it.

    Another rank's finding still open at the end passes when its excess is under a quarter
    of rank 0's lateness on the job's clock: beside two busy loops (clean clone 34) rank 1
    was flagged 5% slow (1.5 ms a step against rank 0's 12), its work after the step's
    first collective taking 1-2.6 ms longer than the other ranks' while the job's clock
    had it enter that collective with the median rank. On 2 cores shared by 4 ranks and
    busy loops a healthy rank's own work really can run a few percent slow for a whole
    job; an untimed all-reduce would have put rank 0's whole lateness on ranks 2 and 3."""
    steps = hsdp_job.steps
    ready = (steps.duration_s - steps.collective_wait_s)[steps.step >= 30]
    by_rank = ready.groupby(steps["rank"]).median()
    # rank 0's own work is longer than each other rank's by how much later it entered the
    # step's first collective on the job's own clock: the planted sleep, plus its wait for
    # a core on waking where the machine is loaded (12 ms slept, 17 ms late beside
    # another worker's tests); within 25% or 3 ms of scheduling noise
    at = {r: hsdp_job.own_ready(r) for r in range(4)}
    late = {r: statistics.median(at[0][s] - at[r][s] for s in at[0] if s >= 30 and s in at[r])
            for r in (1, 2, 3)}
    try:
        f = the_slowed_ranks_finding(hsdp_job, 0, minor_s=0.25 * min(late.values()))
    except AssertionError:
        print(hsdp_windows(hsdp_job, steps))
        raise
    assert f["action"] == "evict"  # (its estimate is the 1-D job's claim: 70 steps
    # after the onset, this short job's estimate is still converging)
    for r in (1, 2, 3):
        assert by_rank[0] - by_rank[r] == pytest.approx(late[r], rel=0.25, abs=0.003), \
            (r, late, by_rank)
    buckets_sum_to_wall_clock(hsdp_job.report)


def hsdp_windows(res, steps) -> str:
    """Per rank and 10-step window, the medians of goodlens's ready time, the job clock's
    time from step start to the first collective, and that instant less the median rank's,
    with the rank's mean CPU wait a step (ms): what a failure prints."""
    rows = ["window: rank ready / job's ready / vs median / CPU wait (ms)"]
    at = {r: res.own_ready(r, 0) for r in range(4)}
    own = {r: res.own_steps(r, 0) for r in range(4)}
    waits = {r: runqueue_per_step(res, r, 0) for r in range(4)}
    gl = steps[steps.attempt == 0].set_index(["rank", "step"])
    for w in range(0, int(steps.step.max()) + 1, 10):
        cells = []
        for r in range(4):
            ss = [s for s in range(w, w + 10) if s in at[r] and s in own[r]
                  and (r, s) in gl.index and all(s in at[q] for q in range(4))]
            if not ss:
                continue
            mine = gl.loc[[(r, s) for s in ss]]
            rdy = statistics.median(mine.duration_s - mine.collective_wait_s) * 1e3
            job = statistics.median(at[r][s] - own[r][s][0] for s in ss) * 1e3
            vs = statistics.median(at[r][s] - statistics.median(at[q][s] for q in range(4))
                                   for s in ss) * 1e3
            rq = [waits[r][s] for s in ss if s in waits[r]]
            cpu = statistics.fmean(rq) * 1e3 if rq else float("nan")
            cells.append(f"r{r} {rdy:5.1f} / {job:5.1f} / {vs:+5.1f} / {cpu:4.1f}")
        rows.append(f"{w:3d}: " + " | ".join(cells))
    return "\n".join(rows)
