"""Slow and stuck checkpoint restores, from each rank's restore progress.

Why it exists: a rank reading its checkpoint slowly and a dead one look the same until a
timeout, and the right answers differ: a slow one should be left to finish (killing it
restarts everyone's restore), a stuck one should not hold the job behind a barrier for
hours. With ``ckpt_restore_progress`` (bytes read so far and the phase,
:mod:`goodlens.exporter.restore`) the two are told apart:

- ``slow_restore``: a rank whose own restore (its start to the end of its own reads, the
  ``barrier`` phase, or its end) has taken more than ``slow_factor`` x the median rank's,
  and at least ``min_excess_s`` more, once half the ranks have finished their reads;
- ``stuck_restore``: a rank still reading or loading whose bytes and phase have not moved
  for the hang timeout. Only restores that report bytes as they arrive (``live_bytes``)
  can be stuck: a read in one call (a Lightning or Hugging Face file) moves at its end.

A rank waiting in the ``barrier`` phase is neither: it is done and waits for the others.
Every rank in a restore that is not stuck is *moving*: the eviction rails never evict it.
Pure: the caller passes the events and the clock in.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

import pandas as pd

from goodlens.model.schema import EventKind

__all__ = ["RankRestore", "RestoreConfig", "RestoreFinding", "rank_restores", "restore_findings"]

SLOW, STUCK = "slow_restore", "stuck_restore"
_START, _PROGRESS, _END = (EventKind.CKPT_RESTORE_START.value,
                           EventKind.CKPT_RESTORE_PROGRESS.value,
                           EventKind.CKPT_RESTORE_END.value)
#: The event kinds this detector reads.
KINDS = (_START, _PROGRESS, _END)


@dataclass(frozen=True)
class RestoreConfig:
    """Tuning of :func:`restore_findings`."""

    slow_factor: float = 2.0
    """A rank's own restore over this x the median rank's is slow."""
    min_excess_s: float = 5.0
    """...and at least this many seconds over the median: a 0.2 s restore against a 0.05 s
    median is no finding."""

    def __post_init__(self) -> None:
        if not self.slow_factor > 1 or not self.min_excess_s >= 0:
            raise ValueError("RestoreConfig: slow_factor must be > 1 and min_excess_s >= 0")


@dataclass(frozen=True)
class RankRestore:
    """One rank's latest restore in an attempt, as its events tell it."""

    rank: int
    host: str | None
    start: float
    """When its restore began (its ``ckpt_restore_start``, or its first progress event)."""
    read_done: float | None
    """When its own reads were done: it entered ``barrier``, or its restore ended."""
    end: float | None
    """Its ``ckpt_restore_end`` (None while it restores)."""
    phase: str
    """Its latest phase (``read``, ``load``, ``barrier``; ``done`` once ended)."""
    bytes_read: int
    bytes_total: int | None
    last_move: float
    """The latest instant its bytes or its phase changed."""
    live_bytes: bool
    """Whether its bytes move as they are read (else only at phase changes)."""

    def own_s(self, now: float) -> float:
        """Its own restore time: start to the end of its reads (to ``now`` while reading)."""
        return (now if self.read_done is None else self.read_done) - self.start


@dataclass(frozen=True)
class RestoreFinding:
    """A slow or stuck rank of a restore in progress."""

    kind: str
    """``slow_restore`` or ``stuck_restore``."""
    rank: int
    host: str | None
    attempt: int
    phase: str
    restore_s: float
    """Its own restore time so far."""
    median_s: float | None
    """The median rank's own restore time (slow only)."""
    bytes_read: int
    bytes_total: int | None
    started: float
    last_move: float
    silent_s: float
    """Seconds since its bytes or phase last moved."""
    timeout_s: float
    """The hang timeout stuck is judged against."""

    @property
    def advice(self) -> str:
        """What an operator should do about it."""
        return ("wait: it is slow, not dead; do not evict it" if self.kind == SLOW else
                "restart it or its host: its read has stopped")

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON (``/v1/actions``)."""
        return {"kind": self.kind, "rank": self.rank, "host": self.host,
                "attempt": self.attempt, "phase": self.phase, "restore_s": self.restore_s,
                "median_s": self.median_s, "bytes_read": self.bytes_read,
                "bytes_total": self.bytes_total, "started": self.started,
                "last_move": self.last_move, "silent_s": self.silent_s,
                "timeout_s": self.timeout_s, "advice": self.advice}


def _detail(text: Any) -> dict[str, Any]:
    try:
        d = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def rank_restores(events: pd.DataFrame) -> list[RankRestore]:
    """Each rank's latest restore from one attempt's restore events (``kind``, ``time``,
    ``rank``, ``host``, ``bytes``, ``label``, ``detail``; any order). A restore opens at its
    start or at a progress event outside one, and closes at its end or at a progress event
    whose ``detail`` says ``ended`` (a torchft heal)."""
    if not len(events):
        return []
    ev = events[events["rank"].notna()].sort_values(["time", "seq"] if "seq" in events
                                                    else ["time"], kind="stable")
    out = []
    for rank, g in ev.groupby("rank", sort=True):
        cur: dict[str, Any] | None = None
        for kind, t, host, b, label, detail in zip(g.kind, g.time, g.host, g.bytes, g.label,
                                                   g.detail):
            t = float(t)
            if kind == _START or (kind == _PROGRESS and (cur is None or cur["end"] is not None)):
                if kind == _START and cur is not None and cur["end"] is None:
                    cur["host"] = cur["host"] or host  # the start of the open one
                    continue
                cur = {"start": t, "read_done": None, "end": None, "phase": "read",
                       "bytes": 0, "total": None, "last_move": t, "live": False,
                       "host": host}
            if cur is None:
                continue   # an end without a start
            if kind == _END:
                cur["end"] = t
                cur["read_done"] = cur["read_done"] or t
                cur["phase"] = "done"
                cur["last_move"] = t
            elif kind == _PROGRESS:
                d = _detail(detail)
                if d.get("ended"):   # a restore without an end event of its own: a heal
                    cur["end"] = t
                    cur["read_done"] = cur["read_done"] or t
                    cur["phase"], cur["last_move"] = "done", t
                    continue
                n = 0 if pd.isna(b) else int(b)
                if n != cur["bytes"] or label != cur["phase"]:
                    cur["last_move"] = t
                cur["bytes"], cur["phase"] = n, str(label)
                cur["live"] = bool(d.get("live_bytes", cur["live"]))
                if d.get("bytes_total") is not None:
                    cur["total"] = int(d["bytes_total"])
                if label == "barrier" and cur["read_done"] is None:
                    cur["read_done"] = t
        if cur is not None:
            out.append(RankRestore(int(rank), None if pd.isna(cur["host"]) else
                                   str(cur["host"]), cur["start"], cur["read_done"],
                                   cur["end"], cur["phase"], cur["bytes"], cur["total"],
                                   cur["last_move"], cur["live"]))
    return out


def is_stuck(r: RankRestore, now: float, timeout_s: float) -> bool:
    """Still reading or loading, bytes that move as read, and none moved for ``timeout_s``."""
    return (r.end is None and r.read_done is None and r.live_bytes
            and r.phase in ("read", "load") and now - r.last_move > timeout_s)


def moving(ranks: list[RankRestore], now: float, timeout_s: float) -> set[int]:
    """The ranks in a restore that is not over and not stuck (the eviction rails spare
    them)."""
    return {r.rank for r in ranks if r.end is None and not is_stuck(r, now, timeout_s)}


def restore_findings(ranks: list[RankRestore], attempt: int, now: float, timeout_s: float,
                     config: RestoreConfig | None = None) -> list[RestoreFinding]:
    """The slow and stuck ranks of a restore at ``now`` (ranks whose own reads are done are
    never either: a finding is about a restore still in progress)."""
    config = config or RestoreConfig()
    if not ranks:
        return []
    own = {r.rank: r.own_s(now) for r in ranks}
    done = sum(r.read_done is not None for r in ranks)
    median = statistics.median(own.values()) if 2 * done >= len(ranks) else None
    out = []
    for r in ranks:
        if r.read_done is not None:
            continue
        silent = now - r.last_move
        common = dict(rank=r.rank, host=r.host, attempt=attempt, phase=r.phase,
                      restore_s=own[r.rank], bytes_read=r.bytes_read,
                      bytes_total=r.bytes_total, started=r.start, last_move=r.last_move,
                      silent_s=silent, timeout_s=timeout_s)
        if is_stuck(r, now, timeout_s):
            out.append(RestoreFinding(STUCK, median_s=None, **common))
        elif (median is not None and own[r.rank] > config.slow_factor * median
              and own[r.rank] - median >= config.min_excess_s):
            out.append(RestoreFinding(SLOW, median_s=median, **common))
    return out
