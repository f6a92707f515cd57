"""The CUDA-event timing of goodlens.exporter.torch's DDP hook, checked on CPU with stand-in events.

Why: on GPU the all-reduce future completes at enqueue, so the hook times buckets with CUDA
events and resolves them lazily (``query()`` on later hook calls, never a sync). CI has no
GPU, so these tests drive that bookkeeping with stand-in events that expose the same calls
as ``torch.cuda.Event`` (``record``, ``query``, ``elapsed_time``) on a fake device clock
whose completion the test controls. What they cannot show (real streams, NCCL, the
callback's stream semantics) is listed in docs/pytorch.md as not run on a GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from goodlens.exporter import torch as gl  # noqa: E402


class Device:
    """A fake device timeline: events get the current device time when recorded and
    complete only when the test says the device got that far."""

    def __init__(self) -> None:
        self.now = 0.0  # seconds
        self.done_until = -1.0
        self.events: list[FakeEvent] = []

    def new_event(self) -> FakeEvent:
        e = FakeEvent(self)
        self.events.append(e)
        return e


class FakeEvent:
    def __init__(self, device: Device) -> None:
        self.device = device
        self.t: float | None = None
        self.queries = 0

    def record(self) -> None:
        self.t = self.device.now

    def query(self) -> bool:
        self.queries += 1
        return self.t is not None and self.t <= self.device.done_until

    def elapsed_time(self, end: FakeEvent) -> float:
        # like CUDA: both events must have completed, or it raises
        if not (self.query() and end.query()):
            raise RuntimeError("event not completed")
        return (end.t - self.t) * 1000.0  # milliseconds


class Sink:
    """Stands in for the exporter: keeps add_wait calls."""

    enabled = True

    def __init__(self) -> None:
        self.waits: list[tuple[str, float]] = []

    def add_wait(self, kind: str, seconds: float) -> None:
        self.waits.append((kind, seconds))

    def event(self, kind: str, **fields: Any) -> None:
        pass


def run_step(timer: gl._DeviceCollectiveTimer, dev: Device,
             buckets: list[tuple[float, float]]) -> None:
    """Launch every bucket at its start time, then finish each at its end time."""
    tokens = []
    for i, (t0, _) in enumerate(buckets):
        dev.now = t0
        tokens.append(timer.begin(last=i == len(buckets) - 1))
    for tok, (_, t1) in sorted(zip(tokens, buckets), key=lambda x: x[1][1]):
        dev.now = t1
        timer.end(tok)


def test_union_length():
    assert gl._union_length([]) == 0
    assert gl._union_length([(0, 2), (1, 3), (5, 6)]) == 3 + 1
    assert gl._union_length([(5, 6), (0, 10)]) == 10
    assert gl._union_length([(0, 1), (1, 2)]) == 2


def test_a_step_is_reported_after_its_events_complete_at_a_later_hook_call():
    dev, sink = Device(), Sink()
    timer = gl._DeviceCollectiveTimer(sink, dev.new_event)
    run_step(timer, dev, [(10.0, 10.2), (10.1, 10.5), (10.7, 10.8)])  # union 0.6 s
    assert sink.waits == []  # never resolved on the step's own path
    assert len(timer.pending) == 1
    # the next step's first bucket: the device has not finished yet -> nothing, no error
    dev.now = 11.0
    tok = timer.begin(last=False)
    assert sink.waits == [] and len(timer.pending) == 1
    # the device is past step 1: the next hook call reports it, with the union
    dev.done_until = 10.8
    dev.now = 11.1
    tok2 = timer.begin(last=True)
    assert len(sink.waits) == 1
    kind, seconds = sink.waits[0]
    assert kind == "collective" and seconds == pytest.approx(0.6)
    assert timer.resolved_steps == 1 and not timer.pending
    dev.now = 11.3
    timer.end(tok)
    timer.end(tok2)
    assert len(timer.pending) == 1  # step 2 waits for its own later call


def test_steps_are_reported_in_order_and_each_once():
    dev, sink = Device(), Sink()
    timer = gl._DeviceCollectiveTimer(sink, dev.new_event)
    for n in range(5):
        base = 10.0 * n
        run_step(timer, dev, [(base, base + 0.1 * (n + 1)), (base + 0.05, base + 0.1)])
    assert sink.waits == []
    dev.done_until = 25.0  # steps 0, 1, 2 are done on the device
    timer.poll()
    assert [round(s, 6) for _, s in sink.waits] == [0.1, 0.2, 0.3]
    timer.poll()
    assert len(sink.waits) == 3
    dev.done_until = 1e9
    timer.poll()
    assert [round(s, 6) for _, s in sink.waits] == [0.1, 0.2, 0.3, 0.4, 0.5]


def test_a_step_closes_only_when_every_bucket_has_ended():
    """Callbacks may run out of launch order: the last bucket can end first."""
    dev, sink = Device(), Sink()
    timer = gl._DeviceCollectiveTimer(sink, dev.new_event)
    dev.now = 1.0
    a = timer.begin(last=False)
    dev.now = 1.1
    b = timer.begin(last=True)
    dev.now = 1.2
    timer.end(b)
    assert not timer.pending  # bucket a still in flight
    dev.now = 1.5
    timer.end(a)
    assert len(timer.pending) == 1
    dev.done_until = 2.0
    timer.poll()
    assert sink.waits[0][1] == pytest.approx(0.5)


def test_events_are_reused_so_steady_state_allocates_none():
    dev, sink = Device(), Sink()
    timer = gl._DeviceCollectiveTimer(sink, dev.new_event)
    for n in range(200):
        dev.done_until = dev.now  # the device keeps up: earlier steps are done
        run_step(timer, dev, [(n + 0.0, n + 0.3), (n + 0.1, n + 0.4), (n + 0.5, n + 0.6)])
    assert timer.resolved_steps == 199
    # 3 buckets x 2 events for the step in flight and the one waiting: 12 at most
    assert timer.created == len(dev.events) <= 12
    assert sum(s for _, s in sink.waits) == pytest.approx(199 * 0.5)


def test_events_that_never_complete_stay_bounded():
    dev, sink = Device(), Sink()
    timer = gl._DeviceCollectiveTimer(sink, dev.new_event)
    for n in range(100):
        run_step(timer, dev, [(float(n), n + 0.5)])
    assert len(timer.pending) == timer.MAX_PENDING_STEPS
    assert timer.dropped_steps == 100 - timer.MAX_PENDING_STEPS
    assert sink.waits == []


class FakeBuffer:
    """A bucket buffer claiming to live on a GPU (only the calls the hook makes)."""

    is_cuda = True

    def div_(self, n: int) -> FakeBuffer:
        return self


class FakeBucket:
    def __init__(self, buf: Any, last: bool) -> None:
        self.buf, self.last = buf, last

    def buffer(self) -> Any:
        return self.buf

    def is_last(self) -> bool:
        return self.last


class FakeWork:
    def __init__(self) -> None:
        self.fut = torch.futures.Future()

    def get_future(self) -> Any:
        return self.fut


@pytest.fixture
def fake_allreduce(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, FakeWork]]:
    launched: list[tuple[Any, FakeWork]] = []

    def all_reduce(tensor: Any, group: Any = None, async_op: bool = False) -> FakeWork:
        work = FakeWork()
        launched.append((tensor, work))
        return work

    monkeypatch.setattr(gl.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(gl.dist, "get_world_size", lambda group=None: 2)
    return launched


def test_the_hook_times_cuda_buckets_with_events_and_cpu_buckets_with_the_clock(
        fake_allreduce):
    dev, sink = Device(), Sink()
    state = gl._CollectiveTimer(sink, object(), gl._DeviceCollectiveTimer(sink, dev.new_event))
    # a CUDA bucket: events, nothing on the wall clock
    out = gl._timed_allreduce_hook(state, FakeBucket(FakeBuffer(), last=True))
    assert len(dev.events) == 1 and dev.events[0].t is not None
    dev.now = 0.25
    fake_allreduce[-1][1].fut.set_result([fake_allreduce[-1][0]])
    assert out.wait() is fake_allreduce[-1][0]
    assert len(dev.events) == 2 and len(timer_pending(state)) == 1
    assert sink.waits == [] and state.buckets == 0
    # a CPU bucket with the same state: the unchanged wall-clock path
    cpu = torch.ones(4)
    out = gl._timed_allreduce_hook(state, FakeBucket(cpu, last=True))
    fake_allreduce[-1][1].fut.set_result([cpu])
    assert out.wait() is cpu
    assert state.buckets == 1 and len(dev.events) == 2
    assert len(sink.waits) == 1 and sink.waits[0][0] == "collective"


def timer_pending(state: gl._CollectiveTimer) -> Any:
    assert state.device is not None
    return state.device.pending


def test_instrument_uses_events_only_when_cuda_is_available(monkeypatch):
    class Model:
        def register_comm_hook(self, state: Any, hook: Any) -> None:
            self.state, self.hook = state, hook

    sink = Sink()
    m = gl.instrument(Model(), sink, collectives="hook")
    assert m.hook is gl._timed_allreduce_hook
    assert (m.state.device is None) == (not torch.cuda.is_available())
    monkeypatch.setattr(gl.torch.cuda, "is_available", lambda: True)
    m = gl.instrument(Model(), sink, collectives="hook")
    assert isinstance(m.state.device, gl._DeviceCollectiveTimer)
    monkeypatch.setattr(gl.torch.cuda, "is_available", lambda: False)
    assert gl.instrument(Model(), sink, collectives="hook").state.device is None
