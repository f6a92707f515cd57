"""An elastic data-parallel job on gloo/CPU: survives a lost node, grows back with a hot spare, and
evicts a straggler node the collector confirmed, keeping the global batch exactly.

Why it exists: it is the job of goodlens's fault scenario (``examples/elastic/scenario.py``,
``make demo-faults``, ``tests/e2e/test_elastic_scenario.py``): several torchrun agents on one
machine, each standing for a node, one training job across them. Every attempt (a new
rendezvous round) it:

- agrees on a job-wide attempt number (rank 0 counts rendezvous rounds in ``STATE/attempt``:
  each agent's own ``TORCHELASTIC_RESTART_COUNT`` differs once nodes come and go) and on
  the newest complete DCP checkpoint, and resumes from it;
- computes micro-batch and gradient accumulation for the world it got with
  :func:`goodlens.exporter.elastic.batch_for_world` (the code of ``goodlens plan elastic``),
  so the samples per optimizer step stay ``--global-batch`` on any world, and prints what
  it chose when the batch does not divide;
- records the world's change (``world_resized``, ``rank_joined``, ``rank_evicted`` of a
  lost node) against the previous attempt's membership (``STATE/membership.json``);
- with ``--evict on|dry_run``, rank 0 polls the collector for confirmed ``evict``
  findings (:class:`goodlens.exporter.elastic.EvictionClient`, with its guard rails) and
  every rank learns the decision at the same step; on an eviction every rank checkpoints,
  the evicted node's ranks stop their agent (the node leaves the rendezvous) and the others
  exit with code 3, so their agents re-rendezvous with whoever waits (a hot spare).

A node (``GOODLENS_NODE``, set per agent) becomes a straggler while the file
``STATE/slow-<node>`` exists: each of its micro-batches sleeps ``--slow-pct`` more. While
``STATE/pace`` exists every rank's step sleeps ``PACE_S`` more (the scenario holds a shrunk
world's pace while a spare's agent starts, so the job cannot finish before it joins).
``--truth-dir``: each rank appends its own clock readings (steps, restore, onset of the
slowdown, the eviction) to ``rank<R>-attempt<A>.jsonl``, for the tests.
"""

from __future__ import annotations

import time

T_SCRIPT = time.time()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from goodlens.exporter import RankExporter  # noqa: E402
from goodlens.exporter import elastic as gle  # noqa: E402
from goodlens.exporter import torch as gl  # noqa: E402

DIM = 32
EXIT_RESIZE = 3
"""Exit status of the ranks that stay after an eviction: their agents re-rendezvous."""
PACE_S = 0.1
"""The extra step time of every rank while ``STATE/pace`` exists."""
LR = 0.01
"""Plain SGD's learning rate (:func:`sgd_step`)."""
ENDED: list[bool] = []
"""Not empty once this process recorded its attempt's end."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--global-batch", type=int, default=48)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--compute-ms", type=float, default=20.0,
                   help="simulated compute per micro-batch (sleep)")
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--async-ckpt", action="store_true", help="DCP async_save")
    p.add_argument("--state-dir", required=True, help="checkpoints and the job's state files")
    p.add_argument("--slow-pct", type=float, default=200.0)
    p.add_argument("--evict", choices=gle.MODES, default="off")
    p.add_argument("--min-confidence", type=float, default=0.7)
    p.add_argument("--max-evictions-per-hour", type=int, default=1)
    p.add_argument("--min-nodes", type=int, default=2)
    p.add_argument("--spare-gpus", type=int, default=0, help="run tag: hot spares' GPUs")
    p.add_argument("--full-world", type=int, default=0, help="ranks of the full job")
    p.add_argument("--run-id", default=os.environ.get("GOODLENS_RUN_ID", "elastic"))
    p.add_argument("--url", default=os.environ.get("GOODLENS_URL"))
    p.add_argument("--truth-dir", default=None)
    return p.parse_args(argv)


class Truth:
    """The job's own clock, JSON lines flushed as they happen."""

    def __init__(self, folder: str | None, rank: int, attempt: int, node: str) -> None:
        self.f = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.f = open(Path(folder) / f"rank{rank}-attempt{attempt}.jsonl", "a")  # noqa: SIM115
            self.write("script_start", t=T_SCRIPT, node=node)

    def write(self, kind: str, **values: Any) -> None:
        if self.f is not None:
            self.f.write(json.dumps({"kind": kind, "t": time.time(), **values}) + "\n")
            self.f.flush()


def latest_checkpoint(ckpt_dir: Path) -> tuple[int, str] | None:
    """The newest complete checkpoint (DCP writes ``.metadata`` last): (step, path)."""
    best: tuple[int, str] | None = None
    if ckpt_dir.is_dir():
        for d in ckpt_dir.iterdir():
            m = re.fullmatch(r"step_(\d+)", d.name)
            if m and (d / ".metadata").exists() and (best is None or int(m.group(1)) > best[0]):
                best = (int(m.group(1)), str(d))
    return best


def next_attempt(state: Path) -> int:
    """Rank 0: this rendezvous round's job-wide attempt number (0, 1, ...)."""
    f = state / "attempt"
    n = int(f.read_text()) if f.exists() else 0
    tmp = state / "attempt.tmp"
    tmp.write_text(str(n + 1))
    os.replace(tmp, f)
    return n


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 1))


def all_reduce_grads(model: nn.Module) -> None:
    """Sum the gradients over ranks in one all-reduce (each rank's loss is already scaled
    by 1 / (replicas x accumulation)). A hand-written DDP: ``DistributedDataParallel``'s
    constructor imports ``torch._dynamo``, 4-5 s of CPU per process, which on 2 cores
    and 6 ranks made every attempt's start-up 10 s longer."""
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def sgd_step(model: nn.Module, lr: float = LR) -> None:
    """Plain SGD by hand (no state to checkpoint): ``torch.optim``'s first optimizer imports
    ``torch._dynamo``, 1.3 s of CPU per process at every attempt's start-up, which on 2 cores
    and 6 ranks put 4 s between each world's start and its first step."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
                p.grad = None


def micro_batch(step: int, index: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples ``index .. index+n`` of step ``step``'s global batch: the same data for the
    same step on any world."""
    g = torch.Generator().manual_seed(step * 100_003 + index)
    x = torch.randn(n, DIM, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def setup(args: argparse.Namespace, node: str) -> tuple[int, list[str], int, Any]:
    """Process group, membership, attempt number and checkpoint every rank agrees on."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, node)
    state = Path(args.state_dir)
    info: list[Any] = [None, None]
    if rank == 0:
        state.mkdir(parents=True, exist_ok=True)
        info = [next_attempt(state), latest_checkpoint(state / "ckpt")]
    dist.broadcast_object_list(info, src=0)
    return rank, [str(h) for h in hosts], int(info[0]), info[1]


def evicted_hosts(state: Path) -> set[str]:
    """Hosts this job evicted itself (not lost): from the eviction history."""
    try:
        lines = (state / "evictions.jsonl").read_text().splitlines()
    except OSError:
        return set()
    return {json.loads(x)["host"] for x in lines if '"verdict": "evict"' in x}


def on_resize(exp: RankExporter) -> None:
    """A healthy worker gets SIGTERM when its agent restarts the group for a membership
    change (a spare joined): record the attempt's end as ``resized`` (accounting then knows
    when it ended), then let goodlens's handler flush and terminate."""
    chained = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        if not ENDED:
            ENDED.append(True)
            gl.attempt_end(exp, "resized")
        if callable(chained):
            chained(signum, frame)
        else:
            sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def leave(node: str, evicted: str, exp: RankExporter, step: int) -> int:
    """After the eviction checkpoint: the evicted node stops its agent, the others exit
    with ``EXIT_RESIZE`` so their agents re-rendezvous."""
    ENDED.append(True)
    gl.attempt_end(exp, "resized", step=step)
    exp.close()
    with contextlib.suppress(Exception):
        dist.barrier()
    if node == evicted:
        if os.environ.get("LOCAL_RANK") == "0":
            os.kill(os.getppid(), signal.SIGTERM)  # the node leaves the rendezvous
        time.sleep(30)  # the agent terminates this worker
        return 0
    return EXIT_RESIZE


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    node = os.environ.get("GOODLENS_NODE") or socket.gethostname()
    state = Path(args.state_dir)
    rank, hosts, attempt, found = setup(args, node)
    world = len(hosts)
    # JSON on the wire: Arrow's encoder imports pandas, a second of CPU per process at
    # every attempt's start-up on 2 cores
    exp = RankExporter.from_env(run_id=args.run_id, url=args.url, attempt=attempt, host=node,
                                flush_interval_s=0.2, wire="json",
                                run_meta={"global_batch": args.global_batch,
                                          "world_size": args.full_world or world,
                                          "tags": json.dumps({"spare_gpus": args.spare_gpus})})
    truth = Truth(args.truth_dir, rank, attempt, node)
    on_resize(exp)
    choice = gle.batch_for_world(args.global_batch, world, args.micro_batch)
    if rank == 0:
        print(f"[goodlens elastic] attempt {attempt}: world {world} on {sorted(set(hosts))}; "
              f"micro-batch {choice.micro_batch} x accumulation {choice.accumulation} on "
              f"{choice.replicas_used} replicas = {choice.global_batch} ({choice.reason})",
              flush=True)
        gle.record_membership(exp, hosts, state / "membership.json", choice,
                              evicted=evicted_hosts(state))
    truth.write("world", world=world, hosts=hosts, micro=choice.micro_batch,
                accumulation=choice.accumulation, used=choice.replicas_used)
    model = make_model()  # the same initial weights on every rank (seeded)
    gl.instrument(model, exp)  # not DDP: records attempt_start only
    loss_fn = nn.MSELoss()
    start = 0
    if found is not None:
        step_done, path = found
        sd = {"model": model.state_dict()}
        gl.load_checkpoint(sd, path, exp, step=step_done)
        model.load_state_dict(sd["model"])
        truth.write("restore", step=step_done)
        start = step_done + 1
    client = None
    if rank == 0 and args.evict != "off":
        policy = gle.EvictionPolicy(args.evict, args.min_confidence,
                                    args.max_evictions_per_hour, args.min_nodes)
        client = gle.EvictionClient(exp, args.url, args.run_id, policy, hosts,
                                    state / "evictions.jsonl").start()
    active = rank < choice.replicas_used
    m, acc = choice.micro_batch, choice.accumulation
    scale = 1.0 / (choice.replicas_used * acc) if active else 0.0  # summed over ranks
    compute_s = args.compute_ms / 1000.0
    slow_file, onset, pace_file = state / f"slow-{node}", False, state / "pace"
    pending: Any = None
    for step in range(start, args.steps):
        slow = slow_file.exists()
        if slow and not onset:
            onset = True
            truth.write("slow_onset", step=step)
        t0 = time.time()
        with exp.step(step):
            if pace_file.exists():
                time.sleep(PACE_S)
            for k in range(acc):
                x, y = micro_batch(step, (rank * acc + k) * m, m)
                time.sleep(compute_s * (1 + (args.slow_pct / 100 if slow else 0)))
                (loss_fn(model(x), y) * scale).backward()
            with exp.phase("collective"):  # goodlens: time blocked in the all-reduce
                all_reduce_grads(model)
            sgd_step(model)
            exp.count(samples=m * acc if active else 0)
        truth.write("step", step=step, t0=t0, t1=time.time(), world=world)
        evicted = gle.agreed_eviction(client, hosts) if args.evict != "off" else None
        saving = evicted is not None or (step + 1) % args.ckpt_every == 0
        if saving:
            if evicted is not None and pending is not None and hasattr(pending, "result"):
                pending.result()  # the last async save is durable before the final one
            pending = gl.save_checkpoint(
                {"model": model.state_dict()},
                state / "ckpt" / f"step_{step:06d}", exp, step,
                async_=args.async_ckpt and evicted is None)
        if evicted is not None:
            truth.write("evict", step=step, host=evicted)
            if client is not None:
                client.stop()
            return leave(node, evicted, exp, step)
    if pending is not None and hasattr(pending, "result"):
        pending.result()
    if client is not None:
        client.stop()
    gl.attempt_end(exp, "completed", step=args.steps - 1)
    exp.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
