"""A finding's ``job_slowdown`` against what the job really paid: its own step period.

The recordings (``tests/record/jobcost.py``): a Lightning job whose rank 2 sleeps 20 ms more
per step from step 40 of 120, on 4 ranks and on 3 ranks sharing this machine's 2 cores.
The truth is the job's own clock: rank 0's step period over the last 64 steps against the
steps before the onset (``tests/jobclock.py::step_period_growth``). On ranks that share
cores the step grows by less than the slowed rank's lateness at the collective: the other
ranks' forward, backward and all-reduce work runs while it sleeps instead of after it. The
ready times alone (``job_slowdown_ready``) read that lateness; the step's own growth since
the onset (``job_slowdown_seen``) bounds the headline ``job_slowdown``.
"""

from __future__ import annotations

import pytest

from tests.jobclock import JobResult, step_period_growth, the_slowed_ranks_finding
from tests.recorded import replay


@pytest.fixture(scope="module", params=["slow-4", "slow-3"])
def job(request, tmp_path_factory) -> JobResult:
    return replay(request.param, tmp_path_factory.mktemp(request.param))


def test_job_slowdown_is_what_the_jobs_step_grew(job):
    s = job.job["settings"]
    f = the_slowed_ranks_finding(job, s["slow_rank"])
    assert f["first_step"] == s["slow_from"], f
    truth = step_period_growth(job, s["slow_from"])
    print(f"{job.job['name']}: job_slowdown {f['job_slowdown']:.3f} (ready "
          f"{f['job_slowdown_ready']:.3f}, seen {f['job_slowdown_seen']:.3f}), job's step "
          f"grew {truth:.3f}")
    # the headline within 10% of what the job's step really grew
    assert f["job_slowdown"] == pytest.approx(truth, rel=0.10), (f, truth)
    assert f["job_slowdown"] == min(f["job_slowdown_ready"], f["job_slowdown_seen"])
    # the ready times alone overstate it by more than 20% here (the work that overlapped)
    assert f["job_slowdown_ready"] > 1.2 * truth, (f, truth)
    # one finding open: the joint cost is its cost, bounded the same way
    assert f["joint_job_slowdown"] == pytest.approx(f["job_slowdown"], rel=1e-6), f
    assert f["job_slowdown_part"] == pytest.approx(f["job_slowdown"], rel=1e-6), f
