"""The two ways the PyTorch integration times DDP's collectives, on 2 real gloo ranks: the
default ``exposed`` mode (the training thread's wait at the end of ``backward()``, no
communication hook) and the ``hook`` mode, against a delay the test plants itself.

Rank 1 sleeps ``DELAY`` before its backward in every step, so rank 0 waits about that long
in the all-reduce; each mode must see it on rank 0 and not on rank 1. Ranks run in
``torch.multiprocessing`` processes of one test; expected values come from the planted
delay, never from goodlens.

A smoke test: the delay is planted big (0.3 s), so what a loaded machine adds to either
rank's arrival (a rank queued for a core for a few ms) cannot move the claims. How close
each mode's measured wait comes to a small, realistic delay (50 ms), quiet and beside busy
loops, is measured by ``bench/accuracy.py``.
"""

from __future__ import annotations

import time

import pytest

from tests.harness import WaitSink as Sink

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow

DELAY = 0.3
STEPS = 7   # the first 2 are start-up: 5 measured steps


MODES = ("exposed", "hook")


def worker(rank: int, port: int, out: str) -> None:
    """Each mode in turn, on a new DDP model over the same process group."""
    import faulthandler

    faulthandler.enable()  # an abort from C++ (SIGABRT) prints every thread's Python stack
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from goodlens.exporter import torch as gl

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    for mode in MODES:
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
        sink = Sink()
        gl.instrument(model, sink, collectives=mode)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        per_step = []
        for _ in range(STEPS):
            n = len(sink.waits)
            x = torch.randn(8, 64)
            loss = model(x).sum()
            if rank == 1:
                time.sleep(DELAY)
            loss.backward()
            opt.step()
            opt.zero_grad()
            per_step.append(sum(sink.waits[n:]))
        _write(out, f"{mode}{rank}", per_step)
        dist.barrier()
        del model, opt
    dist.destroy_process_group()


def _write(out: str, key: str, value: object) -> None:
    import json
    from pathlib import Path
    (Path(out) / f"{key}.json").write_text(json.dumps(value))


def _run(rank: int, port: int, out: str) -> None:
    try:
        worker(rank, port, out)
    except BaseException as exc:  # surfaced by the parent
        _write(out, f"error{rank}", repr(exc))
        raise


@pytest.fixture(scope="module")
def waits(tmp_path_factory) -> dict[str, list[float]]:
    """Both modes' per-step waits, rank by rank (``exposed0``, ``hook1``, ...), from one
    two-rank job."""
    import json

    import torch.multiprocessing as mp

    from tests.harness import free_port

    out = tmp_path_factory.mktemp("modes")
    # results come back as files: a multiprocessing Manager would fork this process (torch,
    # DuckDB threads and all), which crashed in the full suite
    mp.spawn(_run, args=(free_port(), str(out)), nprocs=2, join=True)
    got = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert not any(k.startswith("error") for k in got), got
    return got


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_sees_the_planted_wait_on_the_waiting_rank_only(mode, waits):
    waiting = sorted(waits[f"{mode}0"][2:])  # steps 0-1: start-up
    other = sorted(waits[f"{mode}1"][2:])
    assert len(waiting) == STEPS - 2
    med = waiting[len(waiting) // 2]
    # rank 0 waited for rank 1's sleep: most of it, never much more; rank 1 hardly waited,
    # and rank 0's wait is the largest by far
    assert 0.7 * DELAY <= med <= DELAY + 0.1, waiting
    assert other[len(other) // 2] <= 0.3 * DELAY, other
    assert other[len(other) // 2] <= 0.25 * med, (waiting, other)
