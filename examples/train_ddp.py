"""A tiny DDP training job on gloo/CPU, instrumented with goodlens, with injectable faults.

Why it exists: it is the real distributed job the end-to-end tests and the overhead
benchmark drive (real ranks, a real slow rank, a real crash and torchrun restart, a real
hang), and the worked example of the lines a user adds to a loop (marked ``# goodlens``).

    torchrun --standalone --nproc_per_node=4 examples/train_ddp.py \\
        --steps 250 --ckpt-every 20 --url http://127.0.0.1:8470 --run-id demo

Faults (each on the first attempt only where a restart would otherwise repeat it):
``--slow-rank R --slow-pct X --slow-from S`` sleeps X% of the simulated compute more on
rank R from step S; ``--kill-rank R --kill-at S`` exits rank R abruptly (``os._exit``);
``--hang-rank R --hang-at S`` sleeps forever in rank R (the others block in all-reduce);
``--kill-how raise`` makes the crash an unhandled exception instead, ``kill`` a SIGKILL;
``--kill-after-restore`` crashes rank R also at the first step after every restore (a
restart loop).
``--truth-dir D``: every rank appends its own clock readings (process start as the script
saw it, each step's start and end, the instant it is about to enter the step's
collective, the restore, the crash instant, the instant a rank's own code saw an exception
end its step) to ``D/rank<R>-attempt<A>.jsonl``, line by line, so a test compares goodlens
with the job's own clock.
Each step's compute is the MLP's forward/backward plus ``--compute-ms`` of sleep, so the
injected delay is known exactly: slowed steps x compute_ms x pct / 100.
"""

from __future__ import annotations

import time

T_SCRIPT = time.time()  # before the heavy imports: the job's own clock of its start-up

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from goodlens.exporter import RankExporter  # noqa: E402  # goodlens
from goodlens.exporter import torch as gl  # noqa: E402  # goodlens

DIM = 32


def make_model(hidden: int = 64, layers: int = 1, seed: int = 0) -> nn.Module:
    """The MLP every rank trains (same initial weights everywhere): ``layers`` hidden layers
    of width ``hidden`` (512 x 2: 280k parameters, a 1.1 MB gradient)."""
    torch.manual_seed(seed)
    mods: list[nn.Module] = [nn.Linear(DIM, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(hidden, 1))


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
    p.add_argument("--kill-after-restore", action="store_true",
                   help="--kill-rank also crashes at the first step after every restore")
    p.add_argument("--kill-how", choices=("exit", "raise", "kill"), default="exit",
                   help="the crash: os._exit(1), an unhandled exception, or SIGKILL")
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
    p.add_argument("--collectives", default="auto", choices=("auto", "exposed", "hook", "off"),
                   help="how goodlens times DDP's collectives (see docs/pytorch.md)")
    p.add_argument("--hidden", type=int, default=64, help="width of the MLP's hidden layers")
    p.add_argument("--layers", type=int, default=1, help="hidden layers of the MLP")
    p.add_argument("--truth-dir", default=None,
                   help="every rank appends its own clock readings here (tests)")
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


class Truth:
    """The job's own clock: JSON lines appended (and flushed) as things happen, so a rank
    killed mid-run leaves every line it wrote."""

    def __init__(self, folder: str | None, rank: int, attempt: int) -> None:
        self.f = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.f = open(Path(folder) / f"rank{rank}-attempt{attempt}.jsonl", "a")  # noqa: SIM115
            self.write("script_start", t=T_SCRIPT)

    def write(self, kind: str, **values: Any) -> None:
        if self.f is not None:
            self.f.write(json.dumps({"kind": kind, **values}) + "\n")
            self.f.flush()


def crash(how: str) -> None:
    """The injected crash of ``--kill-rank``."""
    if how == "raise":
        raise RuntimeError("injected crash")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(1)  # a crash: no flush, no cleanup


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    gl.init_process_group("gloo")  # goodlens: survives a torchrun restart (docs/pytorch.md)
    rank = dist.get_rank()
    # goodlens: one exporter per rank; rank, world size and attempt come from torchrun's env
    exp = RankExporter.from_env(run_id=args.run_id, url=args.url,
                                flush_interval_s=args.flush_interval,
                                **({"enabled": False} if args.no_goodlens else {}))
    attempt = exp.attempt
    truth = Truth(args.truth_dir, rank, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
    model = DDP(make_model(args.hidden, args.layers))
    if not args.no_goodlens:  # goodlens: collective wait per step; emits attempt_start
        gl.instrument(model, exp, collectives=args.collectives)
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
            t0 = time.time()
            gl.load_checkpoint(state, path, exp, step=step_done)  # goodlens: restore timing
            model.load_state_dict(state["model"])
            truth.write("restore", t0=t0, t1=time.time(), step=step_done)
            start = step_done + 1
    pending: Any = None
    compute_s = args.compute_ms / 1000.0
    wall: list[float] = []
    for step in range(start, args.steps):
        t_step = time.perf_counter()
        t0 = time.time()
        try:
            with exp.step(step):  # goodlens: times the step
                with exp.phase("data"):  # goodlens: data-loader wait
                    x, y = batch(step, rank)
                extra = 0.0
                if rank == args.slow_rank and step >= args.slow_from:
                    extra = compute_s * args.slow_pct / 100.0
                if compute_s + extra > 0:
                    time.sleep(compute_s + extra)
                if rank == args.kill_rank and ((attempt == 0 and step == args.kill_at) or (
                        args.kill_after_restore and start > 0 and step == start)):
                    truth.write("crash", t=time.time(), step=step)
                    crash(args.kill_how)
                if attempt == 0 and rank == args.hang_rank and step == args.hang_at:
                    while True:
                        time.sleep(3600)
                truth.write("ready", step=step, t=time.time())  # the collective is next
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()  # the communication hook times the all-reduce in here
                opt.step()
                exp.count(samples=len(x))  # goodlens (optional): throughput
        except BaseException as e:  # the job's clock: when this rank saw a failure
            truth.write("error", t=time.time(), what=type(e).__name__)
            raise
        wall.append(time.perf_counter() - t_step)
        truth.write("step", step=step, t0=t0, t1=time.time())
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
