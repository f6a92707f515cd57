"""Per-step fault tolerance on one machine: a replica group lost and healed live, a hot
spare joining, a straggling group evicted, while the others keep training.

Why it exists: it is the torchft half of ``make demo-ft`` (the other half is the restart
path, ``examples/elastic/scenario.py``, on the same fault schedule) and the job of the
``torchft`` recording and the live smoke test. It starts a collector (``goodlens serve``'s
service without the dashboard), a torchft lighthouse (``torchft_lighthouse``) and one
torchrun per replica group (``train_ft.py``, ``--nproc`` ranks each, gloo, its agent
restarting it), all on loopback:

1. groups ``g0``, ``g1``, ``g2`` train together; spare ``g3`` starts and waits, hot;
2. ``g1`` is killed mid-run (its rank 0, SIGKILL); ``g0`` and ``g2`` discard the step in
   flight and go on as two; ``g1``'s agent restarts it, it heals from a peer's memory and
   rejoins at a later quorum;
3. ``g2`` becomes a straggler; the collector's detector confirms ``evict`` and ``g2``
   leaves (``--evict on``) while ``g0`` and ``g1`` go on; the spare ``g3`` is told to join
   and heals in its place;
4. every group reaches ``--steps`` committed steps; the store is left for ``goodlens
   report`` and the dashboard.

``--quick``: steps 1 and 2 only, with two groups (the smoke test's run), ending ten steps
after ``g1`` is back (``STATE/stop``) however long its restart took.
Progress is read from the job's own clock files (``truth/``).

    python examples/ft/scenario.py --out .goodlens/ft   # then: goodlens report ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train_ft.py"
sys.path.insert(0, str(HERE.parent / "elastic"))
from scenario import Scenario as _Base  # noqa: E402  - the elastic scenario's process kit
from scenario import free_port  # noqa: E402


def lighthouse_command(port: int) -> list[str]:
    """The torchft lighthouse on loopback: a quorum every 50 ms, a group that misses its
    heartbeats for 2 s is dropped, and a quorum waits at most 1 s for late joiners."""
    exe = shutil.which("torchft_lighthouse") or str(Path(sys.executable).parent /
                                                   "torchft_lighthouse")
    return [exe, "--min_replicas", "1", "--bind", f"127.0.0.1:{port}",
            "--quorum_tick_ms", "50", "--join_timeout_ms", "1000",
            "--heartbeat_timeout_ms", "2000"]


def clock(truth: Path, width: int = 1) -> list[dict[str, Any]]:
    """Every line the job's ranks wrote (``rank<R>-attempt<A>.jsonl``), with the group
    (``g<R // width>``) and the group's attempt from the file name."""
    out = []
    for f in sorted(truth.glob("rank*-attempt*.jsonl")):
        rank, attempt = f.stem.removeprefix("rank").split("-attempt")
        for line in f.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append({**json.loads(line), "group": f"g{int(rank) // width}",
                            "rank": int(rank), "group_attempt": int(attempt)})
    return out


class FTScenario(_Base):
    """The processes of one torchft scenario and the waits between its phases."""

    def __init__(self, out: Path, run_id: str = "ft", nproc: int = 1, steps: int = 120,
                 step_s: float = 0.05, timeout_s: float = 240.0, evict: str = "on",
                 log: Any = print) -> None:
        super().__init__(out, run_id, nproc, steps, evict, timeout_s, log=log)
        self.step_s = step_s
        self.lh_port = free_port()
        self.groups = 3

    def start_services(self) -> None:
        super().start_services()
        self._spawn("lighthouse", lighthouse_command(self.lh_port))
        self.mark("lighthouse_started", port=self.lh_port)

    def group(self, index: int, *extra: str) -> None:
        """Replica group ``g<index>``: one torchrun agent, restarting its ranks on failure."""
        name = f"g{index}"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nnodes=1", f"--nproc-per-node={self.nproc}", "--max-restarts=3",
               "--monitor-interval=0.2", str(TRAIN), "--group", str(index),
               "--groups", str(self.groups), "--steps", str(self.steps),
               "--step-s", str(self.step_s), "--state", str(self.state),
               "--truth", str(self.truth), "--evict", self.evict, "--spare-groups", "1",
               *extra]
        env = {"GOODLENS_URL": self.url, "GOODLENS_RUN_ID": self.run_id,
               "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{self.lh_port}",
               "OMP_NUM_THREADS": "1", "GOODLENS_SPILL_DIR": str(self.out / "spill")}
        self._spawn(name, cmd, env)
        self.mark("group_started", group=name)

    def committed(self, group: str, **match: Any) -> int:
        """Steps ``group``'s rank 0 committed (lines matching ``match``)."""
        return sum(1 for x in clock(self.truth, self.nproc) if x["group"] == group and
                   x["kind"] == "step" and x.get("committed") and
                   all(x.get(k) == v for k, v in match.items()))

    def said(self, group: str, what: str) -> bool:
        return any(x["group"] == group and x["kind"] == what for x in clock(self.truth, self.nproc))

    def max_step(self) -> int:
        return max((x.get("step", 0) for x in clock(self.truth, self.nproc) if x["kind"] == "step"),
                   default=0)

    def run(self, quick: bool = False) -> dict[str, Any]:
        self.groups = 2 if quick else 3
        self.start_services()
        for i in range(self.groups):
            self.group(i)
        if not quick:
            self.group(3, "--spare")
        self.wait(lambda: self.max_step() >= 20, "20 steps on the full world")
        (self.state / "kill-g1").touch()
        self.mark("kill_planted", group="g1")
        self.wait(lambda: self.said("g1", "rejoined"), "g1 healed and rejoined")
        self.mark("g1_rejoined")
        if quick:   # ten more steps together, then stop, however long g1 took
            (self.state / "stop").write_text(str(self.max_step() + 10))
            return self._finish(["g0", "g1"])
        start = self.max_step()
        self.wait(lambda: self.max_step() >= start + 10, "10 steps on the healed world")
        (self.state / "slow-g2").touch()
        self.mark("straggler_planted", group="g2")
        self.wait(lambda: self.said("g2", "evicted"), "g2 evicted")
        (self.state / "spare-go").touch()
        self.mark("spare_go", group="g3")
        self.wait(lambda: self.said("g3", "rejoined"), "the spare joined")
        return self._finish(["g0", "g1", "g3"])

    def _finish(self, survivors: list[str]) -> dict[str, Any]:
        self.wait(lambda: self.agents_done(survivors), "the job to finish")
        for name in ("lighthouse",):
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(10)
        return super()._finish(survivors)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".goodlens/ft", help="folder for the store and logs")
    p.add_argument("--run-id", default="ft")
    p.add_argument("--steps", type=int, default=0,
                   help="default: 200 (quick: at most 1000, ending 10 steps after g1 is back)")
    p.add_argument("--step-s", type=float, default=0.05, help="compute stand-in per step")
    p.add_argument("--nproc", type=int, default=1, help="ranks per replica group")
    p.add_argument("--quick", action="store_true", help="two groups, one killed and healed")
    p.add_argument("--evict", choices=("on", "dry_run", "off"), default="on")
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    if out.exists():
        for sub in ("truth", "state", "spill"):
            shutil.rmtree(out / sub, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(out / f"{args.run_id}.duckdb")
    out.mkdir(parents=True, exist_ok=True)
    steps = args.steps or (1000 if args.quick else 200)
    sc = FTScenario(out, args.run_id, args.nproc, steps, args.step_s, args.timeout,
                    args.evict)
    try:
        summary = sc.run(quick=args.quick)
    finally:
        sc.stop()
    print(f"[scenario] done: {json.dumps(summary['exit_codes'])}")
    print(f"  goodlens report --db {sc.db} --run {args.run_id}")
    print(f"  goodlens dashboard --db {sc.db}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
