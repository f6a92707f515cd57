"""A finding's job cost bounded by what the job's steps really grew since its onset
(``job_slowdown_seen``; ``job_slowdown`` the smaller of it and the ready-time estimate,
``job_slowdown_ready``). Why: on ranks that share cores the other ranks' work runs while the
slow rank is late, so the step grows by less than its lateness at the collective. Every
expected value is hand arithmetic on a planted timeline."""

from __future__ import annotations

import numpy as np
import pytest

from goodlens.detectors.jobcost import RecentSteps
from goodlens.detectors.stragglers import StragglerDetector

HEALTHY = [0.050, 0.051, 0.052, 0.053]


def _timeline(onset: int, steps: int = 120, warm: float = 1.0
              ) -> tuple[np.ndarray, list[float], list[float]]:
    """5 ranks reaching the collective at 50-53 ms (rotating among ranks 0-3, rank 4 at
    51.5 ms); from ``onset`` rank 4 at 83 ms: 30 ms later than the latest other. The step
    is 100 ms before the onset and 120 ms after (it grew 20 ms, not 30), its starts 100 and
    120 ms apart; the first 10 steps are a 1 s warm-up."""
    x = np.array([[HEALTHY[(r + s) % 4] for r in range(4)] + [0.0515] for s in range(steps)])
    x[onset:, 4] = 0.083
    dur = [0.1 if s < onset else 0.12 for s in range(steps)]
    dur[:10] = [warm] * 10
    start = np.concatenate([[0.0], np.cumsum(dur)[:-1]]).tolist()
    return x, dur, start


@pytest.mark.parametrize("with_starts", [True, False])
def test_the_cost_is_bounded_by_the_steps_growth(with_starts):
    """By hand: the ready times say 30 ms lost of the 120 - 30 = 90 ms step the job would
    have, 0.333; the step grew from 100 ms to 120 ms, 0.2 (the same from the starts'
    spacing or from the durations). The joint of the one open finding is its cost, bounded
    alike, and its part the whole of it."""
    x, dur, start = _timeline(40)
    det = StragglerDetector(None, 5)
    det.update_many(range(120), x, dur, step_starts=start if with_starts else None)
    (f,) = det.active()
    assert f.subject_id == 4 and 38 <= f.first_step <= 40, f
    assert f.job_slowdown_ready == pytest.approx(0.03 / 0.09, rel=1e-5)
    assert f.job_slowdown_seen == pytest.approx(0.2, rel=1e-6)
    assert f.job_slowdown == pytest.approx(0.2, rel=1e-6)
    assert f.joint_job_slowdown == pytest.approx(0.2, rel=1e-6)
    assert f.job_slowdown_part == pytest.approx(0.2, rel=1e-6)


def test_without_a_clean_baseline_the_ready_estimate_stands():
    """Onset at step 24: the steps before it, less the 10 of warm-up (left out), are 14
    (under 16): no baseline, so ``job_slowdown_seen`` is None and the headline is the ready times'
    0.333. A finding from an earlier attempt has none either."""
    x, dur, start = _timeline(24)
    det = StragglerDetector(None, 5)
    det.update_many(range(120), x, dur, step_starts=start)
    (f,) = det.active()
    assert f.job_slowdown_seen is None
    assert f.job_slowdown == pytest.approx(0.03 / 0.09, rel=1e-5) == f.job_slowdown_ready


def test_the_joint_parts_are_scaled_to_the_bound_and_still_add_up():
    """Two subjects: rank 4 30 ms and rank 3 10 ms later than the latest of ranks 0-2
    (50 ms), from step 40; steps 100 ms before and 115 ms after. Ready times: the job loses
    30 ms of an 85 ms step, 0.353; slowest first, rank 4's part 20 / 85, rank 3's 10 / 85.
    The step grew 15%: the joint is 0.15, the parts scaled by 0.15 / 0.353 (0.1 and 0.05).
    Without ``first`` (a subject slow before this attempt) it is not bounded."""
    rec = RecentSteps(5)
    for s in range(120):
        row = np.full(5, 0.05)
        if s >= 40:
            row[3], row[4] = 0.06, 0.08
        t = 0.1 if s < 40 else 0.115
        rec.add_one(s, row, t, None)
    joint, (p4, p3) = rec.joint_job_slowdown([[4], [3]], 40, 40)
    assert joint == pytest.approx(0.15, rel=1e-6)
    assert (p4, p3) == (pytest.approx(0.10, rel=1e-5), pytest.approx(0.05, rel=1e-5))
    unbounded, parts = rec.joint_job_slowdown([[4], [3]], 40)
    assert unbounded == pytest.approx(0.03 / 0.085, rel=1e-5)
    assert parts == [pytest.approx(0.02 / 0.085, rel=1e-5), pytest.approx(0.01 / 0.085,
                                                                         rel=1e-5)]
