"""A fleet of runs over a pool of hosts, two of them bad: the check of ``goodlens nodes``.

Written for this check, not goodlens's own simulators (nothing here calls goodlens to make
its events). Every host fails at a rate per hour it runs and is flagged a straggler at
another; two hosts are planted with ``factor`` (5) times a healthy host's incident rate:
:data:`LEMON_FAIL` by failing more, :data:`LEMON_SLOW` by straggling more. What a
real fleet adds, so the attribution has to be right for the reason it claims:

- each run takes 2 to 16 hosts (2 ranks each), its ranks placed in a new order on every
  attempt (a rank's host in one attempt is not its host in the next);
- a failure ends the attempt; the launcher names the failed rank, with its host half the
  time and by rank alone the other half; 1 to 3 survivors report ``collective_error``
  with their own host, and the launcher a ``failure_detected`` naming nobody;
- after a failure the scheduler replaces the failed host with a spare 30% of the time;
- straggler findings name a rank, half of them later resolved (a second event of the same
  finding); a few job-level hangs name nobody;
- runs last 4 to 24 hours of work, start over six weeks, and a few are still running.

The truth is the two planted hosts; what the detector must hold to is the false discovery
rate it states among the 198 others.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
SPAN_S = 42 * 86_400.0
HOSTS = 200
LEMON_FAIL, LEMON_SLOW = "node-042", "node-137"
CAUSES = ("gpu_xid", "ecc_error", "exit:1", "nccl_error")
STEP_KEYS = ("attempt", "rank", "host", "step", "start_time", "duration_s")
EVENT_KEYS = ("seq", "kind", "time", "attempt", "rank", "host", "step", "cause", "label",
              "detail")


def host_names(n: int = HOSTS) -> list[str]:
    return [f"node-{i:03d}" for i in range(n)]


class _Run:
    """One run's rows as it is generated."""

    def __init__(self, i: int) -> None:
        self.i = i
        self.steps: dict[str, list] = {k: [] for k in STEP_KEYS}
        self.events: dict[str, list] = {k: [] for k in EVENT_KEYS}
        self.sources: list[str] = []
        self.culprit = ""

    def event(self, source: str, kind: str, t: float, attempt: int, **kw: Any) -> None:
        row = {**{k: kw.get(k) for k in EVENT_KEYS}, "kind": kind, "time": t,
               "attempt": attempt, "seq": self.sources.count(source)}
        for k in EVENT_KEYS:
            self.events[k].append(row[k])
        self.sources.append(source)

    def steps_at(self, attempt: int, order: list[str], step: int, t: float) -> None:
        for r, h in enumerate(order):
            for k, v in zip(STEP_KEYS, (attempt, r, h, step, t, 1.0)):
                self.steps[k].append(v)

    def doc(self) -> dict[str, Any]:
        return {"schema_version": 1, "run_id": f"job-{self.i:05d}",
                "run": {"name": f"job-{self.i % 17}", "world_size": len(set(
                    self.steps["rank"])), "gpus_per_rank": 1},
                "steps": self.steps, "events": {**self.events, "source": self.sources}}


def fleet_docs(seed: int = 0, runs: int = 320, hosts: int = HOSTS, fail_rate: float = 0.03,
               slow_rate: float = 0.03, factor: float = 5.0, swap: float = 0.3,
               span_s: float = SPAN_S, t0: float = T0) -> list[dict[str, Any]]:
    """The fleet's runs as push documents (one per run). Rates are per host-hour; a planted
    host's incidents (failures and straggles) come at ``factor`` times a healthy host's
    rate, :data:`LEMON_FAIL`'s extra as failures, :data:`LEMON_SLOW`'s as straggles;
    ``swap``: the chance the scheduler replaces a failed host; runs start in
    ``[t0, t0 + span_s)``."""
    rng = np.random.default_rng(seed)
    names = host_names(hosts)
    extra = (factor - 1.0) * (fail_rate + slow_rate)
    fail = {h: fail_rate + (extra if h == LEMON_FAIL else 0.0) for h in names}
    slow = {h: slow_rate + (extra if h == LEMON_SLOW else 0.0) for h in names}
    return [_run(i, rng, names, fail, slow, swap, running=i >= runs - 4, span=(t0, span_s)
                 ).doc() for i in range(runs)]


def _run(i: int, rng: np.random.Generator, names: list[str], fail: dict, slow: dict,
         swap: float, running: bool, span: tuple[float, float] = (T0, SPAN_S)) -> _Run:
    run = _Run(i)
    n = int(rng.choice([2, 4, 8, 16], p=[0.2, 0.35, 0.3, 0.15]))
    placed = list(rng.choice(names, n, replace=False))
    work, t = float(rng.uniform(4, 24)) * 3600, span[0] + float(rng.uniform(0, span[1]))
    step = 0
    for a in range(12):
        order = [placed[j] for j in rng.permutation(n) for _ in range(2)]  # 2 ranks a host
        run.event("launcher", "attempt_start", t, a, rank=None)
        rates = np.array([fail[h] for h in placed]) / 3600.0
        ttf = float(rng.exponential(1.0 / rates.sum()))
        dur = min(ttf, work) if not (running and a >= 1) else min(ttf, work, 3600.0)
        run.steps_at(a, order, step, t + 60.0)
        _stragglers(run, rng, a, order, placed, slow, t, dur)
        if rng.random() < 0.01:  # a hang of the job, naming nobody
            run.event("detector", "failure_detected", t + dur / 2, a, cause="hang")
        run.steps_at(a, order, step + 1, t + dur - 1.0)
        step += 2
        if ttf >= work or (running and a >= 1):
            if not running:
                run.event("launcher", "attempt_end", t + dur, a, cause="completed")
            return run
        _failure(run, rng, a, order, placed, rates, t + dur)
        work -= dur
        t += dur + float(rng.uniform(600, 1800))
        culprit = run.culprit
        if rng.random() < swap:  # the scheduler swaps the failed host for a spare
            spare = [h for h in names if h not in placed]
            placed[placed.index(culprit)] = str(rng.choice(spare))
    return run


def _stragglers(run: _Run, rng: np.random.Generator, a: int, order: list[str],
                placed: list[str], slow: dict, t: float, dur: float) -> None:
    for h in placed:
        for _ in range(int(rng.poisson(slow[h] * dur / 3600.0))):
            rank = order.index(h) + int(rng.integers(2))
            at = t + float(rng.uniform(0, dur))
            src = f"detector/{a}/rank/{rank}/{int(at)}"
            body = {"subject_kind": "rank", "subject_id": rank, "status": "open"}
            run.event(src, "straggler_flagged", at, a, rank=rank, label=f"rank:{rank}",
                      detail=json.dumps(body))
            if rng.random() < 0.5:
                run.event(src, "straggler_flagged", at + float(rng.uniform(0, t + dur - at)),
                          a, rank=rank, label=f"rank:{rank}",
                          detail=json.dumps({**body, "status": "resolved"}))


def _failure(run: _Run, rng: np.random.Generator, a: int, order: list[str],
             placed: list[str], rates: np.ndarray, at: float) -> None:
    culprit = placed[int(rng.choice(len(placed), p=rates / rates.sum()))]
    rank = order.index(culprit) + int(rng.integers(2))
    cause = str(rng.choice(CAUSES))
    run.event("launcher", "failure", at, a, rank=rank,
              host=culprit if rng.random() < 0.5 else None, cause=cause)
    others = [r for r, h in enumerate(order) if h != culprit]
    for r in rng.choice(others, min(len(others), int(rng.integers(1, 4))), replace=False):
        run.event(f"rank-{r}", "failure", at + 0.5, a, host=order[int(r)],
                  cause="collective_error")
    run.event("launcher", "failure_detected", at + 30.0, a, cause="launcher")
    run.culprit = culprit


# ------------------------------------------------------------------------------ writing
def write_duckdb(path: Path, docs: list[dict[str, Any]]) -> None:
    """The fleet in a DuckDB file, through the store's own writer, summarised."""
    from goodlens.model.batch import validate_batch
    from goodlens.storage.store import Store
    store = Store(path)
    try:
        for k in range(0, len(docs), 500):
            store.write_group([validate_batch(d) for d in docs[k:k + 500]])
        store.summarize_dirty()
    finally:
        store.close()


def write_parquet(root: Path, docs: list[dict[str, Any]]) -> None:
    """The fleet as a Parquet dataset: one segment per run and table (as a compaction
    leaves them), written directly (a collector's fsyncs would dominate a test)."""
    from goodlens.model.batch import validate_batch
    from goodlens.storage.parquet import ParquetStore
    from goodlens.storage.schema import RUN_NAMES
    from goodlens.storage.segments import hour_name
    ParquetStore(root).close()  # the dataset's marker
    metas = []
    for d in docs:
        b = validate_batch(d)
        hour = hour_name(int(min(b.steps.column("start_time").to_pylist()) // 3600))
        for table, t in (("steps", b.steps), ("events", b.events)):
            folder = root / table / f"run_id={b.run_id}" / f"hour={hour}"  # ids are ASCII
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(t, folder / "gen-00000000-00000000.parquet")
        metas.append({"run_id": b.run_id, **{c: b.run.get(c) for c in RUN_NAMES},
                      "first_seen": float(min(b.steps.column("start_time").to_pylist())),
                      "written": 0.0})
    types = {c: (pa.string() if c in ("name", "tags") else pa.int64()) for c in RUN_NAMES}
    (root / "runs").mkdir(exist_ok=True)
    pq.write_table(pa.table({"run_id": [m["run_id"] for m in metas],
                             **{c: pa.array([m[c] for m in metas], types[c])
                                for c in RUN_NAMES},
                             "first_seen": [m["first_seen"] for m in metas],
                             "written": [m["written"] for m in metas]}),
                   root / "runs" / "gen-00000000-00000000.parquet")


def frames(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The node inputs of ``docs`` without a store (the bench's many seeds): each attempt
    from its start event to its first failure notice or end (its latest row while it
    runs), each rank's host per attempt, and the events."""
    import pandas as pd
    st = pd.concat([pd.DataFrame(d["steps"]).assign(run_id=d["run_id"]) for d in docs])
    ev = pd.concat([pd.DataFrame(d["events"]).assign(run_id=d["run_id"]) for d in docs])
    g = ev.groupby(["run_id", "attempt"])
    end = ev[ev.kind.isin(["failure_detected", "attempt_end"]) & (ev.cause != "hang")]
    attempts = pd.DataFrame({"start": g.time.min(), "last_activity": g.time.max()})
    attempts["end"] = end.groupby(["run_id", "attempt"]).time.min()
    last = pd.concat([ev[["run_id", "attempt", "time"]],
                      st.assign(time=st.start_time + st.duration_s)[
                          ["run_id", "attempt", "time"]]]).groupby(["run_id", "attempt"])
    attempts["last_activity"] = last.time.max()
    attempts = attempts.reset_index()
    attempts["end_reason"] = None
    presence = st[["run_id", "attempt", "rank", "host"]].drop_duplicates()
    ev = ev[ev.kind.isin(["failure", "failure_detected", "straggler_flagged",
                          "rank_evicted"])].rename(columns={"source": "source"})
    return {"attempts": attempts, "presence": presence,
            "events": ev.reset_index(drop=True)}
