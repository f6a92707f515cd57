"""Benchmark: the torchft integration's overhead on a torchft job's step time.

Two measurements, each against a baseline taken in the same run:

- **live, paired**: ``examples/ft/train_ft.py``, two replica groups of one process each
  under one torchft lighthouse on loopback, gloo, the tiny model, ``--steps`` committed
  steps of ``--step-s`` simulated compute, with goodlens on (pushing to a real collector)
  and off (``--no-goodlens``: no exporter, no wrapping, a bare step scope), in
  ``--pairs`` pairs whose order alternates (on-off, off-on, ...) so drift hits both arms
  alike. Step time comes from the job's own clock lines (``--truth``: each step's start
  and end), pooled over both groups, first ``--skip`` steps dropped; each pair's ratio is
  its on run's median over its off run's. The process CPU a step (``cpu`` on the same
  lines) is compared the same way. ``--sink`` pushes to a discard sink instead of a
  collector (goodlens's in-process cost without the collector's CPU on the same cores);
- **in-process** (the number set against the target, since load barely moves it):
  :func:`goodlens.exporter.torchft.instrument` on a stand-in manager with torchft's
  methods (``start_quorum``, ``wait_quorum``, ``allreduce``, ``should_commit``,
  ``current_step``, ``is_participating``, ``num_participants``, a checkpoint transport),
  each a no-op, and one step of ``train_ft.py``'s calls on it (a quorum, 4 all-reduces, a
  commit) looped ``--iters`` times inside ``with tracker.step():``, against the same loop
  on a bare stand-in in ``contextlib.nullcontext()`` (the job's ``--no-goodlens`` step).
  The arms take turns over ``--reps`` repetitions (wall and thread CPU). The exporter's
  background thread is stopped so the training thread is timed alone; its send path
  (Arrow encoding and the HTTP POST to the same collector) is then timed in thread CPU
  on batches of one flush interval's steps at the live baseline's cadence.

Target (issue 50): the integration costs <= 1% of step time. The verdict sets the
in-process cost per step (training thread plus flusher) against the live baseline's
median step; the live paired ratio is reported beside it (on 2 shared cores its
run-to-run spread is a few percent, larger than the budget).

    .venv/bin/python bench/torchft_overhead.py [--pairs 4] [--steps 300] [--step-s 0.02]
        [--iters 100000] [--reps 7] [--colocated | --sink] [--json PATH|-]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from time import perf_counter_ns, thread_time_ns
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import Collector, free_port, markdown_section, table, workdir  # noqa: E402
from bench.torch_overhead import Sink  # noqa: E402
from tests.record.ft import ft_scenario  # noqa: E402  (examples/ft/scenario.py, the demo's kit)

TRAIN = ROOT / "examples" / "ft" / "train_ft.py"
TARGET = 0.01
GROUPS = 2
PARAMS = 4  # the tiny model's parameters (2 weights, 2 biases): one all-reduce each

# ----------------------------------------------------------------------------- in-process


class FakeTransport:
    """A checkpoint transport with torchft's ``recv_checkpoint`` (never called here)."""

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: Any) -> Any:
        return {}


class FakeManager:
    """The methods of a torchft ``Manager`` that goodlens wraps or calls, each a no-op.
    As in torchft, ``allreduce``, ``num_participants`` and ``is_participating`` call
    ``self.wait_quorum()`` (so the wrapped one runs there too) and a commit moves the step
    counter on."""

    def __init__(self) -> None:
        self._step = 0
        self._checkpoint_transport = FakeTransport()

    def start_quorum(self, *args: Any, **kwargs: Any) -> None:
        return None

    def wait_quorum(self) -> None:
        return None

    def allreduce(self, tensor: Any, *args: Any, **kwargs: Any) -> Any:
        self.wait_quorum()
        return tensor

    def num_participants(self) -> int:
        self.wait_quorum()
        return GROUPS

    def is_participating(self) -> bool:
        self.wait_quorum()
        return True

    def current_step(self) -> int:
        return self._step

    def should_commit(self, timeout: Any = None) -> bool:
        self.num_participants()
        self._step += 1
        return True


def loop(m: FakeManager, scope: Any, iters: int) -> tuple[int, int]:
    """``iters`` steps of train_ft.py's manager calls, each inside ``scope()``: (wall ns,
    thread CPU ns)."""
    grads = list(range(PARAMS))
    t, c = perf_counter_ns(), thread_time_ns()
    for _ in range(iters):
        with scope():
            m.start_quorum()              # Optimizer.zero_grad
            for g in grads:               # average_gradients
                m.allreduce(g)
            m.is_participating()          # the job's own check
            m.should_commit()             # Optimizer.step
    return perf_counter_ns() - t, thread_time_ns() - c


def in_process(iters: int, reps: int, url: str, flush_rows: int,
               flushes: int = 30) -> dict[str, Any]:
    """ns per step of the bare and the instrumented loop (medians over ``reps``, wall and
    thread CPU) and their paired difference; then the flusher's CPU per step: ``flushes``
    times, ``flush_rows`` steps recorded (one flush interval's worth) and sent to ``url``
    by the exporter's own send path (encoding and HTTP), its thread CPU timed."""
    import gc
    import logging

    from goodlens.exporter import torchft as gft
    from goodlens.exporter.recorder import RankExporter

    exp = RankExporter(run_id="bench-in-process", url=url, spill_dir=None,
                       heartbeat_interval_s=0, hooks=False)
    exp._stop.set()  # the training thread's work is timed alone; the flush separately
    if exp._thread is not None:
        exp._thread.join()
    bare, wrapped = FakeManager(), FakeManager()
    handlers = list(logging.getLogger("torchft_quorums").handlers)
    tracker = gft.instrument(wrapped, exp, group="g0", group_rank=0, samples_per_step=8)
    assert wrapped.should_commit is not FakeManager.should_commit, "instrument did not wrap"

    def reset() -> None:
        exp._steps.clear()
        exp._events.clear()
        exp._marks.clear()
        gc.collect()

    wall: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    flush_ns = 0
    try:
        for rep in range(reps + 1):  # repetition 0 warms up and is discarded
            for arm in ("off", "on") if rep % 2 else ("on", "off"):
                reset()
                before = tracker.committed
                ns, cns = loop(wrapped, tracker.step, iters) if arm == "on" else \
                    loop(bare, contextlib.nullcontext, iters)
                if arm == "on":
                    assert tracker.committed - before == iters == len(exp._steps), \
                        "the tracker did not record every step"
                if rep:
                    wall[arm].append(ns / iters)
                    cpu[arm].append(cns / iters)
        reset()
        exp._send_all()  # the run's metadata goes with the first batch: not timed
        for _ in range(flushes):
            loop(wrapped, tracker.step, flush_rows)
            c = thread_time_ns()
            exp._send_all()
            flush_ns += thread_time_ns() - c
        assert not exp._steps and exp._transport is not None \
            and exp._transport.stats.lost_rows == 0, "the flush did not deliver every row"
    finally:
        reset()
        exp.close(timeout=5)
        logging.getLogger("torchft_quorums").handlers[:] = handlers
    med = {a: statistics.median(v) for a, v in wall.items()}
    cmed = {a: statistics.median(v) for a, v in cpu.items()}
    return {"iters": iters, "reps": reps, "wall_ns": wall, "cpu_ns": cpu,
            "off_ns": med["off"], "on_ns": med["on"],
            "net_ns": statistics.median(a - b for a, b in zip(wall["on"], wall["off"])),
            "off_cpu_ns": cmed["off"], "on_cpu_ns": cmed["on"],
            "net_cpu_ns": statistics.median(a - b for a, b in zip(cpu["on"], cpu["off"])),
            "flush_rows": flush_rows, "flushes": flushes,
            "flush_ns": flush_ns / (flushes * flush_rows)}


# ----------------------------------------------------------------------------- live runs


def run_job(work: Path, tag: str, on: bool, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One torchft job: a lighthouse, a TCPStore per replica group (in this process) and
    ``GROUPS`` groups of one process each; returns its steady-state step times."""
    from torch.distributed import TCPStore

    out = work / tag
    truth = out / "truth"
    truth.mkdir(parents=True)
    lh_port = free_port()
    logs: list[Any] = []

    def spawn(name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        f = open(out / f"{name}.log", "wb")  # noqa: SIM115 - closed after the run
        logs.append(f)
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=out, env=env)

    base = {k: v for k, v in os.environ.items() if not k.startswith("GOODLENS_")}
    lighthouse = spawn("lighthouse", ft_scenario().lighthouse_command(lh_port), base)
    stores, groups = [], []
    try:
        for g in range(GROUPS):
            port = free_port()
            stores.append(TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False))
            env = {**base, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                   "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{lh_port}"}
            if on:
                env.update(GOODLENS_URL=url, GOODLENS_RUN_ID=tag,
                           GOODLENS_SPILL_DIR=str(out / "spill"))
            cmd = [sys.executable, str(TRAIN), "--group", str(g), "--groups", str(GROUPS),
                   "--steps", str(args.steps), "--step-s", str(args.step_s),
                   "--truth", str(truth), *([] if on else ["--no-goodlens"])]
            groups.append(spawn(f"g{g}", cmd, env))
        deadline = time.monotonic() + args.run_timeout
        for g, p in enumerate(groups):
            if p.wait(max(1.0, deadline - time.monotonic())) != 0:
                log = (out / f"g{g}.log").read_text()[-2000:]
                raise RuntimeError(f"{tag}: g{g} exited {p.returncode}:\n{log}")
    finally:
        for p in [*groups, lighthouse]:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for f in logs:
            f.close()
        del stores
    return {"tag": tag, "on": on, **steady(truth, args.skip)}


def steady(truth: Path, skip: int) -> dict[str, Any]:
    """Medians of the step durations (end - start, steps with every group in) and
    cadences (start to next start) of each group's clock lines after its first ``skip``
    steps, pooled; the process CPU a step (``cpu`` on the lines), averaged over the groups;
    the discards among them."""
    durations, cadences, cpu, discards, steps = [], [], [], 0, 0
    for g in range(GROUPS):
        lines = [json.loads(x) for x in (truth / f"rank{g}-attempt0.jsonl").read_text()
                 .splitlines()]
        st = [x for x in lines if x["kind"] == "step"][skip:]
        steps += len(st)
        discards += st[-1]["discarded"] - st[0]["discarded"] if st else 0
        durations += [x["end"] - x["start"] for x in st if x["participants"] == GROUPS]
        cadences += [b["start"] - a["start"] for a, b in itertools.pairwise(st)]
        cpu.append((st[-1]["cpu"] - st[0]["cpu"]) / (len(st) - 1))
    if not durations:
        raise RuntimeError(f"no steady-state steps in {truth} (lower --skip?)")
    return {"median_s": statistics.median(durations), "cadence_s": statistics.median(cadences),
            "cpu_step_s": statistics.fmean(cpu), "steps": steps, "discards": discards}


def stored_steps(db: Path) -> dict[str, int]:
    """Step rows the collector stored per run (the on runs' recording reached it)."""
    import duckdb
    con = duckdb.connect(str(db), read_only=True)
    try:
        return dict(con.execute("SELECT run_id, count(*) FROM steps GROUP BY run_id")
                    .fetchall())
    finally:
        con.close()


# ----------------------------------------------------------------------------- report


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=4, help="on/off pairs of live runs (0: none)")
    ap.add_argument("--steps", type=int, default=300, help="committed steps per live run")
    ap.add_argument("--step-s", type=float, default=0.02, help="simulated compute per step")
    ap.add_argument("--skip", type=int, default=20, help="warm-up steps dropped per group")
    ap.add_argument("--iters", type=int, default=100_000, help="in-process steps per arm "
                    "and repetition")
    ap.add_argument("--reps", type=int, default=7, help="in-process repetitions (median)")
    ap.add_argument("--colocated", action="store_true", help="the collector at normal "
                    "priority (default: nice 19, as on a host of its own)")
    ap.add_argument("--sink", action="store_true", help="push to bench/torch_overhead.py's "
                    "discard sink (nice 19) instead of a collector: goodlens's in-process "
                    "cost alone")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds per live run")
    ap.add_argument("--json", metavar="PATH", help="also write every number as JSON "
                    "('-': to stdout, the tables to stderr)")
    ap.add_argument("--keep", action="store_true", help="keep the runs' folders")
    args = ap.parse_args()
    if args.pairs < 0 or args.steps <= args.skip + 10 or args.iters < 1 or args.reps < 1:
        ap.error("need --pairs >= 0, --steps > --skip + 10, positive --iters and --reps")
    if args.colocated and args.sink:
        ap.error("--colocated is about the collector; --sink replaces it")
    return args


def main() -> int:
    args = parse_args()
    out = sys.stderr if args.json == "-" else sys.stdout

    def say(*parts: Any) -> None:
        print(*parts, file=out, flush=True)

    t_start = time.monotonic()
    runs: list[dict[str, Any]] = []
    with workdir(keep=args.keep) as work:
        coll: Any = Sink() if args.sink else Collector(work).start()
        if not args.colocated and not args.sink:  # production: a host of its own
            os.setpriority(os.PRIO_PROCESS, coll.proc.pid, 19)
        try:
            for i in range(args.pairs):
                for on in (True, False) if i % 2 == 0 else (False, True):
                    tag = f"pair{i}-{'on' if on else 'off'}"
                    runs.append(run_job(work, tag, on, coll.url, args))
                    r = runs[-1]
                    say(f"{tag}: median step {1000 * r['median_s']:.3f} ms, cadence "
                        f"{1000 * r['cadence_s']:.3f} ms, {r['steps']} steady steps, "
                        f"{r['discards']} discarded, process CPU "
                        f"{1e6 * r['cpu_step_s']:.0f} µs a step")
            offs = [r["cadence_s"] for r in runs if not r["on"]]
            cadence = statistics.median(offs) if offs else args.step_s
            # one flush interval (1 s, the exporter's default) of the baseline's steps
            micro = in_process(args.iters, args.reps, coll.url, max(1, round(1.0 / cadence)))
            if not args.sink:
                coll.sync()
        finally:
            coll.stop()
        stored = {} if args.sink else stored_steps(work / "collector.duckdb")
    elapsed = time.monotonic() - t_start
    net_us = micro["net_ns"] / 1000
    flush_us = micro["flush_ns"] / 1000
    cost_us = net_us + flush_us
    say(f"in-process: bare {micro['off_ns']:.0f} ns, instrumented {micro['on_ns']:.0f} ns "
        f"a step -> +{micro['net_ns']:.0f} ns (thread CPU +{micro['net_cpu_ns']:.0f} ns); "
        f"flusher {micro['flush_ns']:.0f} ns a step")

    pairs = []
    for i in range(args.pairs):
        on = next(r for r in runs if r["tag"] == f"pair{i}-on")
        off = next(r for r in runs if r["tag"] == f"pair{i}-off")
        pairs.append({"pair": i, "on_ms": 1000 * on["median_s"], "off_ms": 1000 * off["median_s"],
                      "ratio": on["median_s"] / off["median_s"],
                      "cpu_us": 1e6 * (on["cpu_step_s"] - off["cpu_step_s"]),
                      "stored": stored.get(on["tag"], 0)})
    rows = [[f"pair {p['pair']} ({'on, off' if p['pair'] % 2 == 0 else 'off, on'})",
             f"{p['off_ms']:.3f}", f"{p['on_ms']:.3f}", f"{p['ratio']:.4f}",
             f"{1000 * (p['on_ms'] - p['off_ms']):+.0f}", f"{p['cpu_us']:+.0f}"] for p in pairs]
    summary: dict[str, Any] = {"elapsed_s": elapsed, "target": TARGET}
    if pairs:
        off_ms = statistics.median(p["off_ms"] for p in pairs)
        on_ms = statistics.median(p["on_ms"] for p in pairs)
        ratios = [p["ratio"] for p in pairs]
        summary.update(off_ms=off_ms, on_ms=on_ms, median_ratio=statistics.median(ratios),
                       worst_ratio=max(ratios),
                       paired_us=statistics.median(1000 * (p["on_ms"] - p["off_ms"])
                                                   for p in pairs),
                       cpu_us=statistics.median(p["cpu_us"] for p in pairs))
        rows.append(["median", f"{off_ms:.3f}", f"{on_ms:.3f}",
                     f"{summary['median_ratio']:.4f}", f"{summary['paired_us']:+.0f}",
                     f"{summary['cpu_us']:+.0f}"])
        rows.append(["worst pair", "", "", f"{summary['worst_ratio']:.4f}", "", ""])
    headers = ["live runs", "off ms", "on ms", "on / off", "µs a step",
               "process CPU µs a step"]
    step_ms = summary.get("off_ms", 1000 * args.step_s)
    share = cost_us / (1000 * step_ms)
    verdict = "PASS" if share <= TARGET else "FAIL"
    summary.update(training_thread_us=net_us, flusher_us=flush_us, in_process_us=cost_us,
                   in_process_share=share, step_ms_for_target=step_ms,
                   min_step_ms_at_target=cost_us / TARGET / 1000, verdict=verdict)
    micro_rows = [["bare stand-in, `nullcontext()`", f"{micro['off_ns']:.0f}",
                   f"{micro['off_cpu_ns']:.0f}"],
                  ["`instrument()` + `with tracker.step()`", f"{micro['on_ns']:.0f}",
                   f"{micro['on_cpu_ns']:.0f}"],
                  ["goodlens on the training thread (paired difference)",
                   f"{micro['net_ns']:+.0f}", f"{micro['net_cpu_ns']:+.0f}"],
                  [f"goodlens's flusher: encode + POST, {micro['flush_rows']} steps a batch",
                   "", f"+{micro['flush_ns']:.0f}"]]
    micro_headers = ["in-process, one step", "ns wall", "ns thread CPU"]

    where = "pushing to a discard sink at nice 19" if args.sink else \
        f"collector at {'normal priority' if args.colocated else 'nice 19'}"
    workload = (f"examples/ft/train_ft.py, {GROUPS} replica groups x 1 process, one "
                f"lighthouse, gloo on loopback, tiny model, {args.steps} steps of "
                f"{1000 * args.step_s:g} ms simulated compute, "
                f"{where}; {args.pairs} on/off "
                f"pairs, order alternating; first {args.skip} steps of each group dropped")
    micro_load = (f"{args.reps} repetitions x {args.iters:,} steps per arm, arms taking "
                  "turns, repetition 0 discarded")
    basis = "the live baseline's median" if pairs else "--step-s: no live runs"
    notes = [
        f"In-process cost: **{cost_us:.1f} µs a step** ({net_us:.1f} on the training "
        f"thread, {flush_us:.1f} of the flusher's CPU) = **{100 * share:.3f}%** of the "
        f"{step_ms:.1f} ms step ({basis}); target <= 1%: **{verdict}**. "
        f"The 1% budget holds for steps down to {cost_us / TARGET / 1000:.2f} ms.",
    ]
    if pairs:
        notes.append(
            f"Live, paired: median on/off {summary['median_ratio']:.4f} "
            f"({100 * (summary['median_ratio'] - 1):+.2f}%, {summary['paired_us']:+.0f} µs a "
            f"step), worst pair {summary['worst_ratio']:.4f}; process CPU "
            f"{summary['cpu_us']:+.0f} µs a step (torchft's own threads take "
            f"{1e6 * statistics.median(r['cpu_step_s'] for r in runs):.0f} µs a step per "
            "process and vary more than that between runs)."
            + ("" if args.sink else " Step rows stored per on run: "
               f"{sorted({p['stored'] for p in pairs})} (of {GROUPS * args.steps})."))
    notes.append("The in-process arms run the job's manager calls per step (a quorum, "
                 f"{PARAMS} all-reduces, a commit) on no-op stand-ins, so only goodlens's "
                 "wrappers, step scope and `record_step` differ; the exporter's background "
                 "thread is stopped and its send path timed on its own (thread CPU), one "
                 "flush interval's steps a batch to the same collector.")

    say(f"\nworkload: {workload} ({elapsed:.0f} s)")
    say(f"in-process: {micro_load}\n")
    say(table(micro_rows, micro_headers))
    if rows:
        say()
        say(table(rows, headers))
    say()
    for n in notes:
        say(n.replace("**", ""))
    say(f"RESULT: {verdict}")
    say("\n----- markdown for docs/benchmarks.md -----")
    say(markdown_section(
        "torchft integration overhead",
        f"Workload: {workload}. In-process: {micro_load}.",
        table(micro_rows, micro_headers, markdown=True)
        + ("\n\n" + table(rows, headers, markdown=True) if rows else ""), notes))
    if args.json:
        doc = {"workload": workload, "in_process": micro, "runs": runs, "pairs": pairs,
               "summary": summary, "command": " ".join(sys.argv)}
        text = json.dumps(doc, indent=1, default=float)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
