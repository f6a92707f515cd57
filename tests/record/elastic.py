"""Recipes: the elastic scenario, async DCP checkpoints under torchrun, and the hostile pushes'
good rows.

- ``elastic``: ``examples/elastic/scenario.py``'s full run (3 torchrun agents x 2 gloo ranks;
  node-c killed, hot spare node-d joins, node-b slowed and evicted by the collector's
  ``/v1/actions`` for hot spare node-e);
- ``async-dcp``: ``examples/train_ddp.py --async-ckpt`` on 2 ranks, rank 1 crashing once,
  with the bytes of every checkpoint folder it left (the replay has no files);
- ``hostile``: what a real collector stored from 20,000 generated hostile pushes and the
  bombs (the good pushes' rows), with what it answered and counted.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.e2e.framework_jobs import torchrun_ddp
from tests.harness import ROOT, Collector
from tests.record import Capture, recipe, script_module, timeline

#: elastic: the scenario's job (``train_elastic.py``), every setting the replay reads passed
#: explicitly; node-b is slowed ``slow_pct`` per micro-batch, node-c killed
ELASTIC = {"nproc": 2, "steps": 260, "global_batch": 48, "micro_batch": 4,
           "compute_ms": 20.0, "slow_pct": 200.0, "ckpt_every": 10, "min_confidence": 0.7,
           "max_evictions_per_hour": 1, "min_nodes": 2, "full_world": 6, "spare_gpus": 2,
           "slow_node": "node-b", "lost_node": "node-c", "spares": ["node-d", "node-e"]}
#: async-dcp: 2 ranks, an async DCP save every 10 steps, rank 1 exits at step 38 (attempt 0)
ASYNC = {"steps": 60, "compute_ms": 10.0, "ckpt_every": 10, "kill_rank": 1, "kill_at": 38,
         "flush_interval_s": 0.05}
#: hostile: the generator's requests and seed, every bomb in each of 3 rounds
HOSTILE = {"requests": 20_000, "seed": 2024, "bomb_repeats": 3, "threads": 4}


def scenario_module() -> ModuleType:
    """``examples/elastic/scenario.py`` as a module."""
    return script_module("elastic_scenario", ROOT / "examples" / "elastic" / "scenario.py")


def elastic_args(s: dict) -> list[str]:
    """``train_elastic.py``'s arguments for the settings ``s`` (the scenario adds the rest)."""
    return ["--global-batch", str(s["global_batch"]), "--micro-batch", str(s["micro_batch"]),
            "--compute-ms", str(s["compute_ms"]), "--slow-pct", str(s["slow_pct"]),
            "--ckpt-every", str(s["ckpt_every"]), "--min-confidence", str(s["min_confidence"]),
            "--max-evictions-per-hour", str(s["max_evictions_per_hour"]),
            "--min-nodes", str(s["min_nodes"])]


@recipe("elastic")
def elastic(tmp: Path) -> Capture:
    sc = scenario_module().Scenario(tmp, "faults", nproc=ELASTIC["nproc"],
                                    steps=ELASTIC["steps"], evict="on", timeout_s=600,
                                    extra=elastic_args(ELASTIC))
    try:
        summary = sc.run_full()
    finally:
        sc.stop()
    return Capture(Path(summary["db"]), "faults", tmp / "truth",
                   {"settings": ELASTIC, "exit_codes": summary["exit_codes"],
                    "timeline": timeline(summary, "node")})


@recipe("async-dcp")
def async_dcp(tmp: Path) -> Capture:
    s = ASYNC
    c = Collector(tmp / "a.duckdb").start()
    try:
        torchrun_ddp(tmp, c.url, "async", "--steps", str(s["steps"]),
                     "--compute-ms", str(s["compute_ms"]), "--ckpt-every", str(s["ckpt_every"]),
                     "--async-ckpt", "--flush-interval", str(s["flush_interval_s"]),
                     "--kill-rank", str(s["kill_rank"]), "--kill-at", str(s["kill_at"]),
                     "--truth-dir", str(tmp / "truth"), nproc=2, restarts=1, timeout=180)
        c.sync()
    finally:
        c.stop()
    # every checkpoint folder the job left: step -> file -> bytes
    ckpt = {str(int(d.name.split("_")[1])): {f.name: f.stat().st_size
                                            for f in sorted(d.iterdir()) if f.is_file()}
            for d in sorted((tmp / "ckpt").iterdir())}
    return Capture(Path(c.db), "async", tmp / "truth",
                   {"settings": s, "ranks": 2, "ckpt_files": ckpt})


@recipe("hostile")
def hostile(tmp: Path) -> Capture:
    """The 20,000 pushes and the bombs, as the live test sends its 2,000: what the collector
    answered, counted on /metrics and stored (every run the good pushes named)."""
    from goodlens.storage.store import Store
    from tests.e2e.test_hostile_ingest_http import bomb_rounds, push_hostile, rejected_by_reason
    from tests.harness import http
    from tests.integration.test_hostile_ingest import hostile_requests

    s = HOSTILE
    requests = list(hostile_requests(s["requests"], seed=s["seed"]))
    heavy = bomb_rounds(s["bomb_repeats"])
    c = Collector(tmp / "hostile.duckdb", "--no-detect").start()
    try:
        got = push_hostile(c, heavy, requests, s["threads"])
        c.sync()
        rejected = rejected_by_reason(http("GET", c.url + "/metrics")[1])
    finally:
        c.stop()
    store = Store(Path(c.db), read_only=True)
    try:
        stored = {r: {"steps": len(store.steps(r)), "events": len(store.events(r))}
                  for r in store.runs().run_id}
    finally:
        store.close()
    print(f"{got.sent} pushes in {got.elapsed:.1f} s: {dict(got.statuses)}; RSS "
          f"{got.baseline / 2**20:.0f} -> peak {got.peak / 2**20:.0f} MiB", flush=True)
    (tmp / "no-clock").mkdir()   # no job: an empty clock
    return Capture(Path(c.db), "hostile", tmp / "no-clock", {
        "settings": s, "sent": got.sent, "bombs": len(heavy),
        "statuses": {str(k): v for k, v in sorted(got.statuses.items())},
        "server_errors": len(got.worst), "acknowledged": dict(got.inserted),
        "rejected": rejected, "stored_by_run": stored,
        "rss": {"baseline": got.baseline, "high_water": got.peak},
        "elapsed_s": round(got.elapsed, 1)})


def story(ev: Any, *, first_failure: bool = False, ends: str = "any") -> list[str]:
    """A scenario's stored events (goodlens's and the job's) as a story, in the order of
    their instants, repeats merged: evictions, joins, resizes, findings (a finding's
    updates about a node after it was evicted left out: its ranks step on until the new
    world starts, and the detector may update it from those steps, truly and after the
    decision), attempt ends (``ends``: ``any`` as ``end:CAUSE``, ``completed`` as
    ``completed`` alone) and, with ``first_failure``, attempt 0's failure."""
    out: list[str] = []
    gone: set[str] = set()
    for _, e in ev.sort_values(["time", "seq"]).iterrows():
        key = None
        if e.kind == "failure" and first_failure and e.attempt == 0:
            key = "failure"
        elif e.kind == "rank_evicted":
            key = f"evicted:{e.host}:{e.cause}"
            if e.cause == "straggler":
                gone.add(e.host)
        elif e.kind == "rank_joined":
            key = f"joined:{e.host}"
        elif e.kind == "world_resized":
            key = f"resized:{int(e.world_size)}"
        elif e.kind == "straggler_flagged":
            f = json.loads(e.detail)
            subject = f.get("host") or f["subject_id"]
            if subject not in gone:
                key = f"flagged:{subject}:{f['action']}"
        elif e.kind == "attempt_end" and (ends == "any" or e.cause == ends):
            key = f"end:{e.cause}" if ends == "any" else str(e.cause)
        if key and (not out or out[-1] != key):
            out.append(key)
    return out
