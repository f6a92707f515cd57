"""End-to-end smoke: a real elastic job evicts the straggler node the collector names.

Why: the detector says "evict" and the job's eviction client acts on it; only a live run
shows the loop closed: a real collector's detector, ``GET /v1/actions``, the job's guard
rails, the checkpoint, the evicted node's agent leaving and a hot spare's taking its place.
``examples/elastic/scenario.py --evict-only`` runs it: 3 torchrun agents x 2 gloo ranks
(a node each, c10d rendezvous on a store process of its own) and a spare agent waiting,
``node-b`` slowed from its first steps, ``--evict on``.

A smoke test: it asserts only what a loaded machine cannot change (the node evicted is the
planted one whatever the estimates, the events are there in their causal order, the batch
is kept, the buckets sum, everything ends cleanly). The full scenario (a node lost, the
spares, the eviction) is recorded (``tests/record/elastic.py``, recording ``elastic``) and
its numbers, and a dry-run client's decisions, are checked exactly in
``tests/integration/test_recorded_elastic.py``. Every phase waits on a condition with a
generous timeout; nothing is retried.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.jobclock import buckets_sum_to_wall_clock

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

#: the job's settings: as the recording's, fewer steps (the eviction comes 20-60 steps after
#: the onset, a few steps in; the rest is the new world's tail)
SMOKE_STEPS = 100
FIRST_WORLD = ["node-a", "node-b", "node-c"]
AFTER = ["node-a", "node-c", "node-d"]


def ranks_of(truth: list[dict], attempt: int, node: str) -> list[int]:
    """The ranks ``node`` held in ``attempt`` (the rendezvous orders nodes its own way)."""
    line = next(x for x in truth if x["kind"] == "world" and x["rank"] == 0
                and x["attempt"] == attempt)
    return [r for r, h in enumerate(line["hosts"]) if h == node]


def worlds(truth: list[dict]) -> list[tuple]:
    """(attempt, world, nodes, micro-batch, accumulation) rank 0 ran, by attempt."""
    return [(x["attempt"], x["world"], sorted(set(x["hosts"])), x["micro"], x["accumulation"])
            for x in sorted(truth, key=lambda x: x["attempt"])
            if x["kind"] == "world" and x["rank"] == 0]


def test_the_job_evicts_the_straggler_node_the_collector_names(tmp_path: Path) -> None:
    from goodlens.analysis.report import report_dict
    from goodlens.storage.store import Store
    from tests.record.elastic import ELASTIC, elastic_args, scenario_module, story

    mod = scenario_module()
    sc = mod.Scenario(tmp_path, "faults", nproc=ELASTIC["nproc"], steps=SMOKE_STEPS,
                      evict="on", timeout_s=400, extra=elastic_args(ELASTIC))
    try:
        summary = sc.run_evict()
    except Exception:
        sc.stop()
        logs = {p.name: p.read_text(errors="replace")[-2500:] for p in tmp_path.glob("*.log")}
        pytest.fail(json.dumps(logs, indent=1))
    finally:
        sc.stop()
    truth = mod.progress(tmp_path / "truth")
    # the job finished on the nodes left, and the collector stopped cleanly
    codes = summary["exit_codes"]
    assert codes["node-a"] == codes["node-c"] == codes["node-d"] == 0, codes
    assert sc.procs["collector"].returncode == 0, (tmp_path / "collector.log").read_text()[-2500:]
    # two worlds: node-b's place taken by the spare; the global batch kept (48 = 6 ranks x
    # 2 micro-batches of 4)
    assert worlds(truth) == [(0, 6, FIRST_WORLD, 4, 2), (1, 6, AFTER, 4, 2)]
    # every rank of the first world left at the same step, for node-b
    evicted = [x for x in truth if x["kind"] == "evict"]
    assert {x["host"] for x in evicted} == {"node-b"} and len(evicted) == 6, evicted
    assert len({x["step"] for x in evicted}) == 1 and {x["attempt"] for x in evicted} == {0}
    at = evicted[0]["step"]

    store = Store(Path(summary["db"]), read_only=True)
    try:
        ev, steps, rep = (store.events("faults"), store.step_summaries("faults"),
                          report_dict(store, "faults"))
    finally:
        store.close()
    # the eviction is recorded with the finding that caused it: a confirmed evict about
    # node-b (a host finding, or a rank finding on that host: the node is what leaves), at
    # the confidence the job's rail asks for
    ours = ev[(ev.kind == "rank_evicted") & (ev.cause == "straggler")]
    assert len(ours) and set(ours.host) == {"node-b"}, ours
    finding = json.loads(ours.detail.iloc[0])["finding"]
    assert finding["host"] == "node-b" and finding["action"] == "evict", finding
    assert finding["confidence"] >= ELASTIC["min_confidence"], finding
    assert finding["subject_kind"] in ("host", "rank"), finding
    assert sorted(ours["rank"].astype(int)) == sorted(finding["ranks"])
    assert set(finding["ranks"]) <= set(ranks_of(truth, 0, "node-b")), finding
    assert not len(ev[(ev.kind == "rank_evicted") & (ev.cause == "node_lost")])
    # the story, in causal order: the detector's finding, the job's decision, the spare
    # joining the new world, the end
    expected = ["flagged:node-b:evict", "evicted:node-b:straggler", "end:resized",
                "joined:node-d", "resized:6", "end:completed"]
    got = story(ev)
    assert [s for s in got if s in expected] == expected, got
    # the async DCP checkpoints under torchrun: durable on every rank of the first world,
    # and the new world restored the eviction's own checkpoint on every rank
    durable = ev[(ev.kind == "ckpt_save_durable_end") & (ev.attempt == 0)]
    assert any(set(g["rank"].astype(int)) == set(range(6)) for _, g in durable.groupby("step"))
    restored = ev[ev.kind == "ckpt_restore_end"]
    assert set(restored.attempt) == {1} and set(restored.step) == {at}, restored
    assert sorted(restored["rank"].astype(int)) == list(range(6)) and (restored.bytes > 0).all()
    # goodlens's step summaries: the global batch on every step all ranks reported
    full = steps[steps.ranks == 6]
    assert set(full.attempt) == {0, 1} and set(full.samples.astype(int)) == {48}
    assert full.step.max() == SMOKE_STEPS - 1
    # the report: every second in one bucket, for the run and each attempt
    buckets_sum_to_wall_clock(rep)
    assert len(rep["attempts"]) == 2
    for a in rep["attempts"]:
        assert sum(a["buckets"].values()) == pytest.approx(a["wall_clock_s"], rel=1e-6)
