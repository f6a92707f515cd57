"""Hugging Face ``transformers.Trainer`` integration: steps, data wait, DDP's collective wait,
checkpoint saves, evaluation and resumes, recorded where the Trainer does them.

Why it exists: a Trainer user does not write the training loop, so the few lines the plain
PyTorch recipe adds (docs/pytorch.md) have nowhere to go. A ``TrainerCallback`` alone does
not see enough (checked against transformers 5.24's ``Trainer``):

- an optimizer step's batches are fetched by ``get_batch_samples`` *before*
  ``on_step_begin``, so a step timed from the callback misses its data wait;
- the DDP module (``trainer.model_wrapped``) is not in the callback's arguments (``model``
  is the unwrapped model), so the collective wait cannot be timed from there;
- ``_save_checkpoint`` and ``evaluate`` run after ``on_step_end`` and the callback hears only
  of their end (``on_save``, ``on_evaluate``); checkpoint loading happens in ``train()``
  before ``on_train_begin``.

So :func:`instrument` (the recommended entry) adds a :class:`GoodlensTrainerCallback` and
wraps those methods on the trainer *instance*: the step starts before its batch fetch (timed
as ``data`` wait), DDP is instrumented once wrapped (``goodlens.exporter.torch.instrument``:
collective wait, ``attempt_start``), saves, evaluation and loads get exact bounds. The
callback alone (``Trainer(callbacks=[GoodlensTrainerCallback(...)])``) still records steps
(from ``on_step_begin``, without data wait), ``attempt_start``/``attempt_end`` and
approximate save and eval bounds from the callback events. Nothing here raises into
training: an error in goodlens's own code is logged and training goes on.

Only users of this module import ``transformers``; nothing else in goodlens imports it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Callable
from time import perf_counter as _perf
from typing import Any

from transformers import TrainerCallback

from goodlens.exporter import torch as gl
from goodlens.exporter.recorder import RankExporter
from goodlens.exporter.restore import RestoreProgress
from goodlens.model.schema import EventKind

__all__ = ["GoodlensTrainerCallback", "instrument"]

log = logging.getLogger("goodlens.exporter.hf")

_CKPT = re.compile(r"checkpoint-(\d+)$")
_RANK_FILE = re.compile(r"(?:rng_state_|rank)(\d+)")
_WRAPPED = "_goodlens_wrapped"


def _restored_step(path: Any) -> int | None:
    """The last step a ``checkpoint-N`` folder holds (``N`` optimizer steps done: ``N-1``)."""
    m = _CKPT.search(os.path.normpath(os.fspath(path))) if path else None
    return int(m.group(1)) - 1 if m and int(m.group(1)) > 0 else None


def rank_bytes(folder: str, process_index: int, main: bool) -> int:
    """Bytes of a Trainer checkpoint folder this process wrote: the files named after its
    index (``rng_state_<i>.pth``, ``rank<i>-of-...``) and, on the process that saves the
    model (``args.should_save``), every file named after no process."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            m = _RANK_FILE.search(name)
            if (m and int(m.group(1)) == process_index) or (m is None and main):
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:
                    pass
    return total


def _samples(batches: Any) -> int | None:
    """Samples in a list of micro-batches (the first dimension of each one's first tensor)."""
    n = 0
    for b in batches:
        values = b.values() if isinstance(b, dict) else b if isinstance(b, list | tuple) else [b]
        first = next((v for v in values if hasattr(v, "shape") and len(v.shape)), None)
        if first is None:
            return None
        n += int(first.shape[0])
    return n


class GoodlensTrainerCallback(TrainerCallback):
    """Records a Trainer's steps (one per optimizer step, numbered by ``state.global_step``
    at its start, so a resumed run's redone steps show), attempts, saves, evaluation and
    restores through a :class:`~goodlens.exporter.recorder.RankExporter`.

    ``exporter``: an existing exporter; otherwise one is made with
    ``RankExporter.from_env(run_id=..., url=..., **exporter_options)`` at first use (by then
    the Trainer's process group exists, so rank, world and attempt are torchrun's). ``tier``:
    the checkpoints' tier; ``eval_label``: the label of evaluation intervals;
    ``collectives``: DDP timing mode (see ``goodlens.exporter.torch.instrument``). Use
    :func:`instrument` to add it with everything it cannot see by itself.
    """

    def __init__(self, run_id: str | None = None, url: str | None = None,
                 exporter: RankExporter | None = None, tier: str = "durable",
                 eval_label: str = "eval", collectives: str = "auto",
                 **exporter_options: Any) -> None:
        self._exp = exporter
        self._own = exporter is None
        self._options = {k: v for k, v in (("run_id", run_id), ("url", url)) if v is not None}
        self._options.update(exporter_options)
        self.tier, self.eval_label, self.collectives = tier, eval_label, collectives
        self.trainer: Any = None  # set by instrument(): the methods below are wired
        self._scope: Any = None  # the step scope armed now
        self._stepped = False  # a step ended in this process: later loads are no restore
        self._instrumented: list[Any] = []
        self._pending_save: float | None = None  # callback-only bounds (see on_step_end)
        self._eval_open = False
        self._started = False
        self._gathered = 0.0  # the fetch's all-gather time (see count_items)

    # -- the exporter --------------------------------------------------------------------
    @property
    def exporter(self) -> RankExporter:
        """The exporter (made at first use, with ``attempt_start`` recorded)."""
        if self._exp is None:
            self._exp = RankExporter.from_env(**self._options)
            self._own = True
        if not self._started:  # attempt_start (dated at the process's start) first
            self._started = True
            gl.instrument(None, self._exp, collectives="off")
        return self._exp

    def _safe(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except Exception as exc:  # never into training
            log.warning("goodlens: %s failed: %r", getattr(fn, "__name__", fn), exc)
            return None

    def _event(self, kind: str, **fields: Any) -> None:
        self._safe(lambda: self.exporter.event(kind, **fields))

    # -- steps -----------------------------------------------------------------------------
    def _begin_step(self, n: int) -> None:
        self._scope = self.exporter.step(n)

    def _end_step(self) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.__exit__(None, None, None)
            self._stepped = True

    def _fail_step(self, exc: BaseException) -> None:
        """An exception left the step: a collective's error is recorded as the failure."""
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.__exit__(type(exc), exc, exc.__traceback__)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """The model is wrapped now (``trainer.model_wrapped``: DDP under torchrun): time
        its collectives (``attempt_start`` too, if not yet recorded)."""
        model = self.trainer.model_wrapped if self.trainer is not None else kw.get("model")
        if any(m is model for m in self._instrumented):
            return
        self._instrumented.append(model)

        def wire() -> None:
            exp = self.exporter
            gl.instrument(model, exp, collectives=self.collectives)  # buffer broadcast too
        self._safe(wire)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._scope is None:  # callback alone: from here (the fetch was before)
            self._safe(self._begin_step, state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._safe(self._end_step)
        if self.trainer is None:  # callback alone: eval and save follow at once
            now = time.time()
            if control.should_evaluate:
                self._event(EventKind.CUSTOM_BEGIN, label=self.eval_label)
                self._eval_open = True
            if control.should_save:
                self._pending_save = now

    def on_evaluate(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._eval_open:
            self._event(EventKind.CUSTOM_END, label=self.eval_label)
            self._eval_open = False
            if self._pending_save is not None:
                self._pending_save = time.time()

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._pending_save is None:
            return
        step, t0, self._pending_save = state.global_step - 1, self._pending_save, None
        self._event(EventKind.CKPT_SAVE_START, time_s=t0, step=step, tier=self.tier)
        self._event(EventKind.CKPT_SAVE_BLOCKING_END, step=step, tier=self.tier)
        self._event(EventKind.CKPT_SAVE_DURABLE_END, step=step, tier=self.tier)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        def end() -> None:
            exp = self.exporter
            gl.attempt_end(exp, "completed", step=max(state.global_step - 1, 0))
            if self._own:
                exp.close()
            else:
                exp.flush()
        self._safe(end)

    # -- what instrument() wires -----------------------------------------------------------
    def fetch(self, trainer: Any, original: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        """``get_batch_samples``: the optimizer step starts here; the fetch is data wait,
        less the token count's all-gather in it (:meth:`count_items`)."""
        self._safe(self._begin_step, trainer.state.global_step)
        self._gathered = 0.0
        t0 = _perf()
        out = original(*a, **kw)
        waited = _perf() - t0 - self._gathered
        exp = self._exp
        if exp is not None:
            self._safe(exp.add_wait, "data", max(waited, 0.0))
            n = self._safe(_samples, out[0])
            if n:
                self._safe(exp.count, samples=n)
        return out

    def count_items(self, trainer: Any, original: Callable[..., Any], *a: Any,
                    **kw: Any) -> Any:
        """``_get_num_items_in_batch`` (inside ``get_batch_samples``): with
        ``average_tokens_across_devices`` (the default) and several processes it all-gathers
        the step's label count, so every rank waits there for the last one to fetch: that
        is collective wait, not data wait (counting it as data would make every rank's
        ready time include the slowest peer's fetch, or rank 0's checkpoint save)."""
        t0 = _perf()
        out = original(*a, **kw)
        args = trainer.args
        if getattr(args, "average_tokens_across_devices", False) and args.world_size > 1:
            took = _perf() - t0
            self._gathered += took
            if self._exp is not None:
                self._safe(self._exp.add_wait, "collective", took)
        return out

    def train_step(self, trainer: Any, original: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        """``training_step`` (one micro-batch): an exception ends the step as failed."""
        try:
            return original(*a, **kw)
        except BaseException as exc:
            self._safe(self._fail_step, exc)
            raise

    def save(self, trainer: Any, original: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        """``_save_checkpoint``: the blocking save (every file written when it returns)."""
        step = trainer.state.global_step - 1
        self._event(EventKind.CKPT_SAVE_START, step=step, tier=self.tier)
        try:
            out = original(*a, **kw)
        finally:
            self._event(EventKind.CKPT_SAVE_BLOCKING_END, step=step, tier=self.tier)
        size = self._safe(self._save_bytes, trainer, a[1] if len(a) > 1 else kw.get("trial"))
        extra = {"bytes": size} if size is not None else {}
        self._event(EventKind.CKPT_SAVE_DURABLE_END, step=step, tier=self.tier, **extra)
        return out

    @staticmethod
    def _save_bytes(trainer: Any, trial: Any) -> int:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
        folder = os.path.join(trainer._get_output_dir(trial=trial),
                              f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")
        args = trainer.args
        return rank_bytes(folder, args.process_index, bool(args.should_save))

    def evaluate(self, trainer: Any, original: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        """``evaluate``: a labelled interval (``other.<eval_label>`` in the accounting)."""
        self._event(EventKind.CUSTOM_BEGIN, label=self.eval_label)
        try:
            return original(*a, **kw)
        finally:
            self._event(EventKind.CUSTOM_END, label=self.eval_label)

    def load(self, trainer: Any, original: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        """``_load_from_checkpoint``, ``_load_optimizer_and_scheduler``, ``_load_rng_state``
        before the first step of this process: restore intervals, each with the step it
        brings back (a load after training began, such as the best model's, is not one)."""
        path = a[0] if a else next(iter(kw.values()), None)
        if not path or self._stepped:
            return original(*a, **kw)
        fields: dict[str, Any] = {"tier": self.tier}
        step = _restored_step(path)
        if step is not None:
            fields["step"] = step
        self._event(EventKind.CKPT_RESTORE_START, **fields)
        # live while the load runs (one call: phase read, no bytes until it ends)
        progress = self._safe(lambda: RestoreProgress(self.exporter, live_bytes=False,
                                                      **fields).start())
        try:
            return original(*a, **kw)
        finally:
            if progress is not None:
                self._safe(progress.stop)
            self._event(EventKind.CKPT_RESTORE_END, **fields)


_WIRING = {"get_batch_samples": "fetch", "_get_num_items_in_batch": "count_items",
           "training_step": "train_step",
           "_save_checkpoint": "save", "evaluate": "evaluate",
           "_load_from_checkpoint": "load", "_load_optimizer_and_scheduler": "load",
           "_load_rng_state": "load"}


def instrument(trainer: Any, exporter: RankExporter | None = None,
               **options: Any) -> GoodlensTrainerCallback:
    """Add goodlens to a ``transformers.Trainer`` (call before ``trainer.train()``).

    Uses the trainer's :class:`GoodlensTrainerCallback` if it has one, else adds one made
    with ``exporter`` and ``options`` (``run_id``, ``url``, ``tier``, ``eval_label``,
    ``collectives``, exporter options). Wraps, on this instance only, ``get_batch_samples``
    (step start and data wait), ``training_step`` (a collective's error ends the step as a
    failure), ``_save_checkpoint`` (save bounds and this rank's bytes), ``evaluate`` (eval
    interval) and the three loads of a resume (restore intervals); DDP's collective wait
    is timed from ``on_train_begin`` on ``trainer.model_wrapped``. Returns the callback.
    Calling it twice wraps nothing twice.
    """
    cb = next((c for c in trainer.callback_handler.callbacks
               if isinstance(c, GoodlensTrainerCallback)), None)
    if cb is None:
        cb = GoodlensTrainerCallback(exporter=exporter, **options)
        trainer.add_callback(cb)
    cb.trainer = trainer
    for name, how in _WIRING.items():
        original = getattr(trainer, name, None)
        if original is None or getattr(original, _WRAPPED, False):
            continue
        wrapper = functools.partial(getattr(cb, how), trainer, original)
        wrapped = functools.update_wrapper(_plain(wrapper), original)
        setattr(wrapped, _WRAPPED, True)
        setattr(trainer, name, wrapped)
    return cb


def _plain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A function object (``functools.partial`` takes no attributes by assignment)."""
    def call(*a: Any, **kw: Any) -> Any:
        return fn(*a, **kw)
    return call
