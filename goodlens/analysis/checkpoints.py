"""One row per checkpoint, from the save events every rank emits.

Accounting needs only the union of blocking intervals; a user looking at checkpoints wants
each save on its own: when it started, how long training stood still, how long until the
copy was durable, how many bytes. Every rank of a job emits its own events for one save,
so a save is identified by ``(attempt, step, tier)`` and spans its first rank's start to
its last rank's end (the job waits for the slowest rank).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from goodlens.model.schema import EventKind

_COLUMNS = ["attempt", "step", "tier", "start", "stall_s", "write_s", "bytes", "ranks"]


def checkpoint_table(events: pd.DataFrame) -> pd.DataFrame:
    """Checkpoints of a run from its events (``store.events``): ``attempt, step, tier,
    start`` (epoch s), ``stall_s`` (first start to the last blocking end: training stood
    still), ``write_s`` (first start to the last durable end; NaN while not durable or when
    the tier reports none), ``bytes`` (summed over ranks, from the durable ends or else the
    blocking ends; NaN when none reported) and ``ranks`` (ranks that started it).

    A save without a blocking end is synchronous: its stall is its write. Ordered by start.
    """
    if not len(events):
        return pd.DataFrame(columns=_COLUMNS)
    ev = events[events.kind.isin([EventKind.CKPT_SAVE_START, EventKind.CKPT_SAVE_BLOCKING_END,
                                  EventKind.CKPT_SAVE_DURABLE_END])]
    if not len(ev):
        return pd.DataFrame(columns=_COLUMNS)
    ev = ev.assign(step=ev.step.fillna(-1).astype("int64"), tier=ev.tier.fillna("").astype(str))
    key = ["attempt", "step", "tier"]
    starts = ev[ev.kind == EventKind.CKPT_SAVE_START].groupby(key).agg(
        start=("time", "min"), ranks=("source", "nunique"))
    if not len(starts):
        return pd.DataFrame(columns=_COLUMNS)
    blocking = ev[ev.kind == EventKind.CKPT_SAVE_BLOCKING_END].groupby(key).agg(
        blocking_end=("time", "max"), blocking_bytes=("bytes", lambda b: b.sum(min_count=1)))
    durable = ev[ev.kind == EventKind.CKPT_SAVE_DURABLE_END].groupby(key).agg(
        durable_end=("time", "max"), durable_bytes=("bytes", lambda b: b.sum(min_count=1)))
    t = starts.join(blocking).join(durable).reset_index()
    stall_end = t.blocking_end.where(t.blocking_end.notna(), t.durable_end)
    t["stall_s"] = stall_end - t.start
    t["write_s"] = t.durable_end - t.start
    t["bytes"] = t.durable_bytes.where(t.durable_bytes.notna(), t.blocking_bytes)
    t["step"] = t.step.where(t.step >= 0, np.nan)
    t["tier"] = t.tier.replace("", np.nan)
    return t[_COLUMNS].sort_values("start").reset_index(drop=True)


def checkpoint_trend(table: pd.DataFrame, window: int = 5) -> pd.Series:
    """Rolling median stall over ``window`` saves (what a trend line shows: a stall that
    creeps up as the model or the cluster's storage load grows)."""
    return table.stall_s.rolling(window, min_periods=1).median()
