"""End-to-end: what a slowed rank costs the job, with the collective at 0%, 15% and 40% of
the step (issue #28 item 2), checked against the job's own clock
(``examples/integrations/train_ddp_share.py``).

Why: a finding's ``slowdown`` is the rank's excess time to reach the collective over its
peers' (a ready-time ratio). It leaves out the collective's own time, so it overstates what
the job loses the more the step is communication: a rank whose sleep made the job's steps
20.4% longer read 32% where the all-reduce was 15% of the step. ``job_slowdown`` is the
excess over the step time the job would have without it. Each job here is 3 DDP ranks on
gloo (the fewest the detector scores: a median needs peers; the compute is mostly sleep,
so 3 fit on 2 cores), rank 1 slowed by a planted 10 ms sleep per step, and every rank's
all-reduce completing a planted time after its transfer, sized to the share. The truth is
the job's clock: the planted sleep as it really slept, over a healthy rank's step (on its
own clock) less that sleep (``framework_jobs.true_slowdown``). goodlens's side is what
``goodlens detect --json`` says of the stored run (the command the issue ran).
"""

from __future__ import annotations

import json
import statistics
import subprocess

import pytest

from tests.e2e.framework_jobs import run_job, true_slowdown
from tests.harness import GOODLENS, ROOT

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

STEPS, COMPUTE_MS = 50, 40.0
SLOW_RANK, SLOW_MS, SLOW_FROM = 1, 10.0, 5
# the step less its collective: the compute, the planted sleep and ~3 ms of the MLP, the
# optimizer and the exporter; and the all-reduce's own time before any planted delay (3
# ranks sharing 2 cores: 3-4 ms measured on the slowed rank, of a 56 ms step: "0%" is ~7%)
OWN_MS, TRANSFER_MS = COMPUTE_MS + SLOW_MS + 3.0, 4.0


def comm_ms(share: float) -> float:
    """The planted collective time that makes the collective ``share`` of the step (none
    for 0: the all-reduce alone)."""
    return max(0.0, share / (1.0 - share) * OWN_MS - TRANSFER_MS)


def collective_share(job) -> float:
    """The collective's own time over the step, by the job's clock: the slowed rank's
    all-reduce from launch to completion (it reaches the collective last, so waits for no
    peer) over its step, medians from the slowed steps on."""
    parts = collective_parts(job)
    return parts["comm_ms"] / parts["step_ms"]


#: the band each planted share must land in (the job's clock): apart from each other
REGIMES = {0.0: (0.0, 0.10), 0.15: (0.10, 0.27), 0.40: (0.30, 0.55)}


def collective_parts(job) -> dict[str, float]:
    """The slowed rank's medians from the slowed steps on (ms): its all-reduce, the planted
    delay in it, and its step (printed when a job is outside its regime)."""
    lines = [x for x in job.lines("comm", SLOW_RANK) if x["step"] >= SLOW_FROM]
    steps = [b - a for s, (a, b) in job.own_steps(SLOW_RANK, 0).items() if s >= SLOW_FROM]
    return {"comm_ms": 1e3 * statistics.median(x["s"] for x in lines),
            "delay_ms": 1e3 * statistics.median(x["delay"] for x in lines),
            "step_ms": 1e3 * statistics.median(steps)}


def detect(job) -> list[dict]:
    out = subprocess.run([*GOODLENS, "detect", "--db", str(job.db), "--run", job.run_id,
                          "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True)
    return json.loads(out.stdout)["findings"]


@pytest.mark.parametrize("share", [0.0, 0.15, 0.40])
def test_job_slowdown_is_what_the_job_loses(tmp_path, share):
    job = run_job(tmp_path, "train_ddp_share.py", f"share-{round(100 * share)}",
                  "--steps", str(STEPS), "--compute-ms", str(COMPUTE_MS),
                  "--comm-ms", str(comm_ms(share)), "--slow-rank", str(SLOW_RANK),
                  "--slow-ms", str(SLOW_MS), "--slow-from", str(SLOW_FROM), nproc=3)
    # the job is in the regime it claims: its collective's own time, as its clock measured
    # it, over its step. Only the delay is planted; the transfer under it is gloo's on 2
    # shared cores, 3-4 ms in most runs but 8-9 ms in one (a quiet machine: 0.208 read for
    # 0.15), so each share is a band that keeps the three regimes apart, not a point:
    # "0%" is the all-reduce alone, nothing planted
    seen = collective_share(job)
    low, high = REGIMES[share]
    assert low <= seen < high, (seen, share, collective_parts(job))
    found = detect(job)
    # the slowed rank found as itself: its finding the only one open at the end
    still = [f for f in found if f["status"] != "resolved"]
    assert [f["ranks"] for f in still] == [[SLOW_RANK]], found
    f = still[0]
    truth = true_slowdown(job, rank=0, attempt=0)
    # what the job loses per step, within the 20% of the job's clock, whatever the
    # collective's share: at 0% ~22% (10 ms over a 46 ms step), at 40% ~13% (over 78 ms).
    # Seen: 0.226, 0.202 and 0.133 against 0.220, 0.201 and 0.132 (44 s for the three
    # jobs on 2 cores, 50 steps each; docs/detectors.md). (Run with the slowed
    # rank on time first, the 40% job's step was 80 ms, not 88.6 - 10.1: ranks reaching the
    # all-reduce together slow its transfer by ~2 ms on 2 shared cores, a contention a job
    # with a device per rank does not have; the planted sleep is the truth taken here.)
    assert f["job_slowdown"] == pytest.approx(truth, rel=0.20), (f, truth)
    if share >= 0.4:
        # the ready-time ratio does not say it: it divides by the peers' time to reach the
        # collective (~42 ms, not the ~77 ms step less the sleep): seen 0.243
        assert f["slowdown"] > 1.5 * truth, (f, truth)
