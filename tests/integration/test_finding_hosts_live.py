"""The live detector, the batch pass and ``/v1/actions`` name the same host for a finding
whose ranks moved to a spare (issue #51, point 5).

The unit tests' hand-written timeline (``tests/unit/test_finding_hosts.py``): 8 ranks, two
per host; node-b's ranks 25% late from step 40; node-b fails after step 119 and spare node-e
takes ranks 2 and 3 in attempt 1 (resumed from step 100), healthy. Pushed through the
collector's writer in rounds of 40 steps, a detection pass after each, as a live job's
pushes arrive.
"""

from __future__ import annotations

import time

import numpy as np

from goodlens.collector.actions import evictions
from goodlens.collector.detection import DetectionService
from goodlens.model.batch import validate_batch
from goodlens.model.schema import EventKind
from goodlens.storage.store import Store
from goodlens.storage.writer import Writer
from tests.unit.test_finding_hosts import AFTER, BEFORE, timeline


def _push(writer: Writer, attempt: int, steps: list[int], ready: np.ndarray,
          hosts: list[str], t0: float) -> None:
    """One round of every rank's step rows: each step ends 0.2 s after its slowest rank."""
    dur = ready.max(axis=1) + 0.2
    start = t0 + np.concatenate([[0.0], np.cumsum(dur)[:-1]])
    for r, host in enumerate(hosts):
        writer.submit(validate_batch({
            "schema_version": 1, "run_id": "spare",
            "steps": {"attempt": attempt, "rank": r, "host": host, "step": steps,
                      "start_time": start.tolist(), "duration_s": dur.tolist(),
                      "compute_s": ready[:, r].tolist(),
                      "collective_wait_s": (dur - ready[:, r]).tolist()}}))
    writer.sync()


def test_live_batch_and_actions_name_the_slow_host_not_its_spare(tmp_path):
    from goodlens.analysis.findings import detect_run, finding_dicts, stored_findings
    src = timeline([2, 3], [], AFTER)
    store = Store(tmp_path / "spare.duckdb")
    writer = Writer(store).start()
    t = time.time() - 600.0
    offered: list[tuple[int, list[str]]] = []   # (attempt, hosts /v1/actions offered)
    try:
        svc = DetectionService(store, writer)
        for attempt, (steps, ready, hosts) in enumerate(src.parts):
            for lo in range(0, len(steps), 40):
                _push(writer, attempt, steps[lo:lo + 40], ready[lo:lo + 40], hosts, t)
                t += float((ready[lo:lo + 40].max(axis=1) + 0.2).sum())
                svc.poll_once(now=t)
                offered.append((attempt, [e["host"] for e in evictions(svc, "spare")]))
            t += 30.0   # the restart
        # while node-b ran slow, /v1/actions offered node-b; once node-e held its ranks,
        # nothing (the finding ended with node-b's world)
        assert ["node-b"] in [h for a, h in offered if a == 0], offered
        assert all(h == [] for a, h in offered if a == 1), offered
        live = stored_findings(store, "spare")
        batch = finding_dicts(detect_run(store, "spare"))
        pick = ("id", "subject_kind", "subject_id", "ranks", "attempt", "status", "last_step")
        assert [tuple(f[k] for k in pick) for f in live] == \
            [tuple(f[k] for k in pick) for f in batch]
        assert [(f["subject_id"], f["attempt"], f["status"], f["last_step"]) for f in live] \
            == [("node-b", 0, "resolved", 119)]
        ev = store.events("spare", kinds=[EventKind.STRAGGLER_FLAGGED])
        assert set(ev.host) == {"node-b"} and set(ev.attempt.astype(int)) == {0}
        assert BEFORE[2] == "node-b" and AFTER[2] == "node-e"   # the story, by hand
    finally:
        writer.stop()
        store.close()
