"""Timing of DDP's collectives for the PyTorch integration (``goodlens.exporter.torch``).

Why it exists: straggler accounting needs each rank's time blocked in collectives, and how
it is measured decides what the integration costs. Two modes (``instrument(...,
collectives=...)``):

- ``exposed`` (the default for CPU models): the time the training thread is *blocked*
  at the end of ``backward()`` waiting for DDP's all-reduces, with no communication hook.
  A post-accumulate-grad hook, registered once on a parameter DDP reduces, queues an
  autograd final callback when that gradient is accumulated (before DDP's own hook on the
  parameter runs). Final callbacks run in the order queued once the gradients are
  computed: ours runs before DDP's (which DDP queues when its last bucket is ready, later),
  stamps the time and queues a second callback, which runs after DDP's finalisation, i.e.
  after every bucket's all-reduce completed and the gradients were written back. The
  difference is the exposed wait; all-reduce time hidden behind backward compute is not in
  it (the rank was computing, not waiting). Cost: three Python calls from autograd per
  step, nothing registered per forward, and DDP keeps its C++ all-reduce. With
  ``find_unused_parameters`` (and for ``static_graph``'s first step) a gradient hook on
  each forward's output queues the first callback instead (:class:`_ExposedWaitTimer`).
- ``hook``: a communication hook equivalent to DDP's default (average by all-reduce) that
  times each bucket from launch to completion (the union over buckets, overlapping ones
  counted once), including the part overlapped with backward compute. On CUDA buckets it
  uses CUDA events (:class:`_DeviceCollectiveTimer`; an NCCL future completes at enqueue,
  so wall-clock says little). It replaces DDP's C++ hook with a Python one: measured 6-8%
  of a 21 ms step on a 1.2 MB-gradient model (``bench/torch_overhead.py``).

``instrument``'s default, ``auto``, is ``exposed`` for a model whose parameters are on the
CPU and ``hook`` for CUDA models (the exposed mode's host clock cannot see NCCL work).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from time import perf_counter
from typing import Any

import torch
import torch.distributed as dist

MODES = ("auto", "exposed", "hook", "off")


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


class _Coverage:
    """The union of in-flight all-reduce intervals, stamped as collective wait.

    What the hook's completion callback holds, and all it holds: the callback runs on the
    backend's thread and torch destroys it there, so whatever it references may be freed
    there. A process group freed on its own worker thread aborts the process
    (``~ProcessGroupGloo`` joins that thread: "Resource deadlock avoided"), which the end
    of a job reaches when its training thread drops the model and destroys the group
    while a callback is still being let go (tests/e2e/test_torch_hook_teardown.py). A
    small lock keeps the bookkeeping consistent across the threads callbacks run on."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter
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


class _CollectiveTimer:
    """State of the communication hook: its group, and the :class:`_Coverage` of its
    buckets. ``add_wait`` is stamped at completion time, which falls inside the step
    because DDP waits for every bucket before ``backward()`` returns. ``device`` times CUDA
    buckets with events instead (present when CUDA is available).
    """

    def __init__(self, exporter: Any, group: Any,
                 device: _DeviceCollectiveTimer | None = None) -> None:
        self.group = group
        self.device = device
        self.coverage = _Coverage(exporter)
        self.world: int | None = None  # the group's size, read at the first bucket

    @property
    def buckets(self) -> int:
        """CPU buckets completed."""
        return self.coverage.buckets


def _timed_allreduce_hook(state: _CollectiveTimer, bucket: Any) -> Any:
    """DDP communication hook: average the bucket with an all-reduce, timing its future."""
    group, world = state.group, state.world
    if world is None:  # first bucket: resolve the group and its size once (~1.4 us a bucket)
        if group is None:
            group = state.group = dist.group.WORLD
        world = state.world = dist.get_world_size(group)
    tensor = bucket.buffer()
    tensor.div_(world)
    device = state.device
    if device is not None and tensor.is_cuda:
        token = device.begin(bucket.is_last())
        dfut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done_on_device(f: Any) -> torch.Tensor:
            device.end(token)
            return f.value()[0]

        return dfut.then(done_on_device)
    coverage = state.coverage   # the callback holds this, never the state and its group
    t0 = perf_counter()
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

    def done(f: Any) -> torch.Tensor:
        coverage.record(t0, perf_counter())
        return f.value()[0]

    return fut.then(done)


# DDP checks the hook's annotations with inspect; give it real objects, not the strings
# ``from __future__ import annotations`` leaves behind.
_timed_allreduce_hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                                         "return": torch.futures.Future[torch.Tensor]}


def _new_cuda_event() -> Any:
    return torch.cuda.Event(enable_timing=True)


def _first_tensor(output: Any) -> Any:
    """The first tensor that requires grad in a forward's output (a tensor, a sequence, a
    mapping or an object with tensor attributes such as a ``ModelOutput``), else None."""
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, dict):
        items: Any = output.values()
    elif isinstance(output, (list, tuple)):
        items = output
    else:
        items = getattr(output, "__dict__", {}).values()
    for item in items:
        found = _first_tensor(item) if isinstance(item, (torch.Tensor, list, tuple, dict)) \
            else None
        if found is not None:
            return found
    return None


def _reduced_param_first_in_backward(model: Any) -> Any:
    """The parameter DDP all-reduces whose gradient it expects first in backward (the last
    of its parameters in registration order: DDP buckets them in reverse order), or None.

    Any parameter DDP reduces would do for :class:`_ExposedWaitTimer` (DDP queues its
    finalisation only after every one of them is ready, and a post-accumulate-grad hook runs
    before DDP's hook on the same parameter); the first-arriving one also stays out of
    reentrant activation checkpointing, which rarely wraps the output layer."""
    params = getattr(model, "_module_parameters", None)
    if params is None:
        ignored = getattr(model, "parameters_to_ignore", ())
        params = [p for n, p in model.module.named_parameters() if n not in ignored]
    params = [p for p in params if p.requires_grad]
    return params[-1] if params else None


class _ExposedWaitTimer:
    """The ``exposed`` mode: time blocked at the end of ``backward()`` in DDP's
    finalisation (waiting for the all-reduces), from two autograd final callbacks around
    DDP's own (see the module docstring). One measurement per backward pass.

    The first callback is queued by a post-accumulate-grad hook registered once, at
    :meth:`install`, on a parameter DDP reduces (:func:`_reduced_param_first_in_backward`):
    it runs inside that parameter's gradient accumulation, before DDP's own hook on it, so
    before DDP can queue its finalisation. Per step: three Python calls from autograd, two
    ``queue_callback``, two ``perf_counter`` and the exporter's ``add_wait``; nothing is
    registered or allocated per forward.

    Where that parameter may get no gradient (``find_unused_parameters=True``) or DDP
    queues work at the very start of backward (its first ``static_graph`` iteration), a
    forward hook instead registers a gradient hook on each forward's output, which runs
    first in ``backward()`` (the previous design: about 45 us more of the training thread's
    CPU per step, ``bench/torch_modes.py --in-process``); with ``static_graph`` only until
    the first measurement.
    """

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter
        self.queue = torch.autograd.Variable._execution_engine.queue_callback
        self.armed = False  # the output-hook path: this backward is being measured
        self.t0 = 0.0
        self.measured = 0
        self.param: Any = None  # where the post-accumulate-grad hook goes (or went)
        self.param_hook: Any = None  # its handle
        self.forward_handle: Any = None  # the output-hook path's forward hook, while used
        self.permanent_forward = False
        self._before = self.before_finalize  # bound once: the hot path allocates none
        self._after = self.after_finalize

    def install(self, model: Any) -> None:
        """Hook ``model`` (DDP): the parameter hook, or the output-hook path where needed."""
        if not getattr(model, "_use_python_reducer", False):
            self.param = _reduced_param_first_in_backward(model)
        self.permanent_forward = (self.param is None
                                  or bool(getattr(model, "find_unused_parameters", False)))
        if self.permanent_forward or getattr(model, "static_graph", False):
            self.forward_handle = model.register_forward_hook(self.forward_hook)
        else:
            self._use_param_hook()

    def _use_param_hook(self) -> None:
        if self.forward_handle is not None:
            self.forward_handle.remove()
            self.forward_handle = None
        self.param_hook = self.param.register_post_accumulate_grad_hook(self.on_grad_ready)

    def on_grad_ready(self, param: Any) -> None:
        self.queue(self._before)

    def forward_hook(self, module: Any, args: Any, output: Any) -> None:
        if self.measured and not self.permanent_forward:  # static graph: first step done
            self._use_param_hook()
            return
        if self.armed or not torch.is_grad_enabled():
            return
        tensor = _first_tensor(output)
        if tensor is not None:
            tensor.register_hook(self.on_output_grad)

    def on_output_grad(self, grad: Any) -> None:
        if not self.armed:  # several outputs of one backward: measure once
            self.armed = True
            self.queue(self._before)

    def before_finalize(self) -> None:
        self.t0 = perf_counter()
        self.queue(self._after)  # runs after DDP's finalisation, queued meanwhile

    def after_finalize(self) -> None:
        t1 = perf_counter()
        self.armed = False
        self.measured += 1
        self.exporter.add_wait("collective", t1 - self.t0)


def _on_cuda(model: Any) -> bool:
    try:
        return next(model.parameters()).is_cuda
    except (StopIteration, AttributeError, TypeError):
        return False


_WRAPPED = "_goodlens_timed"


def time_buffer_sync(ddp: Any, exporter: Any) -> None:
    """Time a DDP module's buffer broadcast as collective wait (both modes).

    With ``broadcast_buffers`` (DDP's default) a model with buffers (batch-norm statistics,
    a Llama's rotary ``inv_freq``) broadcasts them from rank 0 at the start of every
    synchronised forward: a collective in which every rank waits for the last to arrive.
    Untimed, that wait is compute, and a slow rank makes the ranks that wait for it there
    look as slow as itself (one slowed rank yields findings for rank 0 too). DDP calls
    ``self._sync_buffers()`` (torch 2.13), so an instance attribute wraps it, once; a module
    without it is left alone."""
    sync = getattr(ddp, "_sync_buffers", None)
    if sync is None or getattr(sync, _WRAPPED, False):
        return
    add_wait = exporter.add_wait
    # the wrapper lives on ``ddp``: holding ``ddp`` (its bound method) would make a cycle
    # that keeps the model, its reducer and their gloo work alive after the job drops it,
    # to be destroyed during interpreter finalization, where gloo aborts the process
    # ("terminate called without an active exception", pytorch/pytorch#179291: seen)
    func, ref = getattr(sync, "__func__", None), weakref.ref(ddp)
    if func is None or getattr(sync, "__self__", None) is not ddp:
        func, ref = (lambda _: sync()), (lambda: None)  # not DDP's own method: call as is

    def timed() -> Any:
        t0 = perf_counter()
        try:
            return func(ref())
        finally:
            add_wait("collective", perf_counter() - t0)

    setattr(timed, _WRAPPED, True)
    ddp._sync_buffers = timed


def attach(model: Any, exporter: Any, process_group: Any = None,
           collectives: str = "auto") -> Any:
    """Install the collective timing of ``collectives`` mode on a DDP ``model`` (and time
    its buffer broadcast, :func:`time_buffer_sync`); returns the timer (None for a model
    that is not DDP, or mode ``off``)."""
    if collectives not in MODES:
        raise ValueError(f"collectives must be one of {MODES}, not {collectives!r}")
    if collectives == "off" or not hasattr(model, "register_comm_hook"):
        return None
    time_buffer_sync(model, exporter)
    if collectives == "auto":
        collectives = "hook" if _on_cuda(model) else "exposed"
    if collectives == "exposed":
        timer = _ExposedWaitTimer(exporter)
        timer.install(model)
        return timer
    device = (_DeviceCollectiveTimer(exporter, _new_cuda_event)
              if torch.cuda.is_available() else None)
    state = _CollectiveTimer(exporter, process_group, device)
    model.register_comm_hook(state, _timed_allreduce_hook)
    return state
