"""The elastic scenario, recorded and replayed exactly: a lost node, a hot spare, a straggler
evicted through the collector's ``/v1/actions``, and what a dry-run job would have decided.

The recording ``elastic`` (``tests/record/elastic.py``) is ``examples/elastic/scenario.py``'s
full run: 3 torchrun agents x 2 gloo ranks (global batch 48, micro-batch 4), ``node-c``
killed, spare ``node-d`` joining, ``node-b`` slowed and evicted, spare ``node-e`` in its
place. The replay pushes what the live collector stored through the in-process collector;
after each detection pass a job's eviction client (the real
:class:`~goodlens.exporter.elastic.EvictionClient`, its rails and history file) polls the
replay's ``/v1/actions``, once as the recorded job did (``on``) and once in ``dry_run``, so
the dry run's claims need no second live job. Expected values come from the job's settings
(``job.json``), its clock files and hand arithmetic; the live smoke test
(``tests/e2e/test_elastic_scenario.py``) shows the loop closed on a real job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from goodlens.exporter.elastic import EvictionClient, EvictionPolicy
from tests.jobclock import JobResult, buckets_sum_to_wall_clock
from tests.record.elastic import story
from tests.recorded import InProcessCollector, replay


class Sink:
    """Stands in for the job's exporter: keeps the events the client records."""

    enabled = True

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def event(self, kind: Any, **fields: Any) -> None:
        self.events.append({"kind": str(getattr(kind, "value", kind)), **fields})


class ActionsClient(EvictionClient):
    """The job's eviction client, asking the replay's collector (``collector``, set before
    each poll) instead of a URL."""

    collector: InProcessCollector | None = None

    def fetch(self) -> list[dict[str, Any]]:
        assert self.collector is not None
        found = self.collector.get("/v1/actions", run=self.run_id)["evict"]
        return [f for f in found if isinstance(f, dict)]


@dataclass
class Job:
    """Rank 0's side of the recorded job, one mode: a client per attempt (each attempt's
    rank 0 starts one with that attempt's nodes), one history file, as the job has."""

    mode: str
    settings: dict
    worlds: dict[int, tuple[float, list[str]]]
    history: Path
    sink: Sink = field(default_factory=Sink)
    clients: dict[int, ActionsClient] = field(default_factory=dict)
    decisions: list[tuple[float, int, Any]] = field(default_factory=list)
    """(pass instant, attempt, Decision) of every decision recorded."""
    taken: list[tuple[float, int, Any]] = field(default_factory=list)
    """(pass instant, attempt, Decision) of every eviction handed to the training loop."""

    def poll(self, col: InProcessCollector, now: float, run_id: str) -> None:
        begun = [a for a, (t, _) in self.worlds.items() if t <= now]
        if not begun:
            return
        attempt = max(begun)
        if attempt not in self.clients:
            s = self.settings
            policy = EvictionPolicy(self.mode, s["min_confidence"],
                                    s["max_evictions_per_hour"], s["min_nodes"])
            self.clients[attempt] = ActionsClient(self.sink, None, run_id, policy,
                                                  self.worlds[attempt][1], self.history)
        client = self.clients[attempt]
        client.collector = col
        d = client.poll_once(now=now)
        if d is not None:
            self.decisions.append((now, attempt, d))
        taken = client.take()
        if taken is not None:
            self.taken.append((now, attempt, taken))


@dataclass
class Replayed:
    """The replay, the two modes' polls, and goodlens's step summaries of the replay."""

    res: JobResult
    on: Job
    dry: Job
    summaries: Any


@pytest.fixture(scope="module")
def elastic(tmp_path_factory: pytest.TempPathFactory) -> Replayed:
    from goodlens.storage.store import Store
    from tests.recorded import load

    rec = load("elastic")
    tmp = tmp_path_factory.mktemp("elastic")
    worlds = {a: (x["t"], x["hosts"]) for (r, a), lines in rec.truth.items() if r == 0
              for x in lines if x["kind"] == "world"}
    s = rec.job["settings"]
    on = Job("on", s, worlds, tmp / "on.jsonl")
    dry = Job("dry_run", s, worlds, tmp / "dry.jsonl")

    def each_pass(col: InProcessCollector, now: float) -> None:
        on.poll(col, now, rec.run_id)
        dry.poll(col, now, rec.run_id)

    res = replay("elastic", tmp, each_pass=each_pass)
    store = Store(res.db, read_only=True)
    try:
        summaries = store.step_summaries(res.run_id)
    finally:
        store.close()
    return Replayed(res, on, dry, summaries)


def worlds(res: JobResult) -> list[tuple]:
    """(attempt, world, nodes, micro-batch, accumulation) rank 0 ran, by attempt."""
    return [(a, x["world"], sorted(set(x["hosts"])), x["micro"], x["accumulation"])
            for a in sorted({a for _, a in res.truth})
            for x in res.lines("world", rank=0, attempt=a)]


def ranks_of(res: JobResult, attempt: int, node: str) -> list[int]:
    """The ranks ``node`` held in ``attempt`` (the rendezvous orders nodes its own way)."""
    hosts = res.lines("world", rank=0, attempt=attempt)[0]["hosts"]
    return [r for r, h in enumerate(hosts) if h == node]


def onset(res: JobResult) -> tuple[int, int]:
    """(attempt, step) of the straggler's onset, by the slowed ranks' own clock."""
    return min((a, x["step"]) for (r, a), lines in res.truth.items()
               for x in lines if x["kind"] == "slow_onset")


def test_each_world_keeps_the_global_batch(elastic):
    res, s = elastic.res, elastic.res.job["settings"]
    # the recorded job: node-c was killed (SIGKILL), the others finished or left
    codes = res.job["exit_codes"]
    assert codes["node-a"] == codes["node-d"] == codes["node-e"] == 0, codes
    assert codes["node-c"] == -9, codes
    # the worlds by hand: 48 samples = 6 ranks x 2 micro-batches of 4 = 4 ranks x 3
    assert (s["global_batch"], s["micro_batch"]) == (48, 4)
    assert worlds(res) == [
        (0, 6, ["node-a", "node-b", "node-c"], 4, 2),
        (1, 4, ["node-a", "node-b"], 4, 3),
        (2, 6, ["node-a", "node-b", "node-d"], 4, 2),
        (3, 6, ["node-a", "node-d", "node-e"], 4, 2)]
    # goodlens's step summaries (every rank reporting): the global batch on every world,
    # to the job's last step
    steps = elastic.summaries
    full = steps[steps.ranks == steps.attempt.map({0: 6, 1: 4, 2: 6, 3: 6})]
    assert set(full.attempt) == {0, 1, 2, 3}
    assert set(full.samples.astype(int)) == {48}
    assert full.step.max() == s["steps"] - 1
    assert s["steps"] - 1 in set(full[full.attempt == 3].step)
    # ...and the report's worlds, per attempt
    assert [(w["attempt"], w["world_size"], w["samples_per_step_min"],
             w["samples_per_step_max"]) for w in res.report["worlds"]] == [
        (0, 6, 48, 48), (1, 4, 48, 48), (2, 6, 48, 48), (3, 6, 48, 48)]


def test_the_report_accounts_every_second_and_every_gpu(elastic):
    rep, s = elastic.res.report, elastic.res.job["settings"]
    buckets_sum_to_wall_clock(rep)
    assert len(rep["attempts"]) == 4
    for a in rep["attempts"]:
        assert sum(a["buckets"].values()) == pytest.approx(a["wall_clock_s"], rel=1e-9)
    # the GPU-time view, by hand: allocated is the full world (6) plus the spare's 2 GPUs;
    # the shrunk attempt (4 ranks) idles 4, a full one the spare's 2
    allocated = s["full_world"] + s["spare_gpus"]
    assert rep["gpu_seconds"]["allocated"] == pytest.approx(allocated * rep["wall_clock_s"],
                                                            rel=1e-9)
    a0, a1, a2, a3 = sorted(rep["attempts"], key=lambda a: a["attempt"])
    assert a1["gpu_seconds"]["idle_allocated"] == pytest.approx((allocated - 4)
                                                                * a1["wall_clock_s"], rel=1e-9)
    for a in (a0, a2, a3):
        assert a["gpu_seconds"]["idle_allocated"] == pytest.approx((allocated - 6)
                                                                   * a["wall_clock_s"], rel=1e-9)
    # the eviction is a restart with its parts: the new world's start-up and its restore
    parts3 = a3["restart_parts"]
    assert parts3["init"] > 0 and parts3["restore"] > 0
    assert a3["buckets"]["restart"] == pytest.approx(sum(parts3.values()), rel=1e-9)


def test_the_story_in_order(elastic):
    """The lost node, the spare joining, the replay's own finding about node-b, the recorded
    job's decision and the second spare, in the order of their instants. Attempts 1 and 2
    ended by a resize (a spare joined, a node evicted): dated, not inferred."""
    ev = elastic.res.events
    got = story(ev, first_failure=True, ends="completed")
    expected = ["failure", "evicted:node-c:node_lost", "resized:4", "joined:node-d",
                "resized:6", "flagged:node-b:evict", "evicted:node-b:straggler",
                "joined:node-e", "resized:6", "completed"]
    assert [s for s in got if s in expected] == expected, got
    ends = ev[(ev.kind == "attempt_end") & (ev.cause == "resized")]
    assert {1, 2} <= set(ends.attempt)


def test_the_recorded_job_evicted_node_b_on_the_collectors_finding(elastic):
    """The live job's decision, as recorded: every rank of the world left at one step,
    within 60 steps of the onset, for a confirmed evict about node-b at the confidence the
    job's rail asks for."""
    res, s = elastic.res, elastic.res.job["settings"]
    attempt, start = onset(res)
    evicted = res.lines("evict")
    assert {x["host"] for x in evicted} == {s["slow_node"]} and len(evicted) == 6
    assert 0 < evicted[0]["step"] - start <= 60, (start, evicted[0]["step"])
    ev = res.events
    ours = ev[(ev.kind == "rank_evicted") & (ev.cause == "straggler")]
    finding = json.loads(ours.detail.iloc[0])["finding"]
    assert finding["host"] == "node-b" and finding["action"] == "evict"
    assert finding["confidence"] >= s["min_confidence"]
    assert finding["subject_kind"] in ("host", "rank")
    assert sorted(ours["rank"].astype(int)) == sorted(finding["ranks"])
    assert set(finding["ranks"]) <= set(ranks_of(res, attempt, "node-b"))
    assert set(ours.host) == {"node-b"}


def test_the_replays_findings_evict_node_b_within_60_steps(elastic):
    """A client polling the replay's ``/v1/actions`` after each pass, as the job's rank 0
    did (``on``, the job's rails): it evicts node-b, the slowed node, once, on a finding
    about node-b's ranks only, within the 60 steps of the onset the live job took at most."""
    res, on = elastic.res, elastic.on
    attempt, start = onset(res)
    assert len(on.taken) >= 1
    _, at, d = on.taken[0]
    assert d.host == "node-b" and d.verdict == "evict" and at == attempt, on.taken
    assert set(d.finding["ranks"]) <= set(ranks_of(res, attempt, "node-b")), d.finding
    assert d.finding["confidence"] >= res.job["settings"]["min_confidence"]
    assert 0 < d.finding["last_step"] - start <= 60, (start, d.finding)


def test_a_dry_run_records_the_eviction_it_would_make_and_evicts_nothing(elastic):
    """The same polls in ``dry_run``: one would-be eviction of node-b (the cap holds in a
    dry run too; a refusal for confidence may come first, the finding then decided again),
    and nothing ever handed to the training loop."""
    res, dry = elastic.res, elastic.dry
    assert not dry.taken, dry.taken
    verdicts = [d.verdict for _, _, d in dry.decisions]
    assert set(verdicts) <= {"dry_run", "refused:cap", "refused:confidence"}, verdicts
    decided = [(a, d) for _, a, d in dry.decisions if d.verdict != "refused:confidence"]
    assert decided and decided[0][1].verdict == "dry_run", verdicts
    attempt, d = decided[0]
    assert d.host == "node-b" and d.finding["action"] == "evict", d
    # its events, as the job records them: the would-be eviction of node-b's ranks
    would = [e for e in dry.sink.events if e["kind"] == "rank_evicted"
             and e["cause"] == "dry_run"]
    assert {e["host"] for e in would} == {"node-b"}
    assert {e["rank"] for e in would} <= set(ranks_of(res, attempt, "node-b"))
    assert not [e for e in dry.sink.events if e["cause"] == "straggler"]


def planted_lateness(s: dict, accumulation: int) -> float:
    """What the slowed node's ranks add to every step, by hand: each micro-batch's sleep
    ``compute_ms`` lasts ``slow_pct`` more, ``accumulation`` micro-batches a step."""
    return accumulation * s["compute_ms"] / 1000 * s["slow_pct"] / 100


def test_the_finding_about_node_b_against_the_jobs_clock(elastic):
    """The replay's finding: dated at the onset on the slowed ranks' clock (a few noisy
    steps either side) and reported within the 30 steps the detector promises; its slowdown
    the estimate's cap (a step's relative excess counts at most 100%: node-b's ranks reach
    the collective after 3x their siblings' compute); its wait the planted lateness times
    the steps slowed before the eviction (rank 0's clock), 5%; the report's straggler wait
    of that attempt the same, 5% (what the other ranks' noise adds is in it too)."""
    res, s = elastic.res, elastic.res.job["settings"]
    attempt, start = onset(res)
    mine = [f for f in res.findings() if f["attempt"] == attempt
            and set(f["ranks"]) <= set(ranks_of(res, attempt, "node-b"))]
    assert len(mine) == 1, res.findings()
    f = mine[0]
    assert start - 5 <= f["first_step"] <= start + 5, f
    assert start <= f["detected_step"] <= start + 30, f
    assert f["slowdown"] == pytest.approx(1.0, abs=0.02), f
    accumulation = res.lines("world", rank=0, attempt=attempt)[0]["accumulation"]
    slowed = [x for x in res.own_steps(0, attempt) if x >= start]
    waited = planted_lateness(s, accumulation) * len(slowed)
    assert f["straggler_wait_s"] == pytest.approx(waited, rel=0.05), (f, waited)
    bucket = next(a for a in res.report["attempts"]
                  if a["attempt"] == attempt)["buckets"]["straggler_wait"]
    assert bucket == pytest.approx(waited, rel=0.05), (bucket, waited)


def test_restart_and_recompute_match_the_jobs_clock(elastic):
    """Three restarts (the lost node, the spare joining, the eviction). Each cost, by rank
    0's clock, from the start of the first step the next attempt redid (or, none redone,
    the end of the attempt's last step) to the next attempt's first step, plus that step's
    warm-up: the report's ``restart`` and ``recompute`` together, 2% (how a failure's cost
    splits between them depends on when it was detected; the sum does not). A resize loses
    nothing in flight: its ``recompute`` is the steps since the checkpoint, exactly as the
    clock has them (50 ms: rank 0's clock against goodlens's reference clock)."""
    from tests.jobclock import first_step

    res = elastic.res
    rep = res.report
    total = 0.0
    for k in range(len(rep["attempts"]) - 1):
        own = res.own_steps(0, k)
        resumed = res.lines("restore", rank=0, attempt=k + 1)[0]["step"]
        since = own[resumed + 1][0] if resumed + 1 in own else max(b for _, b in own.values())
        nxt, warm = first_step(res, k + 1)
        total += nxt - since + warm
    lost = rep["buckets"]["restart"] + rep["buckets"]["recompute"]
    assert lost == pytest.approx(total, rel=0.02), (rep["buckets"], total)
    # attempt 1 ended by a resize (the spare joined): the steps since the checkpoint the
    # next attempt resumed from
    own = res.own_steps(0, 1)
    resumed = res.lines("restore", rank=0, attempt=2)[0]["step"]
    rolled = max(b for _, b in own.values()) - own[resumed + 1][0]
    a1 = next(a for a in rep["attempts"] if a["attempt"] == 1)
    assert a1["buckets"]["recompute"] == pytest.approx(rolled, abs=0.05), (a1, rolled)


#: By hand, from the scenario (examples/elastic/scenario.py, job.json): node-b is the slowed
#: node the job evicted in attempt 2; node-d (joined in attempt 2, held ranks 2-3 in attempt
#: 3) and node-e (joined in attempt 3) are the healthy spares.
SLOW_NODE, SPARES = "node-b", {"node-d", "node-e"}


def test_every_surface_names_the_evicted_straggler_never_a_spare(elastic):
    """After the run, the finding about node-b's ranks names node-b wherever it is read:
    the live detector's stored findings and events, a batch pass (``goodlens detect``, text
    and ``--json``), the dashboard's ranks page (its cells), and every eviction
    ``/v1/actions`` offered the job; it ended with node-b's world, so ``/v1/actions`` offers
    nothing at the end. No surface names a spare. (The rank-to-host map of the latest
    attempt puts node-d on ranks 2-3: a finding dated by it would blame node-d.)"""
    import json as _json

    from click.testing import CliRunner

    from goodlens.analysis.findings import (
        attempt_rank_hosts,
        detect_run,
        finding_cells,
        finding_dicts,
        finding_host,
        finding_hosts,
        stored_findings,
    )
    from goodlens.cli import main
    from goodlens.dashboard.data import RunData
    from goodlens.storage.store import Store

    res, s = elastic.res, elastic.res.job["settings"]
    assert (s["slow_node"], set(s["spares"])) == (SLOW_NODE, SPARES)
    store = Store(res.db, read_only=True)
    try:
        by_attempt = attempt_rank_hosts(store, res.run_id)
        assert by_attempt[3][2] == by_attempt[3][3] == "node-d"   # the trap
        live = stored_findings(store, res.run_id)
        batch = finding_dicts(detect_run(store, res.run_id))
        page = RunData(store).findings(res.run_id)[0]
        ev = store.events(res.run_id, kinds=["straggler_flagged"])
    finally:
        store.close()
    cli = CliRunner()
    as_json = cli.invoke(main, ["detect", "--db", str(res.db), "--run", res.run_id, "--json"])
    text = cli.invoke(main, ["detect", "--db", str(res.db), "--run", res.run_id])
    assert as_json.exit_code == 0 and text.exit_code == 0, (as_json.output, text.output)
    cli_found = _json.loads(as_json.output)["findings"]
    named = {}
    for surface, found in (("live", live), ("batch", batch), ("detect --json", cli_found),
                           ("ranks page", page)):
        ours = [f for f in found if f["attempt"] == 2 and set(f["ranks"]) <= {2, 3}]
        assert len(ours) == 1, (surface, found)
        named[surface] = (finding_host(ours[0]), finding_cells(ours[0])["host"],
                          tuple(finding_hosts(ours[0], by_attempt)), ours[0]["status"])
        assert not SPARES & {finding_host(f) for f in found}, (surface, found)
    assert set(named.values()) == {(SLOW_NODE, SLOW_NODE, (SLOW_NODE,), "resolved")}, named
    assert SLOW_NODE in text.output and not any(h in text.output for h in SPARES)
    assert set(ev.host.dropna()) == {SLOW_NODE}
    offered = [d.host for job in (elastic.on, elastic.dry) for _, _, d in job.decisions]
    assert offered and set(offered) == {SLOW_NODE}, offered
    assert res.actions["evict"] == []
    # the fleet's per-node view puts the straggler finding and the eviction on node-b too
    nodes = cli.invoke(main, ["nodes", "--db", str(res.db), "--all", "--json"])
    assert nodes.exit_code == 0, nodes.output
    rows = {r["host"]: r for r in _json.loads(nodes.output)["hosts"]}
    assert rows[SLOW_NODE]["stragglers"] >= 1 and rows[SLOW_NODE]["evictions"] >= 1
    assert set(rows) >= SPARES and all(rows[h]["stragglers"] == rows[h]["evictions"] == 0
                                       for h in SPARES), {h: rows[h] for h in SPARES}
