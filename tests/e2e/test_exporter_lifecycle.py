"""The exporter at the edges of a process's life, against a real collector: rows recorded
just before a SIGTERM, an unhandled exception or a plain exit (also when Arrow encoding
fails there, as pyarrow's lazy pandas import did at interpreter exit: they go as JSON) all
arrive; a SIGTERM still terminates; an unhandled exception is recorded as a `failure`
at its instant, and a collective's error that a SIGTERM interrupts as its detection
(torchrun's SIGTERM to a crash's survivors races their collective's error); the process's
start comes from the OS.

Each child writes its own clock readings to a file, so expected instants never come from
goodlens.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from goodlens.exporter import lifecycle
from goodlens.storage.store import Store
from tests.harness import ROOT, Collector

CHILD = r"""
import json, os, signal, sys, time
t_start = time.time()
from goodlens.exporter import RankExporter
url, mode, truth = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "broken":  # Arrow encoding fails, as pyarrow's lazy pandas import did at exit
    import goodlens.exporter.recorder as rec
    def broken(doc):
        raise RuntimeError("can't register atexit after shutdown")
    rec.encode_arrow_batch = broken
# a long flush interval: nothing is sent before the end unless the exit path sends it
exp = RankExporter(run_id="life-" + mode, url=url, rank=3, flush_interval_s=3600,
                   spill_dir=None)
for n in range(25):
    with exp.step(n):
        time.sleep(0.002)
facts = {"t_python": t_start}
if mode == "term":
    facts["t_signal"] = time.time()
    open(truth, "w").write(json.dumps(facts))
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    print("still alive after SIGTERM", flush=True)
elif mode == "racing":  # torchrun's SIGTERM arrives while a collective's error unwinds
    def all_reduce():  # as torch.distributed's own wrapper: log the error, re-raise it
        try:
            raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer")
        except RuntimeError:
            facts["t_error"] = time.time()
            open(truth, "w").write(json.dumps(facts))
            os.kill(os.getpid(), signal.SIGTERM)  # handled at the next call: this one
            time.sleep(30)
            raise
    with exp.step(25):
        all_reduce()
    print("still alive after SIGTERM", flush=True)
elif mode == "raise":
    facts["t_raise"] = time.time()
    open(truth, "w").write(json.dumps(facts))
    raise ValueError("boom")
else:
    open(truth, "w").write(json.dumps(facts))
"""


def child(tmp_path: Path, url: str, mode: str) -> tuple[subprocess.CompletedProcess, dict]:
    truth = tmp_path / f"{mode}.json"
    out = subprocess.run([sys.executable, "-c", CHILD, url, mode, str(truth)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    return out, json.loads(truth.read_text())


def stored(db: Path, run: str) -> tuple:
    store = Store(db, read_only=True)
    try:
        return store.steps(run), store.events(run)
    finally:
        store.close()


def test_sigterm_short_exit_and_a_crash_deliver_their_rows(tmp_path):
    c = Collector(tmp_path / "l.duckdb").start()
    try:
        t0 = time.time()
        term, term_facts = child(tmp_path, c.url, "term")
        plain, _ = child(tmp_path, c.url, "exit")
        broken, _ = child(tmp_path, c.url, "broken")
        crash, crash_facts = child(tmp_path, c.url, "raise")
        racing, racing_facts = child(tmp_path, c.url, "racing")
        t1 = time.time()
        c.sync()
    finally:
        c.stop()
    got = {m: stored(c.db, f"life-{m}") for m in ("term", "exit", "raise", "broken",
                                                   "racing")}
    # SIGTERM still terminates, by the signal, well within the flush bound
    assert term.returncode == -signal.SIGTERM, term.stdout + term.stderr
    assert "still alive" not in term.stdout
    assert plain.returncode == 0 and "could not encode" not in plain.stderr, plain.stderr
    assert broken.returncode == 0 and "could not encode" not in broken.stderr, broken.stderr
    assert crash.returncode == 1 and "ValueError: boom" in crash.stderr
    for mode, (steps, _) in got.items():
        assert sorted(steps.step) == list(range(25)), mode  # no row lost
    _, ev = got["raise"]
    failure = ev[ev.kind == "failure"]
    detected = ev[ev.kind == "failure_detected"]
    assert list(failure.cause) == ["exception:ValueError"] and list(failure["rank"]) == [3]
    assert len(detected) == 1
    # the instant: after the child raised (its own clock), within a second
    t = float(failure.time.iloc[0])
    assert crash_facts["t_raise"] <= t <= crash_facts["t_raise"] + 1.0
    assert not len(got["term"][1][got["term"][1].kind == "failure"])  # SIGTERM is no failure
    # ... but a SIGTERM that interrupts a collective's error records that error first, as
    # its detection (when the peer died is not known: the signal may have waited in the
    # collective), then the signal still terminates
    assert racing.returncode == -signal.SIGTERM, racing.stdout + racing.stderr
    _, ev = got["racing"]
    assert not len(ev[ev.kind == "failure"])
    detected = ev[ev.kind == "failure_detected"]
    assert list(detected.cause) == ["collective_error"] and detected["rank"].isna().all()
    t = float(detected.time.iloc[0])
    assert racing_facts["t_error"] <= t <= racing_facts["t_error"] + 1.0
    assert t0 - 1 <= term_facts["t_python"] <= t1


def test_process_start_time_from_proc_and_its_fallback():
    now = time.time()
    started = lifecycle.process_start_time()
    # this test process started before now, and not days ago
    assert now - 7 * 86400 < started <= now
    stat = "123 (a (weird) name) S " + " ".join(["0"] * 18) + " 4200 0 0"
    import os
    hz = os.sysconf("SC_CLK_TCK")
    # started 4200 ticks after boot; 100 s after boot now, at epoch 5000
    got = lifecycle.process_start_time(stat, boot_s=100.0, now=5000.0)
    assert got == pytest.approx(5000 - (100 - 4200 / hz))
    assert lifecycle.process_start_time("garbage") == lifecycle._IMPORTED
    # a child started now is dated now, to a clock tick (and a loaded machine's start-up)
    out = subprocess.run([sys.executable, "-c", "import time; t = time.time(); "
                          "from goodlens.exporter import lifecycle as l; "
                          "print(t, l.process_start_time())"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    t_script, started = map(float, out.stdout.split())
    assert now - 0.02 <= started <= t_script


@pytest.mark.parametrize(("message", "name", "cause", "known"), [
    ("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:123",
     "DistBackendError", "collective_error", True),
    ("Gloo connectFullMesh failed: Connection reset by peer", "RuntimeError",
     "collective_error", True),
    ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
     "1800000ms for recv operation to complete", "DistBackendError", "collective_timeout",
     False),
    ("shapes do not match", "ValueError", "exception:ValueError", True),
])
def test_what_an_exception_says_about_a_failure(message, name, cause, known):
    exc_type = type(name, (RuntimeError,), {})
    assert lifecycle.classify(exc_type, exc_type(message)) == (cause, known)
    events = lifecycle.failure_events(cause, known, None, exc_type(message), now=5.0)
    assert [k for k, _, _ in events] == (["failure"] if known else []) + ["failure_detected"]
