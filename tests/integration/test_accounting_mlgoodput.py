"""An independent check of goodlens's time accounting against Google's ml-goodput-measurement.

ml-goodput-measurement (github.com/AI-Hypercomputer/ml-goodput-measurement, v0.2.3, commit
57092cf) computes goodput and badput types from recorded job/step/checkpoint timestamps. Its
``ml_goodput_measurement/tests/goodput_test.py`` builds small hand-made timelines with expected
values. Each test here rebuilds one of them in goodlens (steps and events through a real store)
and asserts goodlens's buckets against numbers written out by hand, each with where it comes
from (their badput type -> our bucket). Nothing expected is computed with goodlens code.

How their timelines become ours:

- Their steps are *step start times*; a step lasts until the next step starts (the last one
  until the job ends, if it ended). Ours are step records with a start and a duration, so each
  step N here lasts from their start of N to their start of N+1.
- Their TPU initialization, training preparation and (first, synchronous) data loading, and any
  unrecorded time before the first step (their OTHER), are our ``init``: attempt start to
  first step, ``startup.init`` for the first attempt and ``restart.init`` for a later one. We
  record ``init_start``/``init_end`` where they record TPU init; goodlens stores them but does
  not split ``init`` by them today.
- Their PROGRAM_STARTUP (first step's time beyond the average of the segment's other steps) is
  our ``warmup`` (first step's excess over the attempt's *median* step): ``startup.warmup``
  for the first attempt, ``restart.warmup`` for a later one.
- Their WASTED_PROGRESS_FROM_DISRUPTION (steps at or beyond the restart step, timed start to
  next start) is our ``recompute``; our ``recompute`` also holds the step in flight at the
  failure, which they put in INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION (last step start to the
  restart's job start). The rest of that recovery is our ``restart.detection`` + ``queue``.
- Their UNPRODUCTIVE_CHECKPOINT_SAVE_TIME / _RESTORE_TIME are our ``checkpoint_stall`` /
  ``restart.restore``. Their CUSTOM_BADPUT_EVENTS[label] are our ``other.<label>``.
- Their data loading *inside* steps (DATA_LOADING_ASYNC) is productive in both tools; goodlens
  has no data-loading badput: a step's ``data_wait_s`` is stored but stays in ``productive``.

Some tests encode behaviour added with this comparison: a custom interval recorded *inside*
a step record is taken out of productive into
``other_parts[label]``, and a ``failure`` event (the instant the failure happened) ends the
in-flight step's recompute there, with ``restart.detection`` from it to ``failure_detected``.
docs/accounting.md ("Compared with ml-goodput-measurement") has the side-by-side
numbers.
"""

from __future__ import annotations

import pytest

from goodlens.analysis.accounting import account_run
from goodlens.model.batch import validate_batch
from goodlens.storage.store import Store

T0 = 10_000.0
"""Their job start (_TEST_JOB_START_TIME); every time below is seconds after it."""


class Run:
    """Writes a synthetic run into a real store: steps (every rank alike) and events."""

    def __init__(self, store: Store, run_id: str = "mlg", ranks: int = 2) -> None:
        self.store, self.run_id, self.ranks = store, run_id, ranks
        self.seq = 0

    def steps(self, attempt: int, first: int, starts: list[float], ends: list[float]) -> None:
        """Steps ``first``.. running ``[starts[i], ends[i]]`` (seconds after T0) on every rank,
        each rank computing 60% of the step (no straggler: straggler wait is measured as 0)."""
        for r in range(self.ranks):
            dur = [e - s for s, e in zip(starts, ends)]
            cols = {"attempt": attempt, "rank": r, "host": f"h{r}",
                    "step": [first + i for i in range(len(starts))],
                    "start_time": [T0 + s for s in starts], "duration_s": dur,
                    "compute_s": [0.6 * d for d in dur],
                    "collective_wait_s": [0.4 * d for d in dur]}
            self.store.write_group([validate_batch({"schema_version": 1, "run_id": self.run_id,
                                                    "steps": cols})])

    def event(self, kind: str, t: float, attempt: int, **fields) -> None:
        self.store.write_group([validate_batch({
            "schema_version": 1, "run_id": self.run_id,
            "events": {"source": "test", "seq": [self.seq], "kind": [kind], "time": [T0 + t],
                       "attempt": attempt, **{k: [v] for k, v in fields.items()}}})])
        self.seq += 1

    def breakdown(self, since: float | None = None, until: float | None = None, *,
                  as_of: float | None = None, now: float | None = None,
                  exclude: tuple[str, ...] = ()):
        """The run's breakdown, or of the window ``[since, until]``; ``as_of``: the run as
        known at that instant; ``now``: the clock for a run in progress (all seconds after
        T0); ``exclude``: as ``goodlens report --exclude``."""
        self.store.summarize_dirty()
        acc = account_run(self.store, self.run_id,
                          now=None if now is None else T0 + now,
                          as_of=None if as_of is None else T0 + as_of)
        return acc.breakdown(None if since is None else T0 + since,
                             None if until is None else T0 + until, exclude=exclude)


def approx(x: float):
    return pytest.approx(x, abs=1e-6)


def assert_partition(b) -> None:
    """The buckets, startup, restart and other parts add up (goodlens's own invariant)."""
    values = [v for v in b.buckets.values() if v is not None]
    assert sum(values) == approx(b.wall_clock_s)
    assert sum(b.startup_parts.values()) == approx(b.buckets["startup"])
    assert sum(b.restart_parts.values()) == approx(b.buckets["restart"])
    assert sum(b.other_parts.values()) == approx(b.buckets["other"])


def start_up(run: Run, attempt: int, t: float) -> None:
    """Their TPU init (1 s), training prep (2 s) and data loading (2 s) from ``t``: an
    attempt start, then init_start/init_end around the TPU init."""
    run.event("attempt_start", t, attempt)
    run.event("init_start", t, attempt)
    run.event("init_end", t + 1, attempt)


# Their disruption timeline (BadputTest, goodput_test.py), seconds after job start:
#   0-1 TPU init, 1-3 training prep, 3-5 data loading;
#   step 0 5-13 (3 s + 5 s first-step extra), steps 1-4 start at 13, 16, 19, 22 (3 s each);
#   the loop ends at 25, then a 5 s disruption: the job starts again at 30;
#   30-35 start-up (not recorded again: their OTHER), step 2 35-43 (3 s + 5 s extra),
#   step 3 43-46, step 4 46-49, job end 49.
# Step 4 of the first attempt was in flight: its start (22) is recorded, nothing after.
A0_STARTS, A0_ENDS = [5, 13, 16, 19], [13, 16, 19, 22]  # steps 0-3 (step 4 in flight)
A1_STARTS, A1_ENDS = [35, 43, 46], [43, 46, 49]  # steps 2-4 again


def test_clean_run(store):
    """GoodputTest.test_goodput_calculator: startup 5 s, steps 0-4 of 3 s, end at 20.
    Theirs: goodput 75% (15 s / 20 s, asserted), OTHER 5 s (the unrecorded start-up; their
    calculator, not asserted)."""
    run = Run(store)
    run.event("attempt_start", 0, 0)
    run.steps(0, 0, [5, 8, 11, 14, 17], [8, 11, 14, 17, 20])
    run.event("attempt_end", 20, 0, cause="completed")
    b = run.breakdown()
    assert_partition(b)
    assert b.wall_clock_s == approx(20.0)  # their total_time: job end - job start
    assert b.buckets["productive"] == approx(15.0)  # their productive: 5 steps x 3 s
    assert b.goodput == approx(0.75)  # their expected_goodput 75.0 (%)
    # their OTHER 5 s (start-up nobody recorded) -> our startup.init: attempt start to first
    # step is start-up by definition in goodlens, recorded or not
    assert b.startup_parts["init"] == approx(5.0)
    assert b.buckets["restart"] == approx(0.0)
    assert b.buckets["straggler_wait"] == approx(0.0)  # no such type in theirs
    assert b.buckets["other"] == approx(0.0)
    # they return the last productive step number (4); we count steps (0-4 kept)
    assert b.steps["kept"] == 5


def test_program_startup(store):
    """BadputTest.test_badput_calculator_program_startup: TPU init 1 s, training prep 2 s,
    data loading 2 s, first step 3 s + 5 s, then 4 steps of 3 s; total 25 s.
    Theirs: PROGRAM_STARTUP 5 (asserted), productive 15 (goodput 60%); TPU_INITIALIZATION 1,
    TRAINING_PREP 2, DATA_LOADING_SYNC 2 (their calculator; the sibling tests
    test_badput_calculator_tpu_initialization/_training_preparation/_sync_data_loading assert
    these on the same start-up)."""
    run = Run(store)
    start_up(run, 0, 0)
    run.steps(0, 0, [5, 13, 16, 19, 22], [13, 16, 19, 22, 25])
    run.event("attempt_end", 25, 0, cause="completed")
    b = run.breakdown()
    assert_partition(b)
    assert b.wall_clock_s == approx(25.0)  # their total_time
    assert b.goodput == approx(15 / 25)  # their goodput 60%
    assert b.buckets["productive"] == approx(15.0)  # 5 steps x 3 s
    # TPU_INITIALIZATION 1 + TRAINING_PREP 2 + DATA_LOADING_SYNC 2 -> startup.init 5 (one part;
    # goodlens does not split start-up by init_start/init_end or data loading today)
    assert b.startup_parts["init"] == approx(1 + 2 + 2)
    # PROGRAM_STARTUP 5 (first step 8 s - average 3 s) -> startup.warmup 5 (8 s - median 3 s)
    assert b.startup_parts["warmup"] == approx(5.0)
    assert b.buckets["restart"] == approx(0.0)
    assert b.buckets["recompute"] == approx(0.0)
    assert b.buckets["other"] == approx(0.0)  # their OTHER: 0


def _disruption_run(store, failure_at: float | None) -> Run:
    """Their disruption timeline; the failure is detected at 27 (they record no detection:
    we place it 2 s after the loop's end, to give detection and queue a non-zero share of
    their 5 s disruption), attempt 1 starts at 30 as theirs."""
    run = Run(store)
    start_up(run, 0, 0)
    run.steps(0, 0, A0_STARTS, A0_ENDS)
    if failure_at is not None:
        run.event("failure", failure_at, 0, cause="hardware", rank=1)
    run.event("failure_detected", 27, 0, cause="hardware", rank=1)
    start_up(run, 1, 30)
    run.steps(1, 2, A1_STARTS, A1_ENDS)
    run.event("attempt_end", 49, 1, cause="completed")
    return run


def test_disruption_with_wasted_progress(store):
    """BadputTest.test_badput_calculator_wasted_progress_and_disruptions (the same timeline and
    values as ..._program_startup_with_disruptions, ..._infrastructure_badput_from_disruption
    and test_goodput_badput_with_interval_query). No ``failure`` event: the step in flight is
    estimated as one median step (goodlens's behaviour without one).
    Theirs (49 s): productive 15 (goodput 30.6%), WASTED_PROGRESS 6, INFRASTRUCTURE_RECOVERY 8,
    PROGRAM_STARTUP 10, TPU_INITIALIZATION 1, TRAINING_PREP 2, data loading 2, and the
    second attempt's 5 s start-up nobody recorded (OTHER). (Their calculator actually reports
    DATA_LOADING_SYNC 4 and OTHER 3: it counts attempt 0's data loading again at the restart;
    their tests do not assert either.)"""
    b = _disruption_run(store, failure_at=None).breakdown()
    assert_partition(b)
    assert b.wall_clock_s == approx(49.0)  # their total_time
    assert b.buckets["productive"] == approx(15.0)  # their _TEST_STEP_TIME * 5
    assert b.goodput == approx(15 / 49)  # their interval-query goodput 30.6%
    # WASTED_PROGRESS_FROM_DISRUPTION 6 (steps 2 and 3 of attempt 0, 16-22) -> recompute 6,
    # plus the step in flight (step 4, from 22), one median step (3 s): 22-25. They put that
    # in INFRASTRUCTURE_RECOVERY (from step 4's start).
    assert b.buckets["recompute"] == approx(6 + 3)
    # INFRASTRUCTURE_RECOVERY 8 (22 -> 30) = in-flight step 3 (above) + detection + queue:
    assert b.restart_parts["detection"] == approx(27 - 25)  # partial step's end -> detected
    assert b.restart_parts["queue"] == approx(30 - 27)  # detected -> attempt 1 starts
    # PROGRAM_STARTUP 10 (5 s extra in the first step of each segment) -> startup.warmup 5
    # (attempt 0) + restart.warmup 5 (attempt 1)
    assert b.startup_parts["warmup"] == approx(5.0)
    assert b.restart_parts["warmup"] == approx(5.0)
    # TPU_INITIALIZATION 1 + TRAINING_PREP 2 + data loading 2 (attempt 0) -> startup.init 5;
    # their OTHER (attempt 1's unrecorded 5 s start-up) -> restart.init 5
    assert b.startup_parts["init"] == approx(5.0)
    assert b.restart_parts["init"] == approx(5.0)
    assert b.buckets["other"] == approx(0.0)
    assert b.steps == {"kept": 5, "recomputed": 2, "incomplete": 0}


def test_disruption_with_a_failure_event(store):
    """The same timeline with the new ``failure`` event. Their model cannot say when, in the
    22-30 gap, the failure happened (they charge all of it from step 4's start to the restart);
    here it happened 1.5 s into step 4, at 23.5, and was detected at 27. goodlens's in-flight
    step is recompute up to the failure instant (not one median step), and detection runs
    from the failure to failure_detected."""
    b = _disruption_run(store, failure_at=23.5).breakdown()
    assert_partition(b)
    assert b.wall_clock_s == approx(49.0)
    assert b.buckets["productive"] == approx(15.0)  # unchanged: their productive 15
    # WASTED_PROGRESS 6 (steps 2-3) + step 4's 1.5 s before the failure (22 -> 23.5)
    assert b.buckets["recompute"] == approx(6 + 1.5)
    assert b.restart_parts["detection"] == approx(27 - 23.5)  # failure -> failure_detected
    assert b.restart_parts["queue"] == approx(30 - 27)
    # their INFRASTRUCTURE_RECOVERY 8 is still in-flight part + detection + queue = 1.5+3.5+3
    # their PROGRAM_STARTUP 10 -> startup.warmup 5 (attempt 0) + restart.warmup 5 (attempt 1)
    assert b.startup_parts["warmup"] == approx(5.0)
    assert b.restart_parts["warmup"] == approx(5.0)
    # their start-up types (attempt 0) -> startup.init 5; OTHER (attempt 1) -> restart.init 5
    assert b.startup_parts["init"] == approx(5.0)
    assert b.restart_parts["init"] == approx(5.0)
    assert b.steps == {"kept": 5, "recomputed": 2, "incomplete": 0}


# Their test_goodput_badput_with_interval_query (goodput_test.py) records the disruption
# timeline above and queries two windows with get_job_goodput_interval: the whole job
# [job start - 1 us, 49] and [job start - 1 us, 25], which ends at their loop's end, before
# the disruption is known (step 4 started at 22 and was still running at 25).
#
# Their interval query reads only the records inside the window, and its total is
# min(until, last record in the window) - max(since, first record): for [0, 25] that is
# 22 - 0 = 22 s, because step 4's start at 22 is the last record. The 3 s of step 4 in flight
# (22-25) are in no type and out of the total. goodlens's window is until - since, clipped
# to the run: 25 s, every second in a bucket. Hence 12/22 = 54.5% against 12/25 = 48.0%.
# Their own cumulative query (get_job_goodput) asked at 25 s, on the records up to 25 s, also
# gives 12/25 = 48.0%, with OTHER 3 s (their v0.2.3 calculator run on these records).

def _live_until_25(store) -> Run:
    """The same job as recorded by 25 s, while it still ran: attempt 0's start-up and steps
    0-3, step 4 in flight since 22, nothing known of the failure."""
    run = Run(store)
    start_up(run, 0, 0)
    run.steps(0, 0, A0_STARTS, A0_ENDS)
    return run


def test_interval_query_whole_job(store):
    """test_goodput_badput_with_interval_query, first window [job start - 1 us, 49]: the whole
    job, the same numbers as test_disruption_with_wasted_progress. Theirs (asserted): total
    49 s, goodput 15/49 = 30.6%, WASTED_PROGRESS 6/49 = 12.2%, 1 disruption, last step 4.
    goodlens clips the window's start to the run's start, so the 1 us before it is not
    counted: 49 s, not 49.000001."""
    b = _disruption_run(store, failure_at=None).breakdown(since=-1e-6, until=49)
    assert_partition(b)
    assert b.wall_clock_s == approx(49.0)
    assert b.goodput == approx(15 / 49)  # theirs 30.6%
    assert b.buckets["productive"] == approx(15.0)
    assert b.buckets["recompute"] == approx(6 + 3)  # WASTED_PROGRESS 6 + step 4 in flight
    assert b.restart_parts["detection"] == approx(2.0)
    assert b.restart_parts["queue"] == approx(3.0)
    # attempt 0's start-up: startup (TPU init 1 + prep 2 + data loading 2; PROGRAM_STARTUP 5)
    assert b.startup_parts["init"] == approx(5.0)
    assert b.startup_parts["warmup"] == approx(5.0)
    assert b.buckets["startup"] == approx(5 + 5)
    # attempt 1's start-up (their OTHER 5; PROGRAM_STARTUP 5) is restart's
    assert b.restart_parts["init"] == approx(5.0)
    assert b.restart_parts["warmup"] == approx(5.0)
    assert b.buckets["restart"] == approx(2 + 3 + 5 + 5)
    assert b.buckets["checkpoint_stall"] == approx(0.0)
    assert b.buckets["straggler_wait"] == approx(0.0)
    assert b.buckets["other"] == approx(0.0)


@pytest.mark.parametrize("known", ["as_of_25", "recorded_until_25"])
def test_interval_query_window_ending_before_the_disruption(store, known):
    """test_goodput_badput_with_interval_query, second window [job start - 1 us, 25], read as
    the job was known at 25 s: goodlens ``--as-of 25 --until 25`` on the whole job's records,
    and the same job as recorded by 25 s while it ran (``now`` = 25). Both must give the same
    numbers: nothing after the window's end may move them.

    Theirs (asserted): total 22 s (the window ends at the last record in it, step 4's start
    at 22), productive 12 s (steps 0-3, each start to next start: 8 + 3 + 3 + 3, less
    PROGRAM_STARTUP 5), goodput 12/22 = 54.5%, WASTED_PROGRESS 0, 0 disruptions, last step 3.
    Their calculator: TPU_INITIALIZATION 1, TRAINING_PREP 2, DATA_LOADING_SYNC 2,
    PROGRAM_STARTUP 5, OTHER 0 (1 + 2 + 2 + 5 + 12 = 22).

    goodlens: 25 s = startup.init 5 (0-5) + startup.warmup 5 (step 0's 8 s - median 3 s) +
    productive 12 (3 + 3 + 3 + 3: steps 0-3) + other.since_last_step 3 (22-25: step 4 in
    flight, not known to have ended or failed); goodput 12/25 = 48.0%. The same 48.0% as
    their cumulative query at 25 s (OTHER 3 s there). Their 54.5% is goodlens's window with
    ``--exclude since_last_step``: 12 / (25 - 3)."""
    if known == "as_of_25":
        run, at = _disruption_run(store, failure_at=None), {"as_of": 25}
    else:
        run, at = _live_until_25(store), {"now": 25}
    b = run.breakdown(since=-1e-6, until=25, **at)
    assert_partition(b)
    assert b.wall_clock_s == approx(25.0)  # theirs 22: 22-25 left out of the window
    assert b.goodput == approx(12 / 25)  # theirs 12/22 = 54.5%
    assert b.buckets["productive"] == approx(12.0)  # their productive 12
    # TPU_INITIALIZATION 1 + TRAINING_PREP 2 + DATA_LOADING_SYNC 2 -> startup.init 5
    assert b.startup_parts["init"] == approx(5.0)
    assert b.startup_parts["warmup"] == approx(5.0)  # PROGRAM_STARTUP 5
    assert b.buckets["startup"] == approx(5 + 5)
    assert b.buckets["restart"] == approx(0.0)  # no failure known at 25 s
    # step 4 from 22 to the window's end: in their total only in the cumulative query (OTHER)
    assert b.other_parts == {"since_last_step": approx(3.0)}
    assert b.buckets["recompute"] == approx(0.0)  # WASTED_PROGRESS 0: no rollback known
    assert b.buckets["checkpoint_stall"] == approx(0.0)
    assert b.buckets["straggler_wait"] == approx(0.0)
    assert b.in_progress  # at 25 s the job was running
    whole = run.breakdown(**at)
    assert whole.wall_clock_s == approx(25.0)  # the run as known at 25 s is this window
    # their last step 3 and 0 disruptions: steps 0-3 done, none rolled back
    assert whole.steps == {"kept": 4, "recomputed": 0, "incomplete": 0}
    # their 54.5%: the window without the time after its last record
    theirs = run.breakdown(since=-1e-6, until=25, exclude=("since_last_step",), **at)
    assert theirs.wall_clock_s == approx(22.0)
    assert theirs.goodput == approx(12 / 22)
    assert theirs.excluded == {"since_last_step": approx(3.0)}


@pytest.mark.parametrize("failure_at", [None, 23.5])
def test_interval_query_window_ending_before_the_disruption_with_hindsight(store, failure_at):
    """The same window [job start - 1 us, 25] cut from the whole job's accounting (goodlens's
    default, no ``--as-of``): with hindsight, attempt 1 restarted from step 2, so steps 2 and 3
    (16-22) were lost even though the window ends before anyone knew. Their interval query
    reads only the window's records and cannot say so (WASTED_PROGRESS 0, goodput 54.5%).

    No ``failure`` event: 25 s = startup.init 5 + startup.warmup 5 + productive 6 (steps 0,
    1: 3 + 3) + recompute 9 (steps 2-3: 6, step 4 in flight from 22 estimated as one median
    step: 3); goodput 6/25 = 24.0%. A ``failure`` at 23.5: recompute 6 + 1.5 (22-23.5) and
    restart.detection 1.5 (23.5 to the window's end; it runs on to failure_detected at 27)."""
    b = _disruption_run(store, failure_at=failure_at).breakdown(since=-1e-6, until=25)
    assert_partition(b)
    assert b.wall_clock_s == approx(25.0)
    assert b.goodput == approx(6 / 25)
    assert b.buckets["productive"] == approx(6.0)
    assert b.startup_parts["init"] == approx(5.0)
    assert b.startup_parts["warmup"] == approx(5.0)
    assert b.buckets["startup"] == approx(5 + 5)
    if failure_at is None:
        assert b.buckets["recompute"] == approx(6 + 3)
        assert b.restart_parts["detection"] == approx(0.0)
    else:
        assert b.buckets["recompute"] == approx(6 + 1.5)
        assert b.restart_parts["detection"] == approx(25 - 23.5)
    assert b.restart_parts["queue"] == approx(0.0)
    assert b.buckets["restart"] == approx(0.0 if failure_at is None else 1.5)
    assert b.buckets["other"] == approx(0.0)
    assert b.buckets["checkpoint_stall"] == approx(0.0)
    assert b.buckets["straggler_wait"] == approx(0.0)


def test_synchronous_checkpoint_save_and_restore(store):
    """BadputTest.test_badput_calculator_checkpoint_badput: the disruption timeline plus a
    synchronous save of step 1 (checkpoint manager blocking 6 s) and a restore (2 s).
    Theirs: UNPRODUCTIVE_CHECKPOINT_SAVE_TIME 6, _RESTORE_TIME 2, WASTED_PROGRESS 6 (of 49 s),
    and productive 15 - 6 = 9 (goodput 18.4%).

    Their save/restore records carry placeholder times (10.0 s after the epoch, outside the
    job), so their calculator never places them: it subtracts the 6 s save from productive
    time although the recorded steps leave no room for it. goodlens needs a place, so we make
    the timeline physical: the save blocks training right after step 1 (16-22), which pushes
    everything after it 6 s later (run 55 s), and the restore takes the last 2 s of attempt 1's
    5 s start-up (39-41). goodlens then keeps productive at 15: the save is stall, not
    taken out of steps that were never slowed. (Their calculator on this 55 s timeline gives
    productive 20 - the save inflates the average step, hiding attempt 0's 5 s first-step
    extra - see docs/accounting.md.)"""
    run = Run(store)
    start_up(run, 0, 0)
    run.steps(0, 0, [5, 13, 22, 25], [13, 16, 25, 28])  # steps 0-3; step 4 in flight from 28
    run.event("ckpt_save_start", 16, 0, step=1, tier="durable")
    run.event("ckpt_save_durable_end", 22, 0, step=1, tier="durable", bytes=1)  # synchronous
    run.event("failure_detected", 33, 0, cause="hardware")  # their loop ends at 31, +2 s
    start_up(run, 1, 36)  # their 5 s disruption after 31
    run.event("ckpt_restore_start", 39, 1, step=1)
    run.event("ckpt_restore_end", 41, 1, step=1)
    run.steps(1, 2, [41, 49, 52], [49, 52, 55])
    run.event("attempt_end", 55, 1, cause="completed")
    b = run.breakdown()
    assert_partition(b)
    assert b.wall_clock_s == approx(55.0)  # their 49 s + the 6 s the save blocked
    assert b.buckets["productive"] == approx(15.0)  # 5 steps x 3 s (theirs: 15 - 6 = 9)
    assert b.goodput == approx(15 / 55)
    # UNPRODUCTIVE_CHECKPOINT_SAVE_TIME 6 -> checkpoint_stall 6
    assert b.buckets["checkpoint_stall"] == approx(6.0)
    # UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME 2 -> restart.restore 2 (attempt 1's start-up)
    assert b.restart_parts["restore"] == approx(2.0)
    assert b.startup_parts["restore"] == approx(0.0)
    # WASTED_PROGRESS 6 (steps 2, 3) -> recompute 6, + the in-flight step 4 (one median step)
    assert b.buckets["recompute"] == approx(6 + 3)
    # INFRASTRUCTURE_RECOVERY 8 (28 -> 36) = 3 (above) + detection 2 + queue 3
    assert b.restart_parts["detection"] == approx(2.0)
    assert b.restart_parts["queue"] == approx(3.0)
    # PROGRAM_STARTUP 10 -> startup.warmup 5 + restart.warmup 5; start-up 5 -> startup.init 5,
    # attempt 1's 5 - 2 restore -> restart.init 3
    assert b.startup_parts["warmup"] == approx(5.0)
    assert b.restart_parts["warmup"] == approx(5.0)
    assert b.startup_parts["init"] == approx(5.0)
    assert b.restart_parts["init"] == approx(3.0)
    assert b.buckets["other"] == approx(0.0)


def test_custom_eval_between_steps(store):
    """BadputTest.test_badput_calculator_custom_sync_badput: TPU init 1 s, program startup
    5 s, steps 0-4 (3 s each, from 6), an 'eval_step' custom badput event 21-26, steps 5-9
    (from 26), end at 41.
    Theirs: CUSTOM_BADPUT_EVENTS['EVAL_STEP'] 5 (12.2%) and goodput 30/41 = 73.2% (asserted);
    TPU init 1, OTHER 5 (the unrecorded startup; their calculator)."""
    run = Run(store)
    run.event("attempt_start", 0, 0)
    run.event("init_start", 0, 0)
    run.event("init_end", 1, 0)
    run.steps(0, 0, [6, 9, 12, 15, 18], [9, 12, 15, 18, 21])
    run.event("custom_begin", 21, 0, label="eval_step")
    run.event("custom_end", 26, 0, label="eval_step")
    run.steps(0, 5, [26, 29, 32, 35, 38], [29, 32, 35, 38, 41])
    run.event("attempt_end", 41, 0, cause="completed")
    b = run.breakdown()
    assert_partition(b)
    assert b.wall_clock_s == approx(41.0)  # their total_time
    assert b.goodput == approx(30 / 41)  # their expected_goodput: 10 steps x 3 s
    assert b.buckets["productive"] == approx(30.0)
    # CUSTOM_BADPUT_EVENTS['EVAL_STEP'] 5 -> other.eval_step 5 (we keep the label's case;
    # they upper-case it)
    assert b.other_parts == {"eval_step": approx(5.0)}
    # TPU_INITIALIZATION 1 + OTHER 5 (unrecorded program startup before step 0) ->
    # startup.init 6
    assert b.startup_parts["init"] == approx(6.0)
    assert b.startup_parts["warmup"] == approx(0.0)  # PROGRAM_STARTUP 0
    assert b.buckets["restart"] == approx(0.0)


def test_custom_eval_inside_steps(store):
    """GoodputTest._mock_sample_program_with_badput: 1 s pauses around TPU init (1 s), training
    prep (2 s) and data loading (2 s); then 5 steps from 9, each 2 s of data loading + 3 s of
    compute, steps 0 and 3 also holding a 10 s custom event inside the step; end at 54.
    Their suite asserts no goodput for it (test_goodput_recorder_badput checks the logged keys,
    test_exclusion_with_multiple_steps_and_badput the excluded 10 s); their calculator (run on
    the v0.2.3 snapshot) gives: productive 25 (goodput 46.3%), CUSTOM_BADPUT_EVENTS 20,
    TPU_INITIALIZATION 1, TRAINING_PREP 2, DATA_LOADING_SYNC 2, OTHER 4 (the pauses),
    DATA_LOADING_ASYNC 10 (in-step data loading; not badput: excluded from their sum).
    Their label is 'test_sync'; here it is 'eval'.
    A custom interval inside a step record leaves productive for other_parts[label]."""
    run = Run(store)
    run.event("attempt_start", 0, 0)
    run.event("init_start", 1, 0)
    run.event("init_end", 2, 0)
    run.steps(0, 0, [9, 24, 29, 34, 49], [24, 29, 34, 49, 54])
    run.event("custom_begin", 11, 0, label="eval")  # inside step 0 (9-24), after its data load
    run.event("custom_end", 21, 0, label="eval")
    run.event("custom_begin", 36, 0, label="eval")  # inside step 3 (34-49)
    run.event("custom_end", 46, 0, label="eval")
    run.event("attempt_end", 54, 0, cause="completed")
    b = run.breakdown()
    assert_partition(b)
    assert b.wall_clock_s == approx(54.0)
    # their productive 25: 5 steps x (2 s data loading + 3 s compute); data loading inside a
    # step is productive in both tools (their DATA_LOADING_ASYNC is not counted as badput)
    assert b.buckets["productive"] == approx(25.0)
    assert b.goodput == approx(25 / 54)  # theirs 46.3%
    # CUSTOM_BADPUT_EVENTS['TEST_SYNC'] 20 -> other.eval 20
    assert b.other_parts == {"eval": approx(20.0)}
    # TPU init 1 + prep 2 + sync data loading 2 + OTHER 4 (pauses) -> startup.init 9
    assert b.startup_parts["init"] == approx(9.0)
    # their PROGRAM_STARTUP 0: the labelled eval is taken out of step 0 before its excess over
    # the median step is judged, so the eval is not mistaken for warm-up (15 s - 5 s median)
    assert b.startup_parts["warmup"] == approx(0.0)
    assert b.buckets["checkpoint_stall"] == approx(0.0)


def test_custom_eval_inside_a_middle_step(store):
    """A reduced form of the previous timeline, free of the first-step question: only the
    step-3 eval (the run is 10 s shorter). Their calculator's rule (a custom interval within
    one step's start-to-next-start is subtracted from that step) gives productive 25 and
    CUSTOM_BADPUT_EVENTS 10."""
    run = Run(store)
    run.event("attempt_start", 0, 0)
    run.steps(0, 0, [9, 14, 19, 24, 39], [14, 19, 24, 39, 44])
    run.event("custom_begin", 26, 0, label="eval")  # inside step 3 (24-39)
    run.event("custom_end", 36, 0, label="eval")
    run.event("attempt_end", 44, 0, cause="completed")
    b = run.breakdown()
    assert_partition(b)
    assert b.wall_clock_s == approx(44.0)
    assert b.buckets["productive"] == approx(25.0)  # 5 steps x 5 s
    assert b.other_parts == {"eval": approx(10.0)}  # CUSTOM_BADPUT_EVENTS 10
    assert b.startup_parts["init"] == approx(9.0)  # start-up before step 0
    assert b.startup_parts["warmup"] == approx(0.0)
