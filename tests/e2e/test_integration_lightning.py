"""Smoke: one short live PyTorch Lightning job (DDP strategy, goodlens's callback) under
torchrun with a real collector (``examples/integrations/train_lightning.py``): 3 ranks, a
rank slowed by a sleep longer than its step, checkpoints and validation.

It asserts only what load cannot change: the callback's events are there (every rank's
attempt start, the saves, every rank's clean end), validation is counted as eval, the
report's buckets sum to the wall-clock, the planted rank is the one the detector names, and
the job and the collector exit cleanly. No rank is killed: a second start-up of 3 processes
importing Lightning would double the job's time; the resume, like every accuracy claim, is
checked on a recorded run (``tests/integration/test_recorded_lightning.py``).
"""

from __future__ import annotations

import pytest

from tests.e2e.framework_jobs import (
    run_job,
    the_events_are_there,
    the_planted_rank_is_named,
)
from tests.jobclock import buckets_sum_to_wall_clock

pytest.importorskip("lightning")
pytestmark = pytest.mark.slow

RANKS, STEPS, CKPT, VAL, COMPUTE_MS = 3, 30, 10, 10, 10.0
SLOW_RANK, SLOW_MS = 2, 80.0   # longer than a healthy step, even on one loaded core


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lightning")
    return run_job(tmp, "train_lightning.py", "lightning", "--steps", str(STEPS),
                   "--ckpt-every", str(CKPT), "--val-every", str(VAL),
                   "--compute-ms", str(COMPUTE_MS), "--slow-rank", str(SLOW_RANK),
                   "--slow-ms", str(SLOW_MS), detect=True, nproc=RANKS, timeout=240)


def test_a_lightning_job_is_seen_and_its_slow_rank_is_named(job):
    the_events_are_there(job, RANKS, [set(range(CKPT - 1, STEPS, CKPT))])
    rep = job.report
    buckets_sum_to_wall_clock(rep)
    assert [a["steps"]["kept"] for a in rep["attempts"]] == [STEPS]
    assert rep["other_parts"]["eval"] > 0
    the_planted_rank_is_named(job, SLOW_RANK)
