"""Live framework jobs (FSDP2, Lightning, Hugging Face ``Trainer``, DDP): run a job under
torchrun against a real collector, then read what goodlens stored and the job's own clock
(:mod:`tests.jobclock`). Used by the live smoke tests and by the recipes of
``tests/record``, which record these runs for the exact replays in ``tests/integration/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ROOT, Collector, http, job_env, kill_tree
from tests.jobclock import JobResult, read_truth

JOBS = ROOT / "examples" / "integrations"


def torchrun_job(tmp_path: Path, url: str, script: str, run_id: str, *args: str,
                 nproc: int = 4, restarts: int = 0, timeout: float = 240) -> str:
    """Run ``examples/integrations/<script>`` under torchrun (``nproc`` ranks, gloo) against
    the collector at ``url``, its clock in ``tmp_path/truth``, to its end, which must be
    clean; its output (also in ``tmp_path/<run_id>.log``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", f"--max-restarts={restarts}", str(JOBS / script),
           "--url", url, "--run-id", run_id, "--ckpt-dir", str(tmp_path / "ckpt"),
           "--truth-dir", str(tmp_path / "truth"), *args]
    log_path = tmp_path / f"{run_id}.log"
    env = job_env({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                   "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                   "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        pytest.fail(f"torchrun timed out: {log_path.read_text()[-4000:]}")
    text = log_path.read_text(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    return text


def run_job(tmp_path: Path, script: str, run_id: str, *args: str, nproc: int = 4,
            restarts: int = 0, timeout: float = 240, detect: bool = False) -> JobResult:
    """Run ``examples/integrations/<script>`` under torchrun (:func:`torchrun_job`) with a
    collector, then read the report (``/v1/report``, as ``goodlens report --json``), the
    store and the job's clock. ``detect``: after the job, a detection pass over its last
    steps before the collector stops."""
    c = Collector(tmp_path / f"{run_id}.duckdb").start()
    try:
        text = torchrun_job(tmp_path, c.url, script, run_id, *args, nproc=nproc,
                            restarts=restarts, timeout=timeout)
        # summarised first, then a detection pass: the live detector reads step summaries,
        # which a loaded collector may make only at the sync
        c.sync(detect=detect)
        status, report = http("GET", f"{c.url}/v1/report?run={run_id}")
        assert status == 200, report
    finally:
        rc = c.stop()
    assert rc == 0, f"the collector exited {rc}: {c.log.read_text()[-4000:]}"
    res = JobResult(c.db, run_id, read_truth(tmp_path / "truth"), report=report, log=text)
    from goodlens.storage.store import Store
    store = Store(c.db, read_only=True)
    try:
        res.steps, res.events = store.steps(run_id), store.events(run_id)
    finally:
        store.close()
    return res


DDP = ROOT / "examples" / "train_ddp.py"


def torchrun_ddp(tmp_path: Path, url: str, run_id: str, *args: str, nproc: int = 4,
                 restarts: int = 0, timeout: float = 60, wait: bool = True,
                 launcher: str = "torch.distributed.run",
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    """Run ``examples/train_ddp.py`` under torchrun (or ``launcher``, a module taking
    torchrun's arguments: ``goodlens.exporter.launch``) with ``nproc`` ranks, its output in
    ``tmp_path/<run_id>.log``; with ``wait``, to its end, which must be clean."""
    cmd = [sys.executable, "-m", launcher, "--standalone",
           f"--nproc_per_node={nproc}", f"--max-restarts={restarts}", str(DDP),
           "--url", url, "--run-id", run_id, "--ckpt-dir", str(tmp_path / "ckpt"), *args]
    log_path = tmp_path / f"{run_id}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=job_env(env))
    if wait:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            pytest.fail(f"torchrun timed out: {log_path.read_text()[-3000:]}")
        assert proc.returncode == 0, log_path.read_text()[-3000:]
    return proc


def the_planted_rank_is_named(res: JobResult, rank: int) -> dict:
    """The finding that cost the job the most straggler wait names ``rank`` alone: a smoke
    job plants a slowdown of the order of its step, which on any load no healthy rank's own
    delays come near (the estimate itself is the recorded runs' claim). Returns it."""
    found = res.findings()
    assert found, "no straggler finding"
    top = max(found, key=lambda f: f["straggler_wait_s"])
    assert top["ranks"] == [rank], found
    return top


def events_of(res: JobResult, kind: str, attempt: int | None = None) -> Any:
    """The stored events of ``kind`` (in ``attempt`` when given)."""
    ev = res.events
    ev = ev[ev.kind == kind]
    return ev if attempt is None else ev[ev.attempt == attempt]


def the_events_are_there(res: JobResult, ranks: int, saved: list[set[int]]) -> None:
    """What the exporter must send whatever the load: every rank's ``attempt_start`` in
    each attempt (``saved`` has one entry per attempt), a durable checkpoint save at each
    step of ``saved[attempt]`` (the step the save followed), and the last attempt ended
    ``completed`` by every rank."""
    everyone = set(range(ranks))
    ev = res.events
    assert sorted(set(ev.attempt.dropna().astype(int))) == list(range(len(saved))), \
        sorted(set(ev.attempt))
    for attempt, steps in enumerate(saved):
        assert set(events_of(res, "attempt_start", attempt)["rank"]) == everyone, attempt
        assert set(events_of(res, "ckpt_save_durable_end", attempt).step) == steps, attempt
    ended = events_of(res, "attempt_end", len(saved) - 1)
    assert set(ended["rank"]) == everyone, ended
    assert set(ended.cause) == {"completed"}, ended
