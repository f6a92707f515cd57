"""Async DCP checkpoints under torchrun, recorded and replayed exactly.

The recording ``async-dcp`` (``tests/record/elastic.py``) is ``examples/train_ddp.py
--async-ckpt`` on 2 gloo ranks: an ``async_save`` every 10 steps on a gloo group of its own,
rank 1 exiting at step 38 of the first attempt, torchrun restarting both ranks, which resume
from the last checkpoint. ``job.json`` holds the bytes of every file of every checkpoint
folder the job left (the replay has no files). The replay pushes what the live collector
stored through the in-process collector; the expected values come from the job's settings,
its clock and those file sizes. A single-process test of the same saves, with files and
clocks of its own, is ``tests/e2e/test_torch_async.py``.
"""

from __future__ import annotations

import pytest

from tests.jobclock import JobResult
from tests.recorded import replay


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    return replay("async-dcp", tmp_path_factory.mktemp("async-dcp"))


def saves(job: dict) -> tuple[list[int], int]:
    """The steps that saved (every ``ckpt_every``-th, by hand) and the last one before the
    crash: the one the restart resumes from."""
    s = job["settings"]
    steps = list(range(s["ckpt_every"] - 1, s["steps"], s["ckpt_every"]))
    return steps, max(x for x in steps if x < s["kill_at"])


def test_the_job_left_a_folder_per_save(run):
    steps, _ = saves(run.job)
    assert sorted(int(k) for k in run.job["ckpt_files"]) == steps   # 9, 19, ..., 59


def own_files(files: dict[str, int], rank: int) -> int:
    """The bytes ``rank`` wrote of a checkpoint folder: its shard (``__R_0.distcp``), and
    for rank 0, DCP's coordinator, the ``.metadata``."""
    return files[f"__{rank}_0.distcp"] + (files[".metadata"] if rank == 0 else 0)


def test_every_save_is_durable_on_both_ranks_with_the_folders_bytes(run):
    """Each save's durable end, from both ranks, in the attempt that made it; each rank's
    bytes its own files, together the whole folder; and after the rank's blocking end."""
    steps, resumed = saves(run.job)
    ev = run.events
    durable = ev[ev.kind == "ckpt_save_durable_end"]
    for step in steps:
        rows = durable[durable.step == step]
        files = run.job["ckpt_files"][str(step)]
        assert sorted(files) == [".metadata", "__0_0.distcp", "__1_0.distcp"], files
        for _, row in rows.iterrows():
            assert int(row["bytes"]) == own_files(files, int(row["rank"])), (step, row)
            blk = ev[(ev.kind == "ckpt_save_blocking_end") & (ev.step == step)
                     & (ev["rank"] == row["rank"])]
            assert len(blk) == 1 and float(blk.time.iloc[0]) <= float(row.time)
        if step == resumed and len(rows) < 2:
            # the crash (os._exit, no flush) can come before rank 1 sent this save's events
            assert set(rows["rank"]) <= {0, 1} and set(rows.attempt) <= {0}, rows
            continue
        assert sorted(rows["rank"]) == [0, 1], (step, rows)
        assert set(rows.attempt) == {0 if step <= resumed else 1}
        assert int(rows["bytes"].sum()) == sum(files.values()), (step, files)


def test_the_restart_restores_the_last_save_before_the_crash(run):
    _, resumed = saves(run.job)
    # the job's own clock: both ranks of the restarted attempt restored that step
    restored = {(r, a, x["step"]) for (r, a), lines in run.truth.items()
                for x in lines if x["kind"] == "restore"}
    assert restored == {(0, 1, resumed), (1, 1, resumed)}
    restores = run.events[run.events.kind == "ckpt_restore_end"]
    assert sorted(restores["rank"]) == [0, 1]
    assert set(restores.step) == {resumed} and set(restores.attempt) == {1}
    # each rank read the whole folder (the model is replicated)
    folder = sum(run.job["ckpt_files"][str(resumed)].values())
    assert set(restores["bytes"].astype(int)) == {folder}
