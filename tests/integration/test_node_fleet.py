"""``goodlens nodes`` over a generated fleet: the two bad hosts are flagged, healthy ones
at most at the stated false discovery rate.

The fleet (:mod:`tests.nodefleet`, written for this check) is 320 runs over 200 hosts, two
of them with 5 times a healthy host's incident rate: ``node-042`` by failing, ``node-137``
by straggling, with the noise a real fleet has (ranks placed anew each attempt, failures
named by rank alone, survivors' collective errors, resolved findings, job-level hangs).

The stated bound: ``drain`` holds the false discovery rate to q = 0.05 (Benjamini-
Hochberg), so with the two planted hosts found, the expected number of healthy hosts
flagged is about 0.1; this fixed seed must flag at most one. Across 50 seeds
``bench/nodes.py`` measures the false discovery proportion and the power.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from goodlens.analysis.nodes import NODE_NAMES
from goodlens.cli import main
from tests.nodefleet import LEMON_FAIL, LEMON_SLOW, fleet_docs, write_parquet

SEED, RUNS = 0, 320


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nodes") / "ds"
    write_parquet(root, fleet_docs(SEED, RUNS))
    return root


def nodes(root: Path, *extra: str) -> str:
    r = CliRunner().invoke(main, ["nodes", "--db", f"parquet:{root}", *extra])
    assert r.exit_code == 0, r.output
    return r.output


@pytest.fixture(scope="module")
def doc(fleet) -> dict:
    return json.loads(nodes(fleet, "--json"))


def test_both_planted_hosts_are_flagged_and_healthy_ones_at_most_once(doc) -> None:
    drain = doc["drain"]
    assert {LEMON_FAIL, LEMON_SLOW} <= set(drain)
    assert len(set(drain) - {LEMON_FAIL, LEMON_SLOW}) <= 1
    assert doc["fleet"]["hosts"] == 200
    assert doc["test"]["q"] == 0.05
    rows = {r["host"]: r for r in doc["hosts"]}
    assert list(doc["hosts"][0]) == NODE_NAMES
    # how each was caught: LEMON_FAIL by its failures, LEMON_SLOW by its findings
    assert rows[LEMON_FAIL]["failures"] > rows[LEMON_FAIL]["stragglers"]
    assert rows[LEMON_SLOW]["stragglers"] > rows[LEMON_SLOW]["failures"]
    for h in (LEMON_FAIL, LEMON_SLOW):
        assert rows[h]["verdict"] == "drain" and rows[h]["q_value"] <= 0.05
        assert rows[h]["rate_ratio"] > 2 and "BH q-value" in rows[h]["evidence"]


def test_survivors_and_the_launchers_notice_name_nobody(doc) -> None:
    # every failure the generator plants names one host; the survivors' collective errors
    # and the launcher's notice would add a failure to every host of every failed attempt
    rows = doc["hosts"]
    assert sum(r["failures"] for r in rows) <= sum(r["restarts"] for r in rows) / 2
    assert all(set(json.loads(r["failure_causes"])) <= {"gpu_xid", "ecc_error", "exit:1",
                                                       "nccl_error"} for r in rows)


def test_the_drain_list_and_the_text(fleet, doc) -> None:
    assert nodes(fleet, "--drain-list").splitlines() == doc["drain"]
    out = nodes(fleet)
    assert "Benjamini-Hochberg at q=0.05" in out
    assert f"  {LEMON_FAIL}: " in out and "failures by cause" in out


def test_spark_needs_a_dataset_and_q_a_rate(tmp_path) -> None:
    r = CliRunner().invoke(main, ["nodes", "--db", "parquet:/nonexistent", "--q", "2"])
    assert r.exit_code == 2
    db = tmp_path / "x.duckdb"
    from goodlens.storage.store import Store
    Store(db).close()
    r = CliRunner().invoke(main, ["nodes", "--db", str(db), "--engine", "spark"])
    assert r.exit_code == 2 and "Parquet dataset" in r.output
    r = CliRunner().invoke(main, ["nodes", "--db", str(db), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["hosts"] == []


def test_the_dashboards_nodes_page_shows_the_hosts_to_drain(fleet, doc) -> None:
    from goodlens.dashboard.nodes import nodes_layout
    from goodlens.storage.parquet import ParquetStore
    store = ParquetStore(fleet, read_only=True)
    try:  # every run: a window from before the fleet's first run to after its last
        page = nodes_layout(store, {"days": "400"}, now=1_767_225_600.0 + 200 * 86400)
    finally:
        store.close()
    text = str(page)
    assert "Drain: " + ", ".join(doc["drain"]) in text
