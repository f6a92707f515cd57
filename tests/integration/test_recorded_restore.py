"""Restore progress, recorded and replayed exactly: a slow read is ``slow_restore`` and never
evicted, a stopped read is ``stuck_restore`` within the hang timeout.

The recording ``restore`` (``tests/record/restore.py``) is ``tests/record/restore_job.py``
under torchrun, 4 gloo ranks, each restoring a 60-item DCP checkpoint at its attempt's
start: in attempt 0 rank 2 sleeps 0.15 s before each item (its read moves, ~9 s against
the others' fraction of a second); in attempt 1 rank 3 stops for good after 10 items.
The collector's hang floor is 5 s. Expected values come from the job's own clock (each
rank's ``restore_start``, every ``item`` committed, ``stopped``) and the detector's stated
rules (over 2x the median rank's own read and 5 s more; no move for the timeout), never
from goodlens.

Tolerances: the exporter reads the clock just after the job's line (its restore start, its
barrier after the last item): 50 ms on a loaded box. Progress events come from a sampler
at most once a second, so the last move goodlens knows of is at most 1 s (and a sampler
wake-up, 0.2 s) after the clock's last item; a detection pass comes every 2 s of the
job's time.
"""

from __future__ import annotations

import statistics

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.jobclock import JobResult
from tests.recorded import load, replay

READING_S = 0.05
SAMPLER_S = 1.2
WINDOW_S = 2.0
TIMEOUT_S = 5.0   # the recording's hang floor (job.json)
FACTOR, EXCESS_S = 2.0, 5.0   # the detector's defaults (RestoreConfig)

PASSES: list[dict] = []
"""Per detection pass: its instant, ``/v1/actions`` and the ranks still moving then."""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    def poll(col, now: float) -> None:
        actions = col.get("/v1/actions", run="restore")
        moving, _ = col.detection.restores.restoring("restore")
        text = col.http("GET", "/metrics")[1]
        PASSES.append({"now": now, "actions": actions, "moving": moving,
                       "metrics": {(s.name, tuple(sorted(s.labels.items()))): s.value
                                   for f in text_string_to_metric_families(text)
                                   for s in f.samples if "restore" in s.name}})
    assert load("restore").job["settings"]["hang_floor_s"] == TIMEOUT_S
    return replay("restore", tmp_path_factory.mktemp("restore"), hang_floor_s=TIMEOUT_S,
                  tail_s=12.0, each_pass=poll)


def _start(job: JobResult, rank: int, attempt: int) -> float:
    return job.lines("restore_start", rank, attempt)[0]["t"]


def _last_item(job: JobResult, rank: int, attempt: int) -> float:
    return job.lines("item", rank, attempt)[-1]["t"]


def _kinds(p: dict, kind: str) -> list[int]:
    return [f["rank"] for f in p["actions"][kind]]


def test_the_slow_read_is_slow_restore_while_it_lasts_and_only_it(job):
    own = {r: _last_item(job, r, 0) - _start(job, r, 0) for r in (0, 1, 3)}
    start2, end2 = _start(job, 2, 0), _last_item(job, 2, 0)
    assert end2 - start2 > 8.0 and max(own.values()) < 1.0, (end2 - start2, own)
    seen = []
    for p in PASSES:
        now = p["now"]
        if not start2 < now < end2 - READING_S:
            assert 2 not in _kinds(p, "slow_restore") or now < end2 + READING_S, now
            continue
        # the median rank's own read: the others' and rank 2's so far (4 ranks: the mean
        # of the middle two)
        mid = statistics.median([*own.values(), now - start2])
        elapsed = now - start2
        margin = 2 * READING_S * FACTOR
        if elapsed > FACTOR * mid + margin and elapsed - mid > EXCESS_S + margin:
            assert _kinds(p, "slow_restore") == [2], (now, p["actions"])
            seen.append(now)
        elif elapsed < FACTOR * mid - margin or elapsed - mid < EXCESS_S - margin:
            assert _kinds(p, "slow_restore") == [], (now, p["actions"])
    assert seen, "no pass in rank 2's read was past the thresholds"
    flagged = [f for p in PASSES for f in p["actions"]["slow_restore"]]
    assert {(f["rank"], f["attempt"]) for f in flagged} == {(2, 0)}
    f = flagged[0]
    assert f["phase"] == "read" and f["advice"].startswith("wait")
    assert 0 < f["bytes_read"] < f["bytes_total"]


def test_the_slow_rank_is_never_evicted_and_moves_until_its_read_ends(job):
    start2, end2 = _start(job, 2, 0), _last_item(job, 2, 0)
    during = [p for p in PASSES if start2 + READING_S < p["now"] < end2 - READING_S]
    assert during and all(2 in p["moving"] for p in during)
    assert all(p["actions"]["evict"] == [] for p in PASSES)
    assert not (job.events.kind == "rank_evicted").any()


def test_the_stopped_read_is_stuck_restore_within_the_hang_timeout(job):
    stopped = _last_item(job, 3, 1)
    assert job.lines("stopped", 3, 1), "rank 3 never stopped"
    stuck = [p["now"] for p in PASSES if _kinds(p, "stuck_restore")]
    assert stuck, "no pass called it stuck"
    first = stuck[0]
    # its last move is known at most a sampler interval after its last item; stuck once
    # the timeout has passed since then, at the first pass after that
    assert stopped + TIMEOUT_S < first <= stopped + TIMEOUT_S + SAMPLER_S + WINDOW_S, \
        (first - stopped)
    for p in PASSES:
        assert set(_kinds(p, "stuck_restore")) <= {3}
        if p["now"] >= first:
            assert _kinds(p, "stuck_restore") == [3] and 3 not in p["moving"]
    f = next(p for p in PASSES if p["now"] == first)["actions"]["stuck_restore"][0]
    assert (f["attempt"], f["phase"], f["timeout_s"]) == (1, "read", TIMEOUT_S)
    # the others finished their reads and wait for it: neither slow nor stuck
    assert all(_kinds(p, "slow_restore") == [] for p in PASSES if p["now"] > first)


def test_metrics_carry_the_restore_while_it_lasts(job):
    first = next(p for p in PASSES if _kinds(p, "stuck_restore"))
    m = first["metrics"]
    run = (("run", "restore"),)
    assert m[("goodlens_run_stuck_restore_ranks", run)] == 1
    assert m[("goodlens_run_slow_restore_ranks", run)] == 0
    assert m[("goodlens_run_restore_ranks", (("phase", "barrier"), ("run", "restore")))] == 3
    assert m[("goodlens_run_restore_ranks", (("phase", "read"), ("run", "restore")))] == 1
    stuck_bytes = first["actions"]["stuck_restore"][0]["bytes_read"]
    assert m[("goodlens_rank_restore_bytes_read", (("rank", "3"), ("run", "restore")))] == \
        stuck_bytes
    slow = next(p for p in PASSES if _kinds(p, "slow_restore"))["metrics"]
    assert slow[("goodlens_run_slow_restore_ranks", run)] == 1
    assert ("goodlens_restore_flagged_seconds",
            (("kind", "slow_restore"), ("rank", "2"), ("run", "restore"))) in slow
