"""The open straggler findings priced together: what the job would gain without all of them
(``joint_job_slowdown``) and each finding's part of it (``job_slowdown_part``), the parts
adding up to the whole. Overlapping stragglers each priced alone hide each other's cost (a
finding behind a slower one reads 0); a rank inside a flagged host is counted once. Every
expected value is hand arithmetic on planted ready times (docs/detectors.md states the rule:
slowest subject first, each charged the drop its removal causes)."""

from __future__ import annotations

import numpy as np
import pytest

from goodlens.detectors.jobcost import RecentSteps
from goodlens.detectors.stragglers import StragglerDetector, Topology


def _rotate(values: list[float], steps: range, ranks: int) -> np.ndarray:
    """Rank r at step s reaches the collective at ``values[(r + s) % len(values)]``: every
    value once per step when ``ranks == len(values)`` (the step's latest is the largest)."""
    return np.array([[values[(r + s) % len(values)] for r in range(ranks)] for s in steps])


#: 11 or 12 healthy ranks' ready times, rotating: the latest of them is 0.86 s every step
HEALTHY_11 = [0.80 + 0.006 * i for i in range(11)]
HEALTHY_12 = [0.80 + 0.06 * i / 11 for i in range(12)]


def test_two_overlapping_ranks_are_priced_together_slowest_first():
    """8 ranks; ranks 2 and 5 reach the collective at 1.21 s and 1.15 s, the other six at
    1.00 s, and the step ends 0.20 s after its latest rank. Step 4 is a hiccup: rank 0 at
    3.0 s (step 3.2 s), which the medians do not move. By hand: with both the latest is
    1.21 s, without both 1.00 s: the job loses 0.21 s of the 1.41 - 0.21 = 1.20 s step it
    would have, 0.175. Slowest first: removing rank 2 drops the latest to 1.15 s (0.06 /
    1.20 = 0.05), then rank 5 to 1.00 s (0.15 / 1.20 = 0.125): 0.05 + 0.125 = 0.175. Each
    priced with the other still in the job: rank 5 costs 0 (rank 2 is later), rank 2
    0.06 / 1.35 = 0.0444."""
    rec = RecentSteps(8)
    for s in range(5):
        row = np.full(8, 1.0)
        row[2], row[5] = 1.21, 1.15
        if s == 4:
            row[0] = 3.0
        rec.add_one(s, row, float(row.max()) + 0.2)
    joint, (p2, p5) = rec.joint_job_slowdown([[2], [5]], None)
    assert joint == pytest.approx(0.21 / 1.20, abs=1e-6)
    assert p2 == pytest.approx(0.06 / 1.20, abs=1e-6)
    assert p5 == pytest.approx(0.15 / 1.20, abs=1e-6)
    assert p2 + p5 == pytest.approx(joint, abs=1e-12)
    # alone, each with the other still in the job: the slower hides the faster's cost
    assert rec.job_slowdown([5], None) == 0.0
    assert rec.job_slowdown([2], None) == pytest.approx(0.06 / 1.35, abs=1e-6)
    # the order the findings are given in does not change who is charged what
    joint2, (q5, q2) = rec.joint_job_slowdown([[5], [2]], None)
    assert (joint2, q5, q2) == pytest.approx((joint, p5, p2))


def test_a_rank_inside_a_flagged_host_is_counted_once():
    """8 ranks, host A = ranks 0-3 at 1.10 s except rank 1 at 1.25 s, ranks 4-7 at 1.00 s,
    the step ending 0.20 s after its latest rank. By hand: the latest is 1.25 s with both,
    1.00 s without: 0.25 / (1.45 - 0.25) = 0.2083. Rank 1 (the slowest) first: 1.25 -> 1.10,
    0.15 / 1.20 = 0.125; then the host on its other ranks: 1.10 -> 1.00, 0.10 / 1.20 =
    0.0833. Priced alone the host would count rank 1's cost too (0.25 / 1.20), so the two
    alone would add up to more than the job loses."""
    rec = RecentSteps(8)
    for s in range(10):
        row = np.array([1.10, 1.25, 1.10, 1.10, 1.0, 1.0, 1.0, 1.0])
        rec.add_one(s, row, 1.45)
    joint, (host, rank) = rec.joint_job_slowdown([[0, 1, 2, 3], [1]], None)
    assert joint == pytest.approx(0.25 / 1.20, abs=1e-6)
    assert rank == pytest.approx(0.15 / 1.20, abs=1e-6)
    assert host == pytest.approx(0.10 / 1.20, abs=1e-6)
    assert host + rank == pytest.approx(joint, abs=1e-12)
    assert rec.job_slowdown([0, 1, 2, 3], None) + rec.job_slowdown([1], None) > joint + 0.1


def test_subjects_covering_every_rank_or_no_step_have_no_joint_figure():
    rec = RecentSteps(4)
    assert rec.joint_job_slowdown([[0]], None) is None   # no step yet
    rec.add_one(0, np.array([1.0, 1.2, 1.0, 1.0]), 1.4)
    assert rec.joint_job_slowdown([[0, 1], [2, 3]], None) is None   # nothing outside
    assert rec.joint_job_slowdown([[1]], since=5) is None            # no step since
    joint, (part,) = rec.joint_job_slowdown([[1]], None)
    assert joint == part == pytest.approx(0.2 / 1.2, abs=1e-6)


def _findings(x: np.ndarray, hosts: list[str]) -> dict[tuple[str, object], object]:
    det = StragglerDetector(None, x.shape[1], Topology.from_hosts(hosts))
    det.update_many(range(len(x)), x, (x.max(axis=1) + 0.05).tolist())
    return {(f.subject_kind, f.subject_id): f for f in det.active()}


def test_the_detector_prices_a_slow_rank_and_a_slow_host_on_another_host_together():
    """4 hosts of 4 ranks. From step 20 rank 1 (host h0) reaches the collective at 1.00 s,
    host h2's ranks 8-11 at 0.93-0.95 s (rotating), the 11 others at 0.80-0.86 s (rotating);
    the step ends 0.05 s after its latest rank. By hand: the latest is 1.00 s with both,
    0.86 s without: 0.14 s of the 1.05 - 0.14 = 0.91 s step, 0.1538. Rank 1 first: 1.00 ->
    0.95 s, 0.05 / 0.91 = 0.0549; host h2: 0.95 -> 0.86 s, 0.09 / 0.91 = 0.0989. Priced alone
    the host reads 0 (rank 1 is later) and rank 1 0.05 / 1.00."""
    x = np.empty((120, 16))
    x[:20] = _rotate(HEALTHY_12 + HEALTHY_12[:4], range(20), 16)
    rest = [0, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]
    x[20:, rest] = _rotate(HEALTHY_11, range(20, 120), 11)
    x[20:, 8:12] = _rotate([0.93, 0.94, 0.95, 0.94], range(20, 120), 4)
    x[20:, 1] = 1.00
    found = _findings(x, [f"h{r // 4}" for r in range(16)])
    assert set(found) == {("rank", 1), ("host", "h2")}
    rank, host = found[("rank", 1)], found[("host", "h2")]
    assert rank.joint_job_slowdown == host.joint_job_slowdown == \
        pytest.approx(0.14 / 0.91, abs=1e-5)
    assert rank.job_slowdown_part == pytest.approx(0.05 / 0.91, abs=1e-5)
    assert host.job_slowdown_part == pytest.approx(0.09 / 0.91, abs=1e-5)
    assert host.job_slowdown == 0.0
    assert rank.job_slowdown == pytest.approx(0.05 / 1.00, abs=1e-5)


def test_the_detector_charges_a_host_for_its_ranks_other_than_a_flagged_one():
    """4 hosts of 4 ranks. From step 20 host h2's ranks 8, 10 and 11 reach the collective at
    0.93-0.95 s (rotating) and its rank 9 at 1.05 s; the 12 others at 0.80-0.86 s; the step
    ends 0.05 s after its latest rank. By hand: 1.05 s with both, 0.86 s without: 0.19 s of
    a 1.10 - 0.19 = 0.91 s step, 0.2088. Rank 9 first: 1.05 -> 0.95 s, 0.10 / 0.91 = 0.1099;
    the host on ranks 8, 10 and 11: 0.95 -> 0.86 s, 0.09 / 0.91 = 0.0989. Priced alone the
    host's would include rank 9's cost: 0.19 / 0.91."""
    x = np.empty((120, 16))
    x[:20] = _rotate(HEALTHY_12 + HEALTHY_12[:4], range(20), 16)
    rest = [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]
    x[20:, rest] = _rotate(HEALTHY_12, range(20, 120), 12)
    x[20:, [8, 10, 11]] = _rotate([0.93, 0.94, 0.95], range(20, 120), 3)
    x[20:, 9] = 1.05
    found = _findings(x, [f"h{r // 4}" for r in range(16)])
    assert set(found) == {("rank", 9), ("host", "h2")}
    rank, host = found[("rank", 9)], found[("host", "h2")]
    assert rank.joint_job_slowdown == pytest.approx(0.19 / 0.91, abs=1e-5)
    assert rank.job_slowdown_part == pytest.approx(0.10 / 0.91, abs=1e-5)
    assert host.job_slowdown_part == pytest.approx(0.09 / 0.91, abs=1e-5)
    assert host.job_slowdown == pytest.approx(0.19 / 0.91, abs=1e-5)


def _finding(kind: str, sid: object, ranks: list[int], job: float, part: float,
             joint: float, status: str = "update", last_step: int = 99):
    from goodlens.detectors.stragglers import Finding
    return Finding(kind, sid, ranks, 20, 30, 0.1, 5.0, 60.0, "evict", 0.9, 0, status,
                   f"0/{kind}/{sid}/20", last_step, "h0" if kind == "rank" else None,
                   None, "x", job, part, joint)


class _Detection:
    """What /metrics and /v1/actions read of the collector's detection service."""

    def __init__(self, found: list) -> None:
        self.found = found

    def flagged(self) -> dict[str, list]:
        return {"r": self.found}

    def onset(self, run_id: str, finding_id: str) -> float | None:
        return None


def test_every_surface_shows_each_findings_part_and_the_joint_figure():
    """Two open findings (a rank: 0.0549 of a 0.1538 joint; a host: 0.0989 and 0 alone) and
    one resolved: detect's cells, its run-level figure, /v1/actions and /metrics carry the
    part per finding and the joint figure once per run (the resolved finding's cells none)."""
    from dataclasses import asdict

    from goodlens.analysis.findings import finding_cells, joint_job_slowdown
    from goodlens.collector.actions import evictions
    from goodlens.collector.metrics import _stragglers

    rank = _finding("rank", 1, [1], 0.05, 0.0549, 0.1538)
    host = _finding("host", "h2", [8, 9, 10, 11], 0.0, 0.0989, 0.1538)
    gone = _finding("rank", 7, [7], 0.02, 0.5, 0.9, status="resolved", last_step=120)
    dicts = [asdict(f) for f in (rank, host, gone)]
    cells = [finding_cells(f) for f in dicts]
    assert [(c["job_slowdown"], c["job_slowdown_part"], c["joint_job_slowdown"])
            for c in cells] == [("5.0%", "5.5%", "15.4%"), ("0.0%", "9.9%", "15.4%"),
                                ("2.0%", "", "")]
    assert joint_job_slowdown(dicts) == 0.1538
    assert joint_job_slowdown(dicts[2:]) is None

    det = _Detection([rank, host])
    acts = {(a["subject_kind"], a["subject_id"]): a for a in evictions(det, "r")}
    assert (acts[("host", "h2")]["job_slowdown"], acts[("host", "h2")]["job_slowdown_part"],
            acts[("host", "h2")]["joint_job_slowdown"]) == (0.0, 0.0989, 0.1538)
    assert acts[("rank", 1)]["job_slowdown_part"] == 0.0549

    fams = {m.name: m for m in _stragglers(det, {"r"})}
    parts = {s.labels["subject"]: s.value
             for s in fams["goodlens_straggler_job_slowdown_part_ratio"].samples}
    assert parts == {"1": 0.0549, "h2": 0.0989}
    (joint,) = fams["goodlens_run_straggler_joint_job_slowdown_ratio"].samples
    assert (joint.labels, joint.value) == ({"run": "r"}, 0.1538)
