"""Timing of FSDP2's collectives (``torch.distributed.fsdp.fully_shard``) for the PyTorch
integration: the time the training thread is blocked in an all-gather or reduce-scatter.

Why it exists: under FSDP2 there is no single all-reduce at the end of ``backward()`` to
time. Parameters are all-gathered before each FSDP module's forward and backward, and
gradients reduce-scattered after each module's backward, so a rank waiting for a slow peer
waits at whichever of these collectives comes first after the peer fell behind. The
straggler accounting reads each rank's *time to reach the collective* (step time minus the
time it was blocked in collectives), so every blocked interval must be counted, wherever in
the step it falls.

How: FSDP2's public extension points ``FSDPModule.set_custom_all_gather`` and
``set_custom_reduce_scatter`` take a communication object; :func:`attach` wraps the one each
FSDP module already has (FSDP2's default, or one the user set) in a timed proxy that
forwards ``allocate`` and the call unchanged and adds the call's duration as ``collective``
wait. On a CPU (gloo) process group the call blocks until the collective completes, so this
is exactly the exposed wait, including the wait for a slow peer. An asynchronous call (a
``Work`` returned: FSDP2's ``unshard(async_op=True)``) is timed from the call and again at
its ``wait()`` through a ``Work`` subclass, so only the blocked part is counted.

HSDP (a 2-D mesh): the shard group's collectives go through the same custom comms; the
replicate group's all-reduce is FSDP2's own ``dist.all_reduce`` call, timed through the
public ``set_all_reduce_hook``, which native HSDP runs right after it
(:class:`TimedAllReduce`).

Not covered: on CUDA an NCCL call returns at enqueue and the training thread's stall is a
stream wait the host clock cannot see (:func:`attach` warns, and the step is then compute
plus data wait); tensor and pipeline parallel collectives are not timed
(docs/integrations.md).
"""

from __future__ import annotations

import logging
from time import perf_counter
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

log = logging.getLogger("goodlens.exporter.torch")


class _TimedWork(dist.Work):
    """A ``Work`` whose ``wait()`` adds the time it blocked as collective wait."""

    def __init__(self, inner: Any, add_wait: Any) -> None:
        super().__init__()
        self._inner = inner
        self._add_wait = add_wait

    def wait(self, timeout: Any = None) -> bool:
        t0 = perf_counter()
        try:
            return self._inner.wait() if timeout is None else self._inner.wait(timeout)
        finally:
            self._add_wait("collective", perf_counter() - t0)

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self) -> Any:
        return self._inner.exception()

    def get_future(self) -> Any:
        return self._inner.get_future()

    def result(self) -> Any:
        return self._inner.result()


def _timed(work: Any, t0: float, add_wait: Any) -> Any:
    """Count the call's blocked time; wrap an asynchronous ``Work`` to count its wait."""
    add_wait("collective", perf_counter() - t0)
    if work is None:
        return None
    try:
        return _TimedWork(work, add_wait)
    except (TypeError, RuntimeError):  # a Work that cannot be subclassed here: untimed wait
        return work


class TimedAllGather(AllGather):
    """FSDP2's all-gather (``inner``) timed as collective wait."""

    def __init__(self, inner: Any, exporter: Any) -> None:
        self.inner = inner
        self.add_wait = exporter.add_wait

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> Any:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: Any, async_op: bool = False) -> Any:
        t0 = perf_counter()
        work = self.inner(output_tensor=output_tensor, input_tensor=input_tensor,
                          group=group, async_op=async_op)
        return _timed(work, t0, self.add_wait)


class TimedReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter (``inner``) timed as collective wait. ``mark`` is when FSDP2
    last used it (its output buffer allocated, or the call returned): where an HSDP
    all-reduce that follows begins (:class:`TimedAllReduce`)."""

    def __init__(self, inner: Any, exporter: Any) -> None:
        self.inner = inner
        self.add_wait = exporter.add_wait
        self.mark = 0.0

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> Any:
        out = self.inner.allocate(size, dtype=dtype, device=device)
        self.mark = perf_counter()
        return out

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: Any, op: Any, async_op: bool = False) -> Any:
        t0 = perf_counter()
        work = self.inner(output_tensor=output_tensor, input_tensor=input_tensor,
                          group=group, op=op, async_op=async_op)
        out = _timed(work, t0, self.add_wait)
        self.mark = perf_counter()
        return out


class TimedAllReduce:
    """HSDP's replicate all-reduce timed as collective wait, through FSDP2's public
    ``set_all_reduce_hook``: under native HSDP the hook runs right after FSDP2's own
    ``dist.all_reduce`` of the reduce-scatter's output, so the time since the module's
    reduce-scatter last returned (``scatter.mark``) is that all-reduce (on gloo, blocking),
    plus a few tensor additions. A hook of the user's (``inner``) still runs, after."""

    def __init__(self, scatter: TimedReduceScatter, inner: Any, exporter: Any) -> None:
        self.scatter = scatter
        self.inner = inner
        self.add_wait = exporter.add_wait

    def __call__(self, reduce_output: torch.Tensor) -> None:
        self.add_wait("collective", perf_counter() - self.scatter.mark)
        if self.inner is not None:
            self.inner(reduce_output)


def fsdp_modules(model: Any) -> list[Any]:
    """Every FSDP2 module in ``model``'s tree (the root included), outermost first."""
    modules = getattr(model, "modules", None)
    if modules is None:
        return []
    return [m for m in modules() if isinstance(m, FSDPModule)]


def _current_comm(module: Any, name: str, default: type) -> Any:
    """The communication object FSDP2 holds for ``module`` (``_all_gather_comm`` or
    ``_reduce_scatter_comm`` of its parameter group; FSDP2's private state, read only to
    wrap it), or FSDP2's default."""
    try:
        groups = module._get_fsdp_state()._fsdp_param_groups
    except AttributeError:
        groups = []
    comm = getattr(groups[0], name, None) if groups else None
    if isinstance(comm, (TimedAllGather, TimedReduceScatter)):
        return None  # already timed
    return comm if comm is not None else default()


def attach(model: Any, exporter: Any) -> int:
    """Time the all-gathers and reduce-scatters of every FSDP2 module in ``model``; returns
    how many modules were instrumented (0: no FSDP2 module). Call after ``fully_shard``
    (and after any ``set_custom_all_gather`` of your own) and before the first forward."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
        DefaultAllGather,
        DefaultReduceScatter,
    )
    found = fsdp_modules(model)
    count = 0
    for module in found:
        try:
            if len(module._get_fsdp_state()._fsdp_param_groups) != 1:
                continue  # no parameters of its own (or per-parameter meshes): nothing to time
        except AttributeError:
            continue
        gather = _current_comm(module, "_all_gather_comm", DefaultAllGather)
        scatter = _current_comm(module, "_reduce_scatter_comm", DefaultReduceScatter)
        if gather is not None:
            module.set_custom_all_gather(TimedAllGather(gather, exporter))
        if scatter is not None:
            timed = TimedReduceScatter(scatter, exporter)
            module.set_custom_reduce_scatter(timed)
            group = module._get_fsdp_state()._fsdp_param_groups[0]
            if getattr(group, "_is_hsdp", False):  # the replicate dimension's all-reduce
                module.set_all_reduce_hook(TimedAllReduce(timed, group._all_reduce_hook,
                                                          exporter))
        count += 1
    if count and any(p.is_cuda for p in model.parameters()):
        log.warning("goodlens: FSDP2 on CUDA: the collective wait is timed on the host, where "
                    "NCCL calls return at enqueue; the training thread's stall on them is "
                    "not measured (docs/integrations.md)")
    return count
