"""A tiny Hugging Face ``Trainer`` job (a 2-layer Llama built from a config) on gloo/CPU under
torchrun, instrumented with goodlens, with the shared planted faults (``jobclock.py``) and
its own clock.

Why it exists: the ``Trainer`` owns the training loop (gradient accumulation, checkpoints,
evaluation, resume), so goodlens hooks into it (``goodlens.exporter.hf``) instead of the
user's loop. This job is what ``tests/e2e/test_integration_hf.py`` drives, and the worked
example of the lines a user adds (marked ``# goodlens``):

    torchrun --standalone --nproc_per_node=4 examples/integrations/train_hf.py \\
        --steps 200 --ckpt-every 20 --url http://127.0.0.1:8470 --run-id hf-demo

Nothing is downloaded: the model comes from a ``LlamaConfig``, the data from a seeded
generator. A restarted attempt resumes from the newest ``checkpoint-N`` folder. The job's
clock (``--truth-dir``) comes from a ``Trainer`` subclass and a callback of its own, never
from goodlens: ``step`` (from the start of the optimizer step's batch fetch to
``on_step_end``), ``save`` (``_save_checkpoint``), ``eval`` (``evaluate``), ``restore``
(each of the three loads of a resume), ``crash``, ``stall``, ``slow``. The planted stall
sleeps in the dataset's ``__getitem__`` for the first sample of each stalled step's last
micro-batch (accelerate's loader reads one batch ahead, so that is the one read inside the
step's own fetch when accumulating); the slow rank sleeps in ``compute_loss``.
"""

from __future__ import annotations

import time

T_SCRIPT = time.time()  # before the heavy imports: the job's own clock of its start-up

import argparse  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from jobclock import Faults, JobClock, add_fault_args  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging  # noqa: E402

from goodlens.exporter import hf as glhf  # noqa: E402  # goodlens
from goodlens.exporter import torch as gl  # noqa: E402  # goodlens

SEQ, VOCAB = 16, 64


class Tokens(Dataset):
    """Seeded random token sequences; sample ``i`` is the same on every rank and attempt.

    With ``train_sampling_strategy="sequential"`` accelerate gives rank ``r`` the global
    batches ``r, r + W, ...``, so sample ``i`` is in the rank's micro-batch
    ``(i // B) // W`` and optimizer step ``micro // G``: the planted stall sleeps for the
    first sample of a stalled step's last micro-batch.
    """

    def __init__(self, n: int, seed: int, faults: Faults | None = None, batch: int = 1,
                 world: int = 1, accum: int = 1) -> None:
        self.faults, self.batch, self.world, self.accum = faults, batch, world, accum
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.faults is not None and i % self.batch == 0:
            micro = (i // self.batch) // self.world
            if micro % self.accum == self.accum - 1:
                self.faults.stall(micro // self.accum)
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class JobTrainer(Trainer):
    """The job's own clock and planted faults, around the Trainer's methods."""

    def setup_job(self, clock: JobClock, faults: Faults, compute_s: float,
                  eval_s: float) -> None:
        self.clock, self.faults, self.compute_s, self.eval_s = clock, faults, compute_s, eval_s
        self.t_step = 0.0
        self.micro = 0  # micro-batches of this optimizer step so far
        self.stepped = False

    def get_batch_samples(self, *a: Any, **kw: Any) -> Any:
        self.t_step = time.time()  # the optimizer step starts with its batches' fetch
        self.micro = 0
        return super().get_batch_samples(*a, **kw)

    def compute_loss(self, model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
        if model.training:
            if self.micro == 0:  # once per optimizer step
                self.faults.slow(self.state.global_step)
            time.sleep(self.compute_s / self.args.gradient_accumulation_steps)
            self.micro += 1
            if self.micro == 1:  # the step's first collective is next: DDP's forward
                self.clock.write("ready", step=self.state.global_step, t=time.time())
        out = super().compute_loss(model, inputs, *a, **kw)
        if model.training and self.micro == self.args.gradient_accumulation_steps:
            # the crash: after the last forward, just before the backward whose all-reduce
            # makes the peers notice (the partial step ends at the failure they record)
            self.faults.crash(self.state.global_step)
        return out

    def training_step(self, *a: Any, **kw: Any) -> Any:
        try:  # a micro-batch's forward and backward: where a survivor's collective raises
            return super().training_step(*a, **kw)
        except BaseException as e:  # the job's clock: when this rank saw a failure
            self.clock.error(e)
            raise

    def _save_checkpoint(self, *a: Any, **kw: Any) -> None:
        t0 = time.time()
        super()._save_checkpoint(*a, **kw)
        self.clock.write("save", t0=t0, t1=time.time(), step=self.state.global_step - 1)

    def evaluate(self, *a: Any, **kw: Any) -> Any:
        t0 = time.time()
        time.sleep(self.eval_s)  # a planted evaluation cost on top of the real one
        out = super().evaluate(*a, **kw)
        self.clock.write("eval", t0=t0, t1=time.time(), step=self.state.global_step - 1)
        return out

    def _restore(self, name: str, checkpoint: Any, *a: Any, **kw: Any) -> Any:
        t0 = time.time()
        out = getattr(super(), name)(checkpoint, *a, **kw)
        if checkpoint and not self.stepped:
            self.clock.write("restore", t0=t0, t1=time.time(), what=name,
                             step=int(Path(checkpoint).name.split("-")[-1]) - 1)
        return out

    def _load_from_checkpoint(self, checkpoint: Any, *a: Any, **kw: Any) -> None:
        self._restore("_load_from_checkpoint", checkpoint, *a, **kw)

    def _load_optimizer_and_scheduler(self, checkpoint: Any) -> None:
        self._restore("_load_optimizer_and_scheduler", checkpoint)

    def _load_rng_state(self, checkpoint: Any) -> None:
        self._restore("_load_rng_state", checkpoint)


class StepClock(TrainerCallback):
    """The job's ``step`` lines: from the fetch's start (the trainer's) to ``on_step_end``."""

    def __init__(self, trainer: JobTrainer, wall: list[tuple[float, float]]) -> None:
        self.trainer, self.wall = trainer, wall

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        t = self.trainer
        t1 = time.time()
        t.clock.write("step", step=state.global_step - 1, t0=t.t_step, t1=t1)
        t.stepped = True
        self.wall.append((t1 - t.t_step, time.process_time()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (max_steps)")
    p.add_argument("--compute-ms", type=float, default=20.0,
                   help="simulated compute per optimizer step (sleep) on top of the model")
    p.add_argument("--ckpt-every", type=int, default=20, help="save_steps")
    p.add_argument("--eval-every", type=int, default=0, help="eval_steps (0: no evaluation)")
    p.add_argument("--eval-ms", type=float, default=0.0,
                   help="planted sleep per evaluation, on top of the real one")
    p.add_argument("--accum", type=int, default=2, help="gradient_accumulation_steps")
    p.add_argument("--batch", type=int, default=4, help="per_device_train_batch_size")
    p.add_argument("--ckpt-dir", default="ckpt-hf", help="the Trainer's output_dir")
    p.add_argument("--run-id", default="hf")
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


def newest_checkpoint(folder: Path) -> str | None:
    """The newest complete ``checkpoint-N`` (``trainer_state.json`` is written last), the
    same on every rank (rank 0's listing, broadcast)."""
    found: list[Any] = [None]
    if dist.get_rank() == 0 and folder.is_dir():
        done = [(int(m.group(1)), d) for d in folder.iterdir()
                if (m := re.fullmatch(r"checkpoint-(\d+)", d.name))
                and (d / "trainer_state.json").exists()]
        found[0] = str(max(done)[1]) if done else None
    dist.broadcast_object_list(found, src=0)
    return found[0]


def make_model() -> LlamaForCausalLM:
    """A 2-layer Llama of width 32 (about 40k parameters), the same on every rank."""
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ))


def make_trainer(args: argparse.Namespace, faults: Faults, world: int) -> JobTrainer:
    targs = TrainingArguments(
        output_dir=args.ckpt_dir, max_steps=args.steps, save_strategy="steps",
        save_steps=args.ckpt_every, eval_strategy="steps" if args.eval_every else "no",
        eval_steps=args.eval_every or None, per_device_train_batch_size=args.batch,
        per_device_eval_batch_size=args.batch, gradient_accumulation_steps=args.accum,
        use_cpu=True, ddp_backend="gloo", report_to=[], logging_steps=10**6,
        dataloader_num_workers=0, save_only_model=False, learning_rate=1e-3,
        train_sampling_strategy="sequential", ddp_find_unused_parameters=False,
        disable_tqdm=True, prediction_loss_only=True, seed=0)
    n_train = (args.steps + 1) * args.accum * args.batch * world  # one epoch covers it
    train = Tokens(n_train, 1, faults, args.batch, world, args.accum)
    evals = Tokens(2 * args.batch * world, 2)
    return JobTrainer(model=make_model(), args=targs, train_dataset=train, eval_dataset=evals)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    # goodlens: a process group that survives a torchrun restart; accelerate then uses it
    gl.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    clock = JobClock(args.truth_dir, rank, T_SCRIPT)
    faults = Faults(args, rank, clock)
    resume = newest_checkpoint(Path(args.ckpt_dir))
    trainer = make_trainer(args, faults, world)
    trainer.setup_job(clock, faults, args.compute_ms / 1000.0, args.eval_ms / 1000.0)
    wall: list[tuple[float, float]] = []
    trainer.add_callback(StepClock(trainer, wall))
    if not args.no_goodlens:  # goodlens: steps, data and collective wait, saves, eval, restore
        glhf.instrument(trainer, run_id=args.run_id, url=args.url,
                        flush_interval_s=args.flush_interval)
    trainer.train(resume_from_checkpoint=resume)
    if args.times_out and rank == 0:
        Path(args.times_out).write_text("".join(f"{w} {c}\n" for w, c in wall))
    dist.barrier()
    del trainer  # the DDP module before the group (DDP teardown hang)
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
