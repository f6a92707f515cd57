"""The fault scenario goodlens exists for, on one machine: nodes lost, a hot spare, a
straggler evicted automatically, all accounted by a real collector.

Why it exists: the planners and the detector are only worth their advice if a real job can
follow it. This drives one job (``train_elastic.py``) across several torchrun agents, each
standing for a node (``--nproc`` processes, gloo, c10d rendezvous on loopback,
``--nnodes MIN:MAX``, asynchronous DCP checkpoints every 10 steps), with a collector
(``goodlens serve``'s service, without the dashboard) storing everything:

1. nodes ``node-a``, ``node-b``, ``node-c`` start; the job trains on the full world;
2. ``node-c`` is lost: its agent and its workers are killed (the whole process group, as a
   node dies); the survivors re-rendezvous with a smaller world and go on from the last
   checkpoint, raising gradient accumulation so the global batch stays the same;
3. hot spare ``node-d`` starts and waits in the rendezvous; the world grows back;
4. hot spare ``node-e`` starts and waits (the rendezvous is full);
5. ``node-b`` becomes a straggler; the collector's detector confirms ``evict``; the job
   (``--evict on``) checkpoints, ``node-b`` leaves and ``node-e`` takes its place;
6. the job finishes; the collector stops; the store is left for ``goodlens report`` and
   the dashboard.

``--dry-run``: a shorter run (steps 1 and 5 only) with ``--evict dry_run``: the job records
the eviction it would have made and evicts nothing. ``--evict-only``: the eviction alone
(steps 1, 4 and 5; the spare, ``node-d``, waiting from the first world on; ``node-b`` slow
from the first steps), the shortest run in which the job acts on the collector's finding.

The rendezvous store runs as its own small process (as a cluster runs etcd): hosted by an
agent, it would die with that agent's node. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` makes
every round publish a fresh address for the workers' store (torch 2.13 otherwise keeps the
first round's, hosted by an agent that may be gone). Progress is read from the job's own
clock files (``truth/``); each phase waits on a condition with a generous timeout.

    python examples/elastic/scenario.py --out .goodlens/faults   # then: goodlens report ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train_elastic.py"
EXIT_RESIZE = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_store(port: int) -> None:
    """The rendezvous store, alone in its process (``scenario.py --store PORT``)."""
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while store is not None:
        time.sleep(3600)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def progress(truth: Path) -> list[dict[str, Any]]:
    """Every step line any rank wrote, with its attempt (from the file name)."""
    out = []
    for f in sorted(truth.glob("rank*-attempt*.jsonl")):
        attempt = int(f.stem.split("-attempt")[1])
        for line in f.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append({**json.loads(line), "attempt": attempt,
                            "rank": int(f.stem.split("-")[0][4:])})
    return out


class Scenario:
    """The processes of one scenario run and the waits between its phases."""

    def __init__(self, out: Path, run_id: str = "faults", nproc: int = 2, steps: int = 260,
                 evict: str = "on", timeout_s: float = 150.0, extra: list[str] | None = None,
                 log: Callable[[str], None] = print) -> None:
        self.out = out
        self.run_id = run_id
        self.nproc = nproc
        self.steps = steps
        self.evict = evict
        self.extra = extra or []
        self.deadline = time.monotonic() + timeout_s
        self.truth = out / "truth"
        self.state = out / "state"
        self.db = out / f"{run_id}.duckdb"
        self.procs: dict[str, subprocess.Popen] = {}
        self.timeline: list[dict[str, Any]] = []
        self.log = log
        self.store_port = free_port()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    # -- processes -----------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None
               ) -> subprocess.Popen:
        logf = open(self.out / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=self.out,
                             env={**os.environ, **(env or {})}, start_new_session=True)
        logf.close()
        self.procs[name] = p
        return p

    def mark(self, what: str, **info: Any) -> None:
        self.timeline.append({"what": what, "t": time.time(), **info})
        self.log(f"[scenario] {what} {info if info else ''}")

    def start_services(self) -> None:
        for d in (self.truth, self.state):
            d.mkdir(parents=True, exist_ok=True)
        self._spawn("store", [sys.executable, str(Path(__file__).resolve()), "--store",
                              str(self.store_port)])
        # the collector without the dashboard (``goodlens dashboard --db`` reads the store
        # afterwards): ``goodlens serve`` minus the UI
        code = ("from goodlens.collector.server import ServerConfig, serve; "
                f"serve(ServerConfig(db={str(self.db)!r}, port={self.port}), "
                "log_level='info')")
        self._spawn("collector", [sys.executable, "-c", code])
        self.wait(lambda: self._healthy(), "collector and store up", 60)

    def _healthy(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.store_port), timeout=1):
                pass
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def agent(self, node: str, min_nodes: int = 2, max_nodes: int = 3) -> None:
        """One node: a torchrun agent with ``nproc`` workers, in its own process group."""
        conf = ("is_host=false,join_timeout=120,last_call_timeout=5,close_timeout=10,"
                "keep_alive_interval=1,keep_alive_max_attempt=3")
        cmd = [sys.executable, "-m", "torch.distributed.run",
               f"--nnodes={min_nodes}:{max_nodes}", f"--nproc-per-node={self.nproc}",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{self.store_port}",
               f"--rdzv-id={self.run_id}", f"--rdzv-conf={conf}", "--max-restarts=6",
               "--monitor-interval=0.2", str(TRAIN), "--steps", str(self.steps),
               "--state-dir", str(self.state), "--url", self.url, "--run-id", self.run_id,
               "--truth-dir", str(self.truth), "--evict", self.evict,
               "--full-world", str(max_nodes * self.nproc),
               "--spare-gpus", str(self.nproc), "--async-ckpt", *self.extra]
        self._spawn(node, cmd, {"GOODLENS_NODE": node, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                                "OMP_NUM_THREADS": "1", "LOGLEVEL": "INFO"})
        self.mark("node_started", node=node)

    def kill_node(self, node: str) -> None:
        """The node dies: its agent and every worker at once. torchrun starts each worker
        in a session of its own, so killing the agent's process group alone would leave the
        workers training: the whole process tree is killed."""
        p = self.procs[node]
        tree = [p.pid, *descendants(p.pid)]
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        p.wait(10)
        self.mark("node_killed", node=node, pids=tree)

    def stop(self) -> None:
        """Stop whatever still runs (agents first, then the collector, then the store)."""
        for name, p in self.procs.items():
            if name in ("collector", "store") or p.poll() is not None:
                continue
            for pid in [p.pid, *descendants(p.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            p.wait(10)
        for name in ("collector", "store"):
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                if name == "collector":
                    with contextlib.suppress(OSError):
                        urllib.request.urlopen(urllib.request.Request(
                            f"{self.url}/v1/sync", method="POST"), timeout=30).close()
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(10)

    # -- waiting -------------------------------------------------------------
    def wait(self, cond: Callable[[], Any], what: str, timeout: float | None = None) -> Any:
        end = self.deadline if timeout is None else min(self.deadline,
                                                         time.monotonic() + timeout)
        while True:
            got = cond()
            if got:
                return got
            for name, p in self.procs.items():
                if name in ("collector", "store") and p.poll() is not None:
                    raise RuntimeError(f"{name} exited while waiting for {what}")
            if time.monotonic() > end:
                raise TimeoutError(f"scenario: timed out waiting for {what}")
            time.sleep(0.25)

    def steps_in(self, world: int, nodes: set[str] | None = None) -> int:
        """Steps rank 0 finished in attempts of ``world`` ranks (on exactly ``nodes``)."""
        lines = progress(self.truth)
        attempts = {x["attempt"] for x in lines if x["kind"] == "world" and x["rank"] == 0
                    and x["world"] == world and (nodes is None or set(x["hosts"]) == nodes)}
        return sum(1 for x in lines if x["kind"] == "step" and x["rank"] == 0
                   and x["attempt"] in attempts)

    def agents_done(self, names: list[str]) -> bool:
        return all(self.procs[n].poll() is not None for n in names)

    # -- the scenarios ---------------------------------------------------------
    def run_full(self) -> dict[str, Any]:
        """Lose a node, grow back with a spare, evict a straggler for the other spare."""
        n = self.nproc
        self.start_services()
        for node in ("node-a", "node-b", "node-c"):
            self.agent(node)
        self.wait(lambda: self.steps_in(3 * n) >= 25, "25 steps on the full world")
        # every step 0.1 s longer until the spare joined: the shrunk world must not finish
        # the job first (seen: its start-up took 55 s on a loaded machine, then its 240
        # steps ran in 17 s while the spare's agent was still starting)
        (self.state / "pace").touch()
        self.kill_node("node-c")
        # the spare starts once the shrunk world trains (its agent's start-up overlaps it)
        self.wait(lambda: self.steps_in(2 * n) >= 5, "5 steps on the shrunk world")
        self.agent("node-d")
        full = {"node-a", "node-b", "node-d"}
        self.wait(lambda: self.steps_in(3 * n, full) >= 1, "the spare joined")
        (self.state / "pace").unlink()
        self.agent("node-e")  # the rendezvous is full: it waits
        self.wait(lambda: self.steps_in(3 * n, full) >= 15, "15 steps before the straggler")
        (self.state / "slow-node-b").touch()
        self.mark("straggler_planted", node="node-b")
        swapped = {"node-a", "node-d", "node-e"}
        self.wait(lambda: self.steps_in(3 * n, swapped) >= 1, "the spare replacing node-b")
        self.mark("straggler_replaced", node="node-b")
        return self._finish(["node-a", "node-d", "node-e"])

    def run_evict(self) -> dict[str, Any]:
        """Three nodes and a hot spare; node-b slow from the first steps, evicted, the spare
        in its place. The spare's agent starts once the first world formed (so it cannot
        take a place in it) and starts up while the workers do; the straggler is planted
        once it waits in the rendezvous, so the eviction's new world is whole at once.
        Every step sleeps ``PACE_S`` more until then: fewer of the job's steps are spent
        before the straggler's onset."""
        n = self.nproc
        self.start_services()
        (self.state / "pace").touch()
        for node in ("node-a", "node-b", "node-c"):
            self.agent(node)
        self.wait(lambda: self._logged("node-a", "Rendezvous complete"), "the first world")
        self.agent("node-d")
        self.wait(lambda: self._logged("node-d", "Rendezvous'ing worker group")
                  and self.steps_in(3 * n) >= 1, "the spare waiting, the first step")
        time.sleep(1.0)  # its join follows that line at once: a margin for a loaded machine
        (self.state / "pace").unlink()
        (self.state / "slow-node-b").touch()
        self.mark("straggler_planted", node="node-b")
        swapped = {"node-a", "node-c", "node-d"}
        self.wait(lambda: self.steps_in(3 * n, swapped) >= 1, "the spare replacing node-b")
        self.mark("straggler_replaced", node="node-b")
        return self._finish(["node-a", "node-c", "node-d"])

    def _logged(self, name: str, text: str) -> bool:
        """Whether ``name``'s log holds ``text`` (an agent's own account of its rendezvous)."""
        try:
            return text in (self.out / f"{name}.log").read_text(errors="replace")
        except OSError:
            return False

    def run_dry(self) -> dict[str, Any]:
        """Three nodes, one slow, eviction in dry-run: recorded, nothing evicted."""
        n = self.nproc
        self.start_services()
        for node in ("node-a", "node-b", "node-c"):
            self.agent(node)
        self.wait(lambda: self.steps_in(3 * n) >= 20, "20 steps on the full world")
        (self.state / "slow-node-b").touch()
        self.mark("straggler_planted", node="node-b")
        return self._finish(["node-a", "node-b", "node-c"])

    def _finish(self, survivors: list[str]) -> dict[str, Any]:
        self.wait(lambda: self.agents_done(survivors), "the job to finish")
        codes = {name: p.returncode for name, p in self.procs.items()
                 if name not in ("collector", "store")}
        self.mark("job_finished", codes=codes)
        time.sleep(1)
        self.stop()
        summary = {"run_id": self.run_id, "db": str(self.db), "timeline": self.timeline,
                   "exit_codes": codes, "url": self.url}
        (self.out / "scenario.json").write_text(json.dumps(summary, indent=1))
        return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".goodlens/faults", help="folder for the store and logs")
    p.add_argument("--run-id", default="faults")
    p.add_argument("--dry-run", action="store_true", help="eviction in dry-run mode")
    p.add_argument("--evict-only", action="store_true",
                   help="the eviction alone: three nodes and a hot spare")
    p.add_argument("--steps", type=int, default=0,
                   help="default: 260 (dry run: 120, eviction alone: 200)")
    p.add_argument("--nproc", type=int, default=2, help="processes per node")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--store", type=int, default=0, help=argparse.SUPPRESS)
    args, extra = p.parse_known_args(argv)
    if args.store:
        serve_store(args.store)
        return 0
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps = args.steps or (120 if args.dry_run else 200 if args.evict_only else 260)
    sc = Scenario(out, args.run_id, args.nproc, steps, "dry_run" if args.dry_run else "on",
                  args.timeout, extra)
    try:
        summary = (sc.run_dry() if args.dry_run else sc.run_evict() if args.evict_only
                   else sc.run_full())
    finally:
        sc.stop()
    print(f"[scenario] done: {json.dumps(summary['exit_codes'])}")
    print(f"  goodlens report --db {sc.db} --run {args.run_id}")
    print(f"  goodlens dashboard --db {sc.db}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
