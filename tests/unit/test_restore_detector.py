"""slow_restore and stuck_restore on restore timelines written out by hand
(goodlens.detectors.restore), and the eviction rail that spares a rank still restoring."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from goodlens.detectors.restore import (
    RestoreConfig,
    is_stuck,
    moving,
    rank_restores,
    restore_findings,
)

T = 1_700_000_000.0
TIMEOUT = 60.0


def _ev(rank: int, kind: str, t: float, bytes_: int | None = None, phase: str | None = None,
        live: bool = True, total: int | None = None) -> dict:
    detail = None
    if kind == "ckpt_restore_progress":
        detail = json.dumps({"live_bytes": live, **({"bytes_total": total} if total else {})})
    return {"kind": kind, "time": T + t, "rank": rank, "host": f"h{rank}", "bytes": bytes_,
            "label": phase, "detail": detail, "seq": int(t * 10)}


def _timeline() -> pd.DataFrame:
    """Four ranks start their restore at 0 s and read 1000 bytes. Ranks 0, 1 and 3 finish
    their reads at 10, 11 and 12 s (then wait in the barrier); rank 2 reads 100 bytes a
    second from 1 s to 5 s (500 bytes at 5 s), then nothing more."""
    rows = []
    for r in range(4):
        rows += [_ev(r, "ckpt_restore_start", 0.0),
                 _ev(r, "ckpt_restore_progress", 0.0, 0, "read", total=1000)]
    for r, done in ((0, 10.0), (1, 11.0), (3, 12.0)):
        rows += [_ev(r, "ckpt_restore_progress", done / 2, 500, "read"),
                 _ev(r, "ckpt_restore_progress", done, 1000, "barrier")]
    rows += [_ev(2, "ckpt_restore_progress", float(s), 100 * s, "read") for s in range(1, 6)]
    return pd.DataFrame(rows).sample(frac=1.0, random_state=3)   # any order


def test_events_fold_into_each_ranks_latest_restore():
    ranks = {r.rank: r for r in rank_restores(_timeline())}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert ranks[0].read_done == T + 10.0 and ranks[0].phase == "barrier"
    assert ranks[0].bytes_read == 1000 and ranks[0].bytes_total == 1000
    two = ranks[2]
    assert (two.read_done, two.end, two.phase, two.bytes_read) == (None, None, "read", 500)
    assert two.last_move == T + 5.0 and two.live_bytes


def test_slow_past_twice_the_median_rank_and_not_before():
    ranks = rank_restores(_timeline())
    # own times at 20 s: 10, 11, 20, 12 -> median 11.5; 20 < 2 x 11.5 = 23: not yet
    assert restore_findings(ranks, 0, T + 20.0, TIMEOUT) == []
    # at 24 s: rank 2's 24 s > 23 and 12.5 s over the median (>= 5 s)
    (f,) = restore_findings(ranks, 0, T + 24.0, TIMEOUT)
    assert (f.kind, f.rank, f.host, f.median_s, f.restore_s) == ("slow_restore", 2, "h2",
                                                                 11.5, 24.0)
    assert f.bytes_read == 500 and f.silent_s == 19.0
    # a floor on the excess: with 15 s required, 24 - 11.5 = 12.5 is not enough
    assert restore_findings(ranks, 0, T + 24.0, TIMEOUT, RestoreConfig(min_excess_s=15)) == []


def test_stuck_once_its_bytes_stood_still_for_the_timeout():
    ranks = rank_restores(_timeline())
    # last move at 5 s: silent 59.9 s at 64.9 s (slow, still moving), 60.1 s at 65.1 s
    (f,) = restore_findings(ranks, 0, T + 64.9, TIMEOUT)
    assert f.kind == "slow_restore"
    assert moving(ranks, T + 64.9, TIMEOUT) == {0, 1, 2, 3}
    (f,) = restore_findings(ranks, 0, T + 65.1, TIMEOUT)
    assert (f.kind, f.rank, f.median_s) == ("stuck_restore", 2, None)
    assert f.silent_s == pytest.approx(60.1)
    # the barrier ranks have not moved for longer still: they wait, they are not stuck
    assert moving(ranks, T + 65.1, TIMEOUT) == {0, 1, 3}


def test_a_read_in_one_call_is_never_stuck_and_half_the_ranks_must_be_done():
    phase_only = [_ev(r, "ckpt_restore_progress", 0.0, 0, "read", live=False)
                  for r in range(3)]
    phase_only.append(_ev(0, "ckpt_restore_end", 2.0, 800))
    ranks = rank_restores(pd.DataFrame(phase_only))
    assert {r.rank: r.phase for r in ranks} == {0: "done", 1: "read", 2: "read"}
    assert not any(is_stuck(r, T + 1000.0, TIMEOUT) for r in ranks)
    # one of three done: the median rank has not finished, so nobody is slow yet
    assert restore_findings(ranks, 0, T + 1000.0, TIMEOUT) == []


def test_an_ended_restore_flags_nothing_and_a_new_one_starts_afresh():
    rows = [_ev(0, "ckpt_restore_start", 0.0), _ev(0, "ckpt_restore_progress", 0.0, 0, "read"),
            _ev(0, "ckpt_restore_end", 50.0, 10),
            _ev(0, "ckpt_restore_start", 100.0), _ev(0, "ckpt_restore_progress", 101.0, 7,
                                                      "read")]
    (r,) = rank_restores(pd.DataFrame(rows))
    assert (r.start, r.end, r.bytes_read, r.last_move) == (T + 100.0, None, 7, T + 101.0)


def test_a_heal_ends_at_its_ended_progress_event():
    # a torchft heal has no ckpt_restore_end: read 0-3 s, barrier 3-8 s, load 8-9 s, then a
    # last event saying it ended; a heal ended long ago is neither moving nor stuck
    ended = _ev(1, "ckpt_restore_progress", 9.0, 400, "load", live=False)
    ended["detail"] = json.dumps({"live_bytes": False, "ended": True})
    rows = [_ev(1, "ckpt_restore_progress", 0.0, 0, "read", live=False),
            _ev(1, "ckpt_restore_progress", 3.0, 400, "barrier", live=False),
            _ev(1, "ckpt_restore_progress", 8.0, 400, "load", live=False), ended]
    (r,) = rank_restores(pd.DataFrame(rows))
    assert (r.start, r.read_done, r.end, r.phase, r.bytes_read) == (T, T + 3.0, T + 9.0,
                                                                   "done", 400)
    assert moving([r], T + 1000.0, TIMEOUT) == set()
    assert restore_findings([r], 0, T + 1000.0, TIMEOUT) == []


def test_the_eviction_rail_refuses_a_node_still_restoring_and_decides_again(tmp_path):
    from goodlens.exporter.elastic import EvictionClient, EvictionPolicy

    class Events:
        def __init__(self) -> None:
            self.rows: list[tuple] = []

        def event(self, kind, **fields):
            self.rows.append((str(kind), fields))

    ev = Events()
    client = EvictionClient(ev, None, "r", EvictionPolicy(mode="on"), ["a", "b", "c"],
                            tmp_path / "history.jsonl")
    finding = {"id": "f1", "host": "b", "ranks": [1], "action": "evict", "confidence": 0.8,
               "restoring": True}
    assert client.decide(finding, now=T).verdict == "refused:restoring"
    assert client.decide(finding, now=T + 1) is None   # recorded once
    assert client.decide({**finding, "restoring": False}, now=T + 2).verdict == "evict"
    assert [f["cause"] for _, f in ev.rows] == ["refused:restoring", "straggler"]
