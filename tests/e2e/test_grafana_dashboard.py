"""contrib/grafana/goodlens.json: every panel's PromQL returns data from a real Prometheus
scraping a real collector.

The collector (``goodlens serve``, hang floor 60 s) is fed two recordings with their clocks
moved to now, so every series exists at once: ``ddp-slow`` (a finished run with a confirmed
straggler: goodput, buckets, step times, findings) and ``restore`` (a run whose second
attempt restores with rank 3 stopped 90 s ago: restore progress, a stuck rank). Its store
starts with a small generated fleet (:mod:`tests.nodefleet`: 40 runs over 50 hosts in the
last days, ``node-042`` failing at 10 times a healthy host's rate), so the ``goodlens_node_*``
series of a host to drain exist too: the first scrape starts the node table's computation
(:class:`goodlens.collector.nodes.NodeCache`, the data already stored) and a later scrape,
a second on, exports it. Each panel's queries are asked of Prometheus with ``$run`` as
``.*``.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.harness import ROOT, Collector, Prometheus, http
from tests.nodefleet import LEMON_FAIL, fleet_docs, write_duckdb
from tests.recorded import load

DASHBOARD = ROOT / "contrib" / "grafana" / "goodlens.json"
METRICS = ROOT / "goodlens" / "collector" / "metrics.py"
#: Series of hosts to drain only: the fleet's failing host must be among them
PER_HOST = {"goodlens_node_incident_rate_ratio", "goodlens_node_incidents",
            "goodlens_node_q_value"}


def _targets() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] if p["type"] != "row"
            for t in p["targets"]]


def _names(expr: str) -> set[str]:
    return set(re.findall(r"\bgoodlens_[a-z_]+", expr))


def _exposed() -> set[str]:
    """Metric names the collector defines (counters gain ``_total`` on the wire)."""
    text = METRICS.read_text()
    names = set(re.findall(r'"(goodlens_[a-z_]+)"', text))
    return names | {n + "_total" for n in names}


def _push(url: str, name: str, end_at: float) -> str:
    """POST recording ``name`` with its clock moved so its last row is at ``end_at``."""
    import pyarrow.compute as pc

    from goodlens.model.wire import ARROW, encode_arrow_batch
    rec = load(name)
    steps, events = rec.tables["steps"], rec.tables["events"]
    last = max(pc.max(pc.add(steps["start_time"], steps["duration_s"])).as_py() or 0.0,
               pc.max(events["time"]).as_py())
    dt = end_at - last
    doc: dict = {"schema_version": 1, "run_id": rec.run_id}
    for key, table, col in (("steps", steps, "start_time"), ("events", events, "time")):
        cols = table.drop_columns(["run_id"]).to_pydict()
        cols[col] = [t + dt for t in cols[col]]
        doc[key] = {k: v for k, v in cols.items() if any(x is not None for x in v)}
    status, body = http("POST", url + "/v1/ingest", encode_arrow_batch(doc),
                        headers={"Content-Type": ARROW})
    assert status == 200, body
    return rec.run_id


@pytest.mark.slow
def test_every_panel_returns_data_from_a_real_prometheus(tmp_path):
    targets = _targets()
    assert len(targets) >= 15
    assert {n for _, e in targets for n in _names(e)} <= _exposed()
    now = time.time()
    # the fleet's runs start 4 to 2 days ago and end at least a day ago: inside the node
    # table's 7-day window, and none of them live any more
    write_duckdb(tmp_path / "g.duckdb", fleet_docs(0, runs=40, hosts=50, factor=10.0,
                                                    span_s=2 * 86400.0, t0=now - 4 * 86400.0))
    c = Collector(tmp_path / "g.duckdb").start()
    prom = None
    try:
        _push(c.url, "ddp-slow", now - 30)
        _push(c.url, "restore", now - 90)   # rank 3 stopped 90 s ago: past the 60 s floor
        c.sync(detect=True)
        prom = Prometheus(tmp_path, c.port)
        empty = []
        for title, expr in targets:
            q = expr.replace("$run", ".*")
            if _names(expr) & PER_HOST:   # the series name the host to drain
                found = prom.query_until(q, lambda r: any(
                    s["metric"].get("host") == LEMON_FAIL for s in r), timeout=10)
            else:
                found = prom.query_until(q, lambda r: True, timeout=60 if not empty else 10)
            if not found:
                empty.append((title, q))
        assert not empty, empty
    finally:
        if prom is not None:
            prom.stop()
        c.stop()
