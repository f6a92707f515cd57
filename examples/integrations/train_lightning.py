"""A small PyTorch Lightning job (DDP strategy, gloo/CPU) instrumented with goodlens's
callback, with the shared planted faults (``jobclock.py``) and its own clock.

Why it exists: Lightning owns the training loop, so goodlens sees it only through a callback
(``goodlens.exporter.lightning.GoodlensCallback``); this job is what
``tests/e2e/test_integration_lightning.py`` and the integrations benchmark drive, and the
worked example of the lines a Lightning user adds (marked ``# goodlens``):

    torchrun --standalone --nproc_per_node=4 --max-restarts=1 \\
        examples/integrations/train_lightning.py --steps 200 --ckpt-every 20 \\
        --url http://127.0.0.1:8470 --run-id lightning-demo

A restarted attempt resumes from the newest ``ModelCheckpoint`` file with
``fit(ckpt_path=...)``. The job's own clock (``--truth-dir``) is taken in the job's code, never
from goodlens: a step runs from the data set's ``__getitem__`` of its first micro-batch to
the end of ``optimizer_step``; ``save`` around ``ModelCheckpoint``'s save, ``restore`` around
the checkpoint file's load (a ``CheckpointIO`` plugin), ``eval`` from the module's
``on_validation_start`` to ``on_validation_end``. The data set's items are whole
micro-batches, numbered across the run (item ``i`` is micro-batch ``i``; a resumed attempt's
sampler starts at ``global_step x accumulate``), so a planted stall hits the step it names.
"""

from __future__ import annotations

import time

T_SCRIPT = time.time()  # before the heavy imports: the job's own clock of its start-up

import argparse  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from jobclock import Faults, JobClock, add_fault_args  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import TorchCheckpointIO  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, Sampler  # noqa: E402

from goodlens.exporter import torch as gl  # noqa: E402  # goodlens (restart-safe gloo init)

DIM = 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (max_steps)")
    p.add_argument("--compute-ms", type=float, default=20.0,
                   help="simulated compute per micro-batch (sleep) on top of the MLP")
    p.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    p.add_argument("--ckpt-every", type=int, default=0,
                   help="ModelCheckpoint every K optimizer steps (0: never)")
    p.add_argument("--ckpt-dir", default="ckpt-lightning")
    p.add_argument("--val-every", type=int, default=0,
                   help="validation every V optimizer steps (0: never)")
    p.add_argument("--val-batches", type=int, default=4, help="validation batches per rank")
    p.add_argument("--val-ms", type=float, default=10.0,
                   help="simulated compute per validation batch (sleep)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--run-id", default="lightning")
    p.add_argument("--url", default=None)
    p.add_argument("--flush-interval", type=float, default=0.2,
                   help="exporter flush interval in seconds")
    p.add_argument("--no-goodlens", action="store_true",
                   help="the same job without the callback (the overhead benchmark's baseline)")
    p.add_argument("--times-out", default=None,
                   help="rank 0 writes each step's wall time and its process CPU time at the "
                        "step's end (s), one step per line, to this file")
    add_fault_args(p)
    return p.parse_args(argv)


def batch(item: int, rank: int, n: int = 16, salt: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic micro-batch for (item, rank)."""
    g = torch.Generator().manual_seed(item * 1009 + rank + salt)
    x = torch.randn(n, DIM, generator=g)
    return x, x.sum(dim=1, keepdim=True)


class MicroBatches(Dataset):
    """Item ``i``: micro-batch ``i`` of the run, whole (the loader has ``batch_size=None``).
    Fetching a step's first micro-batch starts the step on the job's clock; the planted
    stall is in that fetch."""

    def __init__(self, rank: int, items: int, accumulate: int, faults: Faults) -> None:
        self.rank, self.items, self.accumulate, self.faults = rank, items, accumulate, faults
        self.fetch_t0: dict[int, float] = {}

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        step, k = divmod(i, self.accumulate)
        if k == 0:
            self.fetch_t0[step] = time.time()
            self.faults.stall(step)
        return batch(i, self.rank)


class FromStep(Sampler[int]):
    """Items from ``start()`` (read when an epoch's iteration begins: after a resume, the
    restored ``global_step x accumulate``) to the end; its length stays the whole run's, as
    Lightning counts a resumed epoch's batches from where it stopped."""

    def __init__(self, items: int, start: Callable[[], int]) -> None:
        self.items, self.start = items, start

    def __len__(self) -> int:
        return self.items

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start(), self.items))


class ValBatches(Dataset):
    def __init__(self, rank: int, items: int) -> None:
        self.rank, self.items = rank, items

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return batch(i, self.rank, salt=7_777_777)


class Job(pl.LightningModule):
    """The MLP, its planted slow rank and crash, and the job's own step and eval clock."""

    def __init__(self, args: argparse.Namespace, data: MicroBatches, faults: Faults,
                 clock: JobClock) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(DIM, args.hidden), nn.ReLU(),
                                 nn.Linear(args.hidden, 1))
        self.args, self.data, self.faults, self.clock = args, data, faults, clock
        self.loss_fn = nn.MSELoss()
        self.wall: list[tuple[float, float]] = []
        self._eval_t0 = 0.0

    def training_step(self, xy: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> Any:
        step = self.trainer.global_step
        time.sleep(self.args.compute_ms / 1000.0)
        self.faults.slow(step)
        self.faults.crash(step)
        self.clock.write("ready", step=step, t=time.time())  # the first collective is next
        x, y = xy
        return self.loss_fn(self.net(x), y)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        step = self.trainer.global_step  # not yet counted: this step's number
        super().optimizer_step(*args, **kwargs)
        t1 = time.time()
        t0 = self.data.fetch_t0.pop(step, t1)
        self.wall.append((t1 - t0, time.process_time()))
        self.clock.write("step", step=step, t0=t0, t1=t1)

    def validation_step(self, xy: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        time.sleep(self.args.val_ms / 1000.0)
        x, y = xy
        # sync_dist: one all-reduce at the end, so every rank leaves validation together
        self.log("val_loss", self.loss_fn(self.net(x), y), sync_dist=True)

    def on_validation_start(self) -> None:
        self._eval_t0 = time.time()

    def on_validation_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.clock.write("eval", t0=self._eval_t0, t1=time.time(),
                             step=self.trainer.global_step - 1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SeenError(pl.Callback):
    """When this rank's own code saw an exception end ``fit`` (a survivor's all-reduce
    raising after a peer was killed), on the job's clock."""

    def __init__(self, clock: JobClock) -> None:
        self.clock = clock

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self.clock.error(exception)


class TimedCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose blocking save is on the job's clock."""

    def __init__(self, clock: JobClock, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.clock = clock

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        t0 = time.time()
        super()._save_checkpoint(trainer, filepath)
        self.clock.write("save", t0=t0, t1=time.time(), step=trainer.global_step - 1)


class TimedIO(TorchCheckpointIO):
    """The checkpoint file's load (a resume) on the job's clock."""

    def __init__(self, clock: JobClock) -> None:
        super().__init__()
        self.clock = clock

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        t0 = time.time()
        ckpt = super().load_checkpoint(path, *args, **kwargs)
        self.clock.write("restore", t0=t0, t1=time.time(), step=int(ckpt["global_step"]) - 1)
        return ckpt


def latest_checkpoint(ckpt_dir: Path) -> str | None:
    """The newest ``step<N>.ckpt`` (rank 0 looks; every rank resumes from the same one)."""
    found = [(int(m.group(1)), f) for f in (ckpt_dir.iterdir() if ckpt_dir.is_dir() else [])
             if (m := re.fullmatch(r"step(\d+)\.ckpt", f.name))]
    pick = [str(max(found)[1]) if found and dist.get_rank() == 0 else None]
    dist.broadcast_object_list(pick, src=0)
    return pick[0]


def make_trainer(args: argparse.Namespace, clock: JobClock) -> pl.Trainer:
    callbacks: list[pl.Callback] = [SeenError(clock)]  # first: before any other's hook
    if args.ckpt_every > 0:
        callbacks.append(TimedCheckpoint(clock, dirpath=args.ckpt_dir, filename="step{step}",
                                         auto_insert_metric_name=False, save_top_k=-1,
                                         every_n_train_steps=args.ckpt_every))
    if not args.no_goodlens:  # goodlens: the one line a Lightning job adds
        from goodlens.exporter.lightning import GoodlensCallback
        callbacks.append(GoodlensCallback(run_id=args.run_id, url=args.url,
                                          flush_interval_s=args.flush_interval))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    val = args.val_every > 0
    return pl.Trainer(
        accelerator="cpu", devices=local, num_nodes=dist.get_world_size() // local,
        strategy="ddp", max_steps=args.steps, max_epochs=-1,
        accumulate_grad_batches=args.accumulate, callbacks=callbacks,
        enable_checkpointing=args.ckpt_every > 0, plugins=[TimedIO(clock)],
        val_check_interval=args.val_every * args.accumulate if val else None,
        check_val_every_n_epoch=None if val else 1, limit_val_batches=args.val_batches if val
        else 0, num_sanity_val_steps=0, use_distributed_sampler=False, logger=False,
        enable_progress_bar=False, enable_model_summary=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    # Lightning keeps a process group that exists; goodlens's survives a torchrun restart
    # (gloo's store keys per attempt; docs/pytorch.md)
    gl.init_process_group("gloo")
    rank = dist.get_rank()
    clock = JobClock(args.truth_dir, rank, T_SCRIPT)
    faults = Faults(args, rank, clock)
    items = args.steps * args.accumulate
    data = MicroBatches(rank, items, args.accumulate, faults)
    model = Job(args, data, faults, clock)
    trainer = make_trainer(args, clock)
    sampler = FromStep(items, lambda: trainer.global_step * args.accumulate)
    train = DataLoader(data, batch_size=None, sampler=sampler, num_workers=0)
    val = DataLoader(ValBatches(rank, args.val_batches), batch_size=None, num_workers=0)
    resume = latest_checkpoint(Path(args.ckpt_dir)) if args.ckpt_every > 0 else None
    trainer.fit(model, train_dataloaders=train,
                val_dataloaders=val if args.val_every > 0 else None, ckpt_path=resume)
    if args.times_out and rank == 0:
        Path(args.times_out).write_text("".join(f"{w} {c}\n" for w, c in model.wall))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
