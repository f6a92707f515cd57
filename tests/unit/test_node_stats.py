"""The node table's statistics and counting on hand-worked cases (goodlens.analysis.nodes)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from goodlens.analysis.nodes import (
    NODE_NAMES,
    NodeInputs,
    benjamini_hochberg,
    binomial_sf,
    node_table,
)


def test_binomial_tail_against_sums_worked_by_hand() -> None:
    # P(X >= 8), X ~ Bin(10, 1/2) = (45 + 10 + 1) / 1024
    assert binomial_sf(8, 10, 0.5) == pytest.approx(56 / 1024, rel=1e-12)
    # P(X >= 1) = 1 - (1 - p)^n
    assert binomial_sf(1, 20, 0.1) == pytest.approx(1 - 0.9 ** 20, rel=1e-12)
    # P(X >= n) = p^n
    assert binomial_sf(5, 5, 0.3) == pytest.approx(0.3 ** 5, rel=1e-12)
    assert binomial_sf(0, 7, 0.2) == 1.0 and binomial_sf(8, 7, 0.2) == 0.0
    # a far tail, against the sum of its terms: P(X >= 30), X ~ Bin(1000, 0.01)
    terms = [math.comb(1000, j) * 0.01 ** j * 0.99 ** (1000 - j) for j in range(30, 1001)]
    assert binomial_sf(30, 1000, 0.01) == pytest.approx(sum(terms), rel=1e-10)


def test_benjamini_hochberg_worked_by_hand() -> None:
    # sorted p: .001 .008 .039 .041 .2 ; m = 5: p * 5 / rank = .005 .02 .065 .05125 .2,
    # then the running minimum from the top: .005 .02 .05125 .05125 .2
    q = benjamini_hochberg([0.2, 0.039, 0.001, 0.041, 0.008])
    assert q == pytest.approx([0.2, 0.05125, 0.005, 0.05125, 0.02])


def frames() -> NodeInputs:
    """Two runs on hosts a, b, c, d (hours worked out below)."""
    attempts = pd.DataFrame({
        "run_id": ["r1", "r1", "r2"], "attempt": [0, 1, 0],
        "start": [0.0, 7200.0, 0.0], "end": [3600.0, None, None],
        "last_activity": [3600.0, 7200.0 + 2 * 3600, 3 * 3600.0],
        "end_reason": ["failed", None, None]})
    # r1 attempt 0: ranks 0-3 on a, a, b, c; attempt 1 (after c failed): a, a, b, d
    # r2 attempt 0: ranks on a and d
    presence = pd.DataFrame(
        [("r1", 0, 0, "a"), ("r1", 0, 1, "a"), ("r1", 0, 2, "b"), ("r1", 0, 3, "c"),
         ("r1", 1, 0, "a"), ("r1", 1, 1, "a"), ("r1", 1, 2, "b"), ("r1", 1, 3, "d"),
         ("r2", 0, 0, "a"), ("r2", 0, 1, "d")], columns=["run_id", "attempt", "rank", "host"])
    cols = ["run_id", "attempt", "source", "seq", "time", "kind", "rank", "host", "cause",
            "label", "detail"]
    events = pd.DataFrame([
        # rank 3 (on c in attempt 0) failed; the survivors' collective errors name nobody
        ("r1", 0, "launcher", 0, 3000.0, "failure", 3, None, "gpu_xid", None, None),
        ("r1", 0, "x/0", 0, 3001.0, "failure", None, "a", "collective_error", None, None),
        ("r1", 0, "launcher", 1, 3010.0, "failure_detected", None, None, "launcher", None,
         None),
        # a straggler finding on rank 3 in attempt 1: rank 3 ran on d then
        ("r1", 1, "detector/1/rank/3/5", 0, 8000.0, "straggler_flagged", 3, None, None,
         "rank:3", '{"status": "open"}'),
        ("r1", 1, "detector/1/rank/3/5", 1, 9000.0, "straggler_flagged", 3, None, None,
         "rank:3", '{"status": "resolved"}'),
        # a hang naming rank 1 of r2 (on d); a switch finding names no host
        ("r2", 0, "h", 0, 5000.0, "failure_detected", 1, None, "hang", None, None),
        ("r2", 0, "detector/0/switch/s1/3", 0, 5000.0, "straggler_flagged", None, None, None,
         "switch:s1", '{"status": "open"}'),
    ], columns=cols)
    return NodeInputs(attempts, presence, events)


def test_counts_per_host_worked_by_hand() -> None:
    t = node_table(frames())
    rows = t.rows.set_index("host")
    assert list(t.rows.columns) == NODE_NAMES
    # hours: r1/0 is 1 h, r1/1 is 2 h, r2/0 is 3 h
    assert rows.hours.to_dict() == {"a": 6.0, "b": 3.0, "c": 1.0, "d": 5.0}
    assert rows.runs.to_dict() == {"a": 2, "b": 1, "c": 1, "d": 2}
    assert rows.incidents.to_dict() == {"a": 0, "b": 0, "c": 1, "d": 2}
    assert rows.failures.to_dict() == {"a": 0, "b": 0, "c": 1, "d": 0}
    assert rows.failure_causes["c"] == '{"gpu_xid": 1}'
    assert rows.hangs.to_dict() == {"a": 0, "b": 0, "c": 0, "d": 1}
    assert rows.stragglers.to_dict() == {"a": 0, "b": 0, "c": 0, "d": 1}
    # r1 restarted after attempt 0: a, b, c were in it; c was not in attempt 1
    assert rows.restarts.to_dict() == {"a": 1, "b": 1, "c": 1, "d": 0}
    assert rows.exclusions.to_dict() == {"a": 0, "b": 0, "c": 1, "d": 0}
    # the fleet: 3 incidents over 15 host-hours; c: P(Bin(3, 1/15) >= 1) = 1 - (14/15)^3
    assert (t.incidents, t.hours) == (3, 15.0)
    assert rows.p_value["c"] == pytest.approx(1 - (14 / 15) ** 3, rel=1e-12)
    assert rows.rate_ratio["d"] == pytest.approx((2 / 5) / (3 / 15))
    assert t.drain() == []  # three incidents prove nothing


def test_a_window_clips_hours_and_drops_what_lies_outside() -> None:
    t = node_table(frames(), since=3600.0, until=4 * 3600.0)
    rows = t.rows.set_index("host")
    # r1/1 (2 to 4 h) fully in; r2/0 (0 to 3 h) from 1 h: 2 h; r1/0 ends at 1 h: meets it
    assert rows.hours.to_dict() == {"a": 4.0, "b": 2.0, "c": 0.0, "d": 4.0}
    assert rows.incidents.to_dict() == {"a": 0, "b": 0, "c": 0, "d": 2}


def test_a_host_five_times_the_fleet_rate_is_flagged_and_healthy_ones_are_not() -> None:
    # 100 hosts of 100 h each; 99 with 2 incidents, one with 10: K = 208
    hosts = [f"h{i:03d}" for i in range(100)]
    attempts = pd.DataFrame({"run_id": hosts, "attempt": 0, "start": 0.0,
                             "end": 100 * 3600.0, "last_activity": 100 * 3600.0,
                             "end_reason": "completed"})
    presence = pd.DataFrame({"run_id": hosts, "attempt": 0, "rank": 0, "host": hosts})
    rows = []
    for i, h in enumerate(hosts):
        for j in range(10 if i == 7 else 2):
            # one incident per attempt: each in an attempt of its own run
            rows.append((f"{h}-{j}", 0, "s", 0, 10.0, "failure", 0, h, "gpu_xid", None, None))
    events = pd.DataFrame(rows, columns=["run_id", "attempt", "source", "seq", "time", "kind",
                                         "rank", "host", "cause", "label", "detail"])
    extra = pd.DataFrame({"run_id": events.run_id, "attempt": 0, "start": 0.0, "end": 0.0,
                          "last_activity": 0.0, "end_reason": "failed"})
    t = node_table(NodeInputs(pd.concat([attempts, extra]), presence, events))
    # h007: p = P(Bin(208, 1/100) >= 10) = 5.58e-5, its BH q-value p x 100 / 1 = 0.0056;
    # a healthy host: P(Bin(208, 1/100) >= 2) = 0.617, q-value at least that
    p = binomial_sf(10, 208, 0.01)
    assert p == pytest.approx(5.5798e-5, rel=1e-4)
    rows = t.rows.set_index("host")
    assert rows.p_value["h007"] == pytest.approx(p, rel=1e-12)
    assert rows.q_value["h007"] == pytest.approx(100 * p, rel=1e-12)
    assert t.drain() == ["h007"]
    assert rows.q_value.drop("h007").min() == pytest.approx(0.6166, rel=1e-3)
    assert np.isclose(t.rows.set_index("host").rate_ratio["h007"], (10 / 100) / (208 / 10000))


def test_the_nodes_page_figure_and_route() -> None:
    from goodlens.dashboard.nodes import nodes_figure
    from goodlens.dashboard.urlstate import parse_path
    t = node_table(frames())
    fig = nodes_figure(t)
    by_name = {tr.name: tr for tr in fig.data}
    assert sorted(by_name["ok"].text) == ["a", "b", "c", "d"] and len(by_name["drain"].x) == 0
    # the fleet's rate, 3 incidents over 15 host-hours, up to the largest host's 6 hours
    assert list(by_name["the fleet's rate"].y) == pytest.approx([0.0, 6 * 3 / 15])
    assert parse_path("/nodes") == ("nodes", None)
