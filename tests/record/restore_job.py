"""A DDP job (gloo, CPU) that restores a DCP checkpoint at each attempt's start, with a slow
or a stopped read planted in one rank: the job the ``restore`` recording runs.

Attempt 0: every rank restores ``--ckpt``; rank ``--slow-rank`` sleeps ``--item-delay`` s
before each read item (its read moves, item by item, far slower than the others'), then
the job trains ``--steps`` steps and rank ``--kill-rank`` exits at the last one, so
torchrun starts attempt 1. Attempt 1: rank ``--stuck-rank`` stops reading for good after
``--stop-after`` items (the others wait for it in DCP's barrier) until the job is killed.
``--truth-dir``: each rank writes its own clock (``restore_start``, each ``item`` committed,
``restore_end``, ``step``, ``stopped``) to ``rank{R}-attempt{A}.jsonl``.

``write_checkpoint(path)`` makes the checkpoint in one process before the job runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from goodlens.exporter import RankExporter
from goodlens.exporter import torch as gl

WIDTH, LAYERS = 32, 30   # 60 tensors: 30 weights of 4 KiB, 30 biases


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def write_checkpoint(path: str | os.PathLike[str]) -> None:
    """The checkpoint every attempt restores, written by one process (no process group)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "assuming the intent is to save in a single process"
        dcp.save({"model": make_model().state_dict()}, checkpoint_id=os.fspath(path))


class Clock:
    def __init__(self, folder: str | None, rank: int, attempt: int) -> None:
        self.f = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.f = open(Path(folder) / f"rank{rank}-attempt{attempt}.jsonl", "a")  # noqa: SIM115

    def write(self, kind: str, **values: Any) -> None:
        if self.f is not None:
            self.f.write(json.dumps({"kind": kind, **values}) + "\n")
            self.f.flush()


class Planted(dcp.DefaultLoadPlanner):
    """DCP's planner, with the planted delay before each read item's tensor is resolved
    (``delay`` s), or a stop for good after ``stop_after`` items."""

    def __init__(self, clock: Clock, delay: float = 0.0, stop_after: int = -1) -> None:
        super().__init__()
        self.clock, self.delay, self.stop_after, self.items = clock, delay, stop_after, 0

    def resolve_tensor(self, read_item: Any) -> torch.Tensor:
        if self.items == self.stop_after:
            self.clock.write("stopped", t=time.time(), items=self.items)
            while True:
                time.sleep(3600)
        if self.delay:
            time.sleep(self.delay)
        return super().resolve_tensor(read_item)

    def commit_tensor(self, read_item: Any, tensor: torch.Tensor) -> None:
        super().commit_tensor(read_item, tensor)
        self.items += 1
        self.clock.write("item", t=time.time(), n=self.items)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, kind, default in (("--url", str, None), ("--run-id", str, "restore"),
                                ("--ckpt", str, None), ("--truth-dir", str, None),
                                ("--steps", int, 10), ("--slow-rank", int, 2),
                                ("--item-delay", float, 0.15), ("--kill-rank", int, 1),
                                ("--stuck-rank", int, 3), ("--stop-after", int, 10)):
        p.add_argument(name, type=kind, default=default)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    gl.init_process_group("gloo")
    rank = dist.get_rank()
    exp = RankExporter.from_env(run_id=args.run_id, url=args.url, flush_interval_s=0.2)
    attempt = exp.attempt
    clock = Clock(args.truth_dir, rank, attempt)
    model = DDP(make_model())
    gl.instrument(model, exp)
    planner = Planted(clock)
    if attempt == 0 and rank == args.slow_rank:
        planner.delay = args.item_delay
    if attempt == 1 and rank == args.stuck_rank:
        planner.stop_after = args.stop_after
    state = {"model": model.module.state_dict()}
    clock.write("restore_start", t=time.time())
    gl.load_checkpoint(state, args.ckpt, exp, step=0, planner=planner)
    clock.write("restore_end", t=time.time())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        t0 = time.time()
        with exp.step(step):
            time.sleep(0.02)
            x = torch.randn(8, WIDTH)
            model(x).sum().backward()
            opt.step()
        clock.write("step", step=step, t0=t0, t1=time.time())
        if attempt == 0 and rank == args.kill_rank and step == args.steps:
            exp.flush()
            os._exit(1)   # the failure that starts attempt 1
    dist.barrier()
    gl.attempt_end(exp, "completed", step=args.steps)
    exp.close()
    del model
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
