"""PyTorch integration: a few lines in a DDP loop give goodlens the compute/collective split,
checkpoint stalls and attempts.

Why it exists: the accounting (straggler wait, checkpoint stall, recompute, restart) needs
facts a plain step timer cannot see. A rank waiting in an all-reduce for a slow peer looks
as slow as the peer itself unless the collective wait is separated from compute, and an
asynchronous checkpoint stalls training only for its blocking part. This module measures
both where they happen, inside DDP and around ``torch.distributed.checkpoint`` (DCP), and
sends them through a :class:`~collector.exporter.RankExporter`:

- :func:`instrument` registers a DDP communication hook that launches each bucket's
  all-reduce itself and records the time from launch until its future completes (the
  union of the buckets' intervals, so overlapping buckets count once) as the step's
  ``collective`` wait. On CPU/gloo this is wall-clock time; on GPU the future completes when
  the NCCL kernel is enqueued-and-finished on the stream, so CUDA events recorded around
  the all-reduce on the communication stream (``torch.cuda.Event(enable_timing=True)``,
  read after the step's synchronize) are the precise path; wall-clock is still an upper
  bound of the blocked time and is what this hook records.
- :func:`save_checkpoint` / :func:`load_checkpoint` wrap DCP ``save``, ``async_save`` and
  ``load`` and emit ``ckpt_save_start``, ``ckpt_save_blocking_end`` (the call returned, or
  the async future was created), ``ckpt_save_durable_end`` (the files are written; with this
  rank's bytes) and ``ckpt_restore_start`` / ``ckpt_restore_end``.
- Attempts need no user code: ``RankExporter.from_env`` reads torchrun's
  ``TORCHELASTIC_RESTART_COUNT``, and the first call into this module for an exporter emits
  ``attempt_start`` (with the world size).

Only users who have torch import this module; it imports nothing from torch at goodlens
import time.
"""

from __future__ import annotations

import glob
import os
import threading
import weakref
from time import perf_counter
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["attempt_end", "instrument", "load_checkpoint", "save_checkpoint"]

_STARTED: weakref.WeakSet[Any] = weakref.WeakSet()
_STARTED_LOCK = threading.Lock()


def _ensure_attempt_start(exporter: Any) -> None:
    """Emit ``attempt_start`` once per exporter (the attempt number comes from torchrun)."""
    with _STARTED_LOCK:
        if exporter in _STARTED:
            return
        _STARTED.add(exporter)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    fields: dict[str, Any] = {}
    if world is not None:
        fields["world_size"] = world
    exporter.event("attempt_start", **fields)


def attempt_end(exporter: Any, cause: str = "completed", step: int | None = None) -> None:
    """Emit ``attempt_end`` (call once at the end of a successful run)."""
    _ensure_attempt_start(exporter)
    fields: dict[str, Any] = {"cause": cause}
    if step is not None:
        fields["step"] = step
    exporter.event("attempt_end", **fields)


class _CollectiveTimer:
    """State of the communication hook: the union of in-flight all-reduce intervals.

    Completion callbacks may run on the backend's thread; a small lock keeps the
    bookkeeping consistent. ``add_wait`` is stamped at completion time, which falls inside
    the step because DDP waits for every bucket before ``backward()`` returns.
    """

    def __init__(self, exporter: Any, group: Any) -> None:
        self.exporter = exporter
        self.group = group
        self.lock = threading.Lock()
        self.covered_until = 0.0
        self.buckets = 0

    def record(self, t0: float, t1: float) -> None:
        with self.lock:
            start = t0 if t0 > self.covered_until else self.covered_until
            if t1 > self.covered_until:
                self.covered_until = t1
            self.buckets += 1
        if t1 > start:
            self.exporter.add_wait("collective", t1 - start)


def _timed_allreduce_hook(state: _CollectiveTimer, bucket: Any) -> Any:
    """DDP communication hook: average the bucket with an all-reduce, timing its future."""
    group = state.group if state.group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(group))
    t0 = perf_counter()
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

    def done(f: Any) -> torch.Tensor:
        state.record(t0, perf_counter())
        return f.value()[0]

    return fut.then(done)


# DDP checks the hook's annotations with inspect; give it real objects, not the strings
# ``from __future__ import annotations`` leaves behind.
_timed_allreduce_hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                                         "return": torch.futures.Future[torch.Tensor]}


def instrument(model: Any, exporter: Any, process_group: Any = None) -> Any:
    """Time the all-reduces of a ``DistributedDataParallel`` model as collective wait.

    Registers a communication hook equivalent to DDP's default (average by all-reduce), so
    call it before the first backward and do not register another hook. Returns the model.
    A model that is not DDP (single process) is returned unchanged. Also emits
    ``attempt_start`` for this exporter if not yet done.
    """
    _ensure_attempt_start(exporter)
    if not getattr(exporter, "enabled", True):
        return model
    if not hasattr(model, "register_comm_hook"):
        return model
    model.register_comm_hook(_CollectiveTimer(exporter, process_group), _timed_allreduce_hook)
    return model


def _rank_bytes(path: str, rank: int) -> int:
    """Bytes this rank wrote to a DCP checkpoint folder (its shard files; rank 0 adds the
    metadata)."""
    total = 0
    names = glob.glob(os.path.join(path, f"__{rank}_*.distcp"))
    if rank == 0:
        names.append(os.path.join(path, ".metadata"))
    for name in names:
        try:
            total += os.path.getsize(name)
        except OSError:
            pass
    return total


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike[str], exporter: Any,
                    step: int, async_: bool = False, tier: str = "durable",
                    process_group: Any = None) -> Any:
    """Save ``state`` with DCP (``save``, or ``async_save`` when ``async_``), recording it.

    Returns ``None`` for a synchronous save, or the async save's future (wait on it before
    the next save). Events: ``ckpt_save_start``; ``ckpt_save_blocking_end`` when training can
    go on; ``ckpt_save_durable_end`` with this rank's bytes once the files are written.
    """
    import torch.distributed.checkpoint as dcp

    _ensure_attempt_start(exporter)
    path = os.fspath(path)
    rank = _rank()
    exporter.event("ckpt_save_start", step=step, tier=tier)
    if not async_:
        dcp.save(state, checkpoint_id=path, process_group=process_group)
        exporter.event("ckpt_save_blocking_end", step=step, tier=tier)
        exporter.event("ckpt_save_durable_end", step=step, tier=tier,
                       bytes=_rank_bytes(path, rank))
        return None
    fut = dcp.async_save(state, checkpoint_id=path, process_group=process_group)
    exporter.event("ckpt_save_blocking_end", step=step, tier=tier)
    # newer DCP may return a response object holding the upload future
    target = getattr(fut, "upload_completion", fut)

    def durable(_: Any) -> None:
        exporter.event("ckpt_save_durable_end", step=step, tier=tier,
                       bytes=_rank_bytes(path, rank))

    if hasattr(target, "add_done_callback"):
        target.add_done_callback(durable)
    return fut


def load_checkpoint(state: dict[str, Any], path: str | os.PathLike[str], exporter: Any,
                    step: int | None = None, tier: str = "durable",
                    process_group: Any = None) -> dict[str, Any]:
    """Load ``state`` in place from a DCP checkpoint, recording ``ckpt_restore_start`` and
    ``ckpt_restore_end`` (with the bytes read). Returns ``state``."""
    import torch.distributed.checkpoint as dcp

    _ensure_attempt_start(exporter)
    path = os.fspath(path)
    fields: dict[str, Any] = {"tier": tier}
    if step is not None:
        fields["step"] = step
    exporter.event("ckpt_restore_start", **fields)
    dcp.load(state, checkpoint_id=path, process_group=process_group)
    exporter.event("ckpt_restore_end", bytes=_rank_bytes(path, _rank()), **fields)
    return state
