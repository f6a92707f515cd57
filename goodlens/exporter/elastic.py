"""Elastic training with goodlens: the batch after a resize, the membership story, and
automatic straggler eviction with the guard rails an operator insists on.

Why it exists: goodlens's planners say what to do when nodes are lost and its detector says
"evict", but a job has to act on both. Three pieces, used by ``examples/elastic/``:

- :func:`batch_for_world`: micro-batch and gradient accumulation that keep the global batch
  on the world a rendezvous handed out; the same code as ``goodlens plan elastic``
  (:mod:`goodlens.model.elastic`), so the plan an operator reads is what the job runs. When
  the batch does not divide it says what it chose (``reason``).
- :func:`record_membership`: compares the world an attempt starts with to the previous
  attempt's (a JSON file the job keeps next to its checkpoints) and records
  ``world_resized``, ``rank_joined`` and ``rank_evicted`` (a lost node), so the story of the
  resizes is in the store.
- :class:`EvictionClient`: rank 0 polls the collector's ``GET /v1/actions`` (confirmed
  ``evict`` findings of this run, :mod:`goodlens.collector.actions`) and decides. The rails
  hold whatever the collector answers (a bug, a stale finding, a false alarm): opt-in
  (``mode`` ``off`` by default), a minimum confidence, at most ``max_per_hour`` evictions
  in any hour (counted from a history file that outlives the processes, as evictions
  restart them), never below ``min_nodes``, only a node of the current world, one decision
  per finding (a refusal for confidence is recorded once and decided again as the
  finding's confidence grows), never a node whose rank is in a checkpoint restore that
  still moves (``refused:restoring``, decided again when it is over); ``dry_run``
  records what it would have done and evicts nothing. Every decision is a ``rank_evicted``
  event whose ``detail`` holds the finding that caused it and whose ``cause`` says what
  happened: ``straggler`` (evicted), ``dry_run`` (would have) or ``refused:<rail>``.
  :func:`agreed_eviction` makes every rank learn the decision at the same step (one
  broadcast of one integer).

Imports the model only (and torch lazily, in :func:`agreed_eviction`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from goodlens.model.elastic import BatchChoice, choose_batch
from goodlens.model.schema import EventKind

__all__ = ["BatchChoice", "Decision", "EvictionClient", "EvictionPolicy", "agreed_eviction",
           "batch_for_world", "record_membership"]

log = logging.getLogger("goodlens.exporter.elastic")

MODES = ("off", "on", "dry_run")
#: Most ``rank_evicted`` events one decision records (one per rank of the node).
MAX_RANKS_PER_NODE = 1024


def batch_for_world(global_batch: int, world_size: int, micro_batch: int, *,
                    model_parallel: int = 1, max_micro: int | None = None,
                    allow_inexact: bool = False) -> BatchChoice:
    """Micro-batch and accumulation for ``world_size`` ranks (``model_parallel`` ranks a
    replica) keeping ``global_batch`` samples per optimizer step: exactly what ``goodlens
    plan elastic`` reports for that many replicas. Ranks beyond ``replicas_used`` idle (the
    batch does not divide); ``reason`` says what was chosen."""
    if world_size % model_parallel:
        raise ValueError(f"batch_for_world: model_parallel {model_parallel} does not divide "
                         f"the world ({world_size} ranks)")
    return choose_batch(global_batch, world_size // model_parallel, micro_batch, max_micro,
                        allow_inexact)


# ----------------------------------------------------------------------------- membership

def record_membership(exporter: Any, hosts: list[str], state_file: str | os.PathLike[str],
                      choice: BatchChoice | None = None, evicted: set[str] | None = None
                      ) -> dict[str, Any]:
    """On rank 0 at an attempt's start: compare ``hosts`` (each rank's host, by rank) with
    the previous attempt's membership stored in ``state_file``, record ``world_resized``
    (when the world changed), ``rank_joined`` (ranks on hosts new to the job's world) and
    ``rank_evicted`` with cause ``node_lost`` (hosts gone that this job did not evict
    itself: ``evicted``), then store the new membership. Returns the previous one ({}
    at the first attempt)."""
    path = Path(state_file)
    try:
        prev = json.loads(path.read_text())
    except (OSError, ValueError):
        prev = {}
    old_hosts: list[str] = list(prev.get("hosts") or [])
    world = len(hosts)
    batch = asdict(choice) if choice is not None else None
    if prev and (world != len(old_hosts) or sorted(old_hosts) != sorted(hosts)):
        gone = sorted(set(old_hosts) - set(hosts))
        for h in gone:
            if evicted and h in evicted:
                continue
            for r, oh in enumerate(old_hosts):
                if oh == h:
                    exporter.event(EventKind.RANK_EVICTED, rank=r, host=h, cause="node_lost",
                                   detail=json.dumps({"previous_world": len(old_hosts)}))
        for r, h in enumerate(hosts):
            if h not in old_hosts:
                exporter.event(EventKind.RANK_JOINED, rank=r, host=h, world_size=world)
        exporter.event(EventKind.WORLD_RESIZED, world_size=world,
                       detail=json.dumps({"previous_world": len(old_hosts), "hosts": hosts,
                                          "batch": batch}))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"hosts": hosts, "world": world, "batch": batch,
                               "time": time.time()}))
    os.replace(tmp, path)
    return prev


# ----------------------------------------------------------------------------- eviction

@dataclass(frozen=True)
class EvictionPolicy:
    """When the job may act on an ``evict`` finding (all rails apply in ``on`` and
    ``dry_run``)."""

    mode: str = "off"
    """``off`` (never asks), ``on`` (evicts), ``dry_run`` (records what it would do)."""
    min_confidence: float = 0.7
    """Findings with a lower confidence are refused. The detector's confidence is
    ``1 - 0.5 h / CUSUM``: 0.5 at its threshold ``h`` and at most 5/6 (its CUSUM is capped
    at 3 thresholds, the defaults), so a minimum over 0.83 refuses every finding. 0.7 is a
    CUSUM 1.67 thresholds high."""
    max_per_hour: int = 1
    """Evictions in any 3600 s window, counted over the history file (survives restarts);
    a dry run's would-be evictions count, so it records what ``on`` would really do."""
    min_nodes: int = 1
    """Never evict when it would leave fewer nodes than this."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"eviction mode must be one of {MODES}, not {self.mode!r}")
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ValueError("min_confidence must be within 0-1")
        if self.max_per_hour < 0 or self.min_nodes < 1:
            raise ValueError("max_per_hour must be >= 0 and min_nodes >= 1")


@dataclass(frozen=True)
class Decision:
    """What the client decided about one finding."""

    host: str
    verdict: str
    """``evict``, ``dry_run`` or ``refused:<rail>``."""
    finding: dict[str, Any] = field(default_factory=dict)
    time: float = 0.0


def finding_host(f: dict[str, Any]) -> str | None:
    host = f.get("host")
    if not host and f.get("subject_kind") == "host":
        host = f.get("subject_id")
    return host if isinstance(host, str) and host else None


#: A verdict that is not final: the finding's confidence may still grow.
REFUSED_CONFIDENCE = "refused:confidence"
#: Nor this one: a rank of the finding (or its host) is in a checkpoint restore that still
#: moves (the collector's ``restoring``); slow is not dead, and evicting it would restart
#: every rank's restore. Decided again once the restore is over.
REFUSED_RESTORING = "refused:restoring"
AGAIN = frozenset({REFUSED_CONFIDENCE, REFUSED_RESTORING})


class EvictionClient:
    """Rank 0's side of automatic eviction: polls ``GET /v1/actions`` in a thread, applies
    the rails, records every decision, and hands the training loop at most one host to
    evict (:meth:`take`). ``nodes``: the current world's hosts; ``history``: a JSON-lines
    file of past decisions (the cap and "once per finding" read it, so they hold across
    the restarts evictions cause)."""

    def __init__(self, exporter: Any, url: str | None, run_id: str, policy: EvictionPolicy,
                 nodes: list[str], history: str | os.PathLike[str], *, poll_s: float = 0.5,
                 token: str | None = None, timeout_s: float = 2.0) -> None:
        self.exporter = exporter
        self.url = url.rstrip("/") if url else None
        self.run_id = run_id
        self.policy = policy
        self.nodes = sorted(set(nodes))
        self.history = Path(history)
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._lock = threading.Lock()
        self._pending: Decision | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0

    # -- the rails -------------------------------------------------------------
    def past(self) -> list[dict[str, Any]]:
        """Decisions recorded so far (every process of the job), oldest first."""
        try:
            lines = self.history.read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def decide(self, finding: dict[str, Any], now: float | None = None) -> Decision | None:
        """Apply the rails to one finding; None when it is not this job's to decide (no
        host, already decided). Records and remembers the decision. Every verdict is final
        but ``refused:confidence`` and ``refused:restoring``: a finding's confidence grows
        as its evidence does, and a restore ends, so such a finding is recorded once and
        decided again at later polls."""
        now = time.time() if now is None else now
        fid = str(finding.get("id") or "")
        host = finding_host(finding)
        if not fid or host is None:
            return None
        past = self.past()
        mine = {p.get("verdict") for p in past if p.get("finding_id") == fid}
        if mine - AGAIN:
            return None
        p = self.policy
        try:
            conf = float(finding.get("confidence", 0.0))
        except (TypeError, ValueError):
            conf = 0.0
        recent = [x for x in past if x.get("verdict") in ("evict", "dry_run")
                  and now - float(x.get("time", 0.0)) < 3600.0]
        # a node this client evicted this hour is gone, even if its list still names it
        gone = {x.get("host") for x in recent if x.get("verdict") == "evict"}
        world = [n for n in self.nodes if n not in gone]
        if finding.get("action") != "evict":
            verdict = "refused:not_evict"
        elif host not in world:
            verdict = "refused:not_in_world"
        elif finding.get("restoring"):
            verdict = REFUSED_RESTORING
        elif not conf >= p.min_confidence:
            verdict = REFUSED_CONFIDENCE
        elif len(world) - 1 < p.min_nodes:
            verdict = "refused:min_nodes"
        elif len(recent) >= p.max_per_hour:
            verdict = "refused:cap"
        elif p.mode == "dry_run":
            verdict = "dry_run"
        else:
            verdict = "evict"
        if verdict in mine:  # still doubtful or restoring: recorded once, asked again
            return None
        d = Decision(host, verdict, finding, now)
        self._remember(d, fid)
        return d

    def _remember(self, d: Decision, fid: str) -> None:
        with self.history.open("a") as f:
            f.write(json.dumps({"finding_id": fid, "host": d.host, "verdict": d.verdict,
                                "time": d.time}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        cause = "straggler" if d.verdict == "evict" else d.verdict
        detail = json.dumps({"finding": d.finding, "policy": asdict(self.policy),
                             "nodes": self.nodes}, default=str)
        ranks = d.finding.get("ranks") or [None]
        # one event per rank the finding names, but never more than a node can hold (the
        # list comes from the collector: a garbage one must not flood the job's events)
        ranks = ranks[:MAX_RANKS_PER_NODE] if isinstance(ranks, list) else [None]
        for r in ranks:
            fields: dict[str, Any] = {"host": d.host, "cause": cause, "detail": detail,
                                      "step": d.finding.get("last_step")}
            fields["rank"] = r if isinstance(r, int) and not isinstance(r, bool) else None
            if not isinstance(fields["step"], int):
                fields.pop("step")
            self.exporter.event(EventKind.RANK_EVICTED, **fields)
        log.warning("goodlens: eviction of %s: %s (finding %s)", d.host, d.verdict, fid)

    # -- polling ---------------------------------------------------------------
    def fetch(self) -> list[dict[str, Any]]:
        """The collector's current evict findings for this run ([] on any error)."""
        if not self.url:
            return []
        q = urllib.parse.urlencode({"run": self.run_id})
        req = urllib.request.Request(f"{self.url}/v1/actions?{q}", headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                body = json.loads(resp.read(1 << 20))
        except Exception:  # the collector down or answering garbage: nothing to do
            self.errors += 1
            return []
        found = body.get("evict") if isinstance(body, dict) else None
        return [f for f in found if isinstance(f, dict)] if isinstance(found, list) else []

    def poll_once(self, now: float | None = None) -> Decision | None:
        """Fetch and decide; an ``evict`` verdict becomes the pending eviction (one at a
        time: later findings wait for the next poll after it was taken)."""
        with self._lock:
            if self._pending is not None:
                return None
        made = None
        for f in self.fetch():
            d = self.decide(f, now)
            if d is not None:
                made = d
                if d.verdict == "evict":
                    with self._lock:
                        self._pending = d
                    break
        return made

    def take(self) -> Decision | None:
        """The eviction to carry out now (once), if any."""
        with self._lock:
            d, self._pending = self._pending, None
        return d

    def start(self) -> EvictionClient:
        """Poll in a daemon thread every ``poll_s`` (nothing when ``mode`` is ``off``)."""
        if self.policy.mode != "off" and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="goodlens-eviction",
                                            daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception:  # never into the training loop
                log.exception("goodlens: eviction poll failed")

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)


def agreed_eviction(client: EvictionClient | None, nodes: list[str], src: int = 0,
                    group: Any = None) -> str | None:
    """Collective (every rank calls it at the same step): the host rank ``src``'s client
    decided to evict, or None. One broadcast of one integer (the host's index in the
    sorted ``nodes``, 0 for none)."""
    import torch
    import torch.distributed as dist

    order = sorted(set(nodes))
    code = 0
    if client is not None:
        d = client.take()
        if d is not None and d.host in order:
            code = order.index(d.host) + 1
    t = torch.tensor([code], dtype=torch.int64)
    dist.broadcast(t, src=src, group=group)
    k = int(t.item())
    return order[k - 1] if 0 < k <= len(order) else None
