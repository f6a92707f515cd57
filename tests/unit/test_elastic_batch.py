"""The batch arithmetic of an elastic resize, shared by ``goodlens plan elastic`` and the job.

Why: the job keeps its global batch after a resize with
:func:`goodlens.exporter.elastic.batch_for_world`; the operator reads the plan from
:func:`goodlens.analysis.planner.elastic_plan`. Both call :func:`goodlens.model.elastic.
choose_batch`, so these tests pin its answers (worked by hand) and that the two agree.
"""

from __future__ import annotations

import pytest

from goodlens.analysis.planner import elastic_plan
from goodlens.exporter.elastic import batch_for_world
from goodlens.model.elastic import choose_batch, split_batch


def test_the_scenarios_worlds_keep_48_samples_per_step():
    # 48 samples, micro-batch 4: 6 ranks accumulate 48 / (6 x 4) = 2, 4 ranks 3, 2 ranks 6
    for world, acc in ((6, 2), (4, 3), (2, 6), (3, 4)):
        c = batch_for_world(48, world, 4)
        assert (c.replicas_used, c.micro_batch, c.accumulation, c.global_batch, c.exact) == (
            world, 4, acc, 48, True)
        assert c.reason == "same micro-batch"


def test_a_share_that_is_not_a_multiple_of_the_micro_batch_changes_it():
    # 36 on 6 replicas: 6 each, not a multiple of 4; the largest divisor <= 4 is 3
    c = choose_batch(36, 6, 4)
    assert (c.micro_batch, c.accumulation, c.global_batch) == (3, 2, 36)
    assert c.reason == ("changed micro-batch: 6 samples per replica is not a multiple of 4; "
                        "largest divisor <= 4 used")
    # allowed bigger micro-batches: 6 fits
    assert choose_batch(36, 6, 4, max_micro=8).micro_batch == 6


def test_an_indivisible_batch_idles_replicas_or_says_what_it_chose():
    # 48 on 5 replicas: 4 of them keep it exact (4 x 4 x 3), one idles
    c = choose_batch(48, 5, 4)
    assert (c.replicas_used, c.micro_batch, c.accumulation, c.global_batch, c.exact) == (
        4, 4, 3, 48, True)
    assert c.reason == ("idle replicas: 48 is not a multiple of 5 replicas; 1 left idle to "
                        "keep it exact (closest on all: 50)")
    # or all 5 with the closest batch: 50 = 5 x 2 x 5 (40, 45 and 60 are farther)
    c = choose_batch(48, 5, 4, allow_inexact=True)
    assert (c.replicas_used, c.micro_batch, c.accumulation, c.global_batch, c.exact) == (
        5, 2, 5, 50, False)
    assert c.reason == ("indivisible: 48 is not a multiple of 5 replicas; closest achievable "
                        "batch 50 with micro-batch 2")


def test_model_parallel_ranks_make_one_replica():
    c = batch_for_world(48, 8, 4, model_parallel=2)  # 4 replicas
    assert (c.replicas, c.micro_batch, c.accumulation) == (4, 4, 3)
    with pytest.raises(ValueError, match="does not divide"):
        batch_for_world(48, 7, 4, model_parallel=2)


@pytest.mark.parametrize("nodes,lost,gpn,micro,batch,mmax,inexact", [
    (3, 1, 2, 4, 48, None, False),      # the scenario: 6 ranks to 4
    (16, 1, 8, 4, 1024, None, False),   # idle replicas
    (16, 1, 8, 4, 1024, None, True),    # indivisible
    (4, 1, 2, 4, 96, 8, False),         # a bigger micro-batch within the limit
])
def test_plan_elastic_and_the_job_choose_the_same(nodes, lost, gpn, micro, batch, mmax,
                                                  inexact):
    plan = elastic_plan(nodes, lost, micro, batch, gpus_per_node=gpn,
                        max_micro_per_rank=mmax, allow_inexact=inexact)
    job = batch_for_world(batch, (nodes - lost) * gpn, micro, max_micro=mmax,
                          allow_inexact=inexact)
    assert (plan.data_parallel_used, plan.micro_batch, plan.accumulation, plan.global_batch,
            plan.exact, plan.reason, plan.closest_batch) == (
        job.replicas_used, job.micro_batch, job.accumulation, job.global_batch, job.exact,
        job.reason, job.closest_batch)


def test_split_and_refusals():
    assert split_batch(48, 4, 4) == (4, 3)
    assert split_batch(48, 5, 4) is None
    assert split_batch(7, 1, 4) == (1, 7)  # 7 is prime: micro-batch 1
    for bad in ((0, 4, 4), (48, 0, 4), (48, 4, 0), (48, 4, True)):
        with pytest.raises(ValueError):
            choose_batch(*bad)
    with pytest.raises(ValueError, match="max_micro"):
        choose_batch(48, 4, 4, max_micro=2)
