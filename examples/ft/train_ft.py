"""One replica group of a torchft job on gloo/CPU, recorded by goodlens.

Why it exists: it is the job of ``examples/ft/scenario.py`` (``make demo-ft``), the
recording ``torchft`` under ``tests/fixtures/runs/`` and the live smoke test. Each replica
group is one torchrun (``--nproc-per-node`` ranks, restarted by its own agent); all groups
meet at one torchft lighthouse. The model is tiny and each step sleeps ``--step-s`` to stand
for compute, so the timeline is the faults', not the CPU's.

Faults, each from a file the scenario creates under ``--state`` (so a test decides when):

- ``kill-<group>``: the group's rank 0 kills itself (SIGKILL) in the middle of its next
  step, after flushing what it recorded (a real SIGKILL loses up to one flush interval;
  the recording should hold every step before it); its agent restarts the group, which
  heals from a peer and rejoins;
- ``slow-<group>``: each step of the group sleeps ``--slow-s`` more (a straggler);
- with ``--evict on``, rank 0 of each group polls the collector's ``/v1/actions`` with the
  guard rails of :class:`goodlens.exporter.elastic.EvictionClient`; the group named by a
  confirmed ``evict`` leaves (``group_end`` cause ``evicted``) while the others go on;
- ``stop``: holding a step number, every group stops there (instead of ``--steps``);
- ``--spare``: the group waits (started, imported, model built: hot) until
  ``STATE/spare-go`` exists, then joins at the next quorum and heals from a peer.

``--no-goodlens``: the same job with the integration off (no exporter, no wrapping, a bare
step scope): the baseline of ``bench/torchft_overhead.py``.

``--truth``: each rank appends its own clock readings to
``rank<global rank>-attempt<group attempt>.jsonl``:
its process start, each step with the participants, the commit and the process's CPU
seconds so far (``cpu``), the kill instant, the first
step after a heal, the slow-down's onset and the eviction.
"""

from __future__ import annotations

import time

T_SCRIPT = time.time()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

from goodlens.exporter import lifecycle  # noqa: E402
from goodlens.exporter import torchft as gft  # noqa: E402

DIM = 16


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--group", type=int, required=True, help="this replica group, 0-based")
    p.add_argument("--groups", type=int, default=3, help="replica groups of the full job")
    p.add_argument("--steps", type=int, default=60, help="committed steps to train")
    p.add_argument("--batch", type=int, default=8, help="samples per group per step")
    p.add_argument("--step-s", type=float, default=0.05, help="compute stand-in per step")
    p.add_argument("--slow-s", type=float, default=0.3, help="extra per step while slow")
    p.add_argument("--state", default=None, help="folder of the fault files")
    p.add_argument("--truth", default=None, help="folder for the job's clock lines")
    p.add_argument("--spare", action="store_true", help="wait for STATE/spare-go, then join")
    p.add_argument("--spare-groups", type=int, default=0, help="spares the job keeps")
    p.add_argument("--evict", choices=("off", "on", "dry_run"), default="off")
    p.add_argument("--min-confidence", type=float, default=0.7)
    p.add_argument("--min-groups", type=int, default=2)
    p.add_argument("--timeout-s", type=float, default=10.0, help="torchft's op timeout")
    p.add_argument("--no-goodlens", action="store_true",
                   help="no exporter and no instrumentation (the overhead benchmark's baseline)")
    return p.parse_args(argv)


class Truth:
    """This rank's own clock lines (JSON per line), or nothing without ``--truth``."""

    def __init__(self, folder: str | None, rank: int, attempt: int) -> None:
        self.path = None if folder is None else \
            Path(folder) / f"rank{rank}-attempt{attempt}.jsonl"
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, what: str, **fields: Any) -> None:
        if self.path is not None:
            line = json.dumps({"kind": what, "time": time.time(), **fields})
            with open(self.path, "a") as f:
                f.write(line + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from torchft import Manager, Optimizer, ProcessGroupGloo

    rank = int(os.environ.get("RANK", 0))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    state = Path(args.state) if args.state else None
    width = int(os.environ.get("WORLD_SIZE", 1))
    truth = Truth(args.truth, args.group * width + rank, attempt)
    truth("process_start", at=lifecycle.process_start_time(), group_attempt=attempt,
          spare=args.spare)
    if args.spare and state is not None:
        while not (state / "spare-go").exists():  # hot: imported and built, not in a quorum
            time.sleep(0.05)
        truth("spare_go")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Linear(DIM, 1))
    inner = torch.optim.SGD(model.parameters(), lr=0.01)

    def load(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    def save() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    timeout = timedelta(seconds=args.timeout_s)
    store_addr, store_port, _store = incarnation_store(rank, attempt, timeout)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), load_state_dict=load,
                      state_dict=save, min_replica_size=1, replica_id=f"g{args.group}",
                      timeout=timeout, quorum_timeout=timedelta(seconds=60),
                      connect_timeout=timeout, store_addr=store_addr,
                      store_port=store_port)
    exporter = tracker = None
    if not args.no_goodlens:
        exporter = gft.exporter_for(args.group, args.groups, samples_per_step=args.batch,
                                    host=f"g{args.group}", spare_groups=args.spare_groups,
                                    run_meta={"global_batch": args.batch * args.groups})
        tracker = gft.instrument(manager, exporter, group=f"g{args.group}",
                                 samples_per_step=args.batch, spare=args.spare)
    plain = [0, 0]  # committed, discarded without a tracker: from torchft's step counter
    optim = Optimizer(manager, inner)
    evictor = _evictor(args, exporter) if rank == 0 and exporter is not None else None
    healed_seen = attempt == 0 and not args.spare
    slow_seen = False
    gen = torch.Generator().manual_seed(args.group)
    while manager.current_step() < last_step(state, args.steps):
        kill = state is not None and rank == 0 and attempt == 0 and \
            (state / f"kill-g{args.group}").exists()
        slow = state is not None and (state / f"slow-g{args.group}").exists()
        if slow and not slow_seen:
            slow_seen = True
            truth("slow_onset", step=manager.current_step())
        x = torch.randn(args.batch, DIM, generator=gen)
        before = manager.current_step()
        t0 = time.time()
        with tracker.step() if tracker is not None else contextlib.nullcontext():
            optim.zero_grad()
            time.sleep(args.step_s + (args.slow_s if slow else 0.0))
            if kill:  # mid-step, before the all-reduce: the others discard this step
                if exporter is not None:  # what came before reaches the store (a test reads it)
                    exporter.flush()
                truth("kill", step=manager.current_step())
                os.kill(os.getpid(), signal.SIGKILL)
            loss = model(x).pow(2).mean()
            loss.backward()
            average_gradients(manager, model)
            counted = manager.is_participating()  # its gradients in the average (not healing)
            optim.step()
        step = manager.current_step()
        if tracker is None:  # a committed step moves torchft's counter on
            plain[0 if step > before else 1] += 1
        committed, discarded = (tracker.committed, tracker.discarded) if tracker else plain
        truth("step", start=t0, end=time.time(), step=step, committed=committed,
              discarded=discarded, participants=manager.num_participants(),
              participating=counted, cpu=time.process_time())
        if not healed_seen and manager.is_participating():
            healed_seen = True
            truth("rejoined", step=step)
        if evictor is not None and evictor.take() is not None:  # only with goodlens on
            truth("evicted", step=step)
            evictor.stop()
            tracker.finish("evicted")
            exporter.close()
            manager.shutdown(wait=False)
            os._exit(0)  # leave now: torchft's threads must not keep the group alive
    if evictor is not None:
        evictor.stop()
    truth("done", step=manager.current_step())
    if tracker is not None:
        tracker.finish("completed")
    manager.shutdown(wait=False)
    return 0


def last_step(state: Path | None, steps: int) -> int:
    """``--steps``, or the step number in ``STATE/stop`` once it exists (the groups commit
    in lockstep, so each stops at that same step)."""
    try:
        return int((state / "stop").read_text()) if state is not None else steps
    except (OSError, ValueError):
        return steps


def incarnation_store(rank: int, attempt: int, timeout: timedelta) -> tuple[str, int, Any]:
    """A store of this incarnation of the group for torchft's Manager: rank 0 starts it and
    publishes its port in torchrun's store under the incarnation's number. torchrun's own
    store outlives a restart, and torchft 0.2.0's Manager reads the group's manager address
    from it: with two or more ranks a restarted rank 1 read the dead incarnation's address
    and failed to connect, restart after restart. Returns (address, port, the store rank 0
    must keep alive)."""
    from torch.distributed import TCPStore

    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    agent = TCPStore(addr, int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    key = f"goodlens_ft_store_{attempt}"
    if rank == 0:
        own = TCPStore(addr, 0, is_master=True, wait_for_workers=False, timeout=timeout)
        agent.set(key, str(own.port))
        return addr, own.port, own
    return addr, int(agent.get(key).decode()), None


def average_gradients(manager: Any, model: nn.Module) -> None:
    """Average the gradients over the groups in the quorum through the manager (a peer's
    failure is reported to the manager, which then refuses the commit). torchft 0.2.0's
    ``DistributedDataParallel`` comm hook fails an assertion when a peer dies mid
    all-reduce, so the job calls ``manager.allreduce`` itself."""
    works = [manager.allreduce(p.grad) for p in model.parameters() if p.grad is not None]
    for w in works:
        w.wait()


def _evictor(args: argparse.Namespace, exporter: Any) -> Any:
    """This group's eviction client (rank 0; None with ``--evict off``): it acts only on
    findings that name its own host, ``g<index>``, so the others keep training while it
    leaves. The history file under ``--state`` is shared, so the cap holds job-wide."""
    if args.evict == "off" or not exporter.config.url or args.state is None:
        return None
    from goodlens.exporter import elastic as gle

    me = f"g{args.group}"
    policy = gle.EvictionPolicy(mode=args.evict, min_confidence=args.min_confidence,
                                max_per_hour=1, min_nodes=args.min_groups)
    groups = [f"g{i}" for i in range(args.groups + args.spare_groups)]
    client = gle.EvictionClient(exporter, exporter.config.url, exporter.config.run_id,
                                policy, groups, Path(args.state) / "evictions.jsonl",
                                token=exporter.config.token)
    fetch = client.fetch
    client.fetch = lambda: [f for f in fetch() if gle.finding_host(f) == me]
    return client.start()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
