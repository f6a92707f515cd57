"""One framework's training run in this process, with or without goodlens, for
``bench/integrations.py --in-process``.

Why it exists: between separate torchrun jobs the machine's noise is wider than a 1% effect,
so the jobs' pairs leave the overhead unresolved. Here the two arms run in one process, on
the same world-1 gloo group, model and data, alternating fit by fit, and every step is timed
three ways by the job's own code (never by goodlens): its wall time, the training thread's
CPU time (``time.thread_time``) and the whole process's (``time.process_time``: with
goodlens, also its flusher thread's Arrow encoding and pushes), and, with ``attribute``,
goodlens's own CPU on the training thread (:class:`SelfTime`) and its flusher thread's
CPU (by the thread's own clock). Each step sleeps
``compute_ms`` on top of its tiny model, so steps come at a realistic rate for the flusher
(one push a second) without occupying a core.

- ``fsdp2``: an MLP of 2 ``fully_shard`` blocks and a sharded root, a hand-written loop in
  ``exp.step``/``exp.phase("data")``; goodlens is ``instrument(model, exp)`` (all-gathers
  and reduce-scatters timed) and an enabled exporter; plain: a disabled exporter (what
  ``--no-goodlens`` runs) and no ``instrument``;
- ``lightning``: ``Trainer(strategy="ddp", devices=1)`` with and without
  ``GoodlensCallback`` (DDP's exposed collective wait timed);
- ``hf``: a 2-layer Llama in a ``transformers.Trainer`` with and without
  ``goodlens.exporter.hf.instrument``.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

#: per step: wall, training-thread CPU, process CPU, goodlens's own CPU on the training
#: thread (attributed, ``attribute=True`` only), the exporter's flusher thread's CPU, and
#: the profiler events seen inside goodlens frames (each leaks :func:`event_leak`)
Steps = list[tuple[float, float, float, float, float, float]]
GOODLENS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + "goodlens"


class SelfTime:
    """The training thread's CPU time spent in goodlens's own frames, by ``sys.setprofile``.

    Every Python call and return on the thread passes through :meth:`event`; time runs
    while the innermost Python frame is goodlens code (``goodlens/``; the framework
    integrations' wrappers and hooks, the exporter's scopes, the collective timers), and
    stops in whatever it calls that is not (the framework's original fetch, the collective
    itself). C functions count for the frame that called them (goodlens's clock reads and
    appends are its own). The profiler's own cost is left out: the clock is read on entry
    to each event and the next interval starts when the event returns. The cyclic garbage
    collector is left out too (``gc.callbacks``): a collection runs when the process's
    allocations reach a threshold, inside whichever frame allocated last, and the
    framework's thousands of objects per step, not goodlens's few, are what it walks; a
    wrapper frame's argument tuple tipping it over made a 5 ms collection look like
    goodlens's. So the sum is what goodlens itself executes on the training thread; the
    profiler slows the step, which does not move that sum."""

    def __init__(self) -> None:
        self.total = 0.0
        self.events = 0  # events seen while a goodlens frame ran (each leaks a little)
        self._stack: list[bool] = []
        self._since: float | None = None
        self._ours: dict[Any, bool] = {}
        self._collecting = False

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        now = time.thread_time()
        if phase == "start":
            if self._since is not None:
                self.total += now - self._since
                self._since = None
            self._collecting = True
        else:
            self._collecting = False
            if self._stack and self._stack[-1]:
                self._since = time.thread_time()

    def _is_ours(self, code: Any) -> bool:
        ours = self._ours.get(code)
        if ours is None:
            ours = self._ours[code] = code.co_filename.startswith(GOODLENS_DIR)
        return ours

    def event(self, frame: Any, what: str, arg: Any) -> None:
        now = time.thread_time()
        if self._since is not None:
            self.total += now - self._since
            self.events += 1
            self._since = None
        if what == "call":
            self._stack.append(self._is_ours(frame.f_code))
        elif what == "return" and self._stack:
            self._stack.pop()
        if self._stack and self._stack[-1] and not self._collecting:
            self._since = time.thread_time()


def _known_work(n: int) -> float:
    """``n`` calls of the cheapest thing a goodlens hook does (a clock read and an add),
    as a stand-in frame of known cost; returns the sum so nothing is optimised away."""
    total = 0.0
    for _ in range(n):
        total += time.perf_counter()
    return total


def event_leak(n: int = 20_000, rounds: int = 5) -> float:
    """CPU seconds the profiler adds to goodlens's sum per event it sees inside a goodlens
    frame: the part of each event's handling before its first clock read and after its
    last (the interpreter's call into the profile function and back), which no clock
    inside it can see. Measured on :func:`_known_work` posing as goodlens code: its time
    profiled minus its time unprofiled, over the events the profiler counted; the least
    of ``rounds``."""
    code = _known_work.__code__
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        _known_work(n)
        plain = time.thread_time() - t0
        st = SelfTime()
        st._ours[code] = True
        sys.setprofile(st.event)
        try:
            _known_work(n)
        finally:
            sys.setprofile(None)
        if st.events:
            best = min(best, (st.total - plain) / st.events)
    return max(best, 0.0)


def _flusher_cpu() -> float:
    """CPU seconds of this process's exporter flusher threads (``goodlens-exporter-*``)."""
    import threading
    total = 0.0
    for t in threading.enumerate():
        if t.name.startswith("goodlens-exporter") and t.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except OSError:  # ended meanwhile
                pass
    return total


class _Marks:
    """The job's clock: ``mark()`` at each step's end; ``steps()`` the per-step deltas."""

    def __init__(self, attribute: bool = False) -> None:
        self.t: list[tuple[float, ...]] = []
        self.selftime = SelfTime() if attribute else None

    def start(self) -> None:
        if self.selftime is not None:
            gc.callbacks.append(self.selftime.on_gc)
            sys.setprofile(self.selftime.event)
        self.mark()

    def stop(self) -> None:
        sys.setprofile(None)
        if self.selftime is not None and self.selftime.on_gc in gc.callbacks:
            gc.callbacks.remove(self.selftime.on_gc)

    def mark(self) -> None:
        st = self.selftime
        own, events = (st.total, st.events) if st is not None else (0.0, 0)
        self.t.append((time.perf_counter(), time.thread_time(), time.process_time(), own,
                       _flusher_cpu(), events))

    def steps(self) -> Steps:
        return [tuple(y - x for x, y in zip(a, b))  # type: ignore[misc]
                for a, b in zip(self.t, self.t[1:])]


def _abba(n: int) -> int:
    """0, 1, 1, 0, 0, 1, 1, 0, ...: which arm step ``n`` runs in, so that each arm goes
    first in every other pair (a drift within a pair hits both arms alike)."""
    return (n + n // 2) % 2


def _by_arm(rows: Steps, on: list[bool]) -> tuple[Steps, Steps]:
    """``rows`` split by the arm each ran in: (plain steps, goodlens steps)."""
    return ([r for r, o in zip(rows, on) if not o], [r for r, o in zip(rows, on) if o])


def world_one(port: int) -> None:
    """A world-1 gloo group for every fit of this process (Lightning and HF reuse it), and
    one intra-op thread."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    torch.set_num_threads(1)  # as the jobs: no intra-op pool spinning on the thread's clock
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)


def _fsdp2_arm(url: str | None, run_id: str) -> tuple[Any, nn.Module, Any]:
    """(exporter, model, optimizer): an MLP of 2 ``fully_shard`` blocks and a sharded root;
    with ``url``, ``instrument``-ed with an enabled exporter pushing there, else a disabled
    exporter (what a job's ``--no-goodlens`` runs)."""
    from torch.distributed.fsdp import fully_shard

    from goodlens.exporter import torch as gl
    from goodlens.exporter.recorder import RankExporter

    exp = RankExporter.from_env(run_id=run_id, url=url, hooks=False,
                                **({} if url else {"enabled": False}))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Sequential(nn.Linear(64, 64)),
                          nn.Sequential(nn.Linear(64, 64)), nn.Linear(64, 1))
    for block in (model[2], model[3]):
        fully_shard(block)
    fully_shard(model)
    if url:
        gl.instrument(model, exp)
    return exp, model, torch.optim.SGD(model.parameters(), lr=0.01)


def _fsdp2_step(exp: Any, model: nn.Module, opt: Any, step: int, compute_ms: float) -> None:
    """One step inside the exporter's step and data scopes (a disabled one's cost nothing)."""
    with exp.step(step):
        with exp.phase("data"):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(16, 32, generator=g)
        time.sleep(compute_ms / 1000.0)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
        opt.step()


def fsdp2(url: str | None, steps: int, compute_ms: float, run_id: str,
          attribute: bool = False) -> Steps:
    from goodlens.exporter import torch as gl

    exp, model, opt = _fsdp2_arm(url, run_id)
    marks = _Marks(attribute)
    marks.start()
    for step in range(steps):
        _fsdp2_step(exp, model, opt, step, compute_ms)
        marks.mark()
    marks.stop()
    if url:
        gl.attempt_end(exp, "completed", step=steps - 1)
    exp.close()
    return marks.steps()


def fsdp2_interleaved(url: str, steps: int, compute_ms: float, run_id: str
                      ) -> tuple[Steps, Steps]:
    """``bench/torch_modes.py``'s design for FSDP2, whose timing is per model: two alike
    sharded models in one loop of ``steps`` steps, alternating between the plain one (a
    disabled exporter's scopes, no ``instrument``) and the instrumented one (an enabled
    exporter pushing to ``url``, its scopes, every all-gather and reduce-scatter timed), so
    that the machine's drift hits both arms alike. Returns (plain steps, goodlens steps)."""
    arms = [(*_fsdp2_arm(u, run_id), _Marks()) for u in (None, url)]
    for step in range(steps):
        exp, model, opt, marks = arms[_abba(step)]  # plain, gl; gl, plain; ...
        marks.mark()
        _fsdp2_step(exp, model, opt, step // 2, compute_ms)
        marks.mark()
    out = []
    for exp, _, _, marks in arms:
        exp.close()
        out.append(marks.steps()[::2])  # (start, end) mark pairs: the arm's own steps
    return out[0], out[1]


def _lightning_fit(steps: int, compute_ms: float, callbacks: list[Any]) -> None:
    """``Trainer(strategy="ddp", devices=1)`` over an MLP whose every step sleeps
    ``compute_ms`` (the planted compute), one epoch of ``steps`` batches."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    class Job(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

        def training_step(self, xy: Any, i: int) -> Any:
            time.sleep(compute_ms / 1000.0)
            return nn.functional.mse_loss(self.net(xy[0]), xy[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(steps * 16, 32, generator=g),
                         torch.randn(steps * 16, 1, generator=g))
    trainer = pl.Trainer(accelerator="cpu", devices=1, strategy="ddp", max_steps=steps,
                         callbacks=callbacks, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(Job(), DataLoader(data, batch_size=16))


def lightning(url: str | None, steps: int, compute_ms: float, run_id: str,
              attribute: bool = False) -> Steps:
    import lightning.pytorch as pl

    marks = _Marks(attribute)

    class Clock(pl.Callback):
        def on_train_batch_end(self, *a: Any) -> None:
            marks.mark()

    callbacks: list[pl.Callback] = [Clock()]
    if url:
        from goodlens.exporter.lightning import GoodlensCallback
        callbacks.append(GoodlensCallback(run_id=run_id, url=url, hooks=False))
    marks.start()
    try:
        _lightning_fit(steps, compute_ms, callbacks)
    finally:
        marks.stop()
    return marks.steps()


def lightning_alternating(url: str, steps: int, compute_ms: float, run_id: str
                          ) -> tuple[Steps, Steps]:
    """Lightning's arms step by step in one ``fit``: at every batch's end (after goodlens's
    callback closed its step) the next step's arm is set: the plain arm takes
    ``GoodlensCallback`` out of ``trainer.callbacks`` and gives the data fetcher the epoch
    loop's own fetch hooks; the goodlens arm puts back the callback and goodlens's wrapped
    fetch hooks. Arms alternate in pairs (gl, plain; plain, gl; ...); DDP's exposed-wait
    hooks and the flusher stay in both (as in :func:`hf_alternating`). Returns (plain
    steps, goodlens steps)."""
    import lightning.pytorch as pl

    from goodlens.exporter.lightning import GoodlensCallback

    marks = _Marks()
    arm: list[bool] = [True]  # the first step's: goodlens set up at fit start
    gcb = GoodlensCallback(run_id=run_id, url=url, hooks=False)
    hooks: dict[bool, tuple[Any, Any]] = {}

    def switch(trainer: Any, on: bool) -> None:
        loop, fetcher = trainer.fit_loop.epoch_loop, trainer.fit_loop._data_fetcher
        if not hooks:  # goodlens's wrapped hooks (instance attributes) and the loop's own
            hooks[True] = (loop._on_before_fetch, loop._on_after_fetch)
            hooks[False] = (type(loop)._on_before_fetch.__get__(loop),
                            type(loop)._on_after_fetch.__get__(loop))
        fetcher._start_profiler, fetcher._stop_profiler = hooks[on]
        # new lists: Lightning is iterating the current one (this callback's own call)
        rest = [c for c in trainer.callbacks if c is not gcb]
        trainer.callbacks = [gcb, *rest] if on else rest

    class Switch(pl.Callback):
        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            marks.mark()
            n = len(arm)
            arm.append(_abba(n) == 0)  # the arm the next step runs in: gl, plain; plain, gl
            # (after the last step goodlens stays in: its fit end closes the exporter)
            switch(trainer, arm[-1] or trainer.global_step >= steps)

    marks.start()
    try:
        _lightning_fit(steps, compute_ms, [gcb, Switch()])
    finally:
        marks.stop()
    rows = marks.steps()
    return _by_arm(rows, arm)


def _hf_trainer(steps: int, compute_ms: float, out: str) -> Any:
    """A 2-layer Llama in a ``transformers.Trainer`` whose every micro-batch sleeps
    ``compute_ms`` (the planted compute)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    class Job(Trainer):
        def compute_loss(self, model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
            time.sleep(compute_ms / 1000.0)
            return super().compute_loss(model, inputs, *a, **kw)

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (steps * 2, 16), generator=g)
    args = TrainingArguments(
        output_dir=out, max_steps=steps, save_strategy="no", eval_strategy="no",
        per_device_train_batch_size=2, use_cpu=True, report_to=[], logging_steps=10**6,
        dataloader_num_workers=0, learning_rate=1e-3, disable_tqdm=True, seed=0)
    return Job(model=model, args=args,
               train_dataset=[{"input_ids": t, "labels": t} for t in ids])


def hf(url: str | None, steps: int, compute_ms: float, run_id: str,
       attribute: bool = False) -> Steps:
    import tempfile

    from transformers import TrainerCallback

    marks = _Marks(attribute)

    class Clock(TrainerCallback):
        def on_step_end(self, *a: Any, **kw: Any) -> None:
            marks.mark()

    with tempfile.TemporaryDirectory(prefix="gl-hf-bench-") as out:
        trainer = _hf_trainer(steps, compute_ms, out)
        trainer.add_callback(Clock())
        if url:
            from goodlens.exporter import hf as glhf
            glhf.instrument(trainer, run_id=run_id, url=url, hooks=False)
        marks.start()
        try:
            trainer.train()
        finally:
            marks.stop()
    return marks.steps()


def hf_alternating(url: str, steps: int, compute_ms: float, run_id: str
                   ) -> tuple[Steps, Steps]:
    """The Trainer's arms step by step in one ``train()``: goodlens is instrumented, and at
    every step's end (after goodlens's own ``on_step_end`` closed its step) the next step's
    arm is set: the plain arm takes the callback out of the trainer's list and the wrapped
    methods (fetch, token count, ``training_step``, ...) off the instance, so the class's
    run; the goodlens arm puts both back. Arms alternate in pairs (gl, plain; plain, gl;
    ...). What stays in both arms: DDP's exposed-wait hooks (measured on their own by
    ``bench/torch_modes.py``) and the flusher thread (its clock gives its own CPU).
    Returns (plain steps, goodlens steps)."""
    import tempfile

    from transformers import TrainerCallback

    from goodlens.exporter import hf as glhf

    marks = _Marks()
    arm: list[bool] = []

    with tempfile.TemporaryDirectory(prefix="gl-hf-bench-") as out:
        trainer = _hf_trainer(steps, compute_ms, out)
        cb = glhf.instrument(trainer, run_id=run_id, url=url, hooks=False)
        wrapped = {k: v for k, v in vars(trainer).items() if k in glhf._WIRING}

        def switch(on: bool) -> None:
            # a new list: the handler is iterating the old one (Switch's own call)
            handler = trainer.callback_handler
            if on and cb not in handler.callbacks:
                handler.callbacks = [cb, *handler.callbacks]
                vars(trainer).update(wrapped)
            elif not on and cb in handler.callbacks:
                handler.callbacks = [c for c in handler.callbacks if c is not cb]
                for k in wrapped:
                    vars(trainer).pop(k, None)

        class Switch(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, *a: Any, **kw: Any) -> None:
                marks.mark()
                n = len(arm)
                arm.append(_abba(n) == 0)  # the arm the next step runs in: gl, plain; plain, gl
                # (after the last step goodlens stays in: its train end closes the exporter)
                switch(arm[-1] or state.global_step >= args.max_steps)

        trainer.add_callback(Switch())
        arm.append(True)  # the first step's: goodlens wires DDP's timers at train begin
        marks.start()
        try:
            trainer.train()
        finally:
            marks.stop()
    rows = marks.steps()
    return _by_arm(rows, arm)


FITS: dict[str, Callable[[str | None, int, float, str], Steps]] = {
    "fsdp2": fsdp2, "lightning": lightning, "hf": hf}
