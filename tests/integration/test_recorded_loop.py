"""A recorded restart loop (``tests/fixtures/runs/ddp-loop``: ``examples/train_ddp.py``
under torchrun, 4 gloo ranks, 2 restarts, ``tests/record/ddp.py``), replayed exactly
(``tests/recorded.py``); every expected value is written from the job's settings.

Saves every 5 steps (after steps 4 and 9); rank 1 raises at step 11 in attempt 0 and at the
first step after every restore (``--kill-after-restore``): attempts 1 and 2 each restore
step 9 and fail at step 10, before any save. Attempt 0 committed steps, 1 and 2 did not, so
the loop is flagged at attempt 2 (the second fruitless attempt) with every pattern: the
same rank (1), the same host (the one machine it ran on), the same checkpoint (step 9,
durable); the advice drains that host and restores the durable checkpoint before step 9
(step 4). ``/v1/actions``, ``/v1/report`` and ``/metrics`` all say so.
"""

from __future__ import annotations

import pytest

from tests.jobclock import JobResult
from tests.recorded import replay


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> tuple[JobResult, str]:
    scraped: list[str] = []

    def scrape(col, now: float) -> None:   # /metrics as a scrape after each pass sees it
        status, body = col.http("GET", "/metrics")
        assert status == 200, body
        scraped.append(body)

    res = replay("ddp-loop", tmp_path_factory.mktemp("ddp-loop"), each_pass=scrape)
    return res, scraped[-1]


def test_the_job_is_what_the_recipe_planted(loop):
    res, _ = loop
    s = res.job["settings"]
    assert (s["ckpt_every"], s["kill_rank"], s["kill_at"], s["restarts"]) == (5, 1, 11, 2)
    # the job's clock: rank 1 crashed at step 11, then at step 10 after each restore of step 9
    crashes = [(x["step"]) for x in res.lines("crash", rank=1)]
    assert crashes == [11, 10, 10]
    assert [x["step"] for x in res.lines("restore", rank=1)] == [9, 9]


def test_the_loop_is_flagged_at_the_second_fruitless_attempt(loop):
    res, _ = loop
    lp = res.actions["restart_loop"]
    assert lp is not None, res.actions
    assert lp["attempts"] == [1, 2] and lp["flagged_at_attempt"] == 2
    assert lp["ongoing"] is True and lp["count"] == 2


def test_it_names_the_same_rank_host_and_checkpoint(loop):
    res, _ = loop
    kinds = {p["kind"]: p for p in res.actions["restart_loop"]["patterns"]}
    assert kinds["same_rank"]["ranks"] == [1]
    assert kinds["same_host"]["hosts"] == [res.job["host"]]
    assert (kinds["same_checkpoint"]["step"], kinds["same_checkpoint"]["tier"]) == (9, "durable")


def test_the_advice_drains_the_host_and_restores_the_durable_checkpoint_before(loop):
    res, _ = loop
    advice = {a["action"]: a for a in res.actions["restart_loop"]["advice"]}
    assert advice["drain_host"]["hosts"] == [res.job["host"]]
    assert advice["restore_previous_durable"]["step"] == 4


def test_the_report_and_metrics_show_it(loop):
    res, metrics = loop
    assert res.report["restart_loop"]["attempts"] == [1, 2]
    assert res.report["restart_loop"]["flagged_at_attempt"] == 2
    assert 'goodlens_run_restart_loop_attempts{run="loop"} 2.0' in metrics
