"""Recipes: the framework jobs (FSDP2 and HSDP, Lightning, the Hugging Face Trainer, the
collective-share DDP jobs) under torchrun, their faults planted.

Each job's settings are a dict here, stored as ``job.json``'s ``settings``: the replay tests
(``tests/integration/test_recorded_{fsdp2,lightning,hf,share}.py``) read them from the
recording, so a recording and its claims cannot disagree about what was planted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.framework_jobs import torchrun_job
from tests.harness import Collector
from tests.record import Capture, recipe

#: fsdp2 (``train_fsdp2.py``, 3 ranks, one sharded block and the root): a data stall on
#: every rank at steps 5 and 6, every rank's root reduce-scatter entered 100 ms late on the
#: even steps of [8, 48), rank 2 12 ms slow from step 50, saves every 20 steps, rank 1 killed
#: at step 110 and the job resumed from step 99's checkpoint (``resumed``: its first step).
#: Three ranks and one block: FSDP2 on CPU costs ~33 ms of CPU a rank a step at three
#: blocks, and 4 ranks on 2 cores then queue for the CPU inside every collective.
FSDP2 = {"ranks": 3, "steps": 130, "ckpt_every": 20, "compute_ms": 20.0, "layers": 1,
         "slow_rank": 2, "slow_ms": 12.0, "slow_from": 50, "kill_rank": 1, "kill_at": 110,
         "resumed": 100, "stall_at": [5, 6], "stall_ms": 300.0,
         "rs_delay_ranks": [0, 1, 2], "rs_delay_ms": 100.0, "rs_delay_steps": [8, 48]}
#: hsdp (``train_fsdp2.py --hsdp``, 4 ranks on a (2, 2) mesh: 0-1 and 2-3 shard, 0-2 and
#: 1-3 replicate): rank 0 12 ms slow from step 20, no restart
HSDP = {"ranks": 4, "steps": 90, "compute_ms": 20.0, "slow_rank": 0, "slow_ms": 12.0,
        "slow_from": 20}
#: lightning (``train_lightning.py``, 4 ranks, DDP strategy): a data stall on every rank at
#: steps 30 and 70, rank 2 10 ms slow from step 10, saves and validation every 20 steps,
#: rank 1 killed at step 118 and ``fit(ckpt_path=...)`` resumed at global_step 100
LIGHTNING = {"ranks": 4, "steps": 160, "ckpt_every": 20, "val_every": 20, "compute_ms": 20.0,
             "slow_rank": 2, "slow_ms": 10.0, "slow_from": 10, "kill_rank": 1, "kill_at": 118,
             "resumed": 100, "stall_at": [30, 70], "stall_ms": 300.0}
#: hf (``train_hf.py``, 3 ranks, gradient accumulation 2): a data stall on every rank at
#: steps 8 and 9, rank 2 25 ms slow from step 10, an evaluation (150 ms planted) every 20
#: steps, a checkpoint every 10, rank 1 killed at step 55 and the Trainer resumed from
#: checkpoint-50. Three ranks: the Trainer's own CPU per step is ~10 ms a rank, and 4 ranks
#: on 2 cores queue for the CPU.
HF = {"ranks": 3, "steps": 110, "ckpt_every": 10, "eval_every": 20, "eval_ms": 150.0,
      "accum": 2, "compute_ms": 20.0, "slow_rank": 2, "slow_ms": 25.0, "slow_from": 10,
      "kill_rank": 1, "kill_at": 55, "resumed": 50, "stall_at": [8, 9], "stall_ms": 300.0}
#: share-N (``train_ddp_share.py``, 3 DDP ranks, the fewest the detector scores): rank 1 10 ms
#: slow from step 5, every rank's all-reduce completing ``comm_ms`` after its transfer, sized
#: so that the collective is N% of the step
SHARE = {"ranks": 3, "steps": 50, "compute_ms": 40.0, "slow_rank": 1, "slow_ms": 10.0,
         "slow_from": 5}
#: the step less its collective: the compute, the planted sleep and ~3 ms of the MLP, the
#: optimizer and the exporter; and the all-reduce's own time before any planted delay
#: (3-4 ms on 3 ranks sharing 2 cores)
OWN_MS = SHARE["compute_ms"] + SHARE["slow_ms"] + 3.0
TRANSFER_MS = 4.0


def comm_ms(share: float) -> float:
    """The planted collective time that makes the collective ``share`` of the step (none
    for 0: the all-reduce alone)."""
    return max(0.0, share / (1.0 - share) * OWN_MS - TRANSFER_MS)


def fault_args(s: dict[str, Any]) -> list[str]:
    """The shared fault flags (``examples/integrations/jobclock.py``) for settings ``s``."""
    args = ["--steps", str(s["steps"]), "--compute-ms", str(s["compute_ms"]),
            "--slow-rank", str(s["slow_rank"]), "--slow-ms", str(s["slow_ms"]),
            "--slow-from", str(s["slow_from"])]
    if "kill_rank" in s:
        args += ["--kill-rank", str(s["kill_rank"]), "--kill-at", str(s["kill_at"])]
    if "stall_at" in s:
        args += ["--stall-at", ",".join(map(str, s["stall_at"])),
                 "--stall-ms", str(s["stall_ms"])]
    return args


def record(tmp: Path, script: str, run_id: str, s: dict[str, Any], *extra: str,
           restarts: int = 0) -> Capture:
    """Run ``script`` with settings ``s`` (and ``extra`` flags) against a live collector
    and keep what it stored, the job's clock and the command line."""
    args = [*fault_args(s), *extra]
    c = Collector(tmp / f"{run_id}.duckdb").start()
    try:
        torchrun_job(tmp, c.url, script, run_id, *args, nproc=s["ranks"], restarts=restarts,
                     timeout=300)
        c.sync()
    finally:
        c.stop()
    return Capture(Path(c.db), run_id, tmp / "truth",
                   {"settings": s, "ranks": s["ranks"], "script": script, "args": args,
                    "restarts": restarts})


@recipe("fsdp2")
def fsdp2(tmp: Path) -> Capture:
    s = FSDP2
    return record(tmp, "train_fsdp2.py", "fsdp2", s, "--ckpt-every", str(s["ckpt_every"]),
                  "--layers", str(s["layers"]),
                  "--rs-delay-ranks", ",".join(map(str, s["rs_delay_ranks"])),
                  "--rs-delay-ms", str(s["rs_delay_ms"]),
                  "--rs-delay-steps", "{}:{}".format(*s["rs_delay_steps"]), restarts=1)


@recipe("hsdp")
def hsdp(tmp: Path) -> Capture:
    return record(tmp, "train_fsdp2.py", "hsdp", HSDP, "--hsdp")


@recipe("lightning")
def lightning(tmp: Path) -> Capture:
    s = LIGHTNING
    return record(tmp, "train_lightning.py", "lightning", s,
                  "--ckpt-every", str(s["ckpt_every"]), "--val-every", str(s["val_every"]),
                  restarts=1)


@recipe("hf")
def hf(tmp: Path) -> Capture:
    s = HF
    return record(tmp, "train_hf.py", "hf", s, "--ckpt-every", str(s["ckpt_every"]),
                  "--eval-every", str(s["eval_every"]), "--eval-ms", str(s["eval_ms"]),
                  "--accum", str(s["accum"]), restarts=1)


def _share(share: float) -> None:
    name = f"share-{round(100 * share)}"

    @recipe(name)
    def run(tmp: Path) -> Capture:
        s = {**SHARE, "share": share, "comm_ms": comm_ms(share)}
        return record(tmp, "train_ddp_share.py", name, s, "--comm-ms", str(s["comm_ms"]))


for _s in (0.0, 0.15, 0.40):
    _share(_s)
