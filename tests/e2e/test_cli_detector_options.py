"""The straggler detector's sensitivity on the command line: ``--threshold``,
``--min-slowdown`` and ``--evict-at`` of ``goodlens detect``, ``serve`` and ``dashboard``.

The default detector is tuned for no false findings over 1e8 rank-steps; an operator who
would rather find a 2% rank sooner (or only page on 10%) needs to say so without writing
Python. The demo run's rank 5 is planted 10% slow from step 150 (its estimate ~9.8%), so by
hand: the defaults report it as ``evict``; ``--evict-at 0.5`` keeps it ``watch``;
``--min-slowdown 0.5`` (ignore anything under 50%) and an unreachable ``--threshold`` find
nothing; a threshold of 0 is a usage error naming the option. The collector applies the same
options to its live detector (checked on /metrics).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from goodlens.cli import main
from tests.harness import ROOT, Collector, http, wait_until

SAMPLE = str(ROOT / "sample_data" / "demo")


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory) -> str:
    db = str(tmp_path_factory.mktemp("opts") / "d.duckdb")
    run("import", SAMPLE, "--db", db)
    return db


def found(db: str, *opts: str) -> list[tuple]:
    out = json.loads(run("detect", "--db", db, "--run", "demo-8x", "--json", *opts).output)
    return [(f["subject_kind"], f["subject_id"], f["action"]) for f in out["findings"]]


def test_detect_options_change_what_is_found(demo_db):
    assert found(demo_db) == [("rank", 5, "evict")]
    assert found(demo_db, "--evict-at", "0.5") == [("rank", 5, "watch")]
    assert found(demo_db, "--min-slowdown", "0.5") == []
    assert found(demo_db, "--threshold", "1e9") == []
    # a lower threshold finds it no later than the default
    first = {o: json.loads(run("detect", "--db", demo_db, "--run", "demo-8x", "--json",
                               "--threshold", o).output)["findings"][0]["detected_step"]
             for o in ("30", "15")}
    assert first["15"] <= first["30"]


@pytest.mark.parametrize("cmd", [["detect", "--run", "demo-8x"], ["dashboard"]])
@pytest.mark.parametrize("opt,bad,says", [("--threshold", "0", "--threshold must be > 0"),
                                          ("--min-slowdown", "-1", "--min-slowdown must be >= 0"),
                                          ("--evict-at", "nan", "--evict-at must be >= 0")])
def test_an_out_of_range_option_is_a_usage_error_naming_it(demo_db, cmd, opt, bad, says):
    r = run(*cmd, "--db", demo_db, opt, bad, code=2)
    assert says in r.output and "StragglerConfig" not in r.output


def test_serve_hands_the_options_to_its_live_detector(tmp_path):
    c = Collector(tmp_path / "live.duckdb", "--load", SAMPLE, "--no-dashboard",
                  "--metrics-retention", "all", "--evict-at", "0.5").start(timeout=120)
    try:
        want = 'goodlens_straggler_slowdown_ratio{action="watch",kind="rank",run="demo-8x",' \
               'subject="5"}'
        assert wait_until(lambda: want in http("GET", c.url + "/metrics")[1],
                          timeout=60), http("GET", c.url + "/metrics")[1][-2000:]
        assert 'action="evict"' not in http("GET", c.url + "/metrics")[1]
    finally:
        c.stop()
    r = run("serve", "--db", str(tmp_path / "other.duckdb"), "--threshold", "-3", code=2)
    assert "--threshold must be > 0" in r.output


def test_the_dashboards_batch_scan_uses_the_options(demo_db):
    """The slow-ranks page scans a run no live detector saw with the configured detector
    (what `goodlens dashboard --evict-at 0.5` builds)."""
    from goodlens.dashboard.data import DashConfig, RunData
    from goodlens.detectors.stragglers import StragglerConfig
    from goodlens.storage.store import Store

    store = Store(demo_db, read_only=True)
    try:
        for cfg, action in ((None, "evict"), (StragglerConfig(evict_min_slowdown=0.5), "watch")):
            got, source = RunData(store, DashConfig(straggler=cfg)).findings("demo-8x", wait=True)
            assert source == "batch"
            assert [(f["subject_id"], f["action"]) for f in got] == [(5, action)]
    finally:
        store.close()
