"""Accounting against timelines worked out by hand (the accounting issue): the failure
instant, labelled intervals inside steps, the warm-up reference, a restart from step 0,
exclusions and reports as known at an instant. Every expected number is written here, with
the arithmetic beside it; the invariants (buckets sum to the wall-clock, less what is
excluded) are checked on every breakdown."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goodlens.analysis.report import report_dict
from tests.timelines import T0, Run, check_invariants


def crash_mid_step(run: Run, failure_event: bool) -> None:
    """Ten 1 s steps from T0; the job crashes 0.5 s into step 10 (T0 + 10.5), the launcher
    notices at T0 + 20.5; the next attempt starts at T0 + 30 from step 0 (no checkpoint)
    and runs steps 0-9 to T0 + 40."""
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(10)])
    if failure_event:
        run.event("failure", T0 + 10.5, 0, cause="gpu", rank=1)
    run.event("failure_detected", T0 + 20.5, 0, cause="gpu")
    run.event("attempt_start", T0 + 30, 1)
    run.steps(1, 0, [T0 + 30 + i for i in range(10)])
    run.event("attempt_end", T0 + 40, 1, cause="completed")


def test_the_step_in_flight_runs_to_the_recorded_failure_instant(store):
    run = Run(store, ranks=2)
    crash_mid_step(run, failure_event=True)
    b = run.account().breakdown()
    check_invariants(b)
    assert b.wall_clock_s == pytest.approx(40.0)
    assert b.buckets["recompute"] == pytest.approx(10.5)  # steps 0-9 redone + 0.5 in flight
    assert b.restart_parts["detection"] == pytest.approx(10.0)  # 10.5 -> 20.5
    assert b.restart_parts["queue"] == pytest.approx(9.5)  # 20.5 -> 30
    assert b.buckets["productive"] == pytest.approx(10.0)  # attempt 1's ten steps
    rep = report_dict(store, "r")
    assert rep["partial_steps"] == {"recorded": 1, "estimated": 0}


def test_without_a_failure_event_the_step_in_flight_is_an_estimate_and_says_so(store):
    run = Run(store, ranks=2)
    crash_mid_step(run, failure_event=False)
    b = run.account().breakdown()
    check_invariants(b)
    assert b.buckets["recompute"] == pytest.approx(11.0)  # 10 redone + one median step (1 s)
    assert b.restart_parts["detection"] == pytest.approx(9.5)  # 11 -> 20.5
    rep = report_dict(store, "r")
    assert rep["partial_steps"]["estimated"] == 1 and "estimated" in rep["partial_steps"]["note"]


def test_a_failure_before_the_last_step_end_leaves_nothing_in_flight(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(5)])  # ends T0 + 5
    run.event("failure", T0 + 4.8, 0, cause="nic")  # a rank died; the median rank finished
    run.event("failure_detected", T0 + 9, 0)
    b = run.account().breakdown()
    check_invariants(b)
    assert b.buckets["recompute"] == pytest.approx(0.0)
    assert b.restart_parts["detection"] == pytest.approx(4.0)  # 5 -> 9


def test_a_labelled_interval_inside_a_step_is_not_productive(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    # steps of 1 s, but step 3 lasts 6 s (T0+3 -> T0+9) and holds a 5 s eval
    run.steps(0, 0, [T0, T0 + 1, T0 + 2, T0 + 3, T0 + 9], durs=[1, 1, 1, 6, 1])
    run.event("custom_begin", T0 + 3.5, 0, label="eval")
    run.event("custom_end", T0 + 8.5, 0, label="eval")
    run.event("attempt_end", T0 + 10, 0, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.wall_clock_s == pytest.approx(10.0)
    assert b.other_parts["eval"] == pytest.approx(5.0)
    assert b.buckets["productive"] == pytest.approx(5.0)  # 1 + 1 + 1 + (6 - 5) + 1
    assert b.goodput == pytest.approx(0.5)
    assert b.startup_parts["warmup"] == 0.0  # the first step is 1 s like the others


def test_warm_up_is_measured_against_the_other_steps(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0, T0 + 8], durs=[8.0, 3.0])
    run.event("attempt_end", T0 + 11, 0, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    # the only attempt's: startup's warm-up, 8 - 3, not 8 - median(8, 3)
    assert b.startup_parts["warmup"] == pytest.approx(5.0)
    assert b.buckets["restart"] == 0.0
    assert b.buckets["productive"] == pytest.approx(6.0)  # 3 + 3


def test_a_save_inside_the_first_step_is_stall_not_warm_up(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    # step 0 lasts 6 s: 1 s of work and a 5 s synchronous save; then 1 s steps
    run.steps(0, 0, [T0, T0 + 6, T0 + 7, T0 + 8], durs=[6, 1, 1, 1])
    run.event("ckpt_save_start", T0 + 1, 0, step=0)
    run.event("ckpt_save_durable_end", T0 + 6, 0, step=0)
    run.event("attempt_end", T0 + 9, 0, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.buckets["checkpoint_stall"] == pytest.approx(5.0)
    assert b.startup_parts["warmup"] == pytest.approx(0.0)  # 6 - 5 = 1 s left: a normal step
    assert b.buckets["productive"] == pytest.approx(4.0)


def test_a_restart_from_step_zero_without_a_failure_event_is_recompute(store):
    run = Run(store, ranks=2)
    run.steps(0, 0, [T0 + i for i in range(5)])  # steps 0-4, to T0 + 5
    run.steps(1, 0, [T0 + 20 + i for i in range(5)])  # steps 0-4 again, to T0 + 25
    acc = run.account(now=T0 + 25)
    b = acc.breakdown()
    check_invariants(b)
    assert b.steps == {"kept": 5, "recomputed": 5, "incomplete": 0}
    assert b.buckets["recompute"] == pytest.approx(5 + 1)  # 5 redone + one estimated step
    assert b.restart_parts["unattributed"] == pytest.approx(20 - 5 - 1)
    assert b.buckets["productive"] == pytest.approx(5.0)
    assert acc.failures == {"recorded": 0, "estimated": 1}


def queue_and_maintenance(run: Run) -> None:
    """Attempt 0: 1 s steps 0-9 from T0, a 10 s 'maintenance' pause between steps 4 and 5
    (T0+5 -> T0+15, steps 5-9 at T0+15..T0+20), a crash detected at T0+22 (after a 1 s
    step in flight, estimated), 45 s in the queue; attempt 1 from T0+67 resumes at step 10,
    1 s steps to T0+77."""
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(5)] + [T0 + 15 + i for i in range(5)])
    run.event("custom_begin", T0 + 5, 0, label="maintenance")
    run.event("custom_end", T0 + 15, 0, label="maintenance")
    run.event("failure_detected", T0 + 22, 0)
    run.event("attempt_start", T0 + 67, 1)
    run.steps(1, 10, [T0 + 67 + i for i in range(10)])
    run.event("attempt_end", T0 + 77, 1, cause="completed")


def test_exclusions_take_named_parts_out_of_the_wall_clock(store):
    run = Run(store, ranks=2)
    queue_and_maintenance(run)
    acc = run.account()
    whole = acc.breakdown()
    check_invariants(whole)
    assert whole.wall_clock_s == pytest.approx(77.0)
    assert whole.restart_parts["queue"] == pytest.approx(45.0)  # 22 -> 67
    assert whole.other_parts["maintenance"] == pytest.approx(10.0)
    assert whole.buckets["productive"] == pytest.approx(20.0)  # 10 + 10 steps
    assert whole.buckets["recompute"] == pytest.approx(1.0)  # the estimated step in flight
    assert whole.restart_parts["detection"] == pytest.approx(1.0)  # 21 -> 22
    b = acc.breakdown(exclude=["queue", "maintenance"])
    check_invariants(b)
    assert b.wall_clock_s == pytest.approx(77 - 45 - 10)
    assert b.excluded == pytest.approx({"queue": 45.0, "maintenance": 10.0})
    assert b.restart_parts["queue"] == 0.0 and "maintenance" not in b.other_parts
    assert b.goodput == pytest.approx(20 / 22)
    assert b.gpu_seconds["allocated"] == pytest.approx(2 * 22)  # 2 ranks x the new wall-clock
    # a name with nothing behind it is reported as 0 s, not silently dropped
    assert acc.breakdown(exclude=["debug"]).excluded == {"debug": 0.0}
    # per attempt and in a window, the same rule
    a0, a1 = acc.by_attempt(exclude=["queue"])
    assert a0.wall_clock_s == pytest.approx(67 - 45) and a1.wall_clock_s == pytest.approx(10)
    w = acc.breakdown(T0 + 10, T0 + 30, exclude=["queue", "maintenance"])
    check_invariants(w)
    assert w.wall_clock_s == pytest.approx(20 - 5 - 8)  # maintenance 10-15, queue 22-30
    rep = report_dict(store, "r", exclude=["queue"])
    assert rep["wall_clock_s"] == pytest.approx(32.0) and rep["excluded"] == {"queue": 45.0}


def failure_then_rollback(run: Run) -> None:
    """Steps 0-19 from T0+5 (init 5 s), failure detected at T0+55; attempt 1 at T0+100
    resumes at step 10 and runs 1 s steps to T0+115."""
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + 5 + i for i in range(20)])
    run.event("failure_detected", T0 + 55, 0, cause="hang")
    run.event("attempt_start", T0 + 100, 1)
    run.steps(1, 10, [T0 + 100 + i for i in range(15)])
    run.event("attempt_end", T0 + 115, 1, cause="completed")


def test_as_of_reports_what_was_known_then(store):
    run = Run(store, ranks=2)
    failure_then_rollback(run)
    run.account()  # summarise
    # hindsight: steps 10-19 were redone by attempt 1
    now = report_dict(store, "r")
    assert now["buckets"]["recompute"] == pytest.approx(10 + 1)
    # at T0+30 the run was 25 s into its steps and going: nothing was recompute yet
    then = report_dict(store, "r", as_of=T0 + 30)
    assert then["as_of"] == T0 + 30 and then["in_progress"]
    assert then["wall_clock_s"] == pytest.approx(30.0)
    assert then["startup_parts"]["init"] == pytest.approx(5.0)  # attempt 0's start-up
    assert then["buckets"]["productive"] == pytest.approx(20.0)
    assert then["other_parts"]["since_last_step"] == pytest.approx(5.0)  # 25 -> 30
    assert then["buckets"]["recompute"] == 0.0
    # at T0+60 the failure was known (at 55) but not the rollback: steps 10-19 productive
    after = report_dict(store, "r", as_of=T0 + 60)
    assert not after["in_progress"]
    assert after["wall_clock_s"] == pytest.approx(55.0)
    assert after["buckets"]["productive"] == pytest.approx(20.0)
    assert after["buckets"]["recompute"] == pytest.approx(1.0)  # the estimated step
    assert after["restart_parts"]["detection"] == pytest.approx(29.0)  # 26 -> 55
    # as of the end, the same as hindsight
    assert report_dict(store, "r", as_of=T0 + 115)["buckets"] == pytest.approx(now["buckets"])
    with pytest.raises(ValueError, match="had not started"):
        report_dict(store, "r", as_of=T0 - 1)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0, 1), lo=st.floats(0, 1), hi=st.floats(0, 1),
       names=st.sets(st.sampled_from(["queue", "maintenance", "detection", "init",
                                      "since_last_step", "nothing"])))
def test_exclusions_and_as_of_keep_every_window_partitioned(store, cut, lo, hi, names):
    if store.run("r") is None:  # one store for every example
        queue_and_maintenance(Run(store, ranks=2))
        store.summarize_dirty()
    t = T0 + 77 * cut + 0.001
    rep = report_dict(store, "r", as_of=t, exclude=sorted(names))
    # as known at t: the run ends at t while it runs, at the failure (T0+22) until the next
    # attempt starts (T0+67), at its end (T0+77) afterwards
    end = T0 + 22 if T0 + 22 <= t < T0 + 67 else min(t, T0 + 77)
    assert rep["wall_clock_s"] + sum(rep["excluded"].values()) == \
        pytest.approx(end - T0, abs=1e-9)
    values = [v for v in rep["buckets"].values() if v is not None]
    assert min(values) >= -1e-9
    assert sum(values) == pytest.approx(rep["wall_clock_s"], abs=1e-9)
    a, b = sorted((lo, hi))
    since, until = T0 + 77 * a, T0 + 77 * b
    w = report_dict(store, "r", since=since, until=until, exclude=sorted(names))
    assert w["wall_clock_s"] + sum(w["excluded"].values()) == \
        pytest.approx(until - since, abs=1e-9)
    assert sum(v for v in w["buckets"].values() if v is not None) == \
        pytest.approx(w["wall_clock_s"], abs=1e-9)
