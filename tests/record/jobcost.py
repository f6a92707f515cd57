"""Recipes: a Lightning job with one rank slowed by a planted sleep from a known step, on 4
ranks (2 per core on this 2-core machine: oversubscribed) and on 2 ranks (a core each).

Why: a finding's ``job_slowdown`` claims to predict how much shorter the job's step would be
without the subject. The truth is the job's own step period (rank 0's ``step`` lines) after
the onset against before it (``tests/integration/test_recorded_jobcost.py``). Where ranks
queue for the CPU, the other ranks' work runs while the slowed rank sleeps, so the step grows
by less than the sleep; with a core per rank it grows by the sleep.
"""

from __future__ import annotations

from pathlib import Path

from tests.record import Capture, recipe
from tests.record.frameworks import record

#: slow-N: ``train_lightning.py``, N ranks, rank ``slow_rank`` 20 ms slow from step 40 of
#: 120 (64 steps after the onset and a warm-up, and 40 clean steps before it), no restart
SLOW = {"steps": 120, "compute_ms": 20.0, "slow_ms": 20.0, "slow_from": 40}
CASES = {"slow-4": {**SLOW, "ranks": 4, "slow_rank": 2},
         "slow-3": {**SLOW, "ranks": 3, "slow_rank": 2}}


def _case(name: str) -> None:
    @recipe(name)
    def run(tmp: Path) -> Capture:
        return record(tmp, "train_lightning.py", name, CASES[name])


for _name in CASES:
    _case(_name)
