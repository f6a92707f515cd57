"""Restart loops on hand-written attempt timelines (goodlens.analysis.loops).

Each timeline is written out below with what it must give: the attempt the loop is flagged
at, its patterns and its advice, worked out by reading the events.
"""

from __future__ import annotations

import pandas as pd

from goodlens.analysis.loops import loop_text, restart_loop

COLS = ["attempt", "time", "kind", "rank", "host", "step", "tier", "cause"]


def ev(*rows: tuple) -> pd.DataFrame:
    return pd.DataFrame([dict(zip(COLS, r)) for r in rows], columns=COLS)


def att(*ends: str | None) -> pd.DataFrame:
    return pd.DataFrame({"attempt": range(len(ends)), "end_reason": list(ends)})


def restore(a: int, t: float, step: int, tier: str = "local") -> list[tuple]:
    return [(a, t, "ckpt_restore_start", 0, "n0", step, tier, None),
            (a, t + 5, "ckpt_restore_end", 0, "n0", step, tier, None)]


def fail(a: int, t: float, rank: int | None, host: str | None, cause: str) -> tuple:
    return (a, t, "failure", rank, host, None, None, cause)


# attempt 0 saves step 100 (local) and step 90 (durable) and fails at t=500; attempts 1
# and 2 each restore step 100 from the local tier and rank 3 on node n7 fails 30 s after
# the restore ends (the survivors report collective_error, naming nobody); attempt 3 runs.
LOOP = ev(
    (0, 90, "ckpt_save_durable_end", 0, "n0", 90, "durable", None),
    (0, 100, "ckpt_save_durable_end", 0, "n0", 100, "local", None),
    fail(0, 500, 5, "n9", "exception:RuntimeError"),
    *restore(1, 600, 100), fail(1, 635, 3, "n7", "exception:FloatingPointError"),
    fail(1, 636, None, "n0", "collective_error"),
    *restore(2, 700, 100), fail(2, 735, 3, "n7", "exception:FloatingPointError"),
    (2, 736, "failure_detected", None, "n1", None, None, "collective_error"),
    *restore(3, 800, 100))


def test_the_second_fruitless_attempt_is_flagged_with_its_patterns() -> None:
    # attempt 0 committed steps 90 and 100: not fruitless. Attempt 1 alone: no loop yet.
    assert restart_loop(att("failed", "failed"), LOOP[LOOP.attempt <= 1]) is None
    loop = restart_loop(att("failed", "failed", "failed", None), LOOP)
    assert loop["attempts"] == [1, 2] and loop["flagged_at_attempt"] == 2
    assert loop["ongoing"] is True  # attempt 3 is running and has committed nothing
    kinds = {p["kind"]: p for p in loop["patterns"]}
    assert kinds["same_rank"]["ranks"] == [3]
    assert kinds["same_host"]["hosts"] == ["n7"]  # not n0/n1: those were survivors
    ck = kinds["same_checkpoint"]
    assert (ck["step"], ck["tier"]) == (100, "local")
    # restore ends at 605 and 705, the failures at 635 and 735
    assert ck["failed_after_restore_s"] == [{"attempt": 1, "seconds": 30.0},
                                            {"attempt": 2, "seconds": 30.0}]
    advice = {a["action"]: a for a in loop["advice"]}
    assert advice["drain_host"]["hosts"] == ["n7"]
    # the loop restored the local tier: back to the latest durable checkpoint, step 90
    assert advice["restore_previous_durable"]["step"] == 90
    assert "restart loop: attempts 1, 2" in loop_text(loop)


def test_a_committing_attempt_ends_the_streak_and_preemption_does_not_count() -> None:
    e = ev(*restore(1, 600, 100), fail(1, 635, 3, "n7", "x"),
           (2, 650, "ckpt_save_durable_end", 0, "n0", 120, "durable", None),
           fail(2, 700, 3, "n7", "x"), fail(3, 800, 3, "n7", "x"))
    # 1 fruitless, 2 committed 120 (ends the streak), 3 fruitless: one in a row
    assert restart_loop(att("completed", "failed", "failed", "failed"), e) is None
    # a preempted attempt between two fruitless ones neither counts nor breaks the streak
    e2 = ev(fail(1, 635, 3, "n7", "x"), fail(3, 800, 2, "n8", "y"))
    loop = restart_loop(att("completed", "failed", "preempted", "failed"), e2)
    assert loop["attempts"] == [1, 3]
    assert loop["patterns"] == []  # different ranks, hosts, no restore
    assert [a["action"] for a in loop["advice"]] == ["restore_previous_durable"]


def test_a_durable_restore_loop_advises_the_durable_checkpoint_before_it() -> None:
    e = ev((0, 50, "ckpt_save_durable_end", 0, "n0", 40, "durable", None),
           (0, 90, "ckpt_save_durable_end", 0, "n0", 80, "durable", None),
           *restore(1, 600, 80, "durable"), fail(1, 640, None, None, "collective_error"),
           *restore(2, 700, 80, "durable"), fail(2, 790, None, None, "collective_error"))
    loop = restart_loop(att("failed", "failed", "failed"), e)
    # attempt 0 committed; 1 and 2 restored step 80 and failed; nobody named: no rank/host
    assert [p["kind"] for p in loop["patterns"]] == ["same_checkpoint"]
    assert loop["advice"][0]["step"] == 40
    assert loop["ongoing"] is True


def test_a_run_recording_no_save_commits_by_reaching_a_new_step() -> None:
    e = ev(fail(0, 100, 1, "a", "x"), fail(1, 200, 1, "a", "x"), fail(2, 300, 1, "a", "x"))
    # attempt 0 reached step 50, 1 reached 80 (new), 2 reached 60 (not beyond 80)
    assert restart_loop(att("failed", "failed", "failed"), e, {0: 50, 1: 80, 2: 60}) is None
    loop = restart_loop(att("failed", "failed", "failed", "failed"), e.assign(
        attempt=e.attempt), {0: 50, 1: 80, 2: 60, 3: 70})
    assert loop["attempts"] == [2, 3]


def test_a_host_named_only_by_rank_is_read_from_that_attempts_placement() -> None:
    e = ev(fail(1, 100, 2, None, "exit:1"), fail(2, 200, 2, None, "exit:1"))
    where = {1: {2: "n4"}, 2: {2: "n5"}}  # the rank moved: no common host
    loop = restart_loop(att("completed", "failed", "failed"), e,
                        rank_hosts=lambda atts: {a: where[a] for a in atts})
    kinds = {p["kind"]: p for p in loop["patterns"]}
    assert kinds["same_rank"]["ranks"] == [2] and "same_host" not in kinds
