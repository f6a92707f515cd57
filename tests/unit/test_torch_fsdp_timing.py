"""FSDP2's collective timing (``goodlens.exporter.torch_fsdp``) in one process: the timed
all-gather and reduce-scatter count exactly the time the training thread is blocked, forward
what FSDP2 asks of the communication object, and wrap an FSDP2 model once.

Why: the recorded job (tests/integration/test_recorded_fsdp2.py) proves the numbers on
real ranks; these pin down the mechanics a real job's noise would hide. The inner
communication objects here are the test's own, blocking for a planted ``WAIT``; expected
values are those planted delays, never goodlens's.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from goodlens.exporter import torch as gl  # noqa: E402
from goodlens.exporter import torch_fsdp  # noqa: E402
from tests.harness import WaitSink as Sink  # noqa: E402

WAIT = 0.05


class PlantedWork(dist.Work):
    """An asynchronous collective that completes ``WAIT`` after its ``wait()`` begins."""

    def wait(self, timeout: Any = None) -> bool:
        time.sleep(WAIT)
        return True


class PlantedComm:
    """A blocking (or, with ``asynchronous``, Work-returning) collective of ``WAIT``."""

    def __init__(self, asynchronous: bool = False) -> None:
        self.asynchronous = asynchronous
        self.calls: list[dict] = []
        self.allocated: list[tuple] = []

    def allocate(self, size: Any, *, dtype: Any, device: Any) -> torch.Tensor:
        self.allocated.append((tuple(size), dtype, device))
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, **kw: Any) -> Any:
        self.calls.append(kw)
        if self.asynchronous:
            return PlantedWork()
        time.sleep(WAIT)
        return None


def test_a_blocking_all_gather_counts_its_whole_call():
    sink, inner = Sink(), PlantedComm()
    timed = torch_fsdp.TimedAllGather(inner, sink)
    out, inp = torch.empty(4), torch.ones(2)
    assert timed(out, inp, "group", async_op=False) is None
    assert inner.calls == [{"output_tensor": out, "input_tensor": inp, "group": "group",
                            "async_op": False}]
    assert len(sink.waits) == 1 and WAIT <= sink.waits[0] < WAIT + 0.03
    t = timed.allocate((3,), dtype=torch.float32, device=torch.device("cpu"))
    assert t.shape == (3,) and inner.allocated == [((3,), torch.float32, torch.device("cpu"))]


def test_an_asynchronous_reduce_scatter_counts_the_call_and_the_wait_apart():
    sink, inner = Sink(), PlantedComm(asynchronous=True)
    timed = torch_fsdp.TimedReduceScatter(inner, sink)
    work = timed(torch.empty(1), torch.empty(2), "group", "sum", async_op=True)
    assert inner.calls[0]["op"] == "sum" and inner.calls[0]["async_op"] is True
    assert isinstance(work, dist.Work)  # FSDP2 tests isinstance before it waits
    assert len(sink.waits) == 1 and sink.waits[0] < 0.01  # the launch: not blocked
    time.sleep(0.02)  # compute overlapping the collective is not wait
    assert work.wait() is True
    assert len(sink.waits) == 2 and WAIT <= sink.waits[1] < WAIT + 0.03


@pytest.fixture
def world_one():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _groups(module: Any) -> list[Any]:
    return module._get_fsdp_state()._fsdp_param_groups


def test_instrument_wraps_each_fsdp_module_once_and_keeps_a_users_comm(world_one):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 8)), nn.Linear(8, 1))
    fully_shard(model[1])
    fully_shard(model)
    mine = PlantedComm()
    model[1].set_custom_reduce_scatter(mine)  # a user's own reduce-scatter stays in use
    sink = Sink()
    sink.config, sink.attempt = None, 0  # what attempt_start reads of an exporter
    assert gl.instrument(model, sink) is model
    inner = _groups(model[1])[0]
    assert isinstance(inner._reduce_scatter_comm, torch_fsdp.TimedReduceScatter)
    assert inner._reduce_scatter_comm.inner is mine
    root = _groups(model)[0]
    assert isinstance(root._all_gather_comm, torch_fsdp.TimedAllGather)
    # a second instrument() does not time the same collective twice
    assert torch_fsdp.attach(model, sink) == 2
    assert not isinstance(root._all_gather_comm.inner, torch_fsdp.TimedAllGather)
    assert not isinstance(inner._reduce_scatter_comm.inner, torch_fsdp.TimedReduceScatter)
    # one step trains as before (world 1: FSDP2 copies instead of calling a collective)
    model(torch.ones(2, 4)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_a_model_without_fsdp_is_not_touched():
    assert torch_fsdp.attach(nn.Linear(2, 2), Sink()) == 0
    assert torch_fsdp.fsdp_modules(object()) == []


def test_the_hsdp_all_reduce_is_the_time_since_the_reduce_scatter_returned():
    """Native HSDP runs the all-reduce hook right after its own all-reduce of the
    reduce-scatter's output: the wait is from the reduce-scatter's return to the hook, and
    a hook of the user's still runs, after, with the same tensor."""
    sink, seen = Sink(), []
    scatter = torch_fsdp.TimedReduceScatter(PlantedComm(), sink)
    hook = torch_fsdp.TimedAllReduce(scatter, seen.append, sink)
    out = torch.zeros(2)
    scatter(out, torch.zeros(4), "group", "sum")
    time.sleep(WAIT)  # the all-reduce FSDP2 runs itself, blocking on gloo
    hook(out)
    assert len(sink.waits) == 2
    assert WAIT <= sink.waits[0] < WAIT + 0.03  # the reduce-scatter
    assert WAIT <= sink.waits[1] < WAIT + 0.03  # the all-reduce after it
    assert seen == [out]
    # a shard group of one calls no reduce-scatter: the output buffer's allocation marks it
    scatter.allocate((2,), dtype=torch.float32, device=torch.device("cpu"))
    time.sleep(WAIT)
    torch_fsdp.TimedAllReduce(scatter, None, sink)(out)
    assert WAIT <= sink.waits[2] < WAIT + 0.03


def test_a_ddp_models_buffer_broadcast_is_collective_wait(world_one):
    """DDP broadcasts a model's buffers from rank 0 before every synchronised forward, a
    collective every rank waits in for the last one: ``instrument`` times it (once, however
    often it is called), here planted to block ``WAIT``."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    calls = []

    def planted() -> None:
        calls.append(1)
        time.sleep(WAIT)
    model._sync_buffers = planted
    sink = Sink()
    sink.config, sink.attempt = None, 0
    gl.instrument(model, sink, collectives="exposed")
    gl.instrument(model, sink, collectives="exposed")  # not wrapped twice
    before = len(sink.waits)
    model(torch.ones(3, 4)).sum().backward()
    assert calls == [1]
    buffer_waits = [w for w in sink.waits[before:] if w >= WAIT]
    assert len(buffer_waits) == 1 and buffer_waits[0] < WAIT + 0.03


def test_an_instrumented_ddp_model_is_freed_when_the_job_drops_it(world_one):
    """The buffer-sync wrapper lives on the model, so it must not hold the model: a cycle
    kept a hook-mode DDP model, its reducer and their gloo work alive until interpreter
    finalization, where gloo can abort the process ("terminate called without an active
    exception", seen once in the collective-modes test). With the cycle collector off, the
    model is gone as soon as its last reference is; its real buffer broadcast is still
    timed (the wrapper calls DDP's own method)."""
    import gc
    import weakref

    from torch.nn.parallel import DistributedDataParallel as DDP
    sink = Sink()
    sink.config, sink.attempt = None, 0
    gc.collect()
    gc.disable()
    try:
        model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
        gl.instrument(model, sink, collectives="hook")
        model(torch.ones(3, 4)).sum().backward()
        assert sink.waits, "the buffer broadcast and the all-reduce are timed"
        ref = weakref.ref(model)
        del model
        assert ref() is None
    finally:
        gc.enable()
