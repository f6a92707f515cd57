"""Asynchronous DCP checkpoints through goodlens.exporter.torch, with real processes and real files.

Why: ``save_checkpoint(async_=True)`` splits a save into the stall training sees (until
``async_save`` returns) and the background write, and reports the bytes written. These tests
run the real ``torch.distributed.checkpoint.async_save`` (torch 2.13: a
``concurrent.futures.Future`` with the default stager, an ``AsyncSaveResponse`` with an
asynchronous stager; it needs a CPU backend, gloo here) and check the recorded events
against clocks and files on disk, in a single-process gloo group (this file run as a
script: ``worker``) with a stand-in exporter that stamps each event, and a storage writer
that sleeps before writing so the background part is known to last at least ``SLOW_S``.
Every claim is an order of events or a lower bound the planted sleep makes, never a
duration a loaded machine could stretch. The process runs in its own session under a
timeout, on 127.0.0.1.

Under torchrun: a 2-rank ``examples/train_ddp.py --async-ckpt`` job with a crash and
restart is a recorded run (``async-dcp``, ``tests/integration/test_recorded_async.py``),
and the live elastic smoke test (``tests/e2e/test_elastic_scenario.py``) saves async DCP
checkpoints on 6 ranks and restores one after its restart.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLOW_S = 0.5  # the slow writer's sleep: a lower bound of the background part
GATE_S = 30.0  # how long the first save's write waits for the test to open its gate
N_FLOATS = 2_000_000  # 8 MB tensor: staging it takes measurable time
# DCP's overhead over the tensors' raw bytes: each tensor is written with torch.save (a zip
# record, ~1-2 KiB) and the coordinator writes a pickled .metadata (~1-2 KiB per tensor).
OVERHEAD_PER_TENSOR = 4096


# ----------------------------------------------------------------------------- the worker


class Recorder:
    """Stands in for a RankExporter: keeps each event with its wall and monotonic time."""

    enabled = True
    attempt = 0

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def event(self, kind: str, **fields: Any) -> None:
        with self.lock:
            self.events.append({"kind": kind, "t": time.perf_counter(), "wall": time.time(),
                                "thread": threading.current_thread().name, **fields})

    def add_wait(self, kind: str, seconds: float) -> None:
        pass


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def worker(out: Path, ckpt: Path, port: int) -> None:  # pragma: no cover - subprocess
    import faulthandler

    faulthandler.enable()  # an abort (SIGABRT from C++) prints every thread's Python stack
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from goodlens.exporter import torch as gl

    class SlowWriter(FileSystemWriter):
        """A filesystem writer on slow storage: sleeps before writing its shards. With a
        ``gate``, it first waits for the gate to open (``opened``: whether it did within
        ``GATE_S``): a write held until the save's call returned cannot be in its stall."""

        def __init__(self, path: str, gate: threading.Event | None = None) -> None:
            super().__init__(path)
            self.gate = gate
            self.opened: bool | None = None

        def write_data(self, plan: Any, planner: Any) -> Any:
            if self.gate is not None:
                self.opened = self.gate.wait(GATE_S)
            time.sleep(SLOW_S)
            return super().write_data(plan, planner)

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(N_FLOATS, generator=g), "b": torch.randn(64, generator=g),
             "step": torch.tensor(7)}
    original = {k: v.clone() for k, v in state.items()}
    payload = sum(v.numel() * v.element_size() for v in state.values())
    rec = Recorder()
    res: dict[str, Any] = {"payload": payload, "tensors": len(state)}

    print("worker: 1. async save", flush=True)
    # 1. async save on slow storage whose write waits for the call to have returned, then
    # training goes on and changes the state
    p1 = ckpt / "a1"
    gate = threading.Event()
    writer = SlowWriter(str(p1), gate)
    t0 = time.perf_counter()
    fut = gl.save_checkpoint(state, p1, rec, step=1, async_=True, storage_writer=writer)
    t1 = time.perf_counter()
    res["a1_type"] = type(fut).__name__
    for v in state.values():  # the "next steps": only safe if async_save staged a copy
        v.add_(1)
    res["a1_done_after_return"] = fut.done()
    gate.set()
    fut.result(timeout=60)
    t2 = time.perf_counter()
    res["a1_gate_opened"] = writer.opened
    res["a1"] = {"call": t0, "returned": t1, "result": t2, "dir_bytes": _dir_bytes(p1),
                 "files": sorted(f.name for f in p1.iterdir()),
                 "mtime_max": max(f.stat().st_mtime for f in p1.iterdir())}

    print("worker: 2. two async saves", flush=True)
    # 2. two async saves back to back: the second waits for the first inside its stall
    p2, p3 = ckpt / "a2", ckpt / "a3"
    f2 = gl.save_checkpoint(state, p2, rec, step=2, async_=True,
                            storage_writer=SlowWriter(str(p2)))
    t3 = time.perf_counter()
    f3 = gl.save_checkpoint(state, p3, rec, step=3, async_=True)
    t4 = time.perf_counter()
    f2.result(timeout=60)
    f3.result(timeout=60)
    res["a3"] = {"call": t3, "returned": t4, "dir_bytes": _dir_bytes(p3)}

    print("worker: 3. an asynchronous stager", flush=True)
    # 3. an asynchronous stager: async_save returns an AsyncSaveResponse
    p4 = ckpt / "a4"
    stager = DefaultStager(StagingOptions(False, False, True, False))
    resp = gl.save_checkpoint(state, p4, rec, step=4, async_=True, async_stager=stager)
    res["a4_type"] = type(resp).__name__
    resp.staging_completion.result(timeout=60)
    t5 = time.perf_counter()
    resp.upload_completion.result(timeout=60)
    stager.close()
    res["a4"] = {"staged": t5, "dir_bytes": _dir_bytes(p4)}

    print("worker: 4. a save that fails", flush=True)
    # 4. a save that fails in the background: no durable event, the future raises
    blocker = ckpt / "not-a-dir"
    blocker.write_text("x")
    try:
        gl.save_checkpoint(state, blocker / "a5", rec, step=5, async_=True).result(timeout=60)
        res["a5_error"] = None
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        res["a5_error"] = type(exc).__name__

    print("worker: 5. restore the first", flush=True)
    # 5. restore the first checkpoint into a zeroed state
    restored = {k: torch.zeros_like(v) for k, v in state.items()}
    gl.load_checkpoint(restored, p1, rec, step=1)
    res["restored_equal"] = all(torch.equal(restored[k], original[k]) for k in state)
    res["events"] = rec.events
    out.write_text(json.dumps(res))
    # DCP's executor threads shut themselves down after their save's callbacks; let them
    # finish before the groups they used are destroyed
    for t in threading.enumerate():
        if t.name.startswith("AsyncCheckpointExecutor"):
            t.join(30)
    dist.destroy_process_group()
    print("worker: process groups destroyed", flush=True)


# ----------------------------------------------------------------------------- the tests


def _run(cmd: list[str], log: Path, timeout: float) -> None:
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        from tests.harness import kill_tree
        kill_tree(proc)
        pytest.fail(f"timed out: {log.read_text()[-3000:]}")
    assert proc.returncode == 0, log.read_text()[-3000:]


def _one(events: list[dict], kind: str, step: int) -> dict:
    found = [e for e in events if e["kind"] == kind and e.get("step") == step]
    assert len(found) == 1, (kind, step, found)
    return found[0]


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("torch")
    from tests.harness import free_port
    tmp = tmp_path_factory.mktemp("async")
    out = tmp / "result.json"
    (tmp / "ckpt").mkdir()
    _run([sys.executable, __file__, "worker", str(out), str(tmp / "ckpt"), str(free_port())],
         tmp / "worker.log", timeout=120)
    return json.loads(out.read_text())


def test_the_stall_is_the_part_before_async_save_returns(single):
    r, ev = single, single["events"]
    assert r["a1_type"] == "Future"
    start, blocking = _one(ev, "ckpt_save_start", 1), _one(ev, "ckpt_save_blocking_end", 1)
    a1 = r["a1"]
    # the stall: from the call until async_save returned, both inside the call
    assert a1["call"] <= start["t"] <= blocking["t"] <= a1["returned"]
    assert blocking["thread"] == "MainThread"
    # the slow storage is not in the stall: the write waited for the call to return (had
    # the call waited for the write, the gate would have timed out), and had not ended
    assert r["a1_gate_opened"] is True
    assert not r["a1_done_after_return"]
    # the state was staged before the call returned: the state changed after it, and the
    # checkpoint holds the values from before
    assert r["restored_equal"]


def test_the_background_part_is_recorded_when_the_future_completes(single):
    ev, a1 = single["events"], single["a1"]
    blocking = _one(ev, "ckpt_save_blocking_end", 1)
    durable = _one(ev, "ckpt_save_durable_end", 1)
    assert durable["thread"] != "MainThread"  # the DCP executor thread, at completion
    assert durable["t"] - blocking["t"] >= SLOW_S  # the write's sleep is in the background
    # recorded by the time result() returns (so exporter.close() right after loses nothing)
    assert blocking["t"] < durable["t"] <= a1["result"]
    # and after the last file was written (file times: ~ms resolution on this filesystem)
    assert durable["wall"] >= a1["mtime_max"] - 0.01


def test_bytes_written_match_the_checkpoint_on_disk(single):
    r, ev = single, single["events"]
    a1 = r["a1"]
    assert a1["files"] == [".metadata", "__0_0.distcp"]
    for step, key in ((1, "a1"), (3, "a3"), (4, "a4")):
        got = _one(ev, "ckpt_save_durable_end", step)["bytes"]
        # one rank: its shard plus the coordinator's .metadata, which is the whole folder
        assert got == r[key]["dir_bytes"] > 0
        # and the tensors' raw bytes plus DCP's framing and metadata, at most 4 KiB a tensor
        assert r["payload"] <= got <= r["payload"] + OVERHEAD_PER_TENSOR * r["tensors"]


def test_a_second_async_save_waits_for_the_first_inside_its_stall(single):
    ev, a3 = single["events"], single["a3"]
    durable2 = _one(ev, "ckpt_save_durable_end", 2)
    start3, blocking3 = _one(ev, "ckpt_save_start", 3), _one(ev, "ckpt_save_blocking_end", 3)
    assert a3["call"] <= start3["t"] < durable2["t"] < blocking3["t"] <= a3["returned"]


def test_an_async_stager_ends_the_stall_when_staging_completes(single):
    r, ev = single, single["events"]
    assert r["a4_type"] == "AsyncSaveResponse"
    start, blocking = _one(ev, "ckpt_save_start", 4), _one(ev, "ckpt_save_blocking_end", 4)
    durable = _one(ev, "ckpt_save_durable_end", 4)
    assert start["t"] <= blocking["t"] <= r["a4"]["staged"]
    assert blocking["t"] <= durable["t"]


def test_a_failed_background_save_records_no_durable_end(single):
    ev = single["events"]
    assert single["a5_error"] is not None
    _one(ev, "ckpt_save_start", 5)
    assert not [e for e in ev if e["kind"] == "ckpt_save_durable_end" and e.get("step") == 5]


def test_load_checkpoint_records_the_restore(single):
    ev, a1 = single["events"], single["a1"]
    start, end = _one(ev, "ckpt_restore_start", 1), _one(ev, "ckpt_restore_end", 1)
    assert start["t"] < end["t"]
    assert end["bytes"] == a1["dir_bytes"]
    assert single["restored_equal"]


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
