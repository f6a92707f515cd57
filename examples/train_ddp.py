"""A tiny DDP training job on gloo/CPU, instrumented with goodlens, with injectable faults.

Why it exists: it is the real distributed job the end-to-end tests and the overhead
benchmark drive (real ranks, a real slow rank, a real crash and torchrun restart, a real
hang), and the worked example of the lines a user adds to a loop (marked ``# goodlens``).

    torchrun --standalone --nproc_per_node=4 examples/train_ddp.py \\
        --steps 250 --ckpt-every 20 --url http://127.0.0.1:8470 --run-id demo

Faults (each on the first attempt only where a restart would otherwise repeat it):
``--slow-rank R --slow-pct X --slow-from S`` sleeps X% of the simulated compute more on
rank R from step S; ``--kill-rank R --kill-at S`` exits rank R abruptly (``os._exit``);
``--hang-rank R --hang-at S`` sleeps forever in rank R (the others block in all-reduce).
Each step's compute is the MLP's forward/backward plus ``--compute-ms`` of sleep, so the
injected delay is known exactly: slowed steps x compute_ms x pct / 100.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from goodlens.exporter import RankExporter  # goodlens
from goodlens.exporter import torch as gl  # goodlens

DIM = 32


def make_model(seed: int = 0) -> nn.Module:
    """The MLP every rank trains (same initial weights everywhere)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 1))


def batch(step: int, rank: int, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic batch for (step, rank)."""
    g = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(n, DIM, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--compute-ms", type=float, default=20.0,
                   help="simulated compute per step (sleep) on top of the MLP")
    p.add_argument("--ckpt-every", type=int, default=0, help="DCP save every K steps (0: never)")
    p.add_argument("--ckpt-dir", default=None, help="checkpoint folder (default: ./ckpt-RUN)")
    p.add_argument("--async-ckpt", action="store_true", help="use DCP async_save")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-pct", type=float, default=0.0)
    p.add_argument("--slow-from", type=int, default=0)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-at", type=int, default=-1)
    p.add_argument("--run-id", default=os.environ.get("GOODLENS_RUN_ID", "train-ddp"))
    p.add_argument("--url", default=os.environ.get("GOODLENS_URL"))
    p.add_argument("--no-goodlens", action="store_true",
                   help="run without the integration (no hook, a disabled exporter): the "
                        "overhead benchmark's baseline")
    p.add_argument("--times-out", default=None,
                   help="rank 0 writes its step wall times (s), one per line, to this file")
    p.add_argument("--flush-interval", type=float, default=0.2,
                   help="exporter flush interval in seconds")
    return p.parse_args(argv)


def latest_checkpoint(ckpt_dir: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint (DCP writes ``.metadata`` last) as (step, path)."""
    best: tuple[int, Path] | None = None
    if ckpt_dir.is_dir():
        for d in ckpt_dir.iterdir():
            m = re.fullmatch(r"step_(\d+)", d.name)
            if m and (d / ".metadata").exists() and (best is None or int(m.group(1)) > best[0]):
                best = (int(m.group(1)), d)
    return best


def init_process_group() -> None:
    """gloo init that survives torchrun restarts: a fresh key prefix per attempt.

    torchrun's store outlives an attempt, and on a restart gloo may read the addresses the
    dead attempt published and fail to connect; prefixing the keys with the restart count
    keeps each attempt's rendezvous apart.
    """
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=60))
    prefix = f"goodlens-attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store),
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    init_process_group()
    rank = dist.get_rank()
    # goodlens: one exporter per rank; rank, world size and attempt come from torchrun's env
    exp = RankExporter.from_env(run_id=args.run_id, url=args.url,
                                flush_interval_s=args.flush_interval,
                                **({"enabled": False} if args.no_goodlens else {}))
    attempt = exp.attempt
    model = DDP(make_model())
    if not args.no_goodlens:
        gl.instrument(model, exp)  # goodlens: collective wait per step; emits attempt_start
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()

    ckpt_dir = Path(args.ckpt_dir or f"ckpt-{args.run_id}")
    start = 0
    if args.ckpt_every > 0:
        found = [latest_checkpoint(ckpt_dir) if rank == 0 else None]
        dist.broadcast_object_list(found, src=0)  # every rank resumes from the same one
        if found[0] is not None:
            step_done, path = found[0]
            state = {"model": model.state_dict()}
            gl.load_checkpoint(state, path, exp, step=step_done)  # goodlens: restore timing
            model.load_state_dict(state["model"])
            start = step_done + 1
    pending: Any = None
    compute_s = args.compute_ms / 1000.0
    wall: list[float] = []
    for step in range(start, args.steps):
        t_step = time.perf_counter()
        with exp.step(step):  # goodlens: times the step
            with exp.phase("data"):  # goodlens: data-loader wait
                x, y = batch(step, rank)
            extra = 0.0
            if rank == args.slow_rank and step >= args.slow_from:
                extra = compute_s * args.slow_pct / 100.0
            if compute_s + extra > 0:
                time.sleep(compute_s + extra)
            if attempt == 0 and rank == args.kill_rank and step == args.kill_at:
                os._exit(1)  # a crash: no flush, no cleanup
            if attempt == 0 and rank == args.hang_rank and step == args.hang_at:
                while True:
                    time.sleep(3600)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()  # the communication hook times the all-reduce in here
            opt.step()
            exp.count(samples=len(x))  # goodlens (optional): throughput
        wall.append(time.perf_counter() - t_step)
        if args.ckpt_every > 0 and (step + 1) % args.ckpt_every == 0:
            # goodlens: save with stall / durable timing (an async save first waits for the
            # previous one, inside its recorded stall)
            pending = gl.save_checkpoint({"model": model.state_dict()},
                                         ckpt_dir / f"step_{step:06d}", exp, step,
                                         async_=args.async_ckpt)
    if pending is not None:
        pending.result()  # the last async save is durable (and recorded) before exiting
    if args.times_out and rank == 0:
        Path(args.times_out).write_text("".join(f"{w}\n" for w in wall))
    gl.attempt_end(exp, "completed", step=args.steps - 1)  # goodlens: the run finished
    exp.close()  # goodlens: flush
    dist.barrier()
    del model  # DDP teardown hang workaround: drop the DDP module before destroying the group
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
