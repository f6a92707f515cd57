"""The framework jobs' rule for a finding about a rank nobody slowed (tests/e2e/framework_jobs.py),
on hand-written clocks: still open at the end, it passes only where the kernel's run-queue
wait shows the machine slowed that rank by at least half the finding's excess per step."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.jobclock import JobResult, cpu_starved_s, the_slowed_ranks_finding


def job(extra_rq_ms: float) -> JobResult:
    """4 ranks, steps 0-19 of attempt 0; every rank waits 2 ms a step for a CPU, rank 1
    ``extra_rq_ms`` more from step 10 on. Rank 0 is the planted slow rank."""
    truth = {}
    for r in range(4):
        rq, lines = 0.0, []
        for s in range(20):
            rq += 0.002 + (extra_rq_ms / 1000 if r == 1 and s >= 10 else 0.0)
            lines.append({"kind": "step", "step": s, "t0": s * 0.1, "t1": s * 0.1 + 0.09,
                          "rq": rq})
        truth[r, 0] = lines
    return JobResult(Path("unused"), "run", truth)


def with_findings(res: JobResult, *findings: dict) -> JobResult:
    res.events = pd.DataFrame({"kind": ["straggler_flagged"] * len(findings),
                               "seq": range(len(findings)),
                               "detail": [json.dumps(f) for f in findings]})
    return res


PLANTED = {"id": "0/rank/0/5", "ranks": [0], "status": "update", "attempt": 0,
           "first_step": 5, "last_step": 19, "straggler_wait_s": 0.18}
# rank 1 flagged from step 10 to the end: 60 ms over 10 steps, 6 ms a step
OTHER = {"id": "0/rank/1/10", "ranks": [1], "status": "update", "attempt": 0,
         "first_step": 10, "last_step": 19, "straggler_wait_s": 0.06}


def test_the_run_queue_excess_is_per_step_over_the_findings_steps() -> None:
    assert cpu_starved_s(job(6.0), 1, 0, 10, 19, exclude=0) == pytest.approx(0.006)
    assert cpu_starved_s(job(6.0), 1, 0, 0, 9, exclude=0) == pytest.approx(0.0, abs=1e-12)
    # half the steps starved: 3 ms a step on average over 0-19 (step 0 has no previous)
    assert cpu_starved_s(job(6.0), 1, 0, 1, 19, exclude=0) == pytest.approx(0.06 / 19)


def test_an_open_finding_about_a_starved_rank_passes() -> None:
    res = with_findings(job(6.0), PLANTED, OTHER)
    assert the_slowed_ranks_finding(res, 0)["id"] == PLANTED["id"]
    # 3.5 ms a step of 6 is over half: still real
    assert the_slowed_ranks_finding(with_findings(job(3.5), PLANTED, OTHER), 0)


def test_an_open_finding_about_a_rank_the_machine_did_not_slow_fails() -> None:
    res = with_findings(job(2.0), PLANTED, OTHER)
    with pytest.raises(AssertionError, match=r"waited for a CPU only 2\.0 ms"):
        the_slowed_ranks_finding(res, 0)


def test_a_resolved_finding_passes_and_one_begun_at_a_stall_never_does() -> None:
    resolved = {**OTHER, "status": "resolved"}
    assert the_slowed_ranks_finding(with_findings(job(0.0), PLANTED, resolved), 0)
    with pytest.raises(AssertionError):
        the_slowed_ranks_finding(with_findings(job(6.0), PLANTED, resolved), 0,
                                 stall_steps=(10,))


def test_an_open_finding_under_the_minor_bound_passes_and_one_over_it_does_not() -> None:
    # OTHER: 6 ms a step, rank 1's CPU wait no longer than the others'
    res = with_findings(job(0.0), PLANTED, OTHER)
    assert the_slowed_ranks_finding(res, 0, minor_s=0.0061)["id"] == PLANTED["id"]
    with pytest.raises(AssertionError, match=r"6\.0 ms a step over steps 10-19"):
        the_slowed_ranks_finding(res, 0, minor_s=0.0059)
