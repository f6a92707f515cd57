"""The DDP hook's completion callback must never hold the last reference to the process group.

Why: the callback (``done`` in :func:`goodlens.exporter.torch_collectives._timed_allreduce_hook`)
runs on the backend's worker thread, and torch destroys it there after it ran, once that
thread has the GIL. When the training thread has meanwhile dropped the model and destroyed
the group (the end of a job, the end of a test), a callback holding the group frees it on
that worker thread; ``~ProcessGroupGloo`` then joins its own thread and the process aborts
("terminate called after throwing an instance of 'std::system_error' / Resource deadlock
avoided", and faulthandler's "Current thread: <no Python frame>"). That killed a pytest
worker of ``make test`` (clean clone 5, docs/testing.md) in the test after the hook-mode DDP
test, and would kill a training process at its exit, which torchrun reports as a failure.

The script below holds the worker thread inside the callback (the exporter's ``add_wait``
blocks) while the training thread drops every reference it has and destroys the group;
then lets the callback return. Real gloo, one rank, in a process of its own: the faulty
code aborts it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent("""
    import threading, time
    import torch, torch.distributed as dist
    from goodlens.exporter import torch as gl

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    in_callback, dropped = threading.Event(), threading.Event()

    class Exporter:   # the exporter's add_wait, called by the callback on gloo's thread
        def add_wait(self, kind, seconds):
            in_callback.set()
            assert dropped.wait(10), "the training thread never dropped the group"

    class Bucket:
        def buffer(self): return torch.ones(4)
        def is_last(self): return True

    group = dist.new_group([0])
    state = gl._CollectiveTimer(Exporter(), group)
    fut = gl._timed_allreduce_hook(state, Bucket())
    assert in_callback.wait(10), "the all-reduce's callback never ran"
    # the training thread lets go of everything: the hook's state (DDP's, in a job), the
    # group. Freeing the group here joins gloo's thread, so the callback is let go first.
    del state
    dist.destroy_process_group(group)
    threading.Timer(0.2, dropped.set).start()
    del group
    assert fut.wait().tolist() == [1.0] * 4   # the bucket, averaged over one rank
    dist.destroy_process_group()
    print("ended", flush=True)
""")


def test_the_hooks_callback_does_not_free_the_group_on_gloos_thread(tmp_path):
    out = subprocess.run([sys.executable, "-X", "faulthandler", "-c", SCRIPT], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ended", (
        f"rc {out.returncode}\n{out.stdout}\n{out.stderr[-3000:]}")
    assert "terminate called" not in out.stderr, out.stderr[-3000:]
