"""Rebuild the bundled sample traces from fixed seeds (``make sample-data``).

- ``sim-64/`` and ``sim-16/``: simulated runs (``goodlens.analysis.runsim.tracegen``), each with the
  ground truth the simulator knows and the stragglers it planted (``ground_truth.json``);
  ``sim-64`` shows failures with restarts and recompute, async checkpoints, a persistent
  straggler, a slow switch and an elastic shrink.
- ``demo/``: a hand-built story, small enough to read, of 8 ranks on 2 hosts that

- initialises for 40 s, then steps at about 1 s;
- saves a synchronous checkpoint every 100 steps (6 s stall, 2.6 GB per rank);
- has rank 5 running 10% slow in compute from step 150 (a straggler);
- loses a GPU 0.4 s into step 338 (after step 337 completed): the hang is detected 60 s
  later, the job waits 120 s for a replacement, initialises for 40 s, restores the
  checkpoint taken after step 299 (15 s), redoes steps 300-337, and completes steps up to
  599 (the first step after the restart is 5 s slower: warm-up).

Expected facts are in ``EXPECTED`` below (and asserted by tests/test_sample_data.py).
Run ``python sample_data/generate.py`` to rewrite the trace.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from goodlens.model.trace import write_trace

RUN_ID = "demo-8x"
SEED = 20261129
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
RANKS, HOSTS = 8, 2
STEPS = 600
CKPT_EVERY, CKPT_STALL, CKPT_BYTES = 100, 6.0, 2_600_000_000
SLOW_RANK, SLOW_FROM, SLOWDOWN = 5, 150, 0.10
FAIL_STEP, DETECT_S, QUEUE_S, INIT_S, RESTORE_S, WARMUP_S = 337, 60.0, 120.0, 40.0, 15.0, 5.0

EXPECTED = {"run_id": RUN_ID, "ranks": RANKS, "attempts": 2, "last_step": STEPS - 1,
            "step_rows": RANKS * (FAIL_STEP + 1 + STEPS - 300), "slow_rank": SLOW_RANK,
            "failure_step": FAIL_STEP, "restored_step": 300}


def generate(out: Path) -> Path:
    rng = np.random.default_rng(SEED)
    host_offset = rng.uniform(-0.05, 0.05, HOSTS)  # host clocks disagree by up to 50 ms
    steps: list[tuple] = []
    events: list[tuple] = []
    seq = {"launcher": 0}
    log: list[tuple] = []  # (attempt, step, duration, per-rank compute, data wait): the truth

    def event(kind: str, t: float, attempt: int, **f: object) -> None:
        src = f.pop("source", "launcher")
        seq.setdefault(src, 0)
        events.append((src, seq[src], kind, t, attempt, f.get("rank"), f.get("host"),
                       f.get("step"), f.get("bytes"), f.get("tier"), f.get("cause"), None,
                       f.get("world_size"), None))
        seq[src] += 1

    def run_steps(attempt: int, first: int, last: int, t: float, warmup: bool) -> float:
        for n in range(first, last + 1):
            base = 0.80 * (1 + 0.02 * rng.standard_normal(RANKS)).clip(0.9, 1.1)
            if n >= SLOW_FROM:
                base[SLOW_RANK] *= 1 + SLOWDOWN
            if warmup and n == first:
                base += WARMUP_S
            data = rng.uniform(0.005, 0.015, RANKS)
            allreduce = 0.15
            dur = float((base + data).max() + allreduce)
            log.append((attempt, n, dur, base.copy(), data))
            for r in range(RANKS):
                h = r * HOSTS // RANKS
                coll = dur - base[r] - data[r]
                steps.append((attempt, r, f"node-{h}", n, t + host_offset[h], dur, base[r],
                              coll, data[r], 2048 * 4, 4))
            t += dur
            if n == FAIL_STEP and attempt == 0:
                return t
            if (n + 1) % CKPT_EVERY == 0 and n + 1 < STEPS:
                event("ckpt_save_start", t, attempt, step=n + 1, tier="durable")
                event("ckpt_save_blocking_end", t + CKPT_STALL, attempt, step=n + 1,
                      tier="durable")
                event("ckpt_save_durable_end", t + CKPT_STALL, attempt, step=n + 1,
                      tier="durable", bytes=CKPT_BYTES * RANKS)
                t += CKPT_STALL
        return t

    t = T0
    event("attempt_start", t, 0, world_size=RANKS)
    event("init_start", t, 0)
    event("init_end", t + INIT_S, 0)
    t = run_steps(0, 0, FAIL_STEP, t + INIT_S, warmup=False)
    # the GPU dies part-way through step 338; ranks hang until the watchdog fires
    t_fail = t + 0.4
    event("failure_detected", t_fail + DETECT_S, 0, cause="gpu", rank=2, host="node-0",
          step=FAIL_STEP)
    t = t_fail + DETECT_S + QUEUE_S
    event("attempt_start", t, 1, world_size=RANKS)
    event("init_start", t, 1)
    event("init_end", t + INIT_S, 1)
    event("ckpt_restore_start", t + INIT_S, 1, step=300, tier="durable")
    event("ckpt_restore_end", t + INIT_S + RESTORE_S, 1, step=300, tier="durable",
          bytes=CKPT_BYTES * RANKS)
    t = run_steps(1, 300, STEPS - 1, t + INIT_S + RESTORE_S, warmup=True)
    event("attempt_end", t, 1, cause="completed")

    step_names = ["attempt", "rank", "host", "step", "start_time", "duration_s", "compute_s",
                  "collective_wait_s", "data_wait_s", "tokens", "samples"]
    event_names = ["source", "seq", "kind", "time", "attempt", "rank", "host", "step", "bytes",
                   "tier", "cause", "label", "world_size", "detail"]
    st = pa.Table.from_pylist([dict(zip(step_names, s)) for s in steps])
    ev = pa.Table.from_pylist([dict(zip(event_names, e)) for e in events],
                              schema=_event_schema(event_names))
    st = st.add_column(0, "run_id", pa.array([RUN_ID] * st.num_rows))
    ev = ev.add_column(0, "run_id", pa.array([RUN_ID] * ev.num_rows))
    runs = pa.Table.from_pylist([{
        "run_id": RUN_ID, "name": "demo: 8 ranks, one GPU failure, one straggler",
        "world_size": RANKS, "gpus_per_rank": 1, "global_batch": 32,
        "model_params": 1_300_000_000, "tags": '{"source": "sample_data/generate.py"}'}])
    path = write_trace(out, {"runs": runs, "steps": st, "events": ev}, [RUN_ID])
    truth = ground_truth(log, end=t, detect_gap=0.4 + DETECT_S)
    (path / "ground_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return path


def ground_truth(log: list[tuple], end: float, detect_gap: float) -> dict:
    """The breakdown this trace represents, on the true clock, by the rules of
    docs/accounting.md (host clocks in the trace are off by up to 50 ms, so `goodlens report`
    may differ by a fraction of a second)."""
    b = dict.fromkeys(("productive", "straggler_wait", "checkpoint_stall", "recompute",
                       "startup", "restart", "other"), 0.0)
    parts = dict.fromkeys(("detection", "queue", "init", "restore", "warmup",
                           "unattributed"), 0.0)
    startup = dict.fromkeys(("init", "restore", "warmup"), 0.0)  # attempt 0's start-up
    med = {a: float(np.median([x[2] for x in log if x[0] == a])) for a in (0, 1)}
    first = {a: min(x[1] for x in log if x[0] == a) for a in (0, 1)}
    stalled = 0.0
    for a, n, d, comp, data in log:
        warm = max(0.0, d - med[a]) if n == first[a] else 0.0
        (startup if a == 0 else parts)["warmup"] += warm
        if a == 0 and n >= 300:  # rolled back by attempt 1, which resumes at step 300
            b["recompute"] += d - warm
            continue
        ready = comp + data  # each rank's time to reach the all-reduce
        sw = min(float(ready.max() - np.median(ready)), d - warm)
        inp = min(float(data.min()), d - warm - sw)  # every rank waited on input this long
        b["straggler_wait"] += sw
        stalled += inp
        b["productive"] += d - warm - sw - inp
    partial = min(med[0], detect_gap)
    b["recompute"] += partial
    parts["detection"] = detect_gap - partial
    parts["queue"], parts["init"], parts["restore"] = QUEUE_S, INIT_S, RESTORE_S
    startup["init"] = INIT_S
    b["checkpoint_stall"] = 5 * CKPT_STALL
    b["startup"] = sum(startup.values())
    b["restart"] = sum(parts.values())
    wall = end - T0
    # the input stall, and ~0 besides: nothing else
    b["other"] = wall - sum(v for k, v in b.items() if k != "other")
    return {"run_id": RUN_ID, "seed": SEED, "generator": "sample_data/generate.py (hand-built)",
            "truth": {"run": RUN_ID, "wall_clock_s": wall, "goodput": b["productive"] / wall,
                      "buckets": b, "startup_parts": startup, "restart_parts": parts,
                      "other_parts": {"input_stall": stalled}},
            "findings": [{"subject": "rank", "id": SLOW_RANK, "host": "node-1",
                          "first_step": SLOW_FROM, "slowdown": SLOWDOWN}]}


def _event_schema(names: list[str]) -> pa.Schema:
    types = {"source": pa.string(), "kind": pa.string(), "host": pa.string(),
             "tier": pa.string(), "cause": pa.string(), "label": pa.string(),
             "detail": pa.string(), "time": pa.float64()}
    return pa.schema([(n, types.get(n, pa.int64())) for n in names])


def sim_configs() -> dict[str, tuple]:
    """The simulated sample traces: (config, first seed to try, what it must show)."""
    from dataclasses import replace

    from goodlens.analysis.runsim.presets import get_preset
    h = 3600.0
    rich = replace(get_preset("demo-64"), duration_s=2 * h, step_s=2.0, elastic="shrink",
                   node_mtbf_s=8 * h, straggler_per_node_day=6.0, planned_per_day=2.0,
                   repair_s=0.5 * h, reconfig_s=60.0, nodes_per_switch=4,
                   diurnal_amplitude=0.02)
    return {
        # failures with restarts and recompute, async checkpoints, a persistent straggler,
        # a slow switch, an elastic shrink (and its grow back), a 2% diurnal drift
        "sim-64": (rich, 1, ("failure", "async", "rank_or_node", "switch", "shrink")),
        # the tiny preset as is: a failure and a straggler or two
        "sim-16": (get_preset("test-16"), 1, ("failure",)),
    }


def _shows(result, needs: tuple[str, ...]) -> bool:
    ev = result.tables["events"]
    kinds = set(ev.column("kind").to_pylist())
    subjects = {f["subject"] for f in result.findings}
    checks = {"failure": "failure_detected" in kinds and result.truth["buckets"]["recompute"] > 0,
              "async": result.sim.buckets["checkpoint_stall"] > 0,
              "rank_or_node": bool(subjects & {"rank", "node"}), "switch": "switch" in subjects,
              "shrink": "world_resized" in kinds}
    return all(checks[n] for n in needs)


def generate_sims(root: Path) -> list[Path]:
    """Write each simulated sample trace, from the first seed that shows what it must."""
    from goodlens.analysis.runsim.tracegen import generate_trace
    paths = []
    for name, (config, seed, needs) in sim_configs().items():
        for s in range(seed, seed + 500):
            r = generate_trace(config, s, None, run_id=name)
            if _shows(r, needs):
                break
        else:
            raise RuntimeError(f"no seed in {seed}..{seed + 499} gives {name} {needs}")
        paths.append(generate_trace(config, s, root / name, run_id=name).path)
    return paths


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    for path in [generate(here / "demo"), *generate_sims(here)]:
        print(f"wrote {path}")
