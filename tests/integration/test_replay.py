"""Replaying traces: offline into a store, and live through a real collector at a speed."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from goodlens.analysis.accounting import account_run
from goodlens.cli import main
from goodlens.collector.replay import stream_trace
from goodlens.storage.store import Store
from tests.harness import ROOT

SAMPLE = str(ROOT / "sample_data" / "demo")


def cli(*args: str):
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def _offline_breakdown(tmp_path):
    """The sample's breakdown imported offline (what a live replay must reproduce)."""
    from goodlens.collector.replay import import_trace
    offline = Store(tmp_path / "offline.duckdb")
    try:
        import_trace(offline, SAMPLE)
        return account_run(offline, "demo-8x").breakdown()
    finally:
        offline.close()


def _stored_breakdown(db):
    """(breakdown, step rows) of the sample run in a stopped collector's store."""
    live = Store(db, read_only=True)
    try:
        return account_run(live, "demo-8x").breakdown(), len(live.steps("demo-8x"))
    finally:
        live.close()


def test_offline_replay_is_an_import(tmp_path):
    db = str(tmp_path / "o.duckdb")
    first = json.loads(cli("replay", SAMPLE, "--db", db, "--json"))
    assert first["steps_inserted"] == 5104
    again = json.loads(cli("replay", SAMPLE, "--db", db, "--json"))
    assert again["steps_inserted"] == 0


@pytest.mark.slow
def test_live_replay_gives_the_collector_the_same_run(collector, tmp_path):
    sent = json.loads(cli("replay", SAMPLE, "--live", collector.url, "--speed", "0", "--json"))
    assert sent["steps"] == 5104 and sent["events"] == 25
    collector.stop()
    want, (got, stored) = _offline_breakdown(tmp_path), _stored_breakdown(collector.db)
    assert stored == 5104
    assert got.buckets == pytest.approx(want.buckets)
    assert got.restart_parts == pytest.approx(want.restart_parts)


@pytest.mark.slow
def test_live_replay_paces_itself_by_trace_time(collector):
    # the sample spans 966 s of trace time: at 1000x the replay takes about a second, and
    # half-way through the collector holds only the first part of the run
    seen = []

    def sleep(dt: float) -> None:
        time.sleep(dt)
        seen.append(time.monotonic())

    t0 = time.monotonic()
    sent = stream_trace(SAMPLE, collector.url, speed=1000.0, sleep=sleep)
    elapsed = time.monotonic() - t0
    assert sent["steps"] == 5104
    assert 0.8 <= elapsed < 30
    assert len(seen) > 5  # it waited for trace time to pass, many times


def test_live_replay_errors_are_clear(tmp_path):
    r = CliRunner().invoke(main, ["replay", SAMPLE])
    assert r.exit_code == 2 and "--db PATH (offline) or --live URL" in r.output
    r = CliRunner().invoke(main, ["replay", SAMPLE, "--live", "http://127.0.0.1:9",
                                  "--speed", "-1"])
    assert r.exit_code == 2 and "--speed" in r.output


def test_live_replay_gives_up_on_an_unreachable_collector():
    with pytest.raises(ValueError, match="gave up after 1 s: collector unreachable"):
        stream_trace(SAMPLE, "http://127.0.0.1:9", speed=0, give_up_s=1.0)


def test_a_bad_trace_is_refused_naming_what_is_wrong(tmp_path):
    import shutil

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from goodlens.collector.replay import import_trace
    from goodlens.model.trace import TraceError
    bad = tmp_path / "bad"
    shutil.copytree(SAMPLE, bad)
    steps = pq.read_table(bad / "steps.parquet")
    dur = steps.column("duration_s")
    steps = steps.set_column(steps.column_names.index("duration_s"), "duration_s",
                             pc.multiply(dur, -1.0))
    pq.write_table(steps, bad / "steps.parquet")
    s = Store(tmp_path / "b.duckdb")
    try:
        with pytest.raises(TraceError, match=r"steps\.duration_s must not be negative"):
            import_trace(s, bad)
        shutil.copy(ROOT / "sample_data" / "demo" / "steps.parquet", bad / "steps.parquet")
        ev = pq.read_table(bad / "events.parquet")
        ev = ev.set_column(0, "run_id", pc.if_else(pc.equal(ev.column("seq"), 0),
                                                   "ghost-run", ev.column("run_id")))
        pq.write_table(ev, bad / "events.parquet")
        with pytest.raises(TraceError, match="ghost-run"):
            import_trace(s, bad)
    finally:
        s.close()


def test_live_replay_as_now_moves_every_instant_by_one_amount(collector, tmp_path):
    """--as-now at --speed 0 (all at once): the trace moves to end now (no row stamped in
    the future), and the accounting is exactly the recorded one."""
    import time as _time
    before = _time.time()
    sent = json.loads(cli("replay", SAMPLE, "--live", collector.url, "--speed", "0",
                          "--as-now", "--json"))
    assert sent["steps"] == 5104
    collector.stop()
    want, (got, _) = _offline_breakdown(tmp_path), _stored_breakdown(collector.db)
    assert before - 1 <= got.end <= _time.time()  # re-timed to end now
    assert got.start - want.start > 1e7  # the sample is from another year
    assert got.wall_clock_s == pytest.approx(want.wall_clock_s, abs=1e-3)
    assert got.buckets == pytest.approx(want.buckets, abs=1e-3)
    offline_shift = CliRunner().invoke(main, ["replay", SAMPLE, "--db",
                                              str(tmp_path / "x.duckdb"), "--as-now"])
    assert offline_shift.exit_code == 2 and "use it with --live" in offline_shift.output
