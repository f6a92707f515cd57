"""The ``exposed`` collective timing's hooks, in one process (world-1 gloo): registered once,
and still splitting compute from the all-reduce wait.

Why: the mode registers one post-accumulate-grad hook on a parameter DDP reduces, once,
when the model is wrapped (a hook per forward costs tens of microseconds a step). That is
only right if the hook queues its callback before DDP queues its finalisation. Here a
communication hook of the test's own completes each all-reduce
``WAIT`` seconds after its launch (DDP's finalisation waits for it), and a layer sleeps
``COMPUTE`` seconds in its backward: the measured wait must be the all-reduce's delay,
without the backward compute, for a plain model, a one-parameter model (DDP's own hook on
the hooked parameter launches the all-reduce and queues the finalisation), ``static_graph``
(first step included) and ``find_unused_parameters`` (which keeps the per-forward output
hook). Expected values come from the planted delays, never from goodlens.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from goodlens.exporter import torch as gl  # noqa: E402
from tests.harness import WaitSink as Sink  # noqa: E402

WAIT = 0.10
COMPUTE = 0.20
STEPS = 3


class SlowBackward(torch.autograd.Function):
    """Identity whose backward sleeps COMPUTE (backward compute the rank does itself)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        time.sleep(COMPUTE)
        return grad


class Slow(nn.Module):
    def forward(self, x: Any) -> Any:
        return SlowBackward.apply(x)


class Branchy(nn.Module):
    """A model whose last-registered parameter is unused (``find_unused_parameters``)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), Slow(), nn.Linear(16, 1))
        self.unused = nn.Linear(8, 1)

    def forward(self, x: Any) -> Any:
        return self.body(x)


def delayed_all_reduce(state, bucket):  # no annotations: DDP checks them
    """A communication hook whose future completes WAIT seconds after launch (world 1: the
    bucket is already the average)."""
    fut: Any = torch.futures.Future()
    threading.Timer(WAIT, fut.set_result, args=(bucket.buffer(),)).start()
    return fut


@pytest.fixture
def world_one():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train(model: Any, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        model(torch.randn(4, 8)).sum().backward()
        opt.step()


def _own_post_hooks(param: Any, timer: Any) -> int:
    hooks = getattr(param, "_post_accumulate_grad_hooks", None) or {}
    return sum(getattr(h, "__self__", None) is timer for h in hooks.values())


def test_the_hook_is_registered_once_not_per_forward(world_one, monkeypatch) -> None:
    registered: list[Any] = []
    original = torch.Tensor.register_hook

    def counting(self: Any, hook: Any) -> Any:
        registered.append(hook)
        return original(self, hook)

    monkeypatch.setattr(torch.Tensor, "register_hook", counting)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    sink = Sink()
    timer = gl.attach(model, sink, collectives="exposed")
    params = list(model.module.parameters())
    assert timer.param is params[-1]  # the one DDP expects first in backward
    _train(model, 20)
    assert not [h for h in registered if getattr(h, "__self__", None) is timer]
    assert not model._forward_hooks
    assert [_own_post_hooks(p, timer) for p in params] == [0] * (len(params) - 1) + [1]
    assert timer.measured == 20 and len(sink.waits) == 20


@pytest.mark.parametrize("case", ["plain", "one_parameter", "static_graph",
                                  "find_unused_parameters"])
def test_the_wait_is_the_all_reduce_delay_without_backward_compute(world_one, case) -> None:
    if case == "one_parameter":
        module: nn.Module = nn.Sequential(nn.Linear(8, 1, bias=False), Slow())
    elif case == "find_unused_parameters":
        module = Branchy()
    else:
        module = nn.Sequential(nn.Linear(8, 16), Slow(), nn.ReLU(), nn.Linear(16, 1))
    model = DDP(module, static_graph=case == "static_graph",
                find_unused_parameters=case == "find_unused_parameters")
    model.register_comm_hook(None, delayed_all_reduce)
    sink = Sink()
    timer = gl.attach(model, sink, collectives="exposed")
    _train(model, STEPS)
    assert len(sink.waits) == STEPS, sink.waits
    # every step (the first static_graph one included) waited for the planted all-reduce
    # delay; the COMPUTE sleep in backward is not wait (a loaded machine: wide margins)
    for wait in sink.waits:
        assert 0.8 * WAIT <= wait <= WAIT + 0.5 * COMPUTE, (case, sink.waits)
    if case == "find_unused_parameters":  # the unused last parameter never fires: output
        assert model._forward_hooks  # hook per forward
    else:
        assert not model._forward_hooks  # static graph: removed after the first step
        assert _own_post_hooks(timer.param, timer) == 1
