"""contrib/prometheus: the example rules pass ``promtool check rules`` and their unit tests
(``promtool test rules``), and use only the metric names the collector promises to export
(docs/prometheus.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "contrib" / "prometheus" / "goodlens-rules.yml"
RULE_TESTS = ROOT / "contrib" / "prometheus" / "goodlens-rules.test.yml"

# The contract between the rules and /metrics (goodlens/collector/metrics.py): every series
# the rules may read. A name the rules use that is not here is a typo or a series the
# collector does not export; renaming one here means changing the collector and the docs.
EXPORTED_METRICS = frozenset({
    "goodlens_run_state",
    "goodlens_run_last_activity_timestamp_seconds",
    "goodlens_run_hang_timeout_seconds",
    "goodlens_run_failures_total",
    "goodlens_run_hangs_total",
    "goodlens_run_wall_clock_seconds",
    "goodlens_run_time_seconds",
    "goodlens_run_goodput_ratio",
    "goodlens_straggler_slowdown_ratio",
    "goodlens_straggler_job_slowdown_ratio",
    "goodlens_straggler_onset_timestamp_seconds",
    "goodlens_exporter_dropped_rows_total",
    "goodlens_ingest_rejected_batches_total",
    "goodlens_run_restart_loop_attempts",
    "goodlens_node_incident_rate_ratio",
})

ALERTS = {
    "GoodlensRunHung",
    "GoodlensRunHangDetected",
    "GoodlensRunFailing",
    "GoodlensRestartLoop",
    "GoodlensNodeDrain",
    "GoodlensLowGoodput",
    "GoodlensStragglerFlagged",
    "GoodlensExporterDropping",
    "GoodlensIngestRejecting",
}

_RECORD = re.compile(r"^\s*-\s*record:\s*(\S+)\s*$", re.MULTILINE)
_ALERT = re.compile(r"^\s*-\s*alert:\s*(\S+)\s*$", re.MULTILINE)
_METRIC = re.compile(r"goodlens_[a-z_]+")


def _promtool() -> str:
    path = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists()
                                        else None)
    if path is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; `make test` "
                    "installs it)")
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)


def test_promtool_checks_the_rules():
    text = RULES.read_text()
    n_rules = len(_RECORD.findall(text)) + len(_ALERT.findall(text))
    done = _run("check", "rules", "--lint=all", "--lint-fatal", str(RULES.relative_to(ROOT)))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert f"SUCCESS: {n_rules} rules found" in out, out


def test_promtool_unit_tests_pass():
    done = _run("test", "rules", str(RULE_TESTS.relative_to(ROOT)))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Unit Testing:" in out and "SUCCESS" in out, out
    assert "FAILED" not in out, out


def test_rules_use_only_exported_metrics():
    text = RULES.read_text()
    records = _RECORD.findall(text)
    assert records, "no recording rules found"
    # a recording rule's output (run:goodlens_...:1h) is the file's own name, not a read of
    # /metrics: take those out before looking for the collector's names
    for name in sorted(records, key=len, reverse=True):
        text = text.replace(name, "")
    used = set(_METRIC.findall(text))
    assert used, "no goodlens_ metric found in the rules"
    assert used <= EXPORTED_METRICS, sorted(used - EXPORTED_METRICS)


def test_every_alert_is_there_with_severity_and_annotations():
    text = RULES.read_text()
    assert set(_ALERT.findall(text)) == ALERTS
    # each alert's block: from its `- alert:` line to the next rule
    blocks = re.split(r"^\s*-\s*(?=alert:|record:)", text, flags=re.MULTILINE)
    for block in blocks:
        if not block.startswith("alert:"):
            continue
        assert re.search(r"^\s*severity:\s*(critical|warning)\s*$", block, re.MULTILINE), block
        assert "summary:" in block and "description:" in block, block
        assert "{{ $labels." in block and "{{ $value" in block, block


def test_unit_tests_cover_every_alert_firing_and_silent():
    tests = RULE_TESTS.read_text()
    for alert in ALERTS:
        cases = re.findall(rf"alertname:\s*{alert}\s*\n(\s*)exp_alerts:(.*?)(?=\n\s*-\s*eval_time:|"
                           r"\n\s*-\s*name:|\n\s*#\s*---|\Z)", tests, re.DOTALL)
        assert cases, f"{alert} is not tested"
        silent = [body for _, body in cases if body.strip().startswith("[]")]
        firing = [body for _, body in cases if "exp_labels:" in body]
        assert silent and firing, f"{alert}: needs a case where it fires and one where it does not"
