"""A small FSDP2 (``fully_shard``) training job on gloo/CPU, instrumented with goodlens, with
the shared planted faults (``jobclock.py``) and its own clock.

Why it exists: FSDP2 is how large models are trained, and its collectives (all-gathers
before each layer, reduce-scatters after each layer's backward) are not DDP's single
all-reduce. This job is what ``tests/e2e/test_integration_fsdp2.py`` and
``bench/integrations.py`` drive, and the worked example of the lines a user adds (marked
``# goodlens``):

    torchrun --standalone --nproc_per_node=4 examples/integrations/train_fsdp2.py \\
        --steps 200 --ckpt-every 20 --url http://127.0.0.1:8470 --run-id fsdp2-demo

``--hsdp`` shards within pairs of ranks and replicates across the pairs (a 2-D mesh).
Beyond the shared faults: ``--rs-delay-ranks R,... --rs-delay-ms X --rs-delay-steps A:B``
delays those ranks' reduce-scatter of the root module by X ms inside the call, on the even
steps in [A, B) (a planted slow collective: with every rank delayed, each is blocked in it X
ms longer; the job writes each planted sleep as it measured it, ``rs_delay`` lines).
"""

from __future__ import annotations

import time

T_SCRIPT = time.time()  # before the heavy imports: the job's own clock of its start-up

import argparse  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from jobclock import Faults, JobClock, add_fault_args, attempt  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from goodlens.exporter import RankExporter  # noqa: E402  # goodlens
from goodlens.exporter import torch as gl  # noqa: E402  # goodlens

DIM = 32


class Net(nn.Module):
    """An MLP of ``layers`` blocks (each its own FSDP2 unit) and a head the root shards."""

    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(DIM, hidden)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU())
                                    for _ in range(layers))
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.inp(x))
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class Batches:
    """Deterministic batches per (step, rank); the planted stall is in the fetch."""

    def __init__(self, rank: int, faults: Faults, n: int = 16) -> None:
        self.rank, self.faults, self.n = rank, faults, n

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.faults.stall(step)
        g = torch.Generator().manual_seed(step * 1009 + self.rank)
        x = torch.randn(self.n, DIM, generator=g)
        return x, x.sum(dim=1, keepdim=True)


class DelayedReduceScatter:
    """The planted slow collective: FSDP2's reduce-scatter, entered ``ms`` late on the
    steps ``on(step)`` says (installed by the job before goodlens wraps it)."""

    def __init__(self, inner: Any, ms: float, clock: JobClock) -> None:
        self.inner, self.ms, self.clock = inner, ms, clock
        self.step = -1
        self.active = False

    def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                 async_op: bool = False) -> Any:
        if self.active:
            t0 = time.perf_counter()
            time.sleep(self.ms / 1000.0)
            self.clock.write("rs_delay", step=self.step, s=time.perf_counter() - t0)
        return self.inner(output_tensor=output_tensor, input_tensor=input_tensor,
                          group=group, op=op, async_op=async_op)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--compute-ms", type=float, default=20.0,
                   help="simulated compute per step (sleep) on top of the MLP")
    p.add_argument("--ckpt-every", type=int, default=0, help="DCP save every K steps (0: never)")
    p.add_argument("--ckpt-dir", default="ckpt-fsdp2")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hsdp", action="store_true",
                   help="HSDP: a (world/2, 2) mesh, replicated across pairs of ranks")
    p.add_argument("--rs-delay-ranks", default="",
                   help="comma-separated ranks whose root reduce-scatter is delayed")
    p.add_argument("--rs-delay-ms", type=float, default=0.0)
    p.add_argument("--rs-delay-steps", default="0:0", help="A:B, the even steps in [A, B)")
    p.add_argument("--run-id", default="fsdp2")
    p.add_argument("--url", default=None)
    p.add_argument("--no-goodlens", action="store_true",
                   help="the same job without goodlens (the overhead benchmark's baseline)")
    p.add_argument("--times-out", default=None,
                   help="rank 0 writes each step's wall time and its process CPU time at the "
                        "step's end (s), one step per line, to this file")
    p.add_argument("--flush-interval", type=float, default=0.2,
                   help="exporter flush interval in seconds (tests: 0.2; the default 1.0)")
    add_fault_args(p)
    return p.parse_args(argv)


def latest_checkpoint(ckpt_dir: Path) -> tuple[int, Path] | None:
    """The newest complete DCP checkpoint (``.metadata`` is written last) as (step, path)."""
    found = [(int(m.group(1)), d) for d in (ckpt_dir.iterdir() if ckpt_dir.is_dir() else [])
             if (m := re.fullmatch(r"step_(\d+)", d.name)) and (d / ".metadata").exists()]
    return max(found) if found else None


def restore(model: nn.Module, ckpt_dir: Path, exp: RankExporter, clock: JobClock) -> int:
    """Resume from the newest checkpoint every rank agrees on; the first step to run."""
    found = [latest_checkpoint(ckpt_dir) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(found, src=0)
    if found[0] is None:
        return 0
    step_done, path = found[0]
    t0 = time.time()
    state = {"model": model.state_dict()}
    gl.load_checkpoint(state, path, exp, step=step_done)  # goodlens: restore time and bytes
    model.load_state_dict(state["model"])
    clock.write("restore", t0=t0, t1=time.time(), step=step_done)
    return step_done + 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    gl.init_process_group("gloo")  # goodlens: survives a torchrun restart
    rank = dist.get_rank()
    clock = JobClock(args.truth_dir, rank, T_SCRIPT)
    faults = Faults(args, rank, clock)
    exp = RankExporter.from_env(run_id=args.run_id, url=args.url,  # goodlens
                                flush_interval_s=args.flush_interval,
                                **({"enabled": False} if args.no_goodlens else {}))
    model = Net(args.hidden, args.layers)
    mesh = None
    if args.hsdp:  # 2-D: replicate across pairs of ranks, shard within each pair
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2),
                                mesh_dim_names=("replicate", "shard"))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)  # the root: inp and head
    delay = None
    if str(rank) in args.rs_delay_ranks.split(",") and args.rs_delay_ms > 0:
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter
        delay = DelayedReduceScatter(DefaultReduceScatter(), args.rs_delay_ms, clock)
        model.set_custom_reduce_scatter(delay)
    if not args.no_goodlens:
        gl.instrument(model, exp)  # goodlens: all-gather/reduce-scatter wait; attempt_start
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    ckpt_dir = Path(args.ckpt_dir)
    start = restore(model, ckpt_dir, exp, clock) if args.ckpt_every > 0 else 0
    batches = Batches(rank, faults)
    lo, hi = (int(v) for v in args.rs_delay_steps.split(":"))
    compute_s = args.compute_ms / 1000.0
    wall: list[tuple[float, float]] = []
    for step in range(start, args.steps):
        t0 = time.time()
        if delay is not None:
            delay.step, delay.active = step, attempt() == 0 and lo <= step < hi and step % 2 == 0
        try:
            with exp.step(step):  # goodlens: the step
                with exp.phase("data"):  # goodlens: data-loader wait
                    x, y = batches.get(step)
                time.sleep(compute_s)
                faults.slow(step)
                faults.crash(step)
                clock.write("ready", step=step, t=time.time())  # the first collective is next
                opt.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                opt.step()
        except BaseException as e:  # the job's clock: when this rank saw a failure
            clock.error(e)
            raise
        t1 = time.time()
        wall.append((t1 - t0, time.process_time()))
        clock.write("step", step=step, t0=t0, t1=t1)
        if args.ckpt_every > 0 and (step + 1) % args.ckpt_every == 0:
            s0 = time.time()
            gl.save_checkpoint({"model": model.state_dict()}, ckpt_dir / f"step_{step:06d}",
                               exp, step)  # goodlens: save stall and bytes
            clock.write("save", t0=s0, t1=time.time(), step=step)
    if args.times_out and rank == 0:
        Path(args.times_out).write_text("".join(f"{w} {c}\n" for w, c in wall))
    gl.attempt_end(exp, "completed", step=args.steps - 1)  # goodlens: the run finished
    exp.close()  # goodlens: flush
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
