"""Smoke: one short live FSDP2 (``fully_shard``) job under torchrun with a real collector
(``examples/integrations/train_fsdp2.py``): 3 ranks, a rank slowed by a sleep longer than
its step, DCP checkpoints.

It asserts only what load cannot change: the exporter's events are there (every rank's
attempt start, the saves, every rank's clean end), the report's buckets sum to the
wall-clock, the planted rank is the one the detector names, and the job and the collector
exit cleanly. No rank is killed: a restart's second start-up would double the job's time
(a torchrun restart from a DCP checkpoint is smoked live by ``test_torch_smoke.py``); the
resume, like every accuracy claim (restart, recompute, job slowdown, input and checkpoint
stall, the delayed reduce-scatter, HSDP), is checked on recorded runs
(``tests/integration/test_recorded_fsdp2.py``).
"""

from __future__ import annotations

import pytest

from tests.e2e.framework_jobs import (
    run_job,
    the_events_are_there,
    the_planted_rank_is_named,
)
from tests.jobclock import buckets_sum_to_wall_clock

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

RANKS, STEPS, CKPT, COMPUTE_MS = 3, 30, 10, 10.0
SLOW_RANK, SLOW_MS = 2, 80.0   # longer than a healthy step, even on one loaded core


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp2")
    return run_job(tmp, "train_fsdp2.py", "fsdp2", "--steps", str(STEPS),
                   "--ckpt-every", str(CKPT), "--compute-ms", str(COMPUTE_MS), "--layers", "1",
                   "--slow-rank", str(SLOW_RANK), "--slow-ms", str(SLOW_MS),
                   detect=True, nproc=RANKS, timeout=240)


def test_an_fsdp2_job_is_seen_and_its_slow_rank_is_named(job):
    the_events_are_there(job, RANKS, [set(range(CKPT - 1, STEPS, CKPT))])
    rep = job.report
    buckets_sum_to_wall_clock(rep)
    assert [a["steps"]["kept"] for a in rep["attempts"]] == [STEPS]
    the_planted_rank_is_named(job, SLOW_RANK)
