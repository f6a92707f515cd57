"""A small DDP job on gloo/CPU whose all-reduce takes a planted extra time on every rank,
instrumented with goodlens, with the shared planted faults (``jobclock.py``) and its own
clock.

Why it exists: what a straggler costs the job depends on how much of the step is the
collective's own time (issue #28: a rank 20% slower in its own work read 32% where the
all-reduce was 15% of the step). A CPU job's all-reduce of a small model takes a few
milliseconds at most, so this job plants the collective's time: ``--comm-ms X`` makes
every rank's all-reduce complete X ms after its transfer did (a communication hook waits
on the transfer, then sleeps, off the training thread: the training thread is blocked in
DDP's wait for it, as for a slow transfer; with X 0 the hook only times the all-reduce).
``tests/record/frameworks.py`` records it with the collective at 0%, 15% and 40% of the
step and one rank slowed (``--slow-rank``):

    torchrun --standalone --nproc_per_node=3 examples/integrations/train_ddp_share.py \\
        --steps 80 --comm-ms 30 --slow-rank 1 --slow-ms 10 --url http://127.0.0.1:8470

The job's clock (``--truth-dir``) adds ``comm`` lines to jobclock's (``step``, ``s``: the
all-reduce from its launch to its completion, as the hook's thread timed it; ``delay``:
the planted sleep as long as it really took). On the rank that reaches the collective last,
``s`` is the collective's own time: it waits for no peer.
"""

from __future__ import annotations

import time

T_SCRIPT = time.time()  # before the heavy imports: the job's own clock of its start-up

import argparse  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from jobclock import Faults, JobClock, add_fault_args  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from goodlens.exporter import RankExporter  # noqa: E402  # goodlens
from goodlens.exporter import torch as gl  # noqa: E402  # goodlens

DIM = 32


class SlowAllReduce:
    """The state of :func:`slow_allreduce`: the planted delay, and each bucket's times in
    ``done`` for the training thread to write after the step."""

    def __init__(self, ms: float) -> None:
        self.ms = ms
        self.done: list[tuple[float, float]] = []  # (launch to completion, planted sleep)


def slow_allreduce(state: SlowAllReduce, bucket):  # bare: see below
    """A DDP communication hook: average by all-reduce (DDP's default), completed
    ``state.ms`` after the transfer. A thread waits for the transfer and sleeps, so the
    training thread spends the delay blocked in DDP's wait for the bucket, where goodlens's
    exposed-wait timing counts collective wait (a sleep in the hook itself would run on the
    training thread before that wait: it would read as the rank's own work). DDP refuses a
    hook whose ``bucket`` or return is annotated other than as ``GradBucket`` and
    ``Future[Tensor]``, which a postponed annotation is not: they are left bare."""
    t0 = time.perf_counter()
    tensor = bucket.buffer().div_(dist.get_world_size())

    def finish(fut: torch.futures.Future) -> torch.Tensor:
        s0 = time.perf_counter()
        if state.ms > 0:
            time.sleep(state.ms / 1000.0)
        t1 = time.perf_counter()
        state.done.append((t1 - t0, t1 - s0))
        return fut.value()[0]

    return dist.all_reduce(tensor, async_op=True).get_future().then(finish)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--compute-ms", type=float, default=40.0,
                   help="simulated compute per step (sleep) on top of the MLP")
    p.add_argument("--comm-ms", type=float, default=0.0,
                   help="planted time of every rank's all-reduce after its transfer")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--ckpt-dir", default=None, help="unused: this job saves no checkpoint")
    p.add_argument("--run-id", default="ddp-share")
    p.add_argument("--url", default=None)
    p.add_argument("--flush-interval", type=float, default=0.2,
                   help="exporter flush interval in seconds (tests: 0.2; the default 1.0)")
    add_fault_args(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    gl.init_process_group("gloo")  # goodlens: survives a torchrun restart
    rank = dist.get_rank()
    clock = JobClock(args.truth_dir, rank, T_SCRIPT)
    faults = Faults(args, rank, clock)
    exp = RankExporter.from_env(run_id=args.run_id, url=args.url,  # goodlens
                                flush_interval_s=args.flush_interval)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(DIM, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1)))
    hook = SlowAllReduce(args.comm_ms)
    model.register_comm_hook(hook, slow_allreduce)  # the job's clock of its collective
    gl.instrument(model, exp)  # goodlens: the exposed all-reduce wait; attempt_start
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    compute_s = args.compute_ms / 1000.0
    for step in range(args.steps):
        t0 = time.time()
        with exp.step(step):  # goodlens: the step
            with exp.phase("data"):  # goodlens: data-loader wait
                g = torch.Generator().manual_seed(step * 1009 + rank)
                x = torch.randn(16, DIM, generator=g)
            time.sleep(compute_s)
            faults.slow(step)
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), x.sum(dim=1, keepdim=True)).backward()
            opt.step()
        clock.write("step", step=step, t0=t0, t1=time.time())
        for s, delay in hook.done:
            clock.write("comm", step=step, s=s, delay=delay)
        hook.done.clear()
    gl.attempt_end(exp, "completed", step=args.steps - 1)  # goodlens: the run finished
    exp.close()  # goodlens: flush
    dist.barrier()
    del model  # DDP teardown: drop the module before destroying the group
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
