"""Benchmark: what each way of timing DDP's collectives costs, side by side in one job.

Each gloo rank (torchrun, CPU) holds one DDP model per mode, built alike: ``plain`` (no
goodlens timing), ``exposed`` (the default: autograd callbacks around DDP's finalisation, no
communication hook) and ``hook`` (the Python communication hook). Steps rotate over the
models (plain, exposed, hook; then exposed, hook, plain; ...), so the machine's noise, which
here is larger than the effect, hits every mode alike; every step runs inside the same
exporter scopes (``exp.step``, ``exp.phase("data")``, ``exp.count``), so the rows differ
only by the collective timing. Rank 0 reports, per mode:

- the paired wall-clock overhead: per rotation, the mode's step over the plain step of that
  rotation; the median, with a 95% bootstrap interval of that median;
- the training thread's CPU time per step over plain (``time.thread_time``): what the mode
  itself executes on the thread that trains, which the scheduler's noise barely touches,
  as a share of the plain step's wall time, with its 95% interval.

A mode meets the target when the upper end of the wall-clock interval is <= 1%; when only
the point estimate is, the table says ``unresolved`` (the noise is wider than the target)
and the CPU column says what the mode itself costs. ``--nproc 2`` puts one rank on each of
a 2-core machine's cores (4 ranks on 2 cores mostly measure the scheduler).

    .venv/bin/python bench/torch_modes.py [--steps 600] [--nproc 4] [--config 64,1,20
        --config 512,2,8]

``--in-process`` measures what each mode executes without the job's noise: one process, a
world-1 gloo group, the example's MLP without sleep, each step in ``exp.step`` with the
exporter pushing to the discard sink; blocks of ``--block-steps`` steps rotate over the
models, and the table gives each mode's training-thread CPU per step over plain (median of
the blocks' paired differences, 95% bootstrap interval). ``--against DIR`` adds the modes
as another checkout's ``goodlens/exporter/torch_collectives.py`` installs them (e.g. the
previous commit's tree from ``git archive``), rotated with this tree's in the same process:

    .venv/bin/python bench/torch_modes.py --in-process [--blocks 80] [--block-steps 40]
        [--config 64,1 --config 512,2] [--against /tmp/previous-tree]

Target: <= 1% for the default mode at the example's defaults and on a 512-wide model at
~20 ms steps.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODES = ("plain", "exposed", "hook")


def worker(args: argparse.Namespace) -> None:
    """One rank: rotate steps over the models, rank 0 writes the step times as JSON."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, str(ROOT / "examples"))
    from train_ddp import batch, make_model

    from goodlens.exporter import RankExporter
    from goodlens.exporter import torch as gl

    torch.set_num_threads(1)
    gl.init_process_group("gloo")
    rank = dist.get_rank()
    exp = RankExporter.from_env(run_id="modes", url=args.url, flush_interval_s=1.0,
                                spill_dir=None)
    models, opts = {}, {}
    for mode in MODES:
        m = DDP(make_model(args.hidden, args.layers))
        if mode != "plain":
            gl.instrument(m, exp, collectives=mode)
        models[mode], opts[mode] = m, torch.optim.SGD(m.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    sleep = args.compute_ms / 1000
    times: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    step = 0
    for i in range(args.steps):
        for mode in MODES[i % 3:] + MODES[:i % 3]:  # each mode in each position alike
            model, opt = models[mode], opts[mode]
            t0, c0 = time.perf_counter(), time.thread_time()
            with exp.step(step):
                with exp.phase("data"):
                    x, y = batch(step, rank)
                time.sleep(sleep)
                opt.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                opt.step()
                exp.count(samples=len(x))
            times[mode].append(time.perf_counter() - t0)
            cpu[mode].append(time.thread_time() - c0)
            step += 1
    if rank == 0:
        Path(args.out).write_text(json.dumps({"wall": times, "cpu": cpu}))
    exp.close()
    dist.barrier()
    models.clear()
    dist.destroy_process_group()


def one_job(hidden: int, layers: int, compute_ms: float, steps: int, nproc: int,
            url: str | None) -> dict:
    """Run the job once; rank 0's per-step wall and thread-CPU times by mode."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "times.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", __file__, "--worker", "--out", str(out),
               "--hidden", str(hidden), "--layers", str(layers), "--compute-ms",
               str(compute_ms), "--steps", str(steps)] + (["--url", url] if url else [])
        subprocess.run(cmd, cwd=d, check=True, timeout=1200, capture_output=True,
                       env={**os.environ, "GOODLENS_SPILL_DIR": str(Path(d) / "spill")})
        return json.loads(out.read_text())


def _collective_modules(against: str | None) -> dict[str, Any]:
    """Label prefix -> a ``torch_collectives`` module: this tree's (``""``) and, with
    ``against``, another checkout's copy of the file, loaded under another name."""
    from goodlens.exporter import torch_collectives
    mods: dict[str, Any] = {"": torch_collectives}
    if against:
        path = Path(against) / "goodlens" / "exporter" / "torch_collectives.py"
        spec = importlib.util.spec_from_file_location("torch_collectives_against", path)
        assert spec is not None and spec.loader is not None, path
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mods["against:"] = mod
    return mods


def in_process(hidden: int, layers: int, blocks: int, block_steps: int, url: str,
               against: str | None) -> dict[str, list[float]]:
    """Training-thread CPU (us per step, one value per block) of each model: ``plain`` and
    every mode of this tree (and of ``against``), in one process (world-1 gloo)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, str(ROOT / "examples"))
    from train_ddp import batch, make_model

    from goodlens.exporter import RankExporter

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    exp = RankExporter(run_id="modes-in-process", url=url, flush_interval_s=1.0,
                       spill_dir=None)
    models: dict[str, Any] = {}
    for label, mod in [("", None), *_collective_modules(against).items()]:
        for mode in (["plain"] if mod is None else MODES[1:]):
            m = DDP(make_model(hidden, layers))
            if mod is not None:
                mod.attach(m, exp, None, mode)
            models[label + mode] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    loss_fn = nn.MSELoss()
    x, y = batch(0, 0)
    names = list(models)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    step = 0
    try:
        for b in range(blocks):
            for name in names[b % len(names):] + names[:b % len(names)]:
                model, opt = models[name]
                c0 = time.thread_time_ns()
                for _ in range(block_steps):
                    with exp.step(step):
                        opt.zero_grad(set_to_none=True)
                        loss_fn(model(x), y).backward()
                        opt.step()
                    step += 1
                cpu[name].append((time.thread_time_ns() - c0) / block_steps / 1e3)
    finally:
        exp.close()
        models.clear()
        dist.destroy_process_group()
    return cpu


def in_process_table(args: argparse.Namespace, url: str) -> list[str]:
    """Markdown rows of :func:`in_process` for each ``--config`` (first 3 blocks skipped)."""
    rng = np.random.default_rng(0)
    lines = [f"one process, world-1 gloo, {args.blocks} blocks of {args.block_steps} steps "
             "per model; load average at start "
             f"{' / '.join(f'{v:.2f}' for v in os.getloadavg())}", "",
             "| model | plain us/step | mode | us/step | thread CPU over plain (us) |",
             "|---|---:|---|---:|---:|"]
    for config in args.config or ["64,1", "512,2"]:
        hidden, layers = (int(v) for v in config.split(",")[:2])
        cpu = in_process(hidden, layers, args.blocks, args.block_steps, url, args.against)
        plain = np.asarray(cpu.pop("plain")[3:])
        for name, values in cpu.items():
            v = np.asarray(values[3:])
            med, lo, hi = _median_ci(v - plain, rng)
            lines.append(f"| {hidden}x{layers} | {np.median(plain):.1f} | {name} | "
                         f"{np.median(v):.1f} | {med:+.1f} [{lo:+.1f}, {hi:+.1f}] |")
    return lines


def _median_ci(x: np.ndarray, rng: np.random.Generator, n_boot: int = 2000
               ) -> tuple[float, float, float]:
    """The median of ``x`` and its 95% bootstrap interval (percentile method)."""
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    meds = np.median(x[idx], axis=1)
    return float(np.median(x)), float(np.quantile(meds, 0.025)), float(np.quantile(meds, 0.975))


def summarise(data: dict, skip: int = 20, seed: int = 0) -> dict:
    """Per mode: median step, paired wall overhead and the thread-CPU excess over plain (as
    a share of the plain step), each with a 95% interval; the first ``skip`` rotations are
    warm-up."""
    rng = np.random.default_rng(seed)
    wall = {m: np.asarray(v[skip:]) for m, v in data["wall"].items()}
    cpu = {m: np.asarray(v[skip:]) for m, v in data["cpu"].items()}
    plain_ms = float(np.median(wall["plain"]))
    rows = {}
    for mode in MODES:
        n = min(len(wall[mode]), len(wall["plain"]))
        paired = _median_ci(wall[mode][:n] / wall["plain"][:n] - 1, rng)
        extra = _median_ci(cpu[mode][:n] - cpu["plain"][:n], rng)
        rows[mode] = {"median_ms": 1000 * float(np.median(wall[mode])), "paired": paired,
                      "cpu_us": tuple(1e6 * v for v in extra),
                      "cpu_share": tuple(v / plain_ms for v in extra)}
    return rows


def verdict(paired: tuple[float, float, float], target: float = 0.01) -> str:
    """PASS when the interval's upper end is within the target, FAIL when its lower end is
    over it, else unresolved."""
    if paired[2] <= target:
        return "PASS"
    return "FAIL" if paired[1] > target else "unresolved"


def _pct(t: tuple[float, float, float]) -> str:
    return f"{100 * t[0]:+.2f}% [{100 * t[1]:+.2f}, {100 * t[2]:+.2f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--url", default=None, help="collector or sink (default: none)")
    ap.add_argument("--steps", type=int, default=600, help="rotations (steps per mode)")
    ap.add_argument("--nproc", type=int, default=4, help="ranks (torchrun --nproc_per_node)")
    ap.add_argument("--config", action="append", default=None,
                    help="HIDDEN,LAYERS,COMPUTE_MS (repeatable); default: 64,1,20 and "
                         "512,2,8")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--in-process", action="store_true",
                    help="each mode's CPU per step in one process (see the docstring)")
    ap.add_argument("--blocks", type=int, default=80, help="--in-process: blocks per model")
    ap.add_argument("--block-steps", type=int, default=40, help="--in-process: block size")
    ap.add_argument("--against", default=None,
                    help="--in-process: another checkout whose modes run alongside")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    from bench.torch_overhead import Sink
    if args.in_process:
        sink = Sink()
        try:
            print("\n".join(in_process_table(args, sink.url)))
        finally:
            sink.stop()
        return 0
    configs = [tuple(c.split(",")) for c in (args.config or ["64,1,20", "512,2,8"])]
    sink = Sink()
    lines = [f"{args.nproc} ranks, {args.steps} rotations; intervals are 95% bootstrap "
             "intervals of the median", "",
             "| model | ranks | step ms (plain) | mode | step ms | paired wall overhead "
             "| thread CPU over plain (us) | CPU share of step | <= 1% |",
             "|---|---:|---:|---|---:|---:|---:|---:|---|"]
    failed = 0
    try:
        for hidden, layers, compute in configs:
            params = (32 * int(hidden) + int(hidden) + (int(layers) - 1) *
                      (int(hidden) ** 2 + int(hidden)) + int(hidden) + 1)
            t = time.monotonic()
            rows = summarise(one_job(int(hidden), int(layers), float(compute), args.steps,
                                     args.nproc, sink.url))
            print(f"config hidden={hidden} layers={layers} compute={compute} ms "
                  f"({params} params, {4 * params / 1e6:.2f} MB gradient): "
                  f"{time.monotonic() - t:.0f} s", flush=True)
            base = rows["plain"]["median_ms"]
            for mode in MODES[1:]:
                r = rows[mode]
                v = verdict(r["paired"])
                failed |= (mode == "exposed" and v == "FAIL")
                us = r["cpu_us"]
                lines.append(f"| {hidden}x{layers} ({4 * params / 1e6:.2f} MB grad) | "
                             f"{args.nproc} | {base:.3f} | {mode} | {r['median_ms']:.3f} | "
                             f"{_pct(r['paired'])} | {us[0]:+.0f} [{us[1]:+.0f}, {us[2]:+.0f}]"
                             f" | {_pct(r['cpu_share'])} | {v} |")
    finally:
        sink.stop()
    print("\n".join(lines))
    return failed


if __name__ == "__main__":
    sys.exit(main())
