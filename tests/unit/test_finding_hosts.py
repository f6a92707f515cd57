"""A finding names the host its ranks ran on in the attempts it covers, not where they ran
last (issue #51, point 5).

A hand-written two-attempt timeline: 8 ranks, two per host (node-a..node-d); node-b's ranks
(2 and 3) reach the collective 25% late from step 40; node-b fails after step 119, and the
next attempt resumes from step 100 with spare node-e on ranks 2 and 3. The expected hosts,
ranks and attempts are written out by hand from that story; the noise is the test's own
(normal, 1% of the step).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from goodlens.analysis.findings import (
    attempt_rank_hosts,
    detect_run,
    end_world,
    finding_cells,
    finding_dicts,
    finding_host,
    finding_hosts,
)
from goodlens.detectors.topology import Topology, new_world

BEFORE = ["node-a", "node-a", "node-b", "node-b", "node-c", "node-c", "node-d", "node-d"]
AFTER = ["node-a", "node-a", "node-e", "node-e", "node-c", "node-c", "node-d", "node-d"]


class Source:
    """The parts of a store ``detect_run`` reads, over a hand-written run: per attempt, its
    steps, each rank's time to reach the collective, and each rank's host."""

    def __init__(self, attempts: list[tuple[list[int], np.ndarray, list[str]]]) -> None:
        self.parts = attempts

    def run_row(self, run_id: str) -> dict[str, Any]:
        return {"run_id": run_id, "tags": "{}"}

    def ready_matrix(self, run_id: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
        att = np.concatenate([np.full(len(s), a) for a, (s, _, _) in enumerate(self.parts)])
        steps = np.concatenate([s for s, _, _ in self.parts])
        values = np.vstack([v for _, v, _ in self.parts])
        return {"attempt": att, "step": steps,
                "duration_s": values.max(axis=1) + 0.2}, values

    def rank_host_map(self, run_id: str, attempt: int | None = None
                      ) -> dict[int, str | None]:
        a = len(self.parts) - 1 if attempt is None else attempt
        return dict(enumerate(self.parts[a][2])) if 0 <= a < len(self.parts) else {}


def timeline(slow_ranks_before: list[int], slow_ranks_after: list[int],
             after: list[str]) -> Source:
    """Attempt 0: steps 0-119, ``slow_ranks_before`` 25% late from step 40; attempt 1
    (resumed from step 100): steps 100-219 on ``after``, ``slow_ranks_after`` 25% late."""
    rng = np.random.default_rng(51)
    a0 = 1.0 + rng.normal(0.0, 0.01, (120, 8))
    a0[40:, slow_ranks_before] += 0.25
    a1 = 1.0 + rng.normal(0.0, 0.01, (120, 8))
    a1[:, slow_ranks_after] += 0.25
    return Source([(list(range(120)), a0, BEFORE), (list(range(100, 220)), a1, after)])


def test_a_slow_hosts_finding_names_it_after_a_spare_took_its_ranks():
    """node-b is slow and fails; node-e takes ranks 2 and 3 and is healthy. One finding:
    host node-b (its two ranks, each too few to split, roll up to their host), begun and
    ended in attempt 0, resolved at node-b's last step (119). Nothing names node-e."""
    src = timeline([2, 3], [], AFTER)
    found = finding_dicts(detect_run(src, "r"))
    assert [(f["subject_kind"], f["subject_id"], f["ranks"], f["attempt"], f["status"],
             f["last_step"]) for f in found] == [("host", "node-b", [2, 3], 0, "resolved", 119)]
    (f,) = found
    assert f["id"].startswith("0/host/node-b/") and 35 <= f["first_step"] <= 45
    assert f["slowdown"] == pytest.approx(0.25, abs=0.03)
    by_attempt = attempt_rank_hosts(src, "r", [0, 1])
    assert by_attempt == {0: dict(enumerate(BEFORE)), 1: dict(enumerate(AFTER))}
    assert finding_hosts(f, by_attempt) == ["node-b"]
    assert finding_host(f) == "node-b" and finding_cells(f)["host"] == "node-b"
    assert "node-e" not in repr(found)


def test_a_rank_slow_on_both_hosts_is_two_findings_one_per_host():
    """Rank 2 is slow wherever it runs (its own data, say): on node-b in attempt 0 and on
    node-e in attempt 1. Two findings, each naming the host the rank ran on while it was
    slow: node-b's resolved at step 119, node-e's open from the new attempt's start."""
    src = timeline([2], [2], AFTER)
    found = finding_dicts(detect_run(src, "r"))
    assert [(f["subject_kind"], f["subject_id"], f["host"], f["attempt"], f["status"])
            for f in found] == [("rank", 2, "node-b", 0, "resolved"),
                                ("rank", 2, "node-e", 1, "update")]
    old, new = found
    assert old["last_step"] == 119 and old["id"].startswith("0/rank/2/")
    assert new["id"].startswith("1/rank/2/") and 100 <= new["first_step"] <= 110
    by_attempt = attempt_rank_hosts(src, "r", [0, 1])
    assert [finding_hosts(f, by_attempt) for f in found] == [["node-b"], ["node-e"]]


def test_a_restart_on_the_same_hosts_keeps_one_finding():
    """The control: rank 2 still slow after a restart on the same hosts is one finding,
    begun in attempt 0 on node-b and open at the end (the detector's carry-over over a
    restart is unchanged)."""
    src = timeline([2], [2], BEFORE)
    found = finding_dicts(detect_run(src, "r"))
    assert [(f["subject_id"], f["host"], f["attempt"], f["status"]) for f in found] == [
        (2, "node-b", 1, "update")]
    assert found[0]["id"].startswith("0/rank/2/")


def test_a_restart_on_the_same_hosts_keeps_one_host_finding():
    """The same for a host: node-b's two ranks (too few to split: rolled up to the host)
    slow before and after a restart on the same hosts are one finding, begun in attempt 0
    and open at the end, not one resolved at the restart and a second one found again."""
    src = timeline([2, 3], [2, 3], BEFORE)
    found = finding_dicts(detect_run(src, "r"))
    assert [(f["subject_kind"], f["subject_id"], f["attempt"], f["status"])
            for f in found] == [("host", "node-b", 1, "update")]
    assert found[0]["id"].startswith("0/host/node-b/")


def test_a_new_world_is_a_moved_rank_or_more_ranks():
    """By hand: ranks 2-3 to node-e is a new world; the same hosts on fewer ranks is not;
    more ranks than the world's is; hosts becoming unknown is."""
    before, after = Topology.from_hosts(BEFORE), Topology.from_hosts(AFTER)
    assert new_world(before, 8, after, 8)
    assert not new_world(before, 8, Topology.from_hosts(BEFORE[:4]), 4)
    assert new_world(Topology.from_hosts(BEFORE[:4]), 4, before, 8)
    assert new_world(before, 8, None, 8) and not new_world(None, 8, None, 8)


def test_the_end_of_a_world_resolves_its_open_findings():
    src = timeline([2], [2], AFTER)
    found = detect_run(src, "r")
    assert [f.status for f in end_world(found)] == ["resolved", "resolved"]
    assert [f.status for f in found] == ["resolved", "update"]   # its input unchanged
