"""How the analysis says things in words: the measured interval advice
(``goodlens plan --db --run`` and the dashboard's checkpoints page) writes durations as the
dashboard's cards do, and the what-if calibration's notes count in the singular for one.
Every expectation is written out by hand.
"""

from __future__ import annotations

import pytest

from goodlens.analysis.measured import Measured, interval_advice
from goodlens.analysis.whatif import _count, _stragglers


def _measured(**kw) -> Measured:
    base = dict(run="r", wall_clock_s=3600.0, uptime_s=3500.0, failures=1, mtbf_s=3500.0,
                mtbf_ci_s=None, checkpoints=5, checkpoint_stall_s=6.0, interval_s=None,
                restore_s=None, restart_cost_s=None, gpus=8.0, goodput=0.9)
    return Measured(**{**base, **kw})


@pytest.mark.parametrize(("kw", "said"), [
    # the demo run's numbers: 67.46 s and 110.12 s are 1m 07s and 1m 50s, as the cards say
    (dict(best_interval_s=67.457, interval_s=110.124, gain_points=1.1, gain_gpu_hours=0.0219),
     "checkpointing every 1m 07s instead of 1m 50s would have recovered 1.1 points of "
     "goodput, 0.02 GPU-hours"),
    # 23 minutes against an hour, as the cards write them; 10 GPU-hours and more are
    # written whole, with thousands separated
    (dict(best_interval_s=1380.0, interval_s=3600.0, gain_points=4.1, gain_gpu_hours=11000.4),
     "checkpointing every 23m 00s instead of 1h 00m would have recovered 4.1 points of "
     "goodput, 11,000 GPU-hours"),
    # under a minute: tenths of a second; no gain: "changed"
    (dict(best_interval_s=45.0, interval_s=45.04, gain_points=0.0, gain_gpu_hours=0.0),
     "checkpointing every 45.0s instead of 45.0s would have changed 0.0 points of goodput, "
     "0.00 GPU-hours"),
    # a day and more
    (dict(best_interval_s=2 * 86400 + 3 * 3600, interval_s=7200.0, gain_points=-0.25,
          gain_gpu_hours=-1.5),
     "checkpointing every 2d 03h instead of 2h 00m would have changed -0.2 points of "
     "goodput, -1.50 GPU-hours"),
    (dict(best_interval_s=None, interval_s=110.0),
     "not enough failures or checkpoints in this run to say which interval would have been "
     "better"),
])
def test_measured_sentence_writes_durations_as_the_dashboard(kw, said):
    m = _measured(**kw)
    assert m.sentence() == said
    assert interval_advice(m.as_dict()) == said  # the dashboard's checkpoints page


def test_counts_are_singular_for_one():
    assert [_count(n, "failure") for n in (0, 1, 2, 11)] == [
        "0 failures", "1 failure", "2 failures", "11 failures"]
    assert _count(1, "flagged episode") == "1 flagged episode"
    assert _count(21, "node") == "21 nodes"


def test_straggler_notes_count_episodes():
    one = [{"subject_kind": "rank", "subject_id": 5, "slowdown": 0.1},
           {"subject_kind": "rank", "subject_id": 5, "slowdown": 0.12}]  # one rank, twice
    prov: dict[str, str] = {}
    _stragglers(one, 86400.0, 2, prov)
    assert prov["straggler_per_node_day"] == "measured: 1 flagged episode"
    two = [*one, {"subject_kind": "host", "subject_id": "node-1", "slowdown": 0.05}]
    _stragglers(two, 86400.0, 2, prov)
    assert prov["straggler_per_node_day"] == "measured: 2 flagged episodes"
    _stragglers([], 86400.0, 2, prov)
    assert prov["straggler_per_node_day"] == "measured: no straggler flagged"


def test_a_finding_row_reads_as_the_cli_and_the_ranks_page_show_it() -> None:
    """``goodlens detect``'s and the ranks page's cells for one finding, open then resolved
    (a resolved finding has no evidence left: no confidence to show)."""
    from goodlens.analysis.findings import finding_cells
    f = {"subject_kind": "rank", "subject_id": 21, "host": "n2",
         "relative_to": "the other ranks of host n2", "id": "2/rank/21/2141", "attempt": 2,
         "first_step": 2141, "detected_step": 2152,
         "slowdown": 0.1004, "job_slowdown": 0.0712, "job_slowdown_part": 0.0251,
         "joint_job_slowdown": 0.0934, "straggler_wait_s": 3.4,
         "wait_per_hour_s": 230.0, "action": "evict", "confidence": 0.751, "status": "update"}
    assert finding_cells(f) == {
        "subject": "rank 21", "host": "n2", "relative_to": "the other ranks of host n2",
        "attempt": "2",
        "first_step": "2141", "detected_step": "2152", "slowdown": "10.0%",
        "job_slowdown": "7.1%", "job_slowdown_part": "2.5%", "joint_job_slowdown": "9.3%",
        "straggler_wait": "3.4s", "wait_per_hour": "3m 50s",
        "action": "evict", "confidence": "0.75", "state": "open"}
    # resolved: no longer one of the open findings, so no part of their joint cost
    done = finding_cells({**f, "status": "resolved", "confidence": 0.0})
    assert (done["confidence"], done["state"]) == ("-", "resolved")
    assert (done["job_slowdown_part"], done["joint_job_slowdown"]) == ("", "")
    # a finding stored before job_slowdown existed, or priced before any step time: empty
    assert finding_cells({**f, "job_slowdown": None})["job_slowdown"] == ""
    assert finding_cells({k: v for k, v in f.items() if k != "job_slowdown"})[
        "job_slowdown"] == ""
    # the host it names: a host finding's own name; none for a switch (many hosts)
    host = {**f, "subject_kind": "host", "subject_id": "n2", "host": None}
    assert (finding_cells(host)["subject"], finding_cells(host)["host"]) == ("host n2", "n2")
    assert finding_cells({**f, "subject_kind": "switch", "subject_id": 0,
                          "host": None})["host"] == ""


def test_the_findings_table_names_both_slowdowns() -> None:
    """The two slowdowns' headers say which is which: the ready-time ratio as
    "slower to collective", the job-level loss as "job slowdown", side by side."""
    from goodlens.analysis.findings import FINDING_COLUMNS
    heads = [h for _, h in FINDING_COLUMNS]
    i = heads.index("slower to collective")
    assert heads[i + 1] == "job slowdown"
