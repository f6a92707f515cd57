"""Nodes across runs: one row per host, its incident rate against the fleet's, and a verdict.

Why a module of its own: a run's findings stay inside that run, but a bad node fails or
straggles in job after job. This puts every run's incidents on the host they happened on,
per attempt (a rank's host is the one it reported in *that* attempt: a restart may put the
same rank on another node), and tests each host against the fleet:

- an **incident** is an attempt in which the host was named by a failure, a hang or an
  eviction (one per attempt however many events name it: a failure ends the attempt), or
  a straggler finding on it (each finding once: a host slow again after its finding
  resolved is a new finding). A failure names a host through its ``host``, or its
  ``rank``'s host in that attempt; the failures others report because of it
  (``collective_error``, ``collective_timeout``, the launcher's SIGTERM of the survivors,
  ``launcher``) name nobody. A straggler finding counts by its open events, not its
  resolution;
- **exposure** is the host's hours in attempts it took part in (each attempt from its
  start to its end, or its latest row while it runs, clipped to the window);
- the **test**: under the null that every host has one incident rate, given the fleet's
  ``K`` incidents over ``H`` host-hours a host's count is binomial with ``K`` trials and
  its share of the hours, ``h / H`` (an exact conditional test of a Poisson rate: no rate
  is estimated). Its one-sided p-value is ``P(X >= k)``; the p-values of every host with
  hours are adjusted by Benjamini-Hochberg, and a host whose adjusted value is at most
  ``q`` (default 0.05) gets the verdict ``drain``: among the hosts flagged, the expected
  share that are healthy is at most ``q``.

Pure computation over frames (:mod:`goodlens.storage.nodeio` reads them, with DuckDB or
Spark): no I/O, no SQL.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from goodlens.model.schema import EventKind

#: Event kinds that can name a host in trouble (what :mod:`goodlens.storage.nodeio` reads).
NODE_KINDS = (EventKind.FAILURE, EventKind.FAILURE_DETECTED, EventKind.STRAGGLER_FLAGGED,
              EventKind.RANK_EVICTED)
#: Failure causes that name the survivors of someone else's failure, not the failed host:
#: a collective that lost its peer, the launcher's notice, its SIGTERM to the others.
SECONDARY_CAUSES = frozenset({"collective_error", "collective_timeout", "launcher",
                              "signal:SIGTERM", "signal:SIGINT"})
#: The false discovery rate ``drain`` holds to by default.
DEFAULT_Q = 0.05
#: Incidents listed as evidence per host (the count is exact; the list is a sample).
EVIDENCE_LIMIT = 5

#: The node table's columns: name and meaning (docs/nodes.md lists them).
NODE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("host", "the host name ranks reported"),
    ("runs", "runs the host took part in (in the window)"),
    ("attempts", "attempts it took part in"),
    ("hours", "hours observed: the attempts' time it took part in, clipped to the window"),
    ("incidents", "attempts in which it was named by a failure, hang or eviction (one per "
                  "attempt), plus straggler findings on it"),
    ("failures", "attempts with a failure naming it (its own cause, not a survivor's)"),
    ("failure_causes", "those failures by cause ({cause: attempts})"),
    ("hangs", "attempts with a hang naming it"),
    ("stragglers", "straggler findings on it (a finding per attempt it covered)"),
    ("evictions", "attempts in which it was evicted"),
    ("restarts", "attempts it took part in that the run restarted after"),
    ("exclusions", "restarts after which the run's next attempt ran without it"),
    ("incident_runs", "runs with at least one incident on it"),
    ("rate_per_hour", "incidents / hours"),
    ("rate_ratio", "its rate over the fleet's (1: as the fleet)"),
    ("expected", "incidents it would have at the fleet's rate: K x hours / H"),
    ("p_value", "one-sided exact p-value: P(X >= incidents), X ~ Binomial(K, hours / H)"),
    ("q_value", "the Benjamini-Hochberg adjusted p-value over every host with hours"),
    ("verdict", "drain (q_value <= q) or ok"),
    ("evidence", "why: the rate against the fleet's, the test, and incidents (run, attempt, "
                 "what)"),
)
NODE_NAMES = [n for n, _ in NODE_COLUMNS]


@dataclass(frozen=True)
class NodeInputs:
    """What the node table is computed from, each frame with a ``run_id`` column:
    ``attempts`` (``attempt, start, end, last_activity``), ``presence`` (``attempt, rank,
    host``: each rank's host in each attempt, from its step rows) and ``events`` of
    :data:`NODE_KINDS` (``attempt, source, time, kind, rank, host, cause, label, detail``)."""

    attempts: pd.DataFrame
    presence: pd.DataFrame
    events: pd.DataFrame


@dataclass
class NodeTable:
    """The node table and the fleet it is measured against."""

    rows: pd.DataFrame
    hosts: int
    hours: float
    incidents: int
    q: float
    since: float | None
    until: float | None

    @property
    def rate_per_hour(self) -> float | None:
        """The fleet's incidents per host-hour (None without hours)."""
        return self.incidents / self.hours if self.hours > 0 else None

    def drain(self) -> list[str]:
        """The hosts to drain, most significant first."""
        return [str(h) for h in self.rows.host[self.rows.verdict == "drain"]]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``goodlens nodes --json``)."""
        from goodlens.model.jsonable import records
        return {"since": self.since, "until": self.until,
                "fleet": {"hosts": self.hosts, "hours": self.hours,
                          "incidents": self.incidents, "rate_per_hour": self.rate_per_hour},
                "test": {"name": "exact conditional binomial (Poisson rate), one-sided, "
                                 "Benjamini-Hochberg", "q": self.q},
                "drain": self.drain(), "hosts": records(self.rows)}


# ------------------------------------------------------------------------------ statistics
def binomial_sf(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)``: the regularized incomplete beta
    ``I_p(k, n - k + 1)`` (exact to about 1e-14)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    return _betainc(float(k), float(n - k + 1), p)


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)``, by its continued fraction
    (Lentz's method), on whichever side converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln_front) * _betacf(b, a, 1.0 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
                    -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def benjamini_hochberg(p: Iterable[float]) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values) of ``p``, in its order: reject where
    the adjusted value is at most the false discovery rate asked for."""
    p = np.asarray(list(p), dtype=float)
    m = len(p)
    if not m:
        return p
    order = np.argsort(p, kind="stable")
    ranked = p[order] * m / np.arange(1, m + 1)
    adjusted = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.minimum(adjusted, 1.0)
    return out


# ------------------------------------------------------------------------------ the table
def node_table(inputs: NodeInputs, since: float | None = None, until: float | None = None,
               q: float = DEFAULT_Q) -> NodeTable:
    """The node table of every host with hours or incidents in ``[since, until]`` (epoch
    seconds; None: unbounded), tested at false discovery rate ``q``; drain first, then by
    p-value."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q={q}: a false discovery rate is between 0 and 1")
    att = _windowed_attempts(inputs.attempts, since, until)
    present = _present(inputs.presence, inputs.events, att)
    named = _named(inputs.events, inputs.presence, att, since, until)
    rows = _per_host(present, named, att)
    total_h, total_k = float(rows.hours.sum()), int(rows.incidents.sum())
    rows = _tested(rows, total_h, total_k, q)
    return NodeTable(rows, len(rows), total_h, total_k, q, since, until)


def _windowed_attempts(attempts: pd.DataFrame, since: float | None,
                       until: float | None) -> pd.DataFrame:
    """Attempts meeting the window, with their ``hours`` in it and whether the run
    restarted after them (``restarted``) and ran a next attempt (``next_attempt``)."""
    a = attempts[["run_id", "attempt", "start", "end", "last_activity"]].copy()
    a["attempt"] = a.attempt.astype("int64")
    stop = a["end"].where(a["end"].notna(), a.last_activity).astype(float)
    start = a.start.astype(float)
    stop = np.maximum(stop.fillna(start), start)
    lo = start if since is None else np.maximum(start, since)
    hi = stop if until is None else np.minimum(stop, until)
    a["hours"] = np.maximum(hi - lo, 0.0) / 3600.0
    last = a.groupby("run_id").attempt.transform("max")
    a["restarted"] = a.attempt < last
    keep = np.ones(len(a), bool)
    if since is not None:
        keep &= stop >= since
    if until is not None:
        keep &= start <= until
    return a[keep].reset_index(drop=True)


def _present(presence: pd.DataFrame, events: pd.DataFrame, att: pd.DataFrame
             ) -> pd.DataFrame:
    """``run_id, attempt, host``: each host in each windowed attempt (a rank's step rows, or
    an event of the attempt naming the host)."""
    ev = events[events.host.notna()][["run_id", "attempt", "host"]]
    both = pd.concat([presence[["run_id", "attempt", "host"]], ev], ignore_index=True)
    both = both[both.host.notna()].astype({"attempt": "int64", "host": str})
    both = both.drop_duplicates()
    return both.merge(att[["run_id", "attempt"]], on=["run_id", "attempt"])


def _named(events: pd.DataFrame, presence: pd.DataFrame, att: pd.DataFrame,
           since: float | None, until: float | None) -> pd.DataFrame:
    """The events naming a host in trouble, in the window: ``run_id, attempt, host, what,
    cause, source`` (``what``: failure, hang, straggler, eviction)."""
    ev = events.copy()
    if since is not None:
        ev = ev[ev.time >= since]
    if until is not None:
        ev = ev[ev.time <= until]
    ev = ev.merge(att[["run_id", "attempt"]], on=["run_id", "attempt"])
    what = pd.Series(None, index=ev.index, dtype=object)
    cause = ev.cause.astype(object)
    failure = ev.kind.isin([EventKind.FAILURE.value, EventKind.FAILURE_DETECTED.value])
    what[failure & (cause == "hang")] = "hang"
    what[failure & (cause != "hang") & ~cause.isin(SECONDARY_CAUSES)] = "failure"
    what[(ev.kind == EventKind.RANK_EVICTED.value)] = "eviction"
    straggler = ev.kind == EventKind.STRAGGLER_FLAGGED.value
    maybe = straggler & ev.detail.str.contains("resolved", regex=False, na=False)
    open_finding = pd.Series(True, index=ev.index)
    open_finding[maybe] = ev.detail[maybe].map(_open_finding).astype(bool)
    subject = ev.label.fillna("").str.split(":", n=1).str[0]
    what[straggler & subject.isin(["rank", "host"]) & open_finding] = "straggler"
    ev = ev.assign(what=what)[what.notna()]
    # the host of the event, else its rank's in that attempt (where it ran then)
    hosts = presence.dropna(subset=["host"]).drop_duplicates(["run_id", "attempt", "rank"])
    hosts = hosts.astype({"attempt": "int64", "rank": "int64"})
    ranked = ev[ev.host.isna() & ev["rank"].notna()].astype({"rank": "int64"})
    ranked = ranked.drop(columns="host").merge(hosts, on=["run_id", "attempt", "rank"])
    out = pd.concat([ev[ev.host.notna()], ranked], ignore_index=True)
    cols = ["run_id", "attempt", "host", "what", "cause", "source", "time"]
    return out[cols].astype({"attempt": "int64", "host": str})


def _open_finding(detail: Any) -> bool:
    """A straggler event that is not the finding's resolution."""
    try:
        body = json.loads(detail) if isinstance(detail, str) else {}
    except ValueError:
        return True
    return not (isinstance(body, dict) and body.get("status") == "resolved")


def _per_host(present: pd.DataFrame, named: pd.DataFrame, att: pd.DataFrame
              ) -> pd.DataFrame:
    """The counting columns of the node table, one row per host."""
    p = present.merge(att[["run_id", "attempt", "hours", "restarted"]],
                      on=["run_id", "attempt"])
    g = p.groupby("host")
    rows = pd.DataFrame({"runs": g.run_id.nunique(), "attempts": g.size(),
                         "hours": g.hours.sum(), "restarts": g.restarted.sum()})
    rows["exclusions"] = _exclusions(present, att)
    # a straggler finding is an incident of its own (its source names it); the rest count
    # once per attempt
    key = named.source.where(named.what == "straggler", "")
    inc = named.assign(key=key).drop_duplicates(["run_id", "attempt", "host", "key"])
    rows = rows.reindex(rows.index.union(pd.Index(named.host.unique())))
    rows["incidents"] = inc.groupby("host").size()
    rows["incident_runs"] = inc.groupby("host").run_id.nunique()
    for what, col in (("failure", "failures"), ("hang", "hangs"), ("eviction", "evictions")):
        sel = named[named.what == what].drop_duplicates(["run_id", "attempt", "host"])
        rows[col] = sel.groupby("host").size()
    st = named[named.what == "straggler"].drop_duplicates(["run_id", "attempt", "host",
                                                           "source"])
    rows["stragglers"] = st.groupby("host").size()
    fails = named[named.what == "failure"].sort_values(["time"], kind="stable")
    first = fails.drop_duplicates(["run_id", "attempt", "host"])  # the first cause
    counts = first.cause.fillna("unknown").groupby([first.host, first.cause.fillna(
        "unknown")]).size()
    causes: dict[str, dict[str, int]] = {}
    for (host, cause), n in counts.items():
        causes.setdefault(host, {})[cause] = int(n)
    rows["failure_causes"] = pd.Series({h: json.dumps(c, sort_keys=True)
                                        for h, c in causes.items()}, dtype=object)
    rows["failure_causes"] = rows.failure_causes.fillna("{}")
    ints = ["runs", "attempts", "restarts", "exclusions", "incidents", "incident_runs",
            "failures", "hangs", "evictions", "stragglers"]
    rows[ints] = rows[ints].fillna(0).astype("int64")
    rows["hours"] = rows.hours.fillna(0.0).astype(float)
    rows["evidence_list"] = _evidence(named)
    return rows.rename_axis("host").reset_index()


def _exclusions(present: pd.DataFrame, att: pd.DataFrame) -> pd.Series:
    """Per host: attempts after which the run's next attempt (one with hosts known) ran
    without it."""
    known = present[["run_id", "attempt"]].drop_duplicates()
    nxt = att[att.restarted][["run_id", "attempt"]].assign(next=lambda d: d.attempt + 1)
    nxt = nxt.merge(known.rename(columns={"attempt": "next"}), on=["run_id", "next"])
    here = present.merge(nxt, on=["run_id", "attempt"])
    there = present.rename(columns={"attempt": "next"}).assign(stayed=True)
    gone = here.merge(there, on=["run_id", "next", "host"], how="left")
    return gone[gone.stayed.isna()].groupby("host").size()


def _evidence(named: pd.DataFrame) -> pd.Series:
    """Per host, its first incidents as ``run attempt N: what (cause)`` lines."""
    first = named.sort_values(["time"], kind="stable").drop_duplicates(
        ["run_id", "attempt", "host", "what"])
    first = first.groupby("host", sort=False).head(EVIDENCE_LIMIT)
    cause = first.cause.where(first.what == "failure")
    text = (first.run_id.astype(str) + " attempt " + first.attempt.astype(str) + ": "
            + first.what + (" (" + cause.astype(str) + ")").where(cause.notna(), ""))
    out: dict[str, list[str]] = {}
    for host, line in zip(first.host, text):
        out.setdefault(host, []).append(line)
    return pd.Series(out, dtype=object)


def _tested(rows: pd.DataFrame, total_h: float, total_k: int, q: float) -> pd.DataFrame:
    """The rate, the test and the verdict of each host."""
    fleet_rate = total_k / total_h if total_h > 0 else math.nan
    hours, k = rows.hours.to_numpy(float), rows.incidents.to_numpy(int)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(hours > 0, k / hours, np.nan)
        ratio = rate / fleet_rate if total_k else np.full(len(rows), np.nan)
    tested = hours > 0
    p = np.full(len(rows), np.nan)
    for i in np.flatnonzero(tested):
        p[i] = binomial_sf(int(k[i]), total_k, min(1.0, hours[i] / total_h))
    qv = np.full(len(rows), np.nan)
    qv[tested] = benjamini_hochberg(p[tested])
    rows = rows.assign(rate_per_hour=rate, rate_ratio=ratio,
                       expected=total_k * hours / total_h if total_h > 0 else np.nan,
                       p_value=p, q_value=qv)
    rows["verdict"] = np.where(tested & (qv <= q) & (k > 0), "drain", "ok")
    rows["evidence"] = [_why(r, fleet_rate, q) for r in rows.itertuples()]
    rows = rows.sort_values(["verdict", "p_value", "host"], ascending=[True, True, True],
                            na_position="last", kind="stable")
    return rows[NODE_NAMES].reset_index(drop=True)


def _why(r: Any, fleet_rate: float, q: float) -> str:
    """A host's evidence as one line of text."""
    if r.hours <= 0:
        return f"{r.incidents} incident(s) with no hours observed: not tested"
    head = (f"{r.incidents} incident(s) in {r.hours:.1f} h ({r.rate_per_hour:.3g}/h) "
            f"against the fleet's {fleet_rate:.3g}/h" if r.incidents else
            f"no incident in {r.hours:.1f} h")
    if r.incidents:
        head += (f": {r.rate_ratio:.1f}x, expected {r.expected:.2f}; p={r.p_value:.2g}, "
                 f"BH q-value {r.q_value:.2g} {'<=' if r.q_value <= q else '>'} {q:g}")
    listed = r.evidence_list if isinstance(r.evidence_list, list) else []
    return head + (f" [first: {'; '.join(listed)}]" if listed else "")
