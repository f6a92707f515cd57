"""PyTorch Lightning integration: one callback records what ``goodlens.exporter.torch`` records
for a hand-written DDP loop, from Lightning's own hooks.

Why a callback: a Lightning user owns no training loop, so there is no place to put
``with exp.step(n)``; the step, its data wait, the checkpoint saves and restores and the
validation runs happen inside ``Trainer.fit``. ``GoodlensCallback`` finds each of them
(checked against lightning 2.6's ``fit_loop``, ``training_epoch_loop`` and ``_DataFetcher``):

- a **step** is one optimizer step, numbered ``trainer.global_step`` at its start (0-based,
  continuous across a resume). It starts when the training loop asks its data fetcher for
  the step's first batch (the epoch loop's ``_on_before_fetch``, which Lightning calls
  before every ``next()`` of the training data) and ends in ``on_train_batch_end`` of the
  batch that stepped the optimizer, so it covers the fetch, forward, backward (DDP's
  all-reduce) and the optimizer; every fetch inside it (one per micro-batch with gradient
  accumulation) is its data wait;
- **saves**: ``trainer.save_checkpoint`` (what ``ModelCheckpoint`` calls) is wrapped:
  ``ckpt_save_start`` before it, ``ckpt_save_blocking_end`` when it returns (state
  gathered, file written by rank 0, barrier passed), ``ckpt_save_durable_end`` then (rank 0
  with the file's bytes), or, with ``AsyncCheckpointIO``, when its background write returns;
- **restores**: ``strategy.load_checkpoint`` (the read of ``fit(ckpt_path=...)``'s file,
  before the DDP wrap) gives ``ckpt_restore_start``/``_end`` with the step restored, and
  ``ckpt_restore_progress`` phase ``read`` while the file is read (one call: its bytes
  appear at the end);
- **validation** during fit: ``custom_begin``/``custom_end`` labelled ``eval``; the sanity
  check before the first step is not recorded (it is start-up, ``restart.init``);
- the **attempt**: ``attempt_start`` at setup (``goodlens.exporter.torch.instrument``),
  DDP's exposed collective wait from ``on_fit_start`` (the DDP-wrapped model exists then),
  a failure from ``on_exception``, ``attempt_end`` at ``on_fit_end``.

Nothing here raises into training: a hook that fails logs a warning (once per hook) and
training goes on. Only users of this module import Lightning; nothing else in goodlens
imports it. See ``docs/integrations.md`` (Lightning).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import AsyncCheckpointIO

from goodlens.exporter import lifecycle
from goodlens.exporter import torch as gl
from goodlens.exporter.recorder import RankExporter
from goodlens.exporter.restore import RestoreProgress
from goodlens.model.schema import EventKind

__all__ = ["GoodlensCallback"]

log = logging.getLogger("goodlens.exporter.lightning")


class _StepTracker:
    """Optimizer steps from Lightning's hook order, as exporter step scopes and data waits.

    ``before_fetch``/``after_fetch`` bracket every fetch of a training batch;
    ``batch_start`` and ``batch_end`` are ``on_train_batch_start``/``_end``. A step opens at
    the first fetch (or batch start, for a fetch Lightning does not announce) with no step
    open, and closes at the end of the batch that stepped the optimizer. A step opened by a
    fetch that yielded no batch (the end of an epoch's data) is dropped unrecorded: an armed
    scope records nothing until it exits. ``clock`` is ``perf_counter`` (the exporter's
    clock); tests pass a fake one.
    """

    def __init__(self, exporter: Any, clock: Callable[[], float] = perf_counter) -> None:
        self.exp = exporter
        self.clock = clock
        self.scope: Any = None
        self.step: int | None = None
        self.batches = 0
        self._fetch_t0: float | None = None

    def _open(self, step: int) -> None:
        self.scope = self.exp.step(step)  # arms the scope: its start is now
        self.step = step
        self.batches = 0

    def before_fetch(self, step: int) -> None:
        if self.scope is None or self.batches == 0:  # none open, or one whose fetch ran dry
            self._open(step)
        self._fetch_t0 = self.clock()

    def after_fetch(self) -> None:
        if self._fetch_t0 is not None:
            self.exp.add_wait("data", self.clock() - self._fetch_t0)
            self._fetch_t0 = None

    def batch_start(self, step: int) -> None:
        if self.scope is None:
            self._open(step)
        self.batches += 1

    def batch_end(self, stepped: bool) -> int | None:
        """Close the step if this batch stepped the optimizer; returns its number then."""
        if not stepped or self.scope is None:
            return None
        return self._close(None, None, None)

    def _close(self, exc_type: Any, exc: Any, tb: Any) -> int | None:
        scope, step, self.scope = self.scope, self.step, None
        self._fetch_t0 = None
        if self.batches == 0:
            return None  # no batch ran in it: nothing to record
        scope.__exit__(exc_type, exc, tb)
        return step

    def abort(self, exc: BaseException) -> None:
        """An exception ended fit: the open step did not complete (a collective's error is
        recorded as a failure by the exporter's scope)."""
        if self.scope is not None:
            self._close(type(exc), exc, exc.__traceback__)

    def finish(self) -> None:
        """Fit ended: a step still open had no batch (or never stepped): drop it."""
        self.scope = None
        self._fetch_t0 = None


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` that never raises into training (:func:`goodlens.exporter.lifecycle.guarded`)."""
    return lifecycle.guarded(fn, log)


def _file_bytes(path: Any) -> int | None:
    try:
        return os.path.getsize(os.fspath(path))
    except (OSError, TypeError):
        return None


def _restored_step(checkpoint: Any) -> int | None:
    """The last step a Lightning checkpoint holds (its ``global_step`` counts steps done)."""
    try:
        done = int(checkpoint["global_step"])
    except (KeyError, TypeError, ValueError):
        return None
    return done - 1 if done > 0 else None


class GoodlensCallback(Callback):
    """Records a Lightning job's steps, data wait, DDP collective wait, checkpoint saves and
    restores, validation and failures with a goodlens :class:`RankExporter`.

    ``Trainer(callbacks=[GoodlensCallback(run_id=..., url=...)])``; ``exporter=`` uses an
    exporter you made (flushed, not closed, at the end), else one is made from torchrun's
    environment at ``setup`` (``RankExporter.from_env(run_id=..., url=..., **options)``) and
    closed at ``on_fit_end``. ``tier``: the tier of the saves and restores; ``collectives``:
    how DDP's all-reduce is timed (``goodlens.exporter.torch.instrument``); ``eval_label``:
    the label of validation runs.
    """

    def __init__(self, run_id: str | None = None, url: str | None = None,
                 exporter: RankExporter | None = None, tier: str = "durable",
                 collectives: str = "auto", eval_label: str = "eval",
                 **exporter_options: Any) -> None:
        super().__init__()
        self.exporter = exporter
        self._own = exporter is None
        self._options = dict(exporter_options)
        if run_id is not None:
            self._options["run_id"] = run_id
        if url is not None:
            self._options["url"] = url
        self.tier = tier
        self.collectives = collectives
        self.eval_label = eval_label
        self._tracker: _StepTracker | None = None
        self._undo: list[Callable[[], None]] = []
        self._eval_open = False
        self._ended = False

    # -- setup: the exporter and the wrappers -------------------------------------------
    @_guarded
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        while self._undo:  # a fit() that raised left its wrappers: one layer only
            self._undo.pop()()
        if self.exporter is None:
            self.exporter = RankExporter.from_env(**self._options)
        exp = self.exporter
        gl.instrument(pl_module, exp, collectives="off")  # attempt_start (process start)
        self._ended = False
        self._wrap_save(trainer)
        if stage == "fit":
            self._tracker = _StepTracker(exp)
            self._wrap_fetch(trainer)
            self._wrap_load(trainer)

    def _patch(self, obj: Any, name: str, make: Callable[[Callable[..., Any]], Any]) -> None:
        """Set ``obj.name`` (an instance attribute) to ``make(original)``; undone at
        teardown."""
        original = getattr(obj, name)
        had_own = name in vars(obj)
        setattr(obj, name, make(original))

        def undo() -> None:
            if had_own:
                setattr(obj, name, original)
            else:
                vars(obj).pop(name, None)

        self._undo.append(undo)

    def _wrap_fetch(self, trainer: pl.Trainer) -> None:
        """The training epoch loop hands ``_on_before_fetch``/``_on_after_fetch`` to its data
        fetcher at every epoch start, which calls them around each ``next()``."""
        loop = trainer.fit_loop.epoch_loop
        if not (callable(getattr(loop, "_on_before_fetch", None))
                and callable(getattr(loop, "_on_after_fetch", None))):
            log.warning("goodlens: this Lightning has no fetch hooks in its training loop; "
                        "steps start at on_train_batch_start, without data wait")
            return
        tracker = self._tracker
        assert tracker is not None
        before = _guarded(lambda: tracker.before_fetch(trainer.global_step))
        after = _guarded(tracker.after_fetch)

        def make_before(original: Callable[[], Any]) -> Callable[[], Any]:
            def on_before_fetch() -> Any:
                before()
                return original()
            return on_before_fetch

        def make_after(original: Callable[[], Any]) -> Callable[[], Any]:
            def on_after_fetch() -> Any:
                result = original()
                after()
                return result
            return on_after_fetch

        self._patch(loop, "_on_before_fetch", make_before)
        self._patch(loop, "_on_after_fetch", make_after)

    def _wrap_save(self, trainer: pl.Trainer) -> None:
        exp, tier = self.exporter, self.tier
        io = getattr(trainer.strategy, "checkpoint_io", None)
        writer_async = isinstance(io, AsyncCheckpointIO) and io.checkpoint_io is not None
        if writer_async:
            self._patch(io.checkpoint_io, "save_checkpoint", self._durable_in_background)

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def save_checkpoint(filepath: Any, *args: Any, **kwargs: Any) -> Any:
                fields = _save_fields(trainer.global_step - 1, tier)
                _event(exp, EventKind.CKPT_SAVE_START, **fields)
                result = original(filepath, *args, **kwargs)
                _event(exp, EventKind.CKPT_SAVE_BLOCKING_END, **fields)
                if trainer.is_global_zero and not writer_async:
                    _event(exp, EventKind.CKPT_SAVE_DURABLE_END, bytes=_file_bytes(filepath),
                           **fields)
                elif not trainer.is_global_zero:  # wrote nothing: its part is done
                    _event(exp, EventKind.CKPT_SAVE_DURABLE_END, **fields)
                return result
            return save_checkpoint

        self._patch(trainer, "save_checkpoint", make)

    def _durable_in_background(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """The write ``AsyncCheckpointIO`` runs in its thread: durable when it returns."""
        exp, tier = self.exporter, self.tier

        def save_checkpoint(checkpoint: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(checkpoint, path, *args, **kwargs)
            _event(exp, EventKind.CKPT_SAVE_DURABLE_END, bytes=_file_bytes(path),
                   **_save_fields(_restored_step(checkpoint), tier))
            return result

        return save_checkpoint

    def _wrap_load(self, trainer: pl.Trainer) -> None:
        """``fit(ckpt_path=...)`` reads the file with ``strategy.load_checkpoint`` (for DDP
        before the model is wrapped, after ``setup``)."""
        exp, tier = self.exporter, self.tier

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def load_checkpoint(checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
                t0 = time.time()
                # live while the file is read (one call: phases, no bytes until it ends)
                progress = _progress(exp, _file_bytes(checkpoint_path), tier=tier)
                try:
                    checkpoint = original(checkpoint_path, *args, **kwargs)
                finally:
                    if progress is not None:
                        progress.stop()
                fields = _save_fields(_restored_step(checkpoint), tier)
                _event(exp, EventKind.CKPT_RESTORE_START, time_s=t0, **fields)
                _event(exp, EventKind.CKPT_RESTORE_END, bytes=_file_bytes(checkpoint_path),
                       **fields)
                return checkpoint
            return load_checkpoint

        self._patch(trainer.strategy, "load_checkpoint", make)

    # -- the hooks ---------------------------------------------------------------------
    @_guarded
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from torch.nn.parallel import DistributedDataParallel
        model = trainer.strategy.model
        if isinstance(model, DistributedDataParallel):
            gl.instrument(model, self.exporter, collectives=self.collectives)
        else:
            log.info("goodlens: %s is not DDP; no collective wait is timed",
                     type(trainer.strategy).__name__)

    @_guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self._tracker is not None:
            self._tracker.batch_start(trainer.global_step)

    @_guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._tracker is None:
            return
        loop = trainer.fit_loop.epoch_loop
        accumulating = getattr(loop, "_should_accumulate", None)
        if callable(accumulating):
            stepped = not accumulating()
        else:  # the optimizer stepped in this batch
            stepped = trainer.global_step != self._tracker.step
        self._tracker.batch_end(stepped)

    @_guarded
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._tracker is not None and self._tracker.batches == 0:
            self._tracker.finish()  # the fetch that found the epoch's end opened nothing

    @_guarded
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            _event(self.exporter, EventKind.CUSTOM_BEGIN, label=self.eval_label)
            self._eval_open = True

    @_guarded
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._eval_open:
            _event(self.exporter, EventKind.CUSTOM_END, label=self.eval_label)
            self._eval_open = False

    @_guarded
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        exp = self.exporter
        if exp is None:
            return
        if self._eval_open:
            self.on_validation_end(trainer, pl_module)
        if self._tracker is not None:
            self._tracker.abort(exception)
        exp.record_failure(type(exception), exception)
        exp.flush(timeout=exp.config.exit_flush_timeout_s, spill_ok=True)

    @_guarded
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end(trainer)

    @_guarded
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        while self._undo:
            self._undo.pop()()
        if stage != "fit" and self.exporter is not None:
            self.exporter.flush(timeout=5.0)

    def _end(self, trainer: pl.Trainer) -> None:
        """The attempt completed (after Lightning's teardown: async saves are durable)."""
        exp = self.exporter
        if exp is None or self._ended:
            return
        self._ended = True
        if self._tracker is not None:
            self._tracker.finish()
        last = trainer.global_step - 1
        gl.attempt_end(exp, "completed", step=last if last >= 0 else None)
        if self._own:
            exp.close()
            self.exporter = None
        else:
            exp.flush()


def _save_fields(step: int | None, tier: str) -> dict[str, Any]:
    return {"tier": tier} if step is None or step < 0 else {"step": step, "tier": tier}


def _progress(exp: Any, total: int | None, **fields: Any) -> RestoreProgress | None:
    """A started :class:`RestoreProgress` for a read in one call (None if it cannot be)."""
    try:
        return None if exp is None else RestoreProgress(
            exp, bytes_total=total, live_bytes=False, **fields).start()
    except Exception:
        log.warning("goodlens: no restore progress", exc_info=True)
        return None


def _event(exp: Any, kind: str, **fields: Any) -> None:
    """``exp.event`` that never raises (the wrappers run inside Lightning's own calls)."""
    try:
        if exp is not None:
            if fields.get("bytes", 0) is None:
                fields.pop("bytes")
            exp.event(kind, **fields)
    except Exception:
        log.warning("goodlens: could not record %s", kind, exc_info=True)
