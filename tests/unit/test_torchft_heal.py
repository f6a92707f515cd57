"""A torchft heal's restore progress (``goodlens.exporter.torchft``) over a stand-in of
torchft 0.2.0's ``Manager``, with a fake exporter and a clock that ticks at every reading.

The stand-in copies the order torchft's manager.py runs a heal in: ``start_quorum`` submits
``_async_quorum`` to a thread, which receives the peer's state with
``_checkpoint_transport.recv_checkpoint(src_rank=, metadata=, step=, timeout=)``; the
training thread later loads it with ``_apply_pending_state_dict`` (its first act: wait for
the quorum future), at ``should_commit``. The received state is 100 float32 (400 bytes),
so every expected value below is written by hand.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from goodlens.detectors.restore import rank_restores  # noqa: E402
from goodlens.exporter import torchft as gft  # noqa: E402

STEP, SIZE = 7, 400  # the step healed to; bytes of the received state (100 x 4)


class FakeExporter:
    enabled = True

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.config = SimpleNamespace(restore_progress_s=3600.0, world_size=None)
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def event(self, kind: Any, time_s: float | None = None, **fields: Any) -> None:
        with self._lock:
            self.events.append({"kind": getattr(kind, "value", kind), "rank": self.rank,
                                "time": time.time() if time_s is None else time_s, **fields})

    def flush(self, **_: Any) -> None:
        pass


class Transport:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: Any) -> Any:
        if self.fail:
            raise ConnectionError("peer went away")
        return {"user": {"model": {"w": torch.ones(100)}}, "torchft": {"step": step}}


class Manager:
    """torchft.manager.Manager (0.2.0): the parts a heal runs through."""

    def __init__(self, transport: Transport, with_apply: bool = True) -> None:
        self._checkpoint_transport = transport
        self._executor = ThreadPoolExecutor(1)
        self._quorum_future: Any = None
        self._healing = False
        self._pending_state_dict: Any = None
        self.loaded: dict[str, Any] = {}
        if not with_apply:  # an older manager: nothing to watch the load with
            self._apply_pending_state_dict = None  # type: ignore[assignment]

    def start_quorum(self) -> None:
        self._healing = False
        self._quorum_future = self._executor.submit(self._async_quorum)

    def _async_quorum(self) -> None:
        self._healing = True
        try:
            self._pending_state_dict = self._checkpoint_transport.recv_checkpoint(
                src_rank=0, metadata="http://peer:1234/checkpoint", step=STEP, timeout=None)
        except Exception:
            self._pending_state_dict = None  # report_error

    def wait_quorum(self) -> None:
        self._quorum_future.result()

    def allreduce(self, tensor: Any) -> Any:
        return tensor

    def _apply_pending_state_dict(self) -> None:
        self._quorum_future.result()
        if self._pending_state_dict is not None:
            self.loaded = self._pending_state_dict["user"]["model"]
            self._pending_state_dict = None

    def should_commit(self) -> bool:
        if self._healing and callable(self._apply_pending_state_dict):
            self._apply_pending_state_dict()
        return True

    def current_step(self) -> int:
        return STEP

    def is_participating(self) -> bool:
        return True

    def num_participants(self) -> int:
        return 2


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> None:
    """``time.time()`` a second later at every reading: events order by instant, whatever
    thread sent them."""
    clock = itertools.count(1_000_000)
    monkeypatch.setattr(time, "time", lambda: float(next(clock)))


@pytest.fixture(autouse=True)
def _own_logger_handlers() -> Any:
    quorums = logging.getLogger("torchft_quorums")
    before = list(quorums.handlers)
    yield
    quorums.handlers[:] = before


def heal(group_rank: int, transport: Transport, with_apply: bool = True
         ) -> tuple[Manager, list[dict[str, Any]]]:
    """Instrument a group's rank, heal it once; its events by instant."""
    exp = FakeExporter(rank=2 + group_rank)
    m = Manager(transport, with_apply)
    gft.instrument(m, exp, group="g1", group_rank=group_rank, group_attempt=1)
    m.start_quorum()
    try:
        m.wait_quorum()
    except ConnectionError:
        pass
    m.should_commit()
    m._executor.shutdown()
    return m, sorted(exp.events, key=lambda e: e["time"])


def progress(e: dict[str, Any]) -> tuple:
    return e["label"], e["bytes"], e["step"], json.loads(e["detail"])


def test_a_heal_reports_read_then_received_then_load_then_its_end(ticking):
    m, events = heal(0, Transport())
    assert torch.equal(m.loaded["w"], torch.ones(100))
    kinds = [(e["kind"], e.get("label")) for e in events]
    assert kinds == [("group_start", "g1"),
                     ("ckpt_restore_progress", "read"), ("heal_start", "g1"),
                     ("ckpt_restore_progress", "barrier"), ("heal_end", "g1"),
                     ("ckpt_restore_progress", "load"), ("ckpt_restore_progress", "load")]
    found = [progress(e) for e in events if e["kind"] == "ckpt_restore_progress"]
    one_call = {"live_bytes": False}  # the transport receives in one call
    assert found == [("read", 0, STEP, one_call), ("barrier", SIZE, STEP, one_call),
                     ("load", SIZE, STEP, one_call),
                     ("load", SIZE, STEP, {**one_call, "ended": True})]
    assert events[4]["bytes"] == SIZE  # heal_end, as before
    # the collector folds it into a restore that is over: nothing moving, nothing stuck
    (r,) = rank_restores(pd.DataFrame(
        [{"seq": i, "host": "h", **e} for i, e in enumerate(events)
         if e["kind"] == "ckpt_restore_progress"]))
    assert (r.phase, r.bytes_read, r.end) == ("done", SIZE, events[-1]["time"])
    assert r.read_done == events[3]["time"]  # received: its reads were done


def test_every_rank_of_the_group_reports_its_heal_the_lead_its_events(ticking):
    _, events = heal(1, Transport())
    assert [(e["kind"], e["label"]) for e in events] == [
        ("ckpt_restore_progress", "read"), ("ckpt_restore_progress", "barrier"),
        ("ckpt_restore_progress", "load"), ("ckpt_restore_progress", "load")]
    assert {e["rank"] for e in events} == {3}


def test_a_failed_receive_ends_its_progress_where_it_stopped(ticking):
    _, events = heal(0, Transport(fail=True))
    kinds = [(e["kind"], e.get("label"), e.get("cause")) for e in events]
    assert kinds == [("group_start", "g1", None), ("ckpt_restore_progress", "read", None),
                     ("heal_start", "g1", None), ("ckpt_restore_progress", "read", None),
                     ("heal_end", "g1", "failed")]
    assert json.loads(events[3]["detail"]) == {"live_bytes": False, "ended": True}
    assert events[3]["bytes"] == 0


def test_without_a_load_to_watch_the_heal_ends_when_received(ticking):
    _, events = heal(1, Transport(), with_apply=False)
    found = [progress(e) for e in events]
    assert found == [("read", 0, STEP, {"live_bytes": False}),
                     ("read", SIZE, STEP, {"live_bytes": False, "ended": True})]
