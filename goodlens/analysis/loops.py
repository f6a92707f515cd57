"""Restart loops: a run whose attempts keep failing without committing a new step.

Why it exists: a job that fails the same way after every restart burns its allocation one
restart at a time (a checkpoint restored with NaNs, a node that dies each time it is
given the job), and a launcher that restarts on failure never notices. goodlens sees
every attempt, so it says so at the second such attempt, with the pattern and what to do:

- an attempt **commits** a step when it saves a checkpoint of a step beyond every
  checkpoint saved before it (``ckpt_save_durable_end``; ``ckpt_save_blocking_end`` for a
  run that records no durable end). A run that records no save commits by reaching a step
  beyond every earlier attempt's;
- a **fruitless** attempt ended in a failure (``end_reason`` failed, or unknown: the run
  restarted with no end recorded) without committing; a preempted one neither counts nor
  breaks the streak, a committing or completed one ends it;
- at the second fruitless attempt in a row the run is **looping**, with the patterns that
  hold over every fruitless attempt of the streak: ``same_rank`` and ``same_host`` (the
  failing ranks, and their hosts in each attempt, named by failures of their own cause,
  not the survivors' ``collective_error``), ``same_checkpoint`` (each restored the same
  step, and failed this long after the restore ended);
- the **advice**: drain the host (``same_host``), or restore the previous durable
  checkpoint (the durable one before the step restored, or the latest durable one where
  the looping restore read a faster tier).

Pure computation over one run's frames (no I/O).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from goodlens.analysis.nodes import SECONDARY_CAUSES
from goodlens.model.schema import EventKind
from goodlens.storage.reader import RunReader

_K = EventKind
#: Event kinds the loop check reads (all among the accounting's).
LOOP_KINDS = (_K.FAILURE, _K.FAILURE_DETECTED, _K.CKPT_SAVE_BLOCKING_END,
              _K.CKPT_SAVE_DURABLE_END, _K.CKPT_RESTORE_START, _K.CKPT_RESTORE_END)
#: Fruitless attempts in a row that make a loop.
LOOP_AT = 2
_FAILED = ("failed", "unknown")


def restart_loop(attempts: pd.DataFrame, events: pd.DataFrame,
                 last_steps: Mapping[int, int] | None = None,
                 rank_hosts: Callable[[list[int]], Mapping[int, Mapping[int, str | None]]]
                 | None = None) -> dict[str, Any] | None:
    """The run's latest restart loop (None: none): ``attempts`` (``attempt, end_reason``),
    ``events`` (at least :data:`LOOP_KINDS`), ``last_steps`` (each attempt's last step, for
    a run that records no save) and ``rank_hosts`` (attempts -> ``{attempt: {rank: host}}``,
    to name the host of a failure that names only its rank). ``ongoing``: no attempt has
    committed or completed since."""
    att = attempts.sort_values("attempt")
    saves = _saves(events)
    commit_steps = saves.groupby("attempt").step.max().to_dict() if len(saves) else {}
    reached = dict(last_steps or {})
    high, streak, loop = -1, [], None
    for a, end in zip(att.attempt.astype(int), att.end_reason):
        top = commit_steps.get(a) if len(saves) else reached.get(a)
        committed = top is not None and top > high
        high = max(high, top) if top is not None else high
        if committed or end == "completed":
            streak = []
        elif isinstance(end, str) and end in _FAILED:
            streak.append(a)
            if len(streak) >= LOOP_AT:
                loop = list(streak)
        elif end is None or end != end:  # still running: the streak stands
            continue
    if loop is None:
        return None
    return _describe(loop, streak == loop, events, saves, rank_hosts)


def _saves(events: pd.DataFrame) -> pd.DataFrame:
    """The committed saves: durable ends, or blocking ends where the run records none."""
    durable = events[(events.kind == _K.CKPT_SAVE_DURABLE_END.value) & events.step.notna()]
    if len(durable):
        return durable
    return events[(events.kind == _K.CKPT_SAVE_BLOCKING_END.value) & events.step.notna()]


def _describe(loop: list[int], ongoing: bool, events: pd.DataFrame, saves: pd.DataFrame,
              rank_hosts: Any) -> dict[str, Any]:
    ev = events[events.attempt.isin(loop)]
    fails = ev[ev.kind.isin([_K.FAILURE.value, _K.FAILURE_DETECTED.value])
               & ~ev.cause.isin(SECONDARY_CAUSES)]
    fails = fails[fails["rank"].notna() | fails.host.notna()]
    need = sorted({int(a) for a in fails.attempt[fails.host.isna()]})
    where = rank_hosts(need) if need and rank_hosts is not None else {}
    ranks = {a: {int(r) for r in fails["rank"][fails.attempt == a].dropna()} for a in loop}
    hosts = {a: set() for a in loop}
    for a, r, h in zip(fails.attempt, fails["rank"], fails.host):
        h = h if isinstance(h, str) else (where.get(int(a), {}).get(int(r))
                                          if r == r and r is not None else None)
        if h is not None:
            hosts[int(a)].add(h)
    patterns: list[dict[str, Any]] = []
    same_ranks = set.intersection(*ranks.values())
    if same_ranks:
        patterns.append({"kind": "same_rank", "ranks": sorted(same_ranks)})
    same_hosts = set.intersection(*hosts.values())
    if same_hosts:
        patterns.append({"kind": "same_host", "hosts": sorted(same_hosts)})
    restored = _restores(ev, loop)
    steps = {r["step"] for r in restored.values()}
    if len(restored) == len(loop) and len(steps) == 1:
        after = []
        for a, r in restored.items():
            t_fail = ev.time[(ev.attempt == a) & ev.kind.isin(
                [_K.FAILURE.value, _K.FAILURE_DETECTED.value])]
            if len(t_fail) and r["end"] is not None:
                after.append({"attempt": a,
                              "seconds": max(0.0, float(t_fail.min()) - r["end"])})
        tiers = {r["tier"] for r in restored.values()}
        patterns.append({"kind": "same_checkpoint", "step": steps.pop(),
                         "tier": tiers.pop() if len(tiers) == 1 else None,
                         "failed_after_restore_s": after})
    causes = sorted({str(c) for c in fails.cause.dropna()})
    return {"attempts": loop, "count": len(loop), "first_attempt": loop[0],
            "flagged_at_attempt": loop[LOOP_AT - 1], "ongoing": ongoing,
            "patterns": patterns, "causes": causes,
            "advice": _advice(patterns, saves)}


def _restores(ev: pd.DataFrame, loop: list[int]) -> dict[int, dict[str, Any]]:
    """Per attempt of the loop that restored: the step and tier read, and when the restore
    ended (the last rank's end; None without an end)."""
    out = {}
    for a in loop:
        st = ev[(ev.attempt == a) & (ev.kind == _K.CKPT_RESTORE_START.value)
                & ev.step.notna()]
        if not len(st):
            continue
        end = ev.time[(ev.attempt == a) & (ev.kind == _K.CKPT_RESTORE_END.value)]
        tier = st.tier.dropna()
        out[a] = {"step": int(st.step.max()), "tier": str(tier.iloc[0]) if len(tier) else None,
                  "end": float(end.max()) if len(end) else None}
    return out


def _advice(patterns: list[dict[str, Any]], saves: pd.DataFrame) -> list[dict[str, Any]]:
    """What to do, most specific first."""
    by = {p["kind"]: p for p in patterns}
    out = []
    if "same_host" in by:
        hosts = by["same_host"]["hosts"]
        out.append({"action": "drain_host", "hosts": hosts,
                    "text": f"drain {', '.join(hosts)} and restart without it: each attempt "
                            "of the loop failed there"})
    ck = by.get("same_checkpoint")
    durable = saves[saves.tier.isna() | (saves.tier == "durable")].step.dropna().astype(int)
    if ck is not None:
        step, tier = int(ck["step"]), ck.get("tier")
        before = durable[durable < step] if tier in (None, "durable") else durable[
            durable <= step]
        target = int(before.max()) if len(before) else None
        what = ("the previous durable checkpoint" if tier in (None, "durable")
                else "the latest durable checkpoint")
        at = f" (step {target})" if target is not None else f" (before step {step})"
        out.append({"action": "restore_previous_durable", "step": target,
                    "text": f"restore {what}{at} instead of step {step}"
                            + (f" ({tier})" if tier else "") + ": every attempt of the loop "
                            "failed right after restoring it"})
    elif not out:
        target = int(durable.max()) if len(durable) else None
        out.append({"action": "restore_previous_durable", "step": target,
                    "text": "the attempts fail without committing a step and name no common "
                            "rank, host or checkpoint: look at their causes, or restore an "
                            "earlier durable checkpoint"
                            + (f" (step {target} is the latest)" if target is not None else "")})
    return out


def run_restart_loop(source: RunReader, run_id: str, attempts: pd.DataFrame | None = None,
                     steps: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """:func:`restart_loop` of a stored run (``attempts`` and ``steps``: its attempts and
    step summaries when already read)."""
    from goodlens.analysis.findings import attempt_rank_hosts

    attempts = source.attempts(run_id) if attempts is None else attempts
    if len(attempts) < LOOP_AT:
        return None
    steps = source.step_summaries(run_id) if steps is None else steps
    last = steps.groupby("attempt").step.max() if len(steps) else pd.Series(dtype=int)
    return restart_loop(attempts, source.events(run_id, kinds=list(LOOP_KINDS)),
                        {int(a): int(s) for a, s in last.items()},
                        lambda atts: attempt_rank_hosts(source, run_id, atts))


def loop_text(loop: dict[str, Any]) -> str:
    """A loop as a few lines of text (``goodlens report``)."""
    lines = [f"restart loop: attempts {', '.join(map(str, loop['attempts']))} failed without "
             f"committing a step ({'ongoing' if loop['ongoing'] else 'ended'})"]
    for p in loop["patterns"]:
        if p["kind"] == "same_rank":
            lines.append(f"  the same rank failed each time: {p['ranks']}")
        elif p["kind"] == "same_host":
            lines.append(f"  on the same host each time: {', '.join(p['hosts'])}")
        else:
            lines.append(f"  each restored step {p['step']}"
                         + (f" ({p['tier']})" if p.get("tier") else "")
                         + " and failed right after")
    lines += [f"  advice: {a['text']}" for a in loop["advice"]]
    return "\n".join(lines)
