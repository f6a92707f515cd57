"""The fleet table: one row per run and attempt, with the report's numbers, for plain SQL.

Why a module of its own: a question about a thousand runs (goodput by week and job name,
GPU-hours lost to restarts per cluster) is a GROUP BY over one flat table, which any engine
answers (DuckDB, Spark, Trino) without goodlens. This builds that table's rows from the
accounting every report uses (:func:`goodlens.analysis.accounting.account_run`, over the
run's step summaries and events), so its numbers are the report's: per attempt, its
breakdown (each attempt owns the time until the next one starts, so a run's attempts add up
to the run), every bucket, the parts of startup and restart, GPU-hours, ranks and state.
Reading every run's inputs at once and writing the table are storage's job
(:mod:`goodlens.storage.fleetio`).

Sums over rows are meaningful (seconds, GPU-hours); ratios are not: a goodput over many
rows is ``sum(productive_s) / sum(wall_clock_s)`` (docs/spark.md has the example query).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd

from goodlens.analysis.accounting import BUCKETS, RESTART_PARTS, STARTUP_PARTS, account_run
from goodlens.analysis.worlds import attempt_worlds
from goodlens.model.jsonable import is_missing

#: The fleet table's columns: name, kind (``str``, ``int``, ``float``, ``bool``, ``time``:
#: a UTC instant without a time zone) and meaning. docs/spark.md lists them.
FLEET_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("run_id", "str", "the run"),
    ("name", "str", "the run's name (its metadata); null when it gave none"),
    ("attempt", "int", "the attempt (0 for the first incarnation)"),
    ("attempts", "int", "attempts of the run"),
    ("state", "str", "the run's state: running, completed, failed, preempted, ..."),
    ("attempt_end", "str", "how the attempt ended (completed, failed, preempted, unknown; "
                           "null while it runs)"),
    ("run_start_utc", "time", "the run's start, UTC"),
    ("start_utc", "time", "the attempt's start, UTC"),
    ("end_utc", "time", "the end of the attempt's time: the next attempt's start, or the "
                        "run's end (now for a run in progress), UTC"),
    ("wall_clock_s", "float", "the attempt's wall-clock: every bucket below sums to it"),
    ("goodput", "float", "productive_s / wall_clock_s (0 for an empty attempt)"),
    *((f"{b}_s", "float", f"seconds in the {b} bucket" + (
        " (null: not measured, no rank reported a compute/wait split)"
        if b == "straggler_wait" else "")) for b in BUCKETS),
    *((f"startup_{p}_s", "float", f"startup part {p}") for p in STARTUP_PARTS),
    *((f"restart_{p}_s", "float", f"restart part {p}") for p in RESTART_PARTS),
    ("other_parts", "str", "other's parts as a JSON object of seconds (unexplained, "
                           "input_stall, shutdown, custom labels, ...)"),
    ("ranks", "int", "most ranks that reported a step of the attempt"),
    ("world_size", "int", "ranks at launch (the run's metadata)"),
    ("gpus_allocated", "float", "GPUs the accounting weighs time by: the largest world "
                                "times GPUs per rank, plus spares"),
    ("gpu_hours", "float", "allocated GPU-hours: gpus_allocated x wall-clock"),
    ("gpu_hours_productive", "float", "productive GPU-hours (a shrunk world makes fewer)"),
    ("gpu_time_goodput", "float", "gpu_hours_productive / gpu_hours"),
    ("steps_kept", "int", "steps kept"),
    ("steps_recomputed", "int", "steps redone after a rollback"),
    ("steps_incomplete", "int", "steps fewer ranks reported than the attempt's most"),
    ("straggler_wait_measured", "float", "share of step time whose compute split was "
                                         "reported (1: all)"),
    ("in_progress", "bool", "the run had not ended when the row was computed"),
)
FLEET_NAMES = [name for name, _, _ in FLEET_COLUMNS]


def fleet_rows(runs: pd.DataFrame, attempts: pd.DataFrame, steps: pd.DataFrame,
               events: pd.DataFrame, now: float | None = None,
               progress: Callable[[list[str]], Iterable[str]] = iter) -> pd.DataFrame:
    """The fleet table of every run in ``runs`` (the runs list's rows) from every run's
    ``attempts``, ``steps`` (step summaries) and ``events`` (at least the kinds the
    accounting reads), each with a ``run_id`` column (:func:`goodlens.storage.fleetio.
    read_inputs` reads them at once), as a frame with :data:`FLEET_NAMES` columns ordered
    by run and attempt. ``now``: the instant runs in progress are accounted to (default:
    the current time, once for every run); ``progress`` wraps the run ids being accounted
    (a progress bar). A run with no attempt has no row."""
    now = time.time() if now is None else now
    source = _Frames(runs, attempts, steps, events)
    rows: list[dict[str, Any]] = []
    for run_id in progress(sorted(source.meta)):
        rows += _run_rows(source, run_id, now)
    frame = pd.DataFrame(rows, columns=FLEET_NAMES)
    return frame.sort_values(["run_id", "attempt"], kind="stable").reset_index(drop=True)


class _Frames:
    """Every run's frames, split by run, answering the reads the accounting makes of one
    run (:class:`goodlens.storage.reader.RunReader`'s ``run``, ``attempts``,
    ``step_summaries`` and ``events``) without a store."""

    def __init__(self, runs: pd.DataFrame, attempts: pd.DataFrame, steps: pd.DataFrame,
                 events: pd.DataFrame) -> None:
        self.meta = {str(r["run_id"]): r for r in runs.to_dict("records")}
        self._att = _split(attempts, keep_run=False)
        self._steps = _split(steps, keep_run=True)
        self._ev = _split(events, keep_run=False)
        self._empty = {"att": attempts.drop(columns="run_id").iloc[:0],
                       "steps": steps.iloc[:0], "ev": events.drop(columns="run_id").iloc[:0]}

    def run(self, run_id: str) -> dict[str, Any] | None:
        return self.meta.get(run_id)

    def attempts(self, run_id: str) -> pd.DataFrame:
        return self._att.get(run_id, self._empty["att"])

    def step_summaries(self, run_id: str) -> pd.DataFrame:
        return self._steps.get(run_id, self._empty["steps"])

    def events(self, run_id: str, kinds: list[str] | None = None) -> pd.DataFrame:
        ev = self._ev.get(run_id, self._empty["ev"])
        return ev[ev.kind.isin([str(k) for k in kinds])] if kinds is not None else ev


def _split(frame: pd.DataFrame, keep_run: bool) -> dict[str, pd.DataFrame]:
    """``frame`` by ``run_id`` (each part in its order, re-indexed from 0)."""
    runs = frame.run_id.to_numpy()
    body = frame if keep_run else frame.drop(columns="run_id")
    return {str(run_id): part.reset_index(drop=True)
            for run_id, part in body.groupby(runs, sort=False)}


def _run_rows(source: _Frames, run_id: str, now: float) -> list[dict[str, Any]]:
    """One run's rows: one per attempt."""
    meta = source.meta[run_id]
    attempts, steps = source.attempts(run_id), source.step_summaries(run_id)
    if not len(attempts):
        return []
    # _Frames answers the reads account_run makes of a RunReader
    acc = account_run(source, run_id, now=now, attempts=attempts, steps=steps)  # type: ignore
    ends = {int(a): e for a, e in zip(attempts.attempt, attempts.end_reason)}
    ranks = {w["attempt"]: w["world_size"] for w in attempt_worlds(steps)}
    world = meta.get("world_size")
    out = []
    for b in acc.by_attempt():
        g = b.gpu_seconds
        row = {"run_id": run_id, "name": _text(meta.get("name")), "attempt": b.attempt,
               "attempts": len(attempts), "state": _text(meta.get("state")),
               "attempt_end": _text(ends.get(b.attempt)), "run_start_utc": acc.start,
               "start_utc": b.start, "end_utc": b.end, "wall_clock_s": b.wall_clock_s,
               "goodput": b.goodput,
               **{f"{k}_s": v for k, v in b.buckets.items()},
               **{f"startup_{k}_s": v for k, v in b.startup_parts.items()},
               **{f"restart_{k}_s": v for k, v in b.restart_parts.items()},
               "other_parts": json.dumps(b.other_parts, sort_keys=True),
               "ranks": ranks.get(b.attempt),
               "world_size": None if is_missing(world) else int(world),
               "gpus_allocated": float(acc.gpus_allocated),
               "gpu_hours": g["allocated"] / 3600.0,
               "gpu_hours_productive": g["productive"] / 3600.0,
               "gpu_time_goodput": b.gpu_time_goodput,
               "steps_kept": b.steps.get("kept"), "steps_recomputed": b.steps.get("recomputed"),
               "steps_incomplete": b.steps.get("incomplete"),
               "straggler_wait_measured": b.straggler_wait_measured,
               "in_progress": bool(b.in_progress)}
        out.append(row)
    return out


def _text(v: Any) -> str | None:
    return None if is_missing(v) else str(v)
