"""torchtitan integration: a ``Trainer`` subclass that records what ``goodlens.exporter.torch``
records for a hand-written loop, from torchtitan 0.3.0's own trainer methods.

Why it exists: a torchtitan user owns no training loop. ``torchtitan.train`` builds the
trainer from a config (``config.build()``) and calls ``train()``; the step, its data wait,
the checkpoint saves and restores and the validation runs all happen inside
``Trainer.train``, which has no hook or callback registry. The extension point torchtitan
does offer is the trainer class itself: ``Config.build()`` constructs the class that
declares the nested ``Config`` (``Configurable.__init_subclass__``), and ``--module M
--config F`` runs any config function. So this module provides:

- :class:`GoodlensTrainerMixin`, the instrumentation over torchtitan's ``Trainer`` API
  (checked against 0.3.0's ``trainer.py``, ``components/checkpointer`` and
  ``components/validate.py``; docs/torchtitan-cpu.md):

  - ``init_distributed``: torchtitan's own, whose ``init_process_group`` call goes through
    :func:`goodlens.exporter.torch.init_process_group` (attempt-prefixed store keys, so a
    torchrun restart on gloo does not read a dead rank's address); its backend, timeout
    and NCCL environment stay torchtitan's;
  - a **step** is ``train_step`` (``self.step`` already the new number); each ``next()`` of
    ``batch_generator`` is its ``data`` wait and counts the batch's tokens; FSDP2's
    all-gathers and reduce-scatters of every ``model_parts`` entry are its collective wait
    (:func:`goodlens.exporter.torch.instrument`);
  - **saves**: ``checkpointer.save`` when it wrote: ``ckpt_save_start`` and
    ``ckpt_save_blocking_end`` around the call (it first waits for the previous async
    save: stall), ``ckpt_save_durable_end`` then (synchronous and last-step saves) or when
    ``save_future`` completes (``async``); with ``async_with_pinned_mem`` the blocking part
    ends when ``staging_future`` completes, as in ``goodlens.exporter.torch``. Bytes: this
    rank's files in ``step-N/`` (``__<rank>_*.distcp``, rank 0 also ``.metadata``);
  - **restores**: ``checkpointer.load`` when it loaded: ``ckpt_restore_start``/``_end`` with
    the restored ``self.step``, and bytes = this rank's files in the folder loaded (with an
    unchanged world, its own shards: not a count of what DCP read); while it runs,
    ``ckpt_restore_progress`` from the ``dcp.load`` calls it makes
    (:func:`goodlens.exporter.torch.watching_dcp_loads`: bytes read as DCP commits each
    read item, ``read`` then ``barrier``);
  - **validation**: ``validator.validate`` as a ``custom_begin``/``custom_end`` interval
    labelled ``eval``;
  - the **attempt**: ``attempt_start`` at construction, ``attempt_end`` ("completed", the
    last completed step) when ``train()`` returns, after waiting for an async save still
    in flight; an exception out of ``train()`` is recorded as a failure; ``close()``
    closes the exporter.

- ``GoodlensTrainer`` (the mixin over ``torchtitan.trainer.Trainer``, with its own
  ``Config``), made on first access: importing this module does not import torchtitan.
- :func:`goodlens_config` turns any torchtitan trainer config into one that builds the
  instrumented trainer, and ``--config <registry>:<function>`` does that from the command
  line (``--module goodlens.exporter.torchtitan --config llama3:llama3_8b``).

Nothing here raises into training: a wrapper that fails logs a warning (once per wrapper)
and training goes on. See docs/integrations.md (torchtitan).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator
from functools import wraps
from typing import Any

from goodlens.exporter import lifecycle
from goodlens.exporter import torch as gl
from goodlens.exporter.recorder import RankExporter
from goodlens.exporter.restore import RestoreProgress
from goodlens.model.schema import EventKind

__all__ = ["GoodlensTrainerMixin", "goodlens_config", "trainer_class"]
# ``GoodlensTrainer`` is left out of __all__: a star import would import torchtitan

#: How long the end of ``train()`` waits for a finished async save's event to be recorded.
_UPLOAD_RECORD_S = 10.0

log = logging.getLogger("goodlens.exporter.torchtitan")

_CLASSES: dict[tuple[type, type], type] = {}
_CLASSES_LOCK = threading.Lock()
_END = object()
_REGISTRY_PREFIXES = ("torchtitan.models", "torchtitan.experiments",
                      "torchtitan.experiments.rl.examples")


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` that never raises into training (:func:`goodlens.exporter.lifecycle.guarded`)."""
    return lifecycle.guarded(fn, log)


@_guarded
def _event(exp: Any, kind: str, **fields: Any) -> None:
    exp.event(kind, **fields)


def _bytes(path: str | None) -> int | None:
    """Bytes this rank has in a DCP checkpoint folder, or None (no path, or no files of
    this rank there, e.g. a Hugging Face export)."""
    if not path:
        return None
    size = gl._rank_bytes(str(path), gl._rank())
    return size if size > 0 else None


def _with_bytes(fields: dict[str, Any], path: str | None) -> dict[str, Any]:
    size = _bytes(path)
    return fields if size is None else {**fields, "bytes": size}


def _tokens(batch: Any) -> int | None:
    """Tokens of a ``(input_dict, labels)`` batch: ``labels.numel()`` (as torchtitan counts)."""
    try:
        return int(batch[1].numel())
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return None


class GoodlensTrainerMixin:
    """The goodlens instrumentation of a torchtitan ``Trainer``; put it first in the bases
    (``class T(GoodlensTrainerMixin, Trainer)``, with T's own nested ``Config``), or use
    ``GoodlensTrainer`` / :func:`trainer_class` / :func:`goodlens_config`.

    The exporter comes from :meth:`make_exporter` (``RankExporter.from_env()``: run id,
    collector URL, rank and attempt from the environment; without ``GOODLENS_URL`` it is
    disabled and records nothing). ``goodlens_tier`` is the tier of saves and restores,
    ``goodlens_eval_label`` the label of validation intervals.
    """

    goodlens_tier: str = "durable"
    goodlens_eval_label: str = "eval"
    goodlens_exporter: Any = None

    # torchtitan's Trainer provides these
    config: Any
    step: int
    model_parts: list[Any]
    checkpointer: Any

    def make_exporter(self) -> RankExporter:
        """The exporter this trainer records into (override to configure it)."""
        return RankExporter.from_env()

    # -- construction ---------------------------------------------------------------------
    def init_distributed(self) -> Any:
        """torchtitan's ``init_distributed``, its ``init_process_group`` call made through
        :func:`goodlens.exporter.torch.init_process_group` (fake/local-tensor modes and a
        group that exists already are left alone)."""
        import torch.distributed as dist

        original = dist.init_process_group

        def via_goodlens(backend: Any = None, timeout: Any = None, **options: Any) -> None:
            dist.init_process_group = original  # goodlens's own call reaches torch's
            if backend == "fake" or "rank" in options or "store" in options:
                original(backend, timeout=timeout, **options)
                return
            try:
                gl.init_process_group(backend, timeout=timeout, **options)
            except Exception:
                if dist.is_initialized():
                    raise
                log.warning("goodlens: init_process_group with attempt-prefixed keys failed;"
                            " using torch's", exc_info=True)
                original(backend, timeout=timeout, **options)

        dist.init_process_group = via_goodlens
        try:
            return super().init_distributed()  # type: ignore[misc]
        finally:
            dist.init_process_group = original

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        self.goodlens_exporter = None
        self._goodlens_done: int | None = None
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]
        self._goodlens_setup()

    @_guarded
    def _goodlens_setup(self) -> None:
        exp = self.goodlens_exporter = self.make_exporter()
        parts = list(getattr(self, "model_parts", None) or [])
        for part in parts:  # FSDP2's collectives; attempt_start at the process's start
            _guarded(gl.instrument)(part, exp)
        if not parts:
            _guarded(gl._ensure_attempt_start)(exp)
        checkpointer = getattr(self, "checkpointer", None)
        if checkpointer is not None:
            self._goodlens_wrap_checkpointer(checkpointer, exp)
        validator = getattr(self, "validator", None)
        if validator is not None and callable(getattr(validator, "validate", None)):
            self._goodlens_wrap_validator(validator, exp)

    def _goodlens_wrap_checkpointer(self, ck: Any, exp: Any) -> None:
        """Wrap ``save``/``load`` (and ``dcp_save``/``dcp_load``, to learn the folder) on the
        checkpoint manager instance."""
        where: dict[str, str | None] = {"save": None, "load": None}
        for name, key in (("dcp_save", "save"), ("dcp_load", "load")):
            if callable(getattr(ck, name, None)):
                setattr(ck, name, _noting_path(getattr(ck, name), where, key))
        save, load = ck.save, ck.load

        def timed_save(curr_step: int, last_step: bool = False) -> bool:
            where["save"] = None
            t0 = time.time()
            wrote = save(curr_step, last_step)  # first waits for the previous async save
            if wrote:
                self._goodlens_saved(ck, exp, curr_step, last_step, t0, where["save"])
            return wrote

        def timed_load(step: int = -1) -> bool:
            where["load"] = None
            t0 = time.time()
            made: list[RestoreProgress] = []  # started at the first DCP load, if any

            def progress() -> RestoreProgress:
                if not made:
                    made.append(RestoreProgress(exp, tier=self.goodlens_tier).start())
                return made[0]

            loaded = False
            try:
                with gl.watching_dcp_loads(progress):  # its reads, as DCP commits them
                    loaded = load(step)
            finally:  # progress before the restore's events; none follow if it did not load
                for p in made:
                    _guarded(p.stop)(ended=not loaded)
            if loaded:  # the trainer is the "train_state" Stateful: self.step is restored
                self._goodlens_restored(exp, t0, where["load"])
            return loaded

        ck.save, ck.load = timed_save, timed_load

    @_guarded
    def _goodlens_saved(self, ck: Any, exp: Any, step: int, last_step: bool, t0: float,
                        path: str | None) -> None:
        fields = {"step": step, "tier": self.goodlens_tier}
        exp.event(EventKind.CKPT_SAVE_START, time_s=t0, **fields)
        staging = None if last_step else getattr(ck, "staging_future", None)
        upload = None if last_step else getattr(ck, "save_future", None)  # last: synchronous
        if staging is None:
            exp.event(EventKind.CKPT_SAVE_BLOCKING_END, **fields)
        else:  # async_with_pinned_mem: training may go on once the state is staged
            staging.add_done_callback(
                lambda _f: _event(exp, EventKind.CKPT_SAVE_BLOCKING_END, **fields))
        if upload is None:
            exp.event(EventKind.CKPT_SAVE_DURABLE_END, **_with_bytes(fields, path))
            return

        recorded = threading.Event()  # set once the callback below has run
        self._goodlens_uploads = [e for e in getattr(self, "_goodlens_uploads", [])
                                  if not e.is_set()] + [recorded]

        def durable(f: Any) -> None:
            try:
                if f.cancelled() or f.exception() is not None:
                    log.warning("goodlens: async checkpoint of step %s failed", step)
                    return
                exp.event(EventKind.CKPT_SAVE_DURABLE_END, **_with_bytes(fields, path))
            finally:
                recorded.set()

        upload.add_done_callback(_guarded(durable))

    @_guarded
    def _goodlens_restored(self, exp: Any, t0: float, path: str | None) -> None:
        fields = {"step": int(self.step), "tier": self.goodlens_tier}
        exp.event(EventKind.CKPT_RESTORE_START, time_s=t0, **fields)
        exp.event(EventKind.CKPT_RESTORE_END, **_with_bytes(fields, path))

    def _goodlens_wrap_validator(self, validator: Any, exp: Any) -> None:
        validate = validator.validate
        label = self.goodlens_eval_label

        def timed_validate(model_parts: Any, step: int, *args: Any, **kwargs: Any) -> Any:
            _event(exp, EventKind.CUSTOM_BEGIN, label=label, step=step)
            try:
                return validate(model_parts, step, *args, **kwargs)
            finally:
                _event(exp, EventKind.CUSTOM_END, label=label, step=step)

        validator.validate = timed_validate

    # -- the loop ---------------------------------------------------------------------------
    def batch_generator(self, data_iterable: Iterable[Any]) -> Iterator[Any]:
        """torchtitan's generator, each ``next()`` timed as the step's ``data`` wait."""
        batches = super().batch_generator(data_iterable)  # type: ignore[misc]
        exp = self.goodlens_exporter
        if exp is None:
            yield from batches
            return
        phase, count = exp.phase, _guarded(exp.count)
        while True:
            with phase("data"):  # torchtitan raises DataloaderExhaustedError at the end
                batch = next(batches, _END)
            if batch is _END:
                return
            count(tokens=_tokens(batch))
            yield batch

    def train_step(self, data_iterator: Any) -> Any:
        """One step, ``self.step`` (``train()`` has already incremented it)."""
        exp = self.goodlens_exporter
        if exp is None:
            return super().train_step(data_iterator)  # type: ignore[misc]
        with exp.step(self.step):  # a step that raises records no row
            result = super().train_step(data_iterator)  # type: ignore[misc]
        self._goodlens_done = self.step
        return result

    def train(self) -> Any:
        """torchtitan's ``train()``; then the last async save made durable and
        ``attempt_end``; an exception out of it is recorded as a failure first."""
        try:
            result = super().train()  # type: ignore[misc]
        except Exception as exc:
            self._goodlens_failed(exc)
            raise
        self._goodlens_finish()
        return result

    @_guarded
    def _goodlens_failed(self, exc: Exception) -> None:
        exp = self.goodlens_exporter
        if exp is not None and getattr(exp, "enabled", False):
            exp.record_failure(type(exc), exc)
            exp.flush(timeout=exp.config.exit_flush_timeout_s, spill_ok=True)

    @_guarded
    def _goodlens_finish(self) -> None:
        exp = self.goodlens_exporter
        if exp is None:
            return
        checkpointer = getattr(self, "checkpointer", None)
        wait = getattr(checkpointer, "maybe_wait_for_saving", None)
        if callable(wait):  # a save in flight (the data ran out): durable, and recorded
            _guarded(wait)()
        # a Future wakes its waiters before it runs its callbacks: the durable event of the
        # save just waited for may not be recorded yet
        for recorded in getattr(self, "_goodlens_uploads", []):
            recorded.wait(_UPLOAD_RECORD_S)
        done = self._goodlens_done
        gl.attempt_end(exp, "completed", step=done if done is not None else int(self.step))

    def close(self) -> None:
        """torchtitan's ``close()``, then the exporter's (flushes what is left)."""
        try:
            super().close()  # type: ignore[misc]
        finally:
            self._goodlens_close()

    @_guarded
    def _goodlens_close(self) -> None:
        exp, self.goodlens_exporter = self.goodlens_exporter, None
        if exp is not None:
            exp.close()


def _noting_path(method: Callable[..., Any], where: dict[str, str | None],
                 key: str) -> Callable[..., Any]:
    """``method`` (``dcp_save``/``dcp_load(state_dict, checkpoint_id, ...)``) noting its
    ``checkpoint_id`` in ``where[key]``."""

    @wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        found = kwargs.get("checkpoint_id", args[1] if len(args) > 1 else None)
        where[key] = found if isinstance(found, str) else None
        return method(*args, **kwargs)

    return call


def trainer_class(base: type, base_config: type | None = None) -> type:
    """The mixin over the torchtitan trainer class ``base``, declaring its own ``Config``
    (a subclass of ``base_config``, default ``base.Config``), so ``Config.build()``
    constructs it. Made once per ``(base, base_config)``."""
    base_config = base_config if base_config is not None else base.Config
    key = (base, base_config)
    with _CLASSES_LOCK:
        made = _CLASSES.get(key)
        if made is not None:
            return made
        name = f"Goodlens{base.__name__}"
        config = dataclasses.dataclass(kw_only=True, slots=True)(types.new_class(
            "Config", (base_config,), exec_body=lambda ns: ns.update(
                {"__module__": __name__, "__qualname__": f"{name}.Config"})))
        made = types.new_class(name, (GoodlensTrainerMixin, base), exec_body=lambda ns: ns.update(
            {"__module__": __name__, "__qualname__": name, "Config": config,
             "__doc__": f"torchtitan's {base.__name__} recorded by goodlens."}))
        _CLASSES[key] = made
        return made


def goodlens_config(config: Any) -> Any:
    """``config`` (a torchtitan trainer ``Config``, e.g. what ``llama3_8b()`` returns) as the
    ``Config`` of the goodlens subclass of the trainer it builds: same field values, and
    ``build()`` constructs the instrumented trainer. A config that builds one already is
    returned as it is."""
    owner = getattr(type(config), "_owner", None)
    if not isinstance(owner, type) or not dataclasses.is_dataclass(config):
        raise TypeError(f"not a torchtitan trainer config: {type(config).__name__}")
    if issubclass(owner, GoodlensTrainerMixin):
        return config
    cls = trainer_class(owner, type(config))
    return cls.Config(**{f.name: getattr(config, f.name)
                         for f in dataclasses.fields(config) if f.init})


def _short_names() -> frozenset[str]:
    """torchtitan's own model and experiment names (``llama3``, ...), if it has them."""
    try:
        from torchtitan.experiments import _supported_experiments
        from torchtitan.models import _supported_models
    except ImportError:
        return frozenset()
    return frozenset(_supported_models) | frozenset(_supported_experiments)


def _import_registry(name: str) -> types.ModuleType:
    """A config registry as torchtitan's ConfigManager finds one: a short name (``llama3``)
    under torchtitan's model and experiment folders, else ``<name>.config_registry``, else
    ``<name>`` itself."""
    if name in _short_names():
        candidates = [f"{p}.{name}.config_registry" for p in _REGISTRY_PREFIXES]
    else:
        candidates = [f"{name}.config_registry", name]
    for candidate in candidates:
        try:
            return importlib.import_module(candidate)
        except ModuleNotFoundError as exc:  # that module is not there: try the next one
            missing = exc.name or ""
            if not (candidate == missing or candidate.startswith(missing + ".")):
                raise
    raise ImportError(f"no torchtitan config registry {name!r} (tried {candidates})")


def _config_function(spec: str) -> Callable[[], Any]:
    """``--config <registry>:<function>``: the registry's function, its config made a
    goodlens one (resolved when torchtitan calls it)."""
    registry, _, function = spec.partition(":")

    def config() -> Any:
        return goodlens_config(getattr(_import_registry(registry), function)())

    config.__name__ = config.__qualname__ = spec
    return config


def __getattr__(name: str) -> Any:
    """``GoodlensTrainer`` (imports torchtitan on first access) and ``<registry>:<function>``
    config functions for ``--module goodlens.exporter.torchtitan --config ...``."""
    if name == "GoodlensTrainer":
        try:
            from torchtitan.trainer import Trainer
        except ImportError as exc:
            raise ImportError("GoodlensTrainer needs torchtitan (pip install torchtitan)"
                              ) from exc
        return trainer_class(Trainer)
    if ":" in name and not name.startswith("_"):
        return _config_function(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
