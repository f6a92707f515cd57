"""Straggler wait by time to reach the collective, and job-wide input stalls, on timelines
worked out by hand (the ready-time issue). A rank's *ready* time is its step time minus its
collective wait (else compute + data wait); the straggler wait of a step is the slowest
rank's ready time minus the median rank's; the data wait every rank had (``data_wait_min``)
is ``other.input_stall``. Every expected number is written here with its arithmetic; the
buckets sum to the wall-clock on every breakdown."""

from __future__ import annotations

import pytest

from goodlens.analysis.report import report_dict
from goodlens.cli.reports import report_text
from tests.timelines import T0, Run, check_invariants

STEPS = 10


def ten_steps(run: Run, **kw) -> None:
    """Attempt 0: ten 1 s steps from T0, ending cleanly at T0 + 10 (wall-clock 10 s)."""
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(STEPS)], **kw)
    run.event("attempt_end", T0 + STEPS, 0, cause="completed")


def test_a_data_starved_rank_is_a_straggler(store):
    """Ranks compute 0.6 s each; ranks 0-2 wait 0.001 s for data, rank 3 waits 0.200 s; the
    collective wait is what remains of the 1.0 s step. Ready: 0.601, 0.601, 0.601, 0.800.
    Compute alone (0.6 everywhere) would say no straggler at all."""
    run = Run(store, ranks=4)
    ten_steps(run, data={0: 0.001, 1: 0.001, 2: 0.001, 3: 0.200})
    b = run.account().breakdown()
    check_invariants(b)
    assert b.wall_clock_s == pytest.approx(10.0)
    # per step 0.800 - 0.601 = 0.199 s (median of four: (0.601 + 0.601) / 2)
    assert b.buckets["straggler_wait"] == pytest.approx(0.199 * STEPS)  # 1.99 s
    # every rank waited at least 0.001 s for data: the job was stalled on input that long
    assert b.other_parts == {"input_stall": pytest.approx(0.001 * STEPS)}  # 0.01 s
    assert b.buckets["other"] == pytest.approx(0.01)
    assert b.buckets["productive"] == pytest.approx(10.0 - 1.99 - 0.01)  # 8.0 s
    assert b.straggler_wait_measured == 1.0
    s = store.step_summaries("r")
    assert (s.compute_max - s.compute_median == 0).all()  # the old rule's 0
    assert (s.slowest_rank == 3).all() and (s.slowest_host == "h3").all()
    assert s.ready_max.to_numpy() == pytest.approx([0.8] * STEPS)
    assert s.ready_median.to_numpy() == pytest.approx([0.601] * STEPS)
    # a window cutting steps, and the attempt, still partition
    w = run.account().breakdown(T0 + 0.35, T0 + 4.72)
    check_invariants(w)
    check_invariants(run.account().breakdown(attempt=0))


def test_every_rank_waiting_for_data_is_an_input_stall(store):
    """Every rank waits 0.3 s for data and computes 0.6 s each step: ready 0.9 everywhere, so
    no straggler, and 0.3 s of each step is the job waiting on input."""
    run = Run(store, ranks=4)
    ten_steps(run, data=dict.fromkeys(range(4), 0.3))
    b = run.account().breakdown()
    check_invariants(b)
    assert b.buckets["straggler_wait"] == pytest.approx(0.0)
    assert b.other_parts["input_stall"] == pytest.approx(0.3 * STEPS)  # 3.0 s
    assert b.buckets["productive"] == pytest.approx(1.0 * STEPS - 3.0)  # 7.0 s
    assert b.goodput == pytest.approx(0.7)
    # a named part of other: it can be excluded like queue or a custom label
    x = run.account().breakdown(exclude=["input_stall"])
    check_invariants(x)
    assert x.wall_clock_s == pytest.approx(7.0) and x.excluded == {"input_stall":
                                                                    pytest.approx(3.0)}
    rep = report_dict(store, "r")
    assert rep["other_parts"]["input_stall"] == pytest.approx(3.0)
    assert "input_stall" in report_text(rep)


def test_one_rank_without_a_data_wait_means_no_input_stall(store):
    """Ranks 0-2 wait 0.3 s for data, rank 3 reports no data wait: nobody can say every rank
    waited, so nothing is an input stall (rank 3's ready time is its compute + 0: 0.6)."""
    run = Run(store, ranks=4)
    ten_steps(run, data=dict.fromkeys(range(3), 0.3))
    b = run.account().breakdown()
    check_invariants(b)
    assert "input_stall" not in b.other_parts
    # ready 0.9, 0.9, 0.9, 0.6 (duration - collective wait; rank 3 waited 0.4 in the
    # all-reduce): max 0.9 - median 0.9 = 0
    assert b.buckets["straggler_wait"] == pytest.approx(0.0)
    assert b.buckets["productive"] == pytest.approx(10.0)


def test_collective_wait_without_compute_still_measures_the_straggler(store):
    """Only collective waits are reported (no compute): ready = duration - collective wait.
    Rank 3 waits 0.1 s in the all-reduce, the others 0.4 s: ready 0.6, 0.6, 0.6, 0.9."""
    run = Run(store, ranks=4)
    ten_steps(run, compute={3: 0.9}, report=("collective_wait_s",))
    store.summarize_dirty()
    s = store.step_summaries("r")
    assert (s.compute_ranks == 0).all() and (s.ready_ranks == 4).all()
    b = run.account().breakdown()
    check_invariants(b)
    assert b.buckets["straggler_wait"] == pytest.approx(0.3 * STEPS)  # 0.9 - 0.6 per step
    assert b.buckets["productive"] == pytest.approx(10.0 - 3.0)
    assert b.straggler_wait_measured == 1.0
    assert "input_stall" not in b.other_parts  # no data waits reported


def test_nothing_measured_keeps_the_fallback(store):
    """No compute, collective or data wait: the straggler wait is not measured (None, not 0)
    and the step time stays productive, as before."""
    run = Run(store, ranks=4)
    ten_steps(run, split=False)
    b = run.account().breakdown()
    check_invariants(b)
    assert b.buckets["straggler_wait"] is None
    assert b.straggler_wait_measured == 0.0
    assert b.buckets["productive"] == pytest.approx(10.0)
    assert b.other_parts == {}


def test_input_stall_never_pushes_a_step_past_its_duration(store):
    """Five 1 s steps; a save blocks 0.8 s inside step 2 (T0 + 2.1 -> 2.9); every rank
    waits 0.5 s for data and computes 0.3 s each step. Step 2: 0.8 s checkpoint stall leaves
    0.2 s, all of it input stall (not 0.5). Other steps: 0.5 input stall, 0.5 productive."""
    run = Run(store, ranks=4)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(5)], compute=dict.fromkeys(range(4), 0.3),
              data=dict.fromkeys(range(4), 0.5))
    run.event("ckpt_save_start", T0 + 2.1, 0, step=2)
    run.event("ckpt_save_blocking_end", T0 + 2.9, 0, step=2)
    run.event("attempt_end", T0 + 5, 0, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.buckets["checkpoint_stall"] == pytest.approx(0.8)
    assert b.other_parts["input_stall"] == pytest.approx(4 * 0.5 + 0.2)  # 2.2 s
    assert b.buckets["productive"] == pytest.approx(4 * 0.5)  # 2.0 s
    assert b.buckets["straggler_wait"] == pytest.approx(0.0)


def test_steps_redone_after_a_rollback_keep_their_input_stall_in_recompute(store):
    """Every rank waits 0.3 s for data. Attempt 0 runs steps 0-4 (T0 -> T0 + 5) and fails
    (detected at T0 + 6); attempt 1 starts at T0 + 8 and redoes steps 3-5. Steps 3-4 of
    attempt 0 are recompute, whole (2 s); the kept steps 0-2 and 3-5 stall 0.3 s each."""
    run = Run(store, ranks=2)
    data = dict.fromkeys(range(2), 0.3)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(5)], data=data)
    run.event("failure_detected", T0 + 6, 0, cause="gpu")
    run.event("attempt_start", T0 + 8, 1)
    run.steps(1, 3, [T0 + 8 + i for i in range(3)], data=data)
    run.event("attempt_end", T0 + 11, 1, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.other_parts["input_stall"] == pytest.approx(6 * 0.3)  # 1.8 s
    assert b.buckets["productive"] == pytest.approx(6 * 0.7)  # 4.2 s
    # steps 3-4 redone (2 s) + the step in flight, estimated as one median step (1 s)
    assert b.buckets["recompute"] == pytest.approx(3.0)
