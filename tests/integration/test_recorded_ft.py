"""Per-step fault tolerance (torchft), recorded and replayed exactly: a replica group killed
and healed live, a straggling group evicted while the others train, a hot spare joining.

The recording ``torchft`` (``tests/record/ft.py``) is ``examples/ft/scenario.py``'s full
run: three replica groups (one torchrun and one gloo rank each) and a spare under one
torchft lighthouse, 200 committed steps of 8 samples per group; ``g1`` killed mid-step,
``g2`` slowed and evicted through ``/v1/actions``, spare ``g3`` in its place. Expected
values come from the job's own clock lines (each rank's ``rank<R>-attempt<A>.jsonl``:
its process start, every step's start, end, commit and participants, the kill, the first
step back, the eviction), its settings (``job.json``) and hand arithmetic; never from
goodlens. The live smoke test is ``tests/e2e/test_ft_smoke.py``.

Tolerances: instants goodlens takes from the same clock reading the job wrote down (a
step's start, its end) agree within 5 ms, the time between the exporter's reading and the
job's next line; a process start is read from ``/proc`` twice (by the exporter and by the
job), each to a 10 ms clock tick: 20 ms.
"""

from __future__ import annotations

import itertools

import pytest

from tests.jobclock import JobResult, buckets_sum_to_wall_clock
from tests.recorded import replay

SAME_READING_S = 0.005
PROCESS_START_S = 0.02


METRICS: dict[str, str] = {}
"""``/metrics`` as the last detection pass left it."""
OFFERED: dict[str, float] = {}
"""Host -> the first detection pass (its recorded instant) whose ``/v1/actions`` offered
an ``evict`` for it."""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    def poll(col: object, now: float) -> None:
        for f in col.get("/v1/actions", run="ft")["evict"]:  # type: ignore[attr-defined]
            OFFERED.setdefault(f["host"], now)
        col.sync()  # type: ignore[attr-defined]
        METRICS["text"] = col.http("GET", "/metrics")[1]  # type: ignore[attr-defined]
    return replay("torchft", tmp_path_factory.mktemp("torchft"), each_pass=poll)


def _ft(job: JobResult) -> dict:
    return job.report["fault_tolerance"]


def _group(job: JobResult, name: str) -> dict:
    return next(g for g in _ft(job)["groups"] if g["group"] == name)


def _index(name: str) -> int:
    return int(name.removeprefix("g"))


def _steps(job: JobResult, group: str, attempt: int | None = None) -> list[dict]:
    """The group's rank 0 step lines (its own clock), in order."""
    return job.lines("step", rank=_index(group), attempt=attempt)


def test_every_second_and_gpu_second_lands_in_one_bucket(job: JobResult) -> None:
    buckets_sum_to_wall_clock(job.report)
    ft = _ft(job)
    total = 0.0
    for g in ft["groups"]:
        held = g["allocated_to"] - g["allocated_from"]
        assert sum(g["seconds"].values()) == pytest.approx(held, abs=1e-6), g["group"]
        total += held * ft["gpus_per_group"]
    gpu = ft["gpu_seconds"]
    assert gpu["allocated"] == pytest.approx(total, abs=1e-6)
    assert sum(v for k, v in gpu.items() if k != "allocated") == pytest.approx(total, abs=1e-6)
    assert job.report["buckets"]["restart"] == 0.0   # nobody restarted the job


def test_the_killed_group_heals_and_rejoins_on_the_jobs_clock(job: JobResult) -> None:
    s = job.job["settings"]
    killed = s["killed"]
    (rec,) = [r for r in _ft(job)["recoveries"] if r["group"] == killed]
    (kill,) = job.lines("kill", rank=_index(killed), attempt=0)
    (start,) = job.lines("process_start", rank=_index(killed), attempt=1)
    assert rec["attempt"] == 1
    # the last step it committed ended before the kill, and the others noticed after it:
    # when the first of them gave up the step in flight (its own clock's end of it)
    assert rec["last_step_end"] <= kill["time"] <= rec["detected"]
    gave_up = []
    for name in ("g0", "g2"):
        lines = _steps(job, name, 0)
        gave_up += [x["end"] for prev, x in zip([{"discarded": 0}, *lines], lines)
                    if x["discarded"] > prev["discarded"]]
    assert rec["detected"] == pytest.approx(min(gave_up), abs=SAME_READING_S)
    assert rec["restarted"] == pytest.approx(start["at"], abs=PROCESS_START_S)
    assert rec["restarted"] <= rec["heal_start"] <= rec["heal_end"] <= rec["rejoined"]
    # back: the first step it took part in again, as its own clock says
    (back,) = job.lines("rejoined", rank=_index(killed), attempt=1)
    first = next(x for x in _steps(job, killed, 1) if x["step"] == back["step"])
    assert rec["rejoined"] == pytest.approx(first["start"], abs=SAME_READING_S)
    assert rec["out_s"] == pytest.approx(first["start"] - rec["last_step_end"],
                                         abs=SAME_READING_S)
    heal = next(h for h in _ft(job)["heals"] if h["group"] == killed
                and h["start"] >= rec["restarted"])
    # the model's state: Linear(16, 16) and Linear(16, 1), float32, SGD without momentum
    assert heal["bytes"] == (16 * 16 + 16 + 16 * 1 + 1) * 4
    assert heal["transport"] == "HTTPTransport" and not heal["failed"]
    g = _group(job, killed)
    assert g["attempts"] == 2 and not g["evicted"]
    for part in ("detection", "restart", "init", "heal"):
        assert g["seconds"][part] > 0, part


def test_the_survivors_discard_the_step_in_flight(job: JobResult) -> None:
    s = job.job["settings"]
    killed = s["killed"]
    (kill,) = job.lines("kill", rank=_index(killed), attempt=0)
    discards = []
    for name in ("g0", "g2"):
        lines = _steps(job, name, 0)
        # the job's own count of discarded steps: where its `discarded` counter grew
        mine = [x for prev, x in zip([{"discarded": 0}, *lines], lines)
                if x["discarded"] > prev["discarded"]]
        assert len(mine) == _group(job, name)["steps_discarded"], name
        discards += mine
        ev = job.events[(job.events.kind == "step_discarded") & (job.events.label == name)]
        assert len(ev) == len(mine)
        for line, t_end in zip(mine, sorted(ev.time)):
            assert t_end == pytest.approx(line["end"], abs=SAME_READING_S)
    assert discards and all(x["start"] <= kill["time"] <= x["end"] for x in discards)
    # the wall-clock: the survivors' discarded steps (overlapping: counted once)
    lo, hi = min(x["start"] for x in discards), max(x["end"] for x in discards)
    assert job.report["buckets"]["recompute"] == pytest.approx(hi - lo, abs=2 * SAME_READING_S)


def test_steps_run_short_and_samples_against_the_full_world(job: JobResult) -> None:
    """Per committed step, the groups whose gradients were in it: each group's own line
    says whether it took part (torchft's ``is_participating``; a healing group's gradients
    are zeroed, though torchft's ``num_participants`` and ``batches_committed`` count it)."""
    s = job.job["settings"]
    ft = _ft(job)
    took_part: dict[int, int] = {}
    for lines in job.truth.values():
        steps = [x for x in lines if x["kind"] == "step"]
        for prev, x in zip([{"committed": 0}, *steps], steps):
            if x["committed"] > prev["committed"] and x["participating"]:
                took_part[x["step"]] = took_part.get(x["step"], 0) + 1
    committed = set()                          # a step any group committed is the job's
    for lines in job.truth.values():
        steps = [x for x in lines if x["kind"] == "step"]
        committed |= {x["step"] for prev, x in zip([{"committed": 0}, *steps], steps)
                      if x["committed"] > prev["committed"]}
    assert len(committed) == s["steps"] == ft["steps"]["committed"]
    short = [n for n in committed if took_part.get(n, 0) < s["groups"]]
    assert ft["steps"]["short"] == len(short)
    assert ft["samples"]["committed"] == sum(took_part.values()) * s["batch"]
    runs = ft["steps"]["discarded"]
    assert ft["samples"]["full_world"] == (s["steps"] + runs) * s["groups"] * s["batch"]
    sm = ft["samples"]
    assert sm["committed"] + sm["discarded"] + sm["missing_groups"] == sm["full_world"]


def test_the_planted_slow_group_is_the_one_evicted(job: JobResult) -> None:
    s = job.job["settings"]
    evicted = [g["group"] for g in _ft(job)["groups"] if g["evicted"]]
    assert evicted == [s["slow"]]
    (onset,) = job.lines("slow_onset", rank=_index(s["slow"]))
    (left,) = job.lines("evicted", rank=_index(s["slow"]))
    assert onset["time"] < left["time"]
    ev = job.events[job.events.kind == "rank_evicted"]   # every decision, refusals too
    assert set(ev.host) == {s["slow"]}
    assert len(ev[ev.cause == "straggler"]) == 1
    assert _group(job, s["slow"])["allocated_to"] == pytest.approx(left["time"], abs=0.05)
    # the collector offered it while the job ran (a group out of the quorum sends nothing
    # for its steps: the detector must not wait for it), at most one 2 s pass before the
    # job acted, and only it
    assert set(OFFERED) == {s["slow"]}
    assert onset["time"] < OFFERED[s["slow"]] <= left["time"] + 2.0


def test_the_others_never_stop(job: JobResult) -> None:
    g0 = _group(job, "g0")
    assert g0["attempts"] == 1 and not g0["evicted"]
    assert not [r for r in _ft(job)["recoveries"] if r["group"] == "g0"]
    assert {a for (r, a) in job.truth if r == 0} == {0}   # one process, never restarted
    lines = _steps(job, "g0", 0)
    gaps = [b["start"] - a["end"] for a, b in itertools.pairwise(lines)]
    # between two of its steps it never waited longer than the lighthouse drops a silent
    # group after (2 s, examples/ft/scenario.py)
    assert max(gaps) < 2.0


def test_the_spare_joins_at_a_quorum(job: JobResult) -> None:
    s = job.job["settings"]
    spare = _group(job, s["spare"])
    assert spare["spare"] and spare["attempts"] == 1
    (start,) = job.lines("process_start", rank=_index(s["spare"]), attempt=0)
    assert spare["allocated_from"] == pytest.approx(start["at"], abs=PROCESS_START_S)
    (go,) = job.lines("spare_go", rank=_index(s["spare"]))
    (back,) = job.lines("rejoined", rank=_index(s["spare"]))
    first = next(x for x in _steps(job, s["spare"]) if x["step"] == back["step"])
    rows = job.steps[(job.steps["rank"] == _index(s["spare"])) & (job.steps.samples > 0)]
    assert float(rows.start_time.min()) == pytest.approx(first["start"], abs=SAME_READING_S)
    # idle from its start until told to go, then a heal and its admission
    assert spare["seconds"]["spare_idle"] >= go["time"] - start["at"] - PROCESS_START_S
    assert spare["seconds"]["heal"] > 0
    # recorded with its cause, at that step
    joined = job.events[(job.events.kind == "rank_joined") &
                        (job.events["rank"] == _index(s["spare"]))]
    assert list(joined.cause) == ["spare"]
    assert float(joined.time.iloc[0]) == pytest.approx(first["start"], abs=SAME_READING_S)


def test_the_healed_group_is_recorded_rejoining(job: JobResult) -> None:
    killed = job.job["settings"]["killed"]
    (back,) = job.lines("rejoined", rank=_index(killed), attempt=1)
    first = next(x for x in _steps(job, killed, 1) if x["step"] == back["step"])
    ev = job.events[(job.events.kind == "rank_joined") &
                    (job.events["rank"] == _index(killed))]
    healed = ev[ev.cause == "healed"]
    assert len(healed) == 1
    assert float(healed.time.iloc[0]) == pytest.approx(first["start"], abs=SAME_READING_S)


def _series(name: str) -> dict[str, float]:
    """``/metrics`` samples of ``name`` for run ``ft``: label text -> value."""
    out = {}
    for line in METRICS["text"].splitlines():
        if line.startswith(name + "{") and 'run="ft"' in line:
            labels, value = line[len(name):].rsplit(" ", 1)
            out[labels] = float(value)
    return out


def test_metrics_carry_the_groups_and_their_restarts(job: JobResult) -> None:
    s = job.job["settings"]
    (groups,) = _series("goodlens_run_ft_replica_groups").values()
    assert groups == s["groups"]
    (now,) = _series("goodlens_run_ft_groups_participating").values()
    assert now == s["groups"]                      # g0, g1 healed, g3 for g2: whole again
    (restarts,) = _series("goodlens_run_ft_group_restarts_total").values()
    assert restarts == 1                           # g1, killed once
    gpu = _series("goodlens_run_ft_gpu_seconds")
    assert sum(gpu.values()) == pytest.approx(_ft(job)["gpu_seconds"]["allocated"], rel=1e-6)
