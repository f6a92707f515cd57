"""PyTorch integration: a few lines in a DDP loop give goodlens the compute/collective split,
checkpoint stalls and attempts.

Why it exists: the accounting (straggler wait, checkpoint stall, recompute, restart) needs
facts a plain step timer cannot see. A rank waiting in an all-reduce for a slow peer looks
as slow as the peer itself unless the collective wait is separated from compute, and an
asynchronous checkpoint stalls training only for its blocking part. This module measures
both where they happen, inside DDP and around ``torch.distributed.checkpoint`` (DCP), and
sends them through a :class:`~goodlens.exporter.recorder.RankExporter`:

- :func:`instrument` registers a DDP communication hook that launches each bucket's
  all-reduce itself and records the time from launch until it completes (the union of the
  buckets' intervals, so overlapping buckets count once) as ``collective`` wait.

  - CPU tensors (gloo): host wall-clock from launch until the future completes, added to
    the step running at completion (inside ``backward()``).
  - CUDA tensors (when ``torch.cuda.is_available()``): the future of an NCCL all-reduce
    completes when the work is *enqueued*, so wall-clock says little. Instead a CUDA event
    is recorded on the current stream before the launch and another in the future's
    callback (whose current stream waits for the all-reduce), and the per-step union of
    ``start.elapsed_time(end)`` is the device-side collective time. Events are resolved
    lazily, without a host sync: each later hook call ``query()``-s the finished steps'
    events and reports those that completed, so step N's collective time is added to the
    row of the step running then (normally N+1; one step of lag, the last step of a run is
    not reported). Not yet run on a GPU; see docs/pytorch.md.
- :func:`save_checkpoint` / :func:`load_checkpoint` wrap DCP ``save``, ``async_save`` and
  ``load`` and emit ``ckpt_save_start``, ``ckpt_save_blocking_end`` (training may go on),
  ``ckpt_save_durable_end`` (the files are written; with this rank's bytes) and
  ``ckpt_restore_start`` / ``ckpt_restore_end``. Asynchronous saves run their collectives
  on a dedicated gloo group (on the default group they would interleave with DDP's
  all-reduces from another thread, and the ranks hang), and a save first waits for the
  previous one, inside its recorded stall.
- Attempts need no user code: ``RankExporter.from_env`` reads torchrun's
  ``TORCHELASTIC_RESTART_COUNT``, and the first call into this module for an exporter emits
  ``attempt_start`` (with the world size).

Only users who have torch import this module; it imports nothing from torch at goodlens
import time.
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait
from time import perf_counter
from typing import Any

import torch
import torch.distributed as dist

from goodlens.model.schema import EventKind

__all__ = [EventKind.ATTEMPT_END, "instrument", "load_checkpoint", "save_checkpoint"]

log = logging.getLogger("goodlens.exporter.torch")

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
    exporter.event(EventKind.ATTEMPT_START, **fields)


def attempt_end(exporter: Any, cause: str = "completed", step: int | None = None) -> None:
    """Emit ``attempt_end`` (call once at the end of a successful run)."""
    _ensure_attempt_start(exporter)
    fields: dict[str, Any] = {"cause": cause}
    if step is not None:
        fields["step"] = step
    exporter.event(EventKind.ATTEMPT_END, **fields)


# ----------------------------------------------------------------------------- collectives


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by ``intervals`` (overlaps count once)."""
    total, covered = 0.0, float("-inf")
    for t0, t1 in sorted(intervals):
        if t1 <= covered:
            continue
        total += t1 - max(t0, covered)
        covered = t1
    return total


class _StepEvents:
    """The CUDA event pairs of one step's buckets; complete once the last bucket's all-reduce
    was launched and every launched one has its end event."""

    __slots__ = ("closed", "open", "pairs")

    def __init__(self) -> None:
        self.pairs: list[tuple[Any, Any]] = []
        self.open = 0
        self.closed = False


class _DeviceCollectiveTimer:
    """CUDA-event timing of the all-reduces, resolved lazily so the hot path never syncs.

    ``begin`` (in the hook, before the launch) records a start event on the current stream;
    ``end`` (in the future's callback, whose current stream waits for the all-reduce)
    records the end event. A step's pairs are complete after the bucket DDP marks
    ``is_last()``; they then wait in ``pending`` until ``poll`` (run at every ``begin``)
    finds all their events done with ``query()``, never ``synchronize()``, and adds the
    union of ``elapsed_time`` intervals as collective wait. Resolved events go back to a
    free list, so steady state allocates none. ``new_event`` makes an event
    (``torch.cuda.Event(enable_timing=True)``; tests pass a stand-in).
    """

    MAX_PENDING_STEPS = 64

    def __init__(self, exporter: Any, new_event: Callable[[], Any]) -> None:
        self.exporter = exporter
        self.new_event = new_event
        self.lock = threading.Lock()
        self.free: list[Any] = []
        self.current: _StepEvents | None = None
        self.pending: deque[_StepEvents] = deque()
        self.created = 0
        self.resolved_steps = 0
        self.dropped_steps = 0

    def _event(self) -> Any:
        if self.free:
            return self.free.pop()
        self.created += 1
        return self.new_event()

    def begin(self, last: bool) -> tuple[_StepEvents, Any]:
        """Before a bucket's launch: report finished steps, then record its start event."""
        if self.pending:
            self.poll()
        with self.lock:
            group = self.current
            if group is None:
                group = self.current = _StepEvents()
            group.open += 1
            if last:
                group.closed = True
                self.current = None
            start = self._event()
        start.record()
        return group, start

    def end(self, token: tuple[_StepEvents, Any]) -> None:
        """In the all-reduce future's callback: record the end event."""
        group, start = token
        with self.lock:
            stop = self._event()
        stop.record()
        with self.lock:
            group.pairs.append((start, stop))
            group.open -= 1
            if group.closed and group.open == 0:
                self.pending.append(group)
                if len(self.pending) > self.MAX_PENDING_STEPS:  # events that never complete
                    old = self.pending.popleft()
                    self.dropped_steps += 1
                    for a, b in old.pairs:  # re-recording a pending event is allowed
                        self.free += (a, b)

    def poll(self) -> None:
        """Report every leading pending step whose events have all completed (no sync)."""
        while True:
            with self.lock:
                if not self.pending:
                    return
                group = self.pending[0]
            if not all(a.query() and b.query() for a, b in group.pairs):
                return
            ref = group.pairs[0][0]
            ms = _union_length([(ref.elapsed_time(a), ref.elapsed_time(b))
                                for a, b in group.pairs])
            with self.lock:
                if not self.pending or self.pending[0] is not group:
                    continue  # another thread reported it meanwhile
                self.pending.popleft()
                self.resolved_steps += 1
                for a, b in group.pairs:
                    self.free += (a, b)
            self.exporter.add_wait("collective", ms / 1000.0)


class _CollectiveTimer:
    """State of the communication hook: the union of in-flight all-reduce intervals.

    Completion callbacks may run on the backend's thread; a small lock keeps the
    bookkeeping consistent. ``add_wait`` is stamped at completion time, which falls inside
    the step because DDP waits for every bucket before ``backward()`` returns. ``device``
    times CUDA buckets with events instead (present when CUDA is available).
    """

    def __init__(self, exporter: Any, group: Any,
                 device: _DeviceCollectiveTimer | None = None) -> None:
        self.exporter = exporter
        self.group = group
        self.device = device
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
    device = state.device
    if device is not None and tensor.is_cuda:
        token = device.begin(bucket.is_last())
        dfut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done_on_device(f: Any) -> torch.Tensor:
            device.end(token)
            return f.value()[0]

        return dfut.then(done_on_device)
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


def _new_cuda_event() -> Any:
    return torch.cuda.Event(enable_timing=True)


def instrument(model: Any, exporter: Any, process_group: Any = None) -> Any:
    """Time the all-reduces of a ``DistributedDataParallel`` model as collective wait.

    Registers a communication hook equivalent to DDP's default (average by all-reduce), so
    call it before the first backward and do not register another hook. Returns the model.
    A model that is not DDP (single process) is returned unchanged. Also emits
    ``attempt_start`` for this exporter if not yet done. With CUDA available, CUDA buckets
    are timed with CUDA events (see the module docstring); CPU buckets with wall-clock.
    """
    _ensure_attempt_start(exporter)
    if not getattr(exporter, "enabled", True):
        return model
    if not hasattr(model, "register_comm_hook"):
        return model
    device = (_DeviceCollectiveTimer(exporter, _new_cuda_event)
              if torch.cuda.is_available() else None)
    model.register_comm_hook(_CollectiveTimer(exporter, process_group, device),
                             _timed_allreduce_hook)
    return model


# ----------------------------------------------------------------------------- checkpoints

_ASYNC_LOCK = threading.Lock()
_ASYNC_GROUP: list[Any] = []  # [(default group, its dedicated gloo group for async saves)]
_PENDING: list[Future] = []  # the async save in flight on that group, if any


def _async_group() -> Any:
    """The gloo group async saves use (all ranks create it at their first async save).

    DCP's thread executor runs ``save``'s collectives (plan gather, metadata) in a
    background thread; on the default group they interleave with DDP's all-reduces from
    the training thread in a different order on each rank, and the job hangs (seen with
    torch 2.13 and gloo: 4 ranks, first async save never finished). A second group keeps
    the two streams of collectives apart; it is gloo because async save needs a CPU
    backend.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.distributed_c10d._get_default_group()
    with _ASYNC_LOCK:
        if _ASYNC_GROUP and _ASYNC_GROUP[0][0] is world:
            return _ASYNC_GROUP[0][1]
    group = dist.new_group(backend="gloo")
    with _ASYNC_LOCK:
        _ASYNC_GROUP[:] = [(world, group)]
    return group


@atexit.register
def _forget_async_state() -> None:
    """Drop this module's references to the async-save group and futures at exit.

    ``atexit`` handlers run while the interpreter is whole. A process group or a failed
    save's exception (its traceback holds the save's frames, tensors and group) still
    referenced by module globals would otherwise be destroyed during interpreter
    finalization, where gloo objects that reach back into Python can abort the process
    ("terminate called without an active exception"; see pytorch/pytorch#179291).
    """
    with _ASYNC_LOCK:
        _ASYNC_GROUP.clear()
        _PENDING.clear()


def _checkpoint_files(path: str, rank: int) -> list[str]:
    """The files of a DCP checkpoint folder written by ``rank`` (its shards; the
    coordinator, rank 0, also writes the global ``.metadata``)."""
    names = glob.glob(os.path.join(path, f"__{rank}_*.distcp"))
    names += glob.glob(os.path.join(path, f"__{rank}.metadata"))  # use_collectives=False
    if rank == 0:
        names.append(os.path.join(path, ".metadata"))
    return names


def _rank_bytes(path: str, rank: int) -> int:
    """Bytes this rank wrote to a DCP checkpoint folder (see :func:`_checkpoint_files`)."""
    total = 0
    for name in _checkpoint_files(path, rank):
        try:
            total += os.path.getsize(name)
        except OSError:
            pass
    return total


def _rank(group: Any = None) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(group) if group is not None else dist.get_rank()


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike[str], exporter: Any,
                    step: int, async_: bool = False, tier: str = "durable",
                    process_group: Any = None, **dcp_options: Any) -> Any:
    """Save ``state`` with DCP (``save``, or ``async_save`` when ``async_``), recording it.

    Events: ``ckpt_save_start``; ``ckpt_save_blocking_end`` when training can go on (the
    save returned; for an async save, ``async_save`` returned, i.e. the state was staged to
    CPU memory, or, with an asynchronous stager, staging completed);
    ``ckpt_save_durable_end`` with this rank's bytes once the files are written (not emitted
    when the save fails). An async save first waits for the previous async save to finish
    (inside its recorded stall): both would use the same process group.

    ``dcp_options`` go to DCP as they are (``storage_writer``, ``planner``, and for async
    ``async_checkpointer_type``, ``async_stager``). ``process_group``: default, the default
    group for ``save`` and a dedicated gloo group for ``async_save``.

    Returns ``None`` for a synchronous save. For an async save, what ``async_save`` returns
    (a ``Future``, or an ``AsyncSaveResponse`` with an asynchronous stager) with the upload
    future replaced by one that completes after ``ckpt_save_durable_end`` is recorded, so
    ``result()`` followed by ``exporter.close()`` loses no event.
    """
    import torch.distributed.checkpoint as dcp

    _ensure_attempt_start(exporter)
    path = os.fspath(path)
    exporter.event(EventKind.CKPT_SAVE_START, step=step, tier=tier)
    if not async_:
        dcp.save(state, checkpoint_id=path, process_group=process_group, **dcp_options)
        exporter.event(EventKind.CKPT_SAVE_BLOCKING_END, step=step, tier=tier)
        exporter.event(EventKind.CKPT_SAVE_DURABLE_END, step=step, tier=tier,
                       bytes=_rank_bytes(path, _rank(process_group)))
        return None
    with _ASYNC_LOCK:
        previous = list(_PENDING)
    if previous:  # one async save at a time on the group; waiting is a stall (a failure
        wait(previous)  # is its own future's to report: DCP raises a BaseException)
    group = process_group if process_group is not None else _async_group()
    rank = _rank(group)
    response = dcp.async_save(state, checkpoint_id=path, process_group=group, **dcp_options)
    upload = getattr(response, "upload_completion", response)
    staging = getattr(response, "staging_completion", None)
    if staging is None:
        exporter.event(EventKind.CKPT_SAVE_BLOCKING_END, step=step, tier=tier)
    else:
        staging.add_done_callback(
            lambda _: exporter.event(EventKind.CKPT_SAVE_BLOCKING_END, step=step, tier=tier))
    recorded: Future = Future()

    def durable(f: Future) -> None:
        try:
            value = f.result()
        except BaseException as exc:
            log.warning("goodlens: async checkpoint %s failed: %r", path, exc)
            recorded.set_exception(exc)
        else:
            exporter.event(EventKind.CKPT_SAVE_DURABLE_END, step=step, tier=tier,
                           bytes=_rank_bytes(path, rank))
            recorded.set_result(value)
        with _ASYNC_LOCK:
            if recorded in _PENDING:
                _PENDING.remove(recorded)

    with _ASYNC_LOCK:
        _PENDING[:] = [recorded]
    upload.add_done_callback(durable)
    if upload is response:
        return recorded
    response.upload_completion = recorded
    return response


def load_checkpoint(state: dict[str, Any], path: str | os.PathLike[str], exporter: Any,
                    step: int | None = None, tier: str = "durable",
                    process_group: Any = None, **dcp_options: Any) -> dict[str, Any]:
    """Load ``state`` in place from a DCP checkpoint, recording ``ckpt_restore_start`` and
    ``ckpt_restore_end`` (with the bytes of the files this rank wrote when saving: what it
    reads when the world size is unchanged). Returns ``state``."""
    import torch.distributed.checkpoint as dcp

    _ensure_attempt_start(exporter)
    path = os.fspath(path)
    fields: dict[str, Any] = {"tier": tier}
    if step is not None:
        fields["step"] = step
    exporter.event(EventKind.CKPT_RESTORE_START, **fields)
    dcp.load(state, checkpoint_id=path, process_group=process_group, **dcp_options)
    exporter.event(EventKind.CKPT_RESTORE_END, bytes=_rank_bytes(path, _rank(process_group)),
                   **fields)
    return state
