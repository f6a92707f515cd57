"""Time accounting: one hand-built scenario per edge case, with the expected seconds written
here, and properties on random runs (buckets non-negative, summing to wall-clock for every
window)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodlens.analysis.accounting import BUCKETS, RESTART_PARTS, STARTUP_PARTS, account_run
from goodlens.model.batch import validate_batch
from goodlens.storage.store import Store
from tests.timelines import T0, Run, check_invariants


def test_clean_run_with_a_straggler(store):
    run = Run(store)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + 10 + i for i in range(10)], compute={2: 0.75})
    run.event("attempt_end", T0 + 20, 0, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.wall_clock_s == pytest.approx(20.0)
    # the only attempt's start-up (10 s before the first step) is startup, never restart
    assert b.startup_parts["init"] == pytest.approx(10.0)
    assert b.buckets["startup"] == pytest.approx(10.0) and b.buckets["restart"] == 0
    # median compute of [0.6, 0.6, 0.75, 0.6] is 0.6: 0.15 s a step waiting on rank 2
    assert b.buckets["straggler_wait"] == pytest.approx(1.5)
    assert b.buckets["productive"] == pytest.approx(8.5)
    assert b.goodput == pytest.approx(8.5 / 20)
    assert b.steps == {"kept": 10, "recomputed": 0, "incomplete": 0}


def test_async_checkpoint_counts_only_the_blocking_part_and_overlaps_once(store):
    run = Run(store)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(5)] + [T0 + 8 + i for i in range(5)])
    # async save: blocked 5.0-6.0, background write until 30; a second save overlapping it
    run.event("ckpt_save_start", T0 + 5, 0, step=5, tier="memory")
    run.event("ckpt_save_blocking_end", T0 + 6, 0, step=5, tier="memory")
    run.event("ckpt_save_start", T0 + 5.5, 0, step=5, tier="durable")
    run.event("ckpt_save_blocking_end", T0 + 7, 0, step=5, tier="durable")
    run.event("ckpt_save_durable_end", T0 + 30, 0, step=5, tier="durable", bytes=10**9)
    run.event("attempt_end", T0 + 13, 0, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.buckets["checkpoint_stall"] == pytest.approx(2.0)  # 5.0-7.0, counted once
    assert b.other_parts["unexplained"] == pytest.approx(1.0)  # 7.0-8.0: nothing explains it
    assert b.buckets["productive"] == pytest.approx(10.0)


def test_checkpoint_inside_a_step_is_stall_not_productive(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0, T0 + 1, T0 + 2], durs=[1.0, 1.0, 3.0])
    run.event("ckpt_save_start", T0 + 3, 0, step=3)
    run.event("ckpt_save_durable_end", T0 + 5, 0, step=3, bytes=1)  # synchronous, no blocking end
    run.event("attempt_end", T0 + 5, 0, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.buckets["checkpoint_stall"] == pytest.approx(2.0)
    assert b.buckets["productive"] == pytest.approx(3.0)


def test_steps_where_some_ranks_never_reported(store):
    run = Run(store)
    run.event("attempt_start", T0, 0)
    # rank 3 (the slow one) is missing from steps 2 and 3
    run.steps(0, 0, [T0 + i for i in range(5)], compute={3: 0.9}, skip={3: [2, 3]})
    run.event("attempt_end", T0 + 5, 0, cause="completed")
    acc = run.account()
    b = acc.breakdown()
    check_invariants(b)
    assert b.steps["incomplete"] == 2
    # with rank 3: median(0.6,0.6,0.6,0.9)=0.6 -> 0.3 wait; without it: no wait
    assert b.buckets["straggler_wait"] == pytest.approx(3 * 0.3)


def test_no_compute_split_is_not_measured_never_zero(store):
    run = Run(store)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(5)], split=False)
    run.event("attempt_end", T0 + 5, 0, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.buckets["straggler_wait"] is None
    assert b.straggler_wait_measured == 0.0
    assert b.buckets["productive"] == pytest.approx(5.0)
    assert b.as_dict()["buckets"]["straggler_wait"] is None


def test_failure_with_events_splits_restart_into_its_parts(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    run.event("init_start", T0, 0)
    run.event("init_end", T0 + 5, 0)
    run.steps(0, 0, [T0 + 5 + i for i in range(20)])  # steps 0-19, ends at +25
    run.event("ckpt_save_start", T0 + 15, 0, step=10)
    run.event("ckpt_save_blocking_end", T0 + 15, 0, step=10)
    run.event("failure_detected", T0 + 55, 0, cause="hang")  # hung 30 s after the last step
    run.event("attempt_start", T0 + 100, 1)  # waited 45 s for a node
    run.event("ckpt_restore_start", T0 + 110, 1, step=10)
    run.event("ckpt_restore_end", T0 + 120, 1, step=10)
    # resumes at step 10; the first step takes 4 s (compile), then 1 s each
    run.steps(1, 10, [T0 + 120, *[T0 + 124 + i for i in range(14)]],
              durs=[4.0] + [1.0] * 14)
    run.event("attempt_end", T0 + 138, 1, cause="completed")
    acc = run.account()
    b = acc.breakdown()
    check_invariants(b)
    assert b.wall_clock_s == pytest.approx(138.0)
    assert b.buckets["recompute"] == pytest.approx(10 + 1)  # steps 10-19 and the partial step
    # attempt 0's 5 s before its first step is the run's start-up (its first step, 1 s like
    # the others, has no warm-up); attempt 1's init, restore and warm-up are the restart's
    assert b.startup_parts == {"init": pytest.approx(5.0), "restore": 0.0, "warmup": 0.0}
    r = b.restart_parts
    assert r["detection"] == pytest.approx(29.0)
    assert r["queue"] == pytest.approx(45.0)
    assert r["init"] == pytest.approx(10.0)
    assert r["restore"] == pytest.approx(10.0)
    assert r["warmup"] == pytest.approx(3.0)
    assert b.buckets["restart"] == pytest.approx(29 + 45 + 10 + 10 + 3)
    assert b.buckets["productive"] == pytest.approx(10 + 15)
    a0, a1 = acc.by_attempt()
    assert (a0.wall_clock_s, a1.wall_clock_s) == pytest.approx((100.0, 38.0))
    assert a0.buckets["recompute"] == pytest.approx(11.0) and a1.buckets["recompute"] == 0
    assert a0.steps == {"kept": 10, "recomputed": 10, "incomplete": 0}
    for x in (a0, a1):
        check_invariants(x)


def test_the_first_start_up_is_startup_and_restart_runs_from_the_failure(store):
    """A long first start-up, a crash, a long re-init. The
    first start-up is ``startup``; ``restart`` is the crash to the next step (plus that
    step's warm-up), what the job's own clock calls the cost of the failure."""
    run = Run(store, ranks=4)
    run.event("attempt_start", T0, 0)
    run.event("ckpt_restore_start", T0 + 30, 0, step=0)  # a fine-tune: loads its weights
    run.event("ckpt_restore_end", T0 + 33, 0, step=0)
    # steps 0-29 from +35: the first 3 s (compile), then 1 s each; the last ends at +67
    run.steps(0, 0, [T0 + 35, *[T0 + 38 + i for i in range(29)]], durs=[3.0] + [1.0] * 29)
    run.event("failure", T0 + 67.5, 0, cause="exit:1")  # 0.5 s into step 30
    run.event("failure_detected", T0 + 69.5, 0, cause="launcher")
    run.event("attempt_start", T0 + 70.5, 1)
    run.event("ckpt_restore_start", T0 + 110.5, 1, step=20)  # re-init 40 s, restore 4 s
    run.event("ckpt_restore_end", T0 + 114.5, 1, step=20)
    # steps 20-39 from +114.5: the first 2 s, then 1 s each; the last ends at +135.5
    run.steps(1, 20, [T0 + 114.5, *[T0 + 116.5 + i for i in range(19)]],
              durs=[2.0] + [1.0] * 19)
    run.event("attempt_end", T0 + 135.5, 1, cause="completed")
    acc = run.account()
    b = acc.breakdown()
    check_invariants(b)
    assert b.wall_clock_s == pytest.approx(135.5)
    # start-up: 0 -> 35 (less the 3 s restore), and step 0's 3 s against a 1 s median
    assert b.startup_parts == {"init": pytest.approx(32.0), "restore": pytest.approx(3.0),
                               "warmup": pytest.approx(2.0)}
    assert b.buckets["startup"] == pytest.approx(37.0)
    # restart: crash +67.5 -> detected +69.5 -> attempt 1 at +70.5 -> restore +110.5-114.5
    # -> first step at +114.5 (47 s), plus its 2 s against a 1 s median
    assert b.restart_parts == {"detection": pytest.approx(2.0), "queue": pytest.approx(1.0),
                               "init": pytest.approx(40.0), "restore": pytest.approx(4.0),
                               "warmup": pytest.approx(1.0), "unattributed": 0.0}
    assert b.buckets["restart"] == pytest.approx(114.5 - 67.5 + 1.0)
    # steps 20-29 redone, and 0.5 s of step 30 in flight
    assert b.buckets["recompute"] == pytest.approx(10.5)
    # steps 0-19 (step 0: 1 s beyond its warm-up) and 20-39 (step 20 the same)
    assert b.buckets["productive"] == pytest.approx(20.0 + 20.0)
    assert b.buckets["startup"] + b.buckets["restart"] + b.buckets["recompute"] \
        + b.buckets["productive"] == pytest.approx(135.5)
    a0, a1 = acc.by_attempt()
    assert a0.wall_clock_s == pytest.approx(70.5) and a1.wall_clock_s == pytest.approx(65.0)
    assert a0.buckets["startup"] == pytest.approx(37.0)
    assert a0.buckets["restart"] == pytest.approx(2.0 + 1.0)  # detection and queue
    assert a1.buckets["startup"] == 0.0
    assert a1.buckets["restart"] == pytest.approx(40.0 + 4.0 + 1.0)
    for x in (a0, a1):
        check_invariants(x)
    # --exclude init takes the start-up's and the restart's init out together
    assert acc.breakdown(exclude=["init"]).excluded == {"init": pytest.approx(32.0 + 40.0)}


def test_a_first_attempt_that_fails_before_its_first_step(store):
    """Its time until its end is the run's start-up; from there the restart runs."""
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    run.event("failure_detected", T0 + 12, 0, cause="nccl")
    run.event("attempt_start", T0 + 20, 1)
    run.steps(1, 0, [T0 + 25 + i for i in range(5)])
    run.event("attempt_end", T0 + 30, 1, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.startup_parts["init"] == pytest.approx(12.0)
    assert b.restart_parts["queue"] == pytest.approx(8.0)
    assert b.restart_parts["init"] == pytest.approx(5.0)
    assert b.buckets["productive"] == pytest.approx(5.0)


def test_failure_without_event_is_inferred_from_a_reappearing_step(store):
    run = Run(store, ranks=2)
    run.steps(0, 0, [T0 + i for i in range(10)])
    run.steps(1, 6, [T0 + 30 + i for i in range(6)])  # steps 6.. again: rolled back to 6
    acc = run.account(now=T0 + 36)
    b = acc.breakdown()
    check_invariants(b)
    assert b.buckets["recompute"] == pytest.approx(4 + 1)
    assert b.restart_parts["unattributed"] == pytest.approx(30 - 10 - 1)
    assert acc.by_attempt()[0].attempt == 0
    assert store.attempts("r").end_reason.iloc[0] == "unknown"


def test_clock_offsets_between_hosts_keep_the_partition_and_the_numbers(store):
    run = Run(store)
    offsets = {0: 0.0, 1: 0.08, 2: -0.09, 3: 0.1}  # host clocks off by up to 100 ms
    run.event("attempt_start", T0 - 0.05, 0)
    run.steps(0, 0, [T0 + 10 + i for i in range(20)], offsets=offsets)
    run.event("ckpt_save_start", T0 + 30.07, 0, step=20)  # event clock 70 ms off
    run.event("ckpt_save_blocking_end", T0 + 32.07, 0, step=20)
    run.steps(0, 20, [T0 + 32 + i for i in range(40)], offsets=offsets)
    run.event("attempt_end", T0 + 72, 0, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    # truth: 60 steps of 1 s, a 2 s save in a 2 s gap, 10 s init
    assert b.buckets["productive"] == pytest.approx(60.0, abs=0.2)
    assert b.buckets["checkpoint_stall"] == pytest.approx(2.0, abs=0.2)
    assert b.startup_parts["init"] == pytest.approx(10.05, abs=0.2)


def test_run_in_progress_counts_wall_clock_up_to_now(store):
    run = Run(store)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + 5 + i for i in range(10)])
    acc = run.account(now=T0 + 20)
    b = acc.breakdown()
    check_invariants(b)
    assert b.in_progress and b.wall_clock_s == pytest.approx(20.0)
    assert b.other_parts["since_last_step"] == pytest.approx(5.0)
    later = run.account(now=T0 + 50).breakdown()
    assert later.wall_clock_s == pytest.approx(50.0)


def test_custom_intervals_are_other_by_label(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(5)] + [T0 + 25 + i for i in range(5)])
    run.event("custom_begin", T0 + 5, 0, label="eval")
    run.event("custom_end", T0 + 20, 0, label="eval")
    run.event("attempt_end", T0 + 30, 0, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.other_parts == {"eval": pytest.approx(15.0), "unexplained": pytest.approx(5.0)}


def test_gpu_time_view_shows_a_shrunk_world_and_idle_spares(store):
    run = Run(store, ranks=4, world_size=4, gpus_per_rank=2, tags={"spare_gpus": 2})
    run.event("attempt_start", T0, 0, world_size=4)
    run.steps(0, 0, [T0 + i for i in range(10)])
    run.event("attempt_end", T0 + 10, 0, cause="resized")
    run.event("attempt_start", T0 + 10, 1, world_size=2)
    run.ranks = 2
    run.steps(1, 10, [T0 + 10 + i for i in range(10)])
    run.event("attempt_end", T0 + 20, 1, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.goodput == pytest.approx(1.0)  # wall-clock looks perfect...
    g = b.gpu_seconds
    assert g["allocated"] == pytest.approx(20 * (4 * 2 + 2))
    assert g["productive"] == pytest.approx(10 * 8 + 10 * 4)
    assert g["idle_allocated"] == pytest.approx(10 * 2 + 10 * 6)
    assert b.gpu_time_goodput == pytest.approx(120 / 200)  # ...but 40% of GPU-time was idle


def test_windows_prorate_and_sum(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + 10 + i for i in range(10)])
    run.event("attempt_end", T0 + 20, 0, cause="completed")
    acc = run.account()
    w = acc.breakdown(T0 + 5, T0 + 15)
    check_invariants(w)
    assert w.startup_parts["init"] == pytest.approx(5.0)
    assert w.buckets["productive"] == pytest.approx(5.0)
    assert acc.breakdown(T0 - 100, T0 + 1000).wall_clock_s == pytest.approx(20.0)
    assert acc.breakdown(T0 + 30, T0 + 40).wall_clock_s == 0.0
    series = acc.goodput_series(window_s=5.0, points=5)
    # window ends at +5, +8.75, +12.5, +16.25, +20; steps run from +10
    assert list(series.goodput.round(6)) == [0.0, 0.0, 0.5, 1.0, 1.0]


def test_sample_trace_matches_its_recipe(tmp_path):
    from goodlens.collector.replay import import_trace
    from tests.harness import ROOT
    s = Store(tmp_path / "sample.duckdb")
    try:
        import_trace(s, ROOT / "sample_data" / "demo")
        b = account_run(s, "demo-8x").breakdown()
    finally:
        s.close()
    check_invariants(b)
    r = b.restart_parts
    # the recipe: init 40 s twice (the first attempt's is startup), restore 15 s, queue
    # 120 s, detection 60.4 s less the partial step, warm-up 5 s after the restart, five
    # 6-second saves; host clocks differ by up to 50 ms
    assert b.startup_parts["init"] == pytest.approx(40.0, abs=0.1)
    assert r["init"] == pytest.approx(40.0, abs=0.1)
    assert r["restore"] == pytest.approx(15.0, abs=0.1)
    assert r["queue"] == pytest.approx(120.0, abs=0.1)
    assert r["warmup"] == pytest.approx(5.0, abs=0.1)
    assert b.buckets["checkpoint_stall"] == pytest.approx(30.0, abs=0.1)
    assert r["detection"] + b.buckets["recompute"] == pytest.approx(60.4 + 38 * 1.05, abs=2.0)
    assert b.steps == {"kept": 600, "recomputed": 38, "incomplete": 0}


# ---------------------------------------------------------------------------- properties
@st.composite
def random_runs(draw):
    """A random run: attempts with random step counts, durations, rollbacks and events."""
    n_att = draw(st.integers(1, 4))
    t = T0
    attempts = []
    step = 0
    for a in range(n_att):
        start = t
        init = draw(st.floats(0, 20))
        n_steps = draw(st.integers(0, 15))
        durs = draw(st.lists(st.floats(0.01, 3), min_size=n_steps, max_size=n_steps))
        gaps = draw(st.lists(st.floats(0, 2), min_size=n_steps, max_size=n_steps))
        t = start + init
        starts = []
        for d, g in zip(durs, gaps):
            starts.append(t)
            t += d + g
        first = step
        step += n_steps
        events = [("attempt_start", start, {})] if draw(st.booleans()) else []
        if n_steps and draw(st.booleans()):  # a checkpoint somewhere, maybe async
            c0 = draw(st.floats(start, t))
            events.append(("ckpt_save_start", c0, {"step": first}))
            events.append(("ckpt_save_blocking_end", c0 + draw(st.floats(0, 5)),
                           {"step": first}))
        if draw(st.booleans()):
            c0 = draw(st.floats(start, t + 1))
            events.append(("custom_begin", c0, {"label": "eval"}))
            events.append(("custom_end", c0 + draw(st.floats(0, 10)), {"label": "eval"}))
        t += draw(st.floats(0, 30))
        ending = draw(st.sampled_from(["failure_detected", "attempt_end", None]))
        if ending and (a < n_att - 1 or draw(st.booleans())):
            events.append((ending, t, {"cause": "completed" if a == n_att - 1 else "gpu"}))
        t += draw(st.floats(0, 60))
        if a < n_att - 1 and n_steps:
            step = first + draw(st.integers(0, n_steps))  # roll back somewhere
        attempts.append((first, starts, durs, events))
    compute_slow = draw(st.floats(0.0, 0.5))
    split = draw(st.booleans())
    # data waits: none, or every rank's (a job-wide input stall, rank 1 starved longer)
    wait = draw(st.one_of(st.none(), st.floats(0.0, 1.0)))
    data = None if wait is None else {0: wait, 1: 2 * wait, 2: wait}
    return attempts, compute_slow, split, data, t


@pytest.fixture(scope="module")
def prop_store(tmp_path_factory) -> Iterator[tuple[Store, Iterator[int]]]:
    """One store for every example, each example its own run (opening a store per example
    was most of the test's time)."""
    s = Store(tmp_path_factory.mktemp("prop") / "p.duckdb")
    yield s, itertools.count()
    s.close()


@settings(max_examples=100, deadline=None)
@given(data=random_runs(), cuts=st.lists(st.floats(0, 1), min_size=2, max_size=6))
def test_buckets_are_nonnegative_and_sum_to_wall_clock_in_every_window(prop_store, data, cuts):
    attempts, slow, split, waits, end = data
    s, counter = prop_store
    rid = f"r{next(counter)}"
    run = Run(s, run_id=rid, ranks=3)
    for a, (first, starts, durs, events) in enumerate(attempts):
        if starts:
            run.steps(a, first, starts, durs=durs, compute={1: 0.01 + slow}, split=split,
                      data=waits)
        for kind, t, fields in events:
            run.event(kind, t, a, **fields)
    if s.run(rid) is None or s.attempts(rid).empty:
        return
    acc = run.account(now=end)
    whole = acc.breakdown()
    check_invariants(whole)
    assert set(whole.buckets) == set(BUCKETS)
    assert set(whole.restart_parts) == set(RESTART_PARTS)
    assert set(whole.startup_parts) == set(STARTUP_PARTS)
    # startup is the first attempt's alone
    assert all(x.buckets["startup"] == 0 for x in acc.by_attempt()[1:])
    assert whole.wall_clock_s == pytest.approx(acc.end - acc.start)
    # segments tile the run: contiguous, no gaps, no overlaps
    assert np.allclose(acc.seg_start[1:], acc.seg_end[:-1])
    for x in acc.by_attempt():
        check_invariants(x)
    assert sum(x.wall_clock_s for x in acc.by_attempt()) == pytest.approx(whole.wall_clock_s)
    span = acc.end - acc.start
    edges = sorted(acc.start + c * span for c in cuts)
    windows = [acc.breakdown(lo, hi) for lo, hi in itertools.pairwise(edges)]
    for w in windows:
        check_invariants(w)
        assert 0 <= w.goodput <= 1 + 1e-9
    # adjacent windows add up to the window that spans them
    total = acc.breakdown(edges[0], edges[-1])
    for b in BUCKETS:
        parts = [w.buckets[b] for w in windows]
        if total.buckets[b] is None:
            assert all(p is None for p in parts)
        else:
            assert sum(parts) == pytest.approx(total.buckets[b], abs=1e-6)
    if not split:
        assert whole.buckets["straggler_wait"] is None
    assert not math.isnan(whole.goodput)


def test_every_rank_emitting_its_own_checkpoint_events_counts_each_save_once(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    starts = []
    t = T0
    for _ in range(50):  # 50 steps, a 2 s save after each
        starts.append(t)
        t += 3.0
    run.steps(0, 0, starts)
    ranks = 200
    seqs = list(range(100))
    for r in range(ranks):  # each rank's own save_start / blocking_end, 10 ms apart
        kinds, times = [], []
        for k in range(50):
            kinds += ["ckpt_save_start", "ckpt_save_blocking_end"]
            times += [T0 + 3 * k + 1.0 + 0.00005 * r, T0 + 3 * k + 3.0 - 0.00005 * r]
        store.write_group([validate_batch({
            "schema_version": 1, "run_id": "r",
            "events": {"source": f"rank{r}", "seq": seqs, "kind": kinds, "time": times,
                       "attempt": 0, "step": [k for k in range(50) for _ in (0, 1)]}})])
    run.event("attempt_end", t, 0, cause="completed")
    b = run.account().breakdown()  # 20,000 events, paired with vectorised as-of joins
    check_invariants(b)
    assert b.buckets["checkpoint_stall"] == pytest.approx(50 * 2.0, abs=1e-6)


def test_a_crash_during_a_save_stalls_only_until_its_attempt_ends(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(5)])
    run.event("ckpt_save_start", T0 + 5, 0, step=5)  # never ends: the node died mid-save
    run.event("failure_detected", T0 + 8, 0, cause="gpu")
    run.event("attempt_start", T0 + 10, 1)
    run.steps(1, 0, [T0 + 10 + i for i in range(30)])
    run.event("attempt_end", T0 + 40, 1, cause="completed")
    acc = run.account()
    b = acc.breakdown()
    check_invariants(b)
    assert b.buckets["productive"] == pytest.approx(30.0)  # attempt 1 is not "stalled"
    assert acc.breakdown(attempt=1).buckets["checkpoint_stall"] == 0.0


def test_run_in_progress_after_an_earlier_failure(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(5)])
    run.event("failure_detected", T0 + 10, 0, cause="gpu")
    run.event("attempt_start", T0 + 20, 1)
    run.steps(1, 0, [T0 + 20 + i for i in range(10)])
    b = run.account(now=T0 + 60).breakdown()
    check_invariants(b)
    assert b.in_progress
    assert b.other_parts["since_last_step"] == pytest.approx(30.0)
    assert b.restart_parts["detection"] == pytest.approx(4.0)  # only attempt 0's hang


def test_attempt_end_without_a_cause_is_a_clean_end(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(5)])
    run.event("attempt_end", T0 + 6, 0)
    b = run.account().breakdown()
    check_invariants(b)
    assert b.buckets["recompute"] == 0 and b.buckets["restart"] == 0
    assert b.other_parts["shutdown"] == pytest.approx(1.0)
    assert store.runs().iloc[0].state == "ended"


def test_a_resize_inside_an_attempt_changes_gpus_from_then_on(store):
    run = Run(store, ranks=8, world_size=8)
    run.event("attempt_start", T0, 0, world_size=8)
    run.steps(0, 0, [T0 + i for i in range(20)])
    run.event("world_resized", T0 + 19.0, 0, world_size=4)
    run.event("attempt_end", T0 + 20, 0, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.gpu_seconds["allocated"] == pytest.approx(160.0)
    assert b.gpu_seconds["idle_allocated"] == pytest.approx(4.0)  # the last step ran on 4


def test_a_memory_save_with_only_a_durable_end_is_not_paired_with_the_next_save(store):
    run = Run(store, ranks=2)
    run.event("attempt_start", T0, 0)
    run.steps(0, 0, [T0 + i for i in range(3)] + [T0 + 4 + i for i in range(3)]
              + [T0 + 10 + i for i in range(3)])
    # memory-tier save at 3.0-4.0 reports only its durable end (the peer copy is done)
    run.event("ckpt_save_start", T0 + 3, 0, step=3, tier="memory")
    run.event("ckpt_save_durable_end", T0 + 4, 0, step=3, tier="memory")
    # a durable save later, 7.0-10.0, with a blocking end
    run.event("ckpt_save_start", T0 + 7, 0, step=6, tier="durable")
    run.event("ckpt_save_blocking_end", T0 + 10, 0, step=6, tier="durable")
    run.event("attempt_end", T0 + 13, 0, cause="completed")
    b = run.account().breakdown()
    check_invariants(b)
    assert b.buckets["checkpoint_stall"] == pytest.approx(1.0 + 3.0)


def test_goodput_series_equals_window_breakdowns(tmp_path):
    """The vectorised rolling series (prefix sums) gives each window's breakdown shares."""
    from goodlens.analysis.accounting import BUCKETS
    from goodlens.collector.replay import import_trace
    from tests.harness import ROOT
    s = Store(tmp_path / "sample.duckdb")
    try:
        import_trace(s, ROOT / "sample_data" / "sim-64")
        s.summarize_dirty()
        acc = account_run(s, "sim-64")
    finally:
        s.close()
    for w in (None, 300.0, 5000.0):
        series = acc.goodput_series(window_s=w, points=37)
        width = w or (acc.end - acc.start) / 20
        for row in series.itertuples():
            b = acc.breakdown(max(acc.start, row.time - width), row.time)
            for bucket in BUCKETS:
                want = (b.buckets[bucket] or 0.0) / b.wall_clock_s
                # epoch-second doubles resolve about 0.2 us: shares agree to 1e-6
                assert getattr(row, bucket) == pytest.approx(want, abs=1e-6), (w, bucket)
        assert np.allclose(series[list(BUCKETS)].sum(axis=1), 1.0)
