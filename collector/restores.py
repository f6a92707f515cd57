"""Live restore watch: each running run's latest restore, its slow and stuck ranks, and the
ranks whose restore still moves.

Why it exists apart from the straggler service: a restore has no steps (at an attempt's
start the attempt has none yet), so it is read from the restore events
(``ckpt_restore_start``, ``ckpt_restore_progress``, ``ckpt_restore_end``) of each running
run's latest attempt at every detection pass, and judged by
:func:`goodlens.detectors.restore.restore_findings` against the hang timeout. What it finds
is served while the restore lasts: ``/v1/actions`` (``slow_restore``, ``stuck_restore``, and
``restoring`` on an evict finding whose ranks still restore, which the eviction rails
refuse) and ``/metrics``. It is state of the pass, not stored: the events it reads are.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from goodlens.detectors.hangs import HangConfig
from goodlens.detectors.restore import (
    KINDS,
    RankRestore,
    RestoreConfig,
    RestoreFinding,
    moving,
    rank_restores,
    restore_findings,
)
from goodlens.storage.reader import RunReader

__all__ = ["RestoreState", "RestoreWatch"]

log = logging.getLogger("goodlens.detection")


@dataclass(frozen=True)
class RestoreState:
    """One run's latest restore at the last pass."""

    attempt: int
    ranks: list[RankRestore]
    findings: list[RestoreFinding]
    moving: set[int]
    timeout_s: float
    at: float
    """The pass's clock."""
    open_ranks: set[int] = field(default_factory=set)
    """Ranks whose restore has not ended."""


class RestoreWatch:
    """Reads the running runs' restore events at each pass; thread-safe reads."""

    def __init__(self, store: RunReader, hang_config: HangConfig | None = None,
                 config: RestoreConfig | None = None, live_window_s: float = 3600.0) -> None:
        self.store = store
        self.hang_config = hang_config or HangConfig()
        self.config = config or RestoreConfig()
        self.live_window_s = live_window_s
        self._state: dict[str, RestoreState] = {}
        self._seen: set[tuple[str, int, str, int, float]] = set()  # logged findings
        self._lock = threading.Lock()

    def poll(self, running: list[str], now: float, timeouts: dict[str, float]) -> None:
        """One pass over ``running`` runs at ``now``; ``timeouts``: each run's current hang
        timeout where the hang watch knows one (else the floor)."""
        fresh: dict[str, RestoreState] = {}
        for run_id in running:
            st = self._run(run_id, now, timeouts.get(run_id))
            if st is not None:
                fresh[run_id] = st
        with self._lock:
            self._state = fresh

    def _run(self, run_id: str, now: float, timeout: float | None) -> RestoreState | None:
        attempts = self.store.attempts(run_id)
        if not len(attempts):
            return None
        attempt = int(attempts.attempt.max())
        ev = self.store.events(run_id, kinds=list(KINDS), attempt=attempt)
        if not len(ev) or now - float(ev.time.max()) > self.live_window_s:
            return None   # no restore in this attempt, or a stale one (a replay of old data)
        ranks = rank_restores(ev)
        timeout_s = self.hang_config.timeout(0.0) if timeout is None else timeout
        found = restore_findings(ranks, attempt, now, timeout_s, self.config)
        for f in found:
            key = (run_id, attempt, f.kind, f.rank, f.started)
            if key not in self._seen:
                self._seen.add(key)
                log.warning("run %s attempt %d: rank %d %s (%.0f s in its restore, phase %s, "
                            "%d bytes read)", run_id, attempt, f.rank, f.kind, f.restore_s,
                            f.phase, f.bytes_read)
        return RestoreState(attempt, ranks, found, moving(ranks, now, timeout_s), timeout_s,
                            now, {r.rank for r in ranks if r.end is None})

    def state(self) -> dict[str, RestoreState]:
        """Per running run with a restore in its latest attempt, its state at the last pass."""
        with self._lock:
            return dict(self._state)

    def findings(self, run_id: str, kind: str) -> list[dict[str, Any]]:
        """The run's open findings of ``kind`` as plain values, by rank."""
        st = self.state().get(run_id)
        if st is None:
            return []
        return [f.as_dict() for f in sorted(st.findings, key=lambda f: f.rank)
                if f.kind == kind]

    def restoring(self, run_id: str) -> tuple[set[int], set[str]]:
        """The ranks of the run whose restore still moves, and their hosts."""
        st = self.state().get(run_id)
        if st is None:
            return set(), set()
        hosts = {r.host for r in st.ranks if r.rank in st.moving and r.host}
        return set(st.moving), hosts  # type: ignore[arg-type]
