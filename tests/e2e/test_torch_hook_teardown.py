"""The DDP hook's completion callback must never hold the last reference to the process group.

Why: the callback (``done`` in :func:`goodlens.exporter.torch_collectives._timed_allreduce_hook`)
runs on the backend's worker thread, and torch destroys it there after it ran, once that
thread has the GIL. When the training thread has meanwhile dropped the model and destroyed
the group (the end of a job, the end of a test), a callback holding the group frees it on
that worker thread; ``~ProcessGroupGloo`` then joins its own thread and the process aborts
("terminate called after throwing an instance of 'std::system_error' / Resource deadlock
avoided", and faulthandler's "Current thread: <no Python frame>"): a pytest worker, or a
training process at its exit, which torchrun reports as a failure.

The script below, rank 0 of a two-rank gloo job, holds the worker thread inside the
callback (the exporter's ``add_wait`` blocks) while the training thread drops every
reference it has and destroys the group; then lets the callback return. Rank 1 contributes
to the all-reduce only once rank 0's hook has returned, so the callback is registered
before the all-reduce can complete and runs on gloo's thread (on one rank the all-reduce
could complete first, and ``then`` would run it inline on the training thread). Real gloo,
each rank a process of its own: the faulty code aborts rank 0.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent("""
    import sys, threading
    import torch, torch.distributed as dist
    from goodlens.exporter import torch as gl

    rank = int(sys.argv[1])
    store = dist.FileStore(sys.argv[2], 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    if rank == 1:   # joins the all-reduce once rank 0's hook has registered its callback
        store.wait(["hooked"])
        dist.all_reduce(torch.ones(4) / 2)   # its own bucket, as the hook averages it
        store.wait(["ended"])
        dist.destroy_process_group()
        sys.exit(0)
    in_callback, dropped = threading.Event(), threading.Event()

    class Exporter:   # the exporter's add_wait, called by the callback on gloo's thread
        def add_wait(self, kind, seconds):
            assert threading.current_thread() is not threading.main_thread()
            in_callback.set()
            assert dropped.wait(30), "the training thread never dropped the group"

    class Bucket:
        def buffer(self): return torch.ones(4)
        def is_last(self): return True

    group = dist.group.WORLD
    state = gl._CollectiveTimer(Exporter(), group)
    fut = gl._timed_allreduce_hook(state, Bucket())
    store.set("hooked", "1")
    assert in_callback.wait(60), "the all-reduce's callback never ran"
    # the training thread lets go of everything: the hook's state (DDP's, in a job), the
    # group. Freeing the group here joins gloo's thread, so the callback is let go first.
    del state
    dist.destroy_process_group()
    threading.Timer(0.2, dropped.set).start()
    del group
    assert fut.wait().tolist() == [1.0] * 4   # the bucket, averaged over two ranks
    store.set("ended", "1")
    print("ended", flush=True)
""")


def test_the_hooks_callback_does_not_free_the_group_on_gloos_thread(tmp_path):
    store = str(tmp_path / "store")
    ranks = [subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", SCRIPT, str(r),
                               store], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        out, err = ranks[0].communicate(timeout=120)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert ranks[0].returncode == 0 and out.strip() == "ended", (
        f"rc {ranks[0].returncode}\n{out}\n{err[-3000:]}")
    assert "terminate called" not in err, err[-3000:]
