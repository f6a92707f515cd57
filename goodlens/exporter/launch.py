"""torchrun with the launcher's view of failures: ``python -m goodlens.exporter.launch`` takes
torchrun's arguments unchanged and records, from inside the elastic agent, each failure of a
worker group it sees.

Why it exists: a worker killed by SIGKILL, a segfault, an abort or ``os._exit`` runs no
Python, so it cannot record its own death; its surviving peers usually notice (their
collective raises) but not always (a peer computing when it was stopped). The agent always
sees it: its monitor loop (every ``--monitor-interval``, 0.1 s by default) finds the exit
code. When a check finds the group ``FAILED`` or ``UNHEALTHY`` this wrapper records, for
the attempt that failed (``TORCHELASTIC_RESTART_COUNT`` of its workers): ``failure`` for each
failed rank (``cause`` ``exit:<code>`` or ``signal:<name>``, ``rank``, ``host``), dated now,
at most one monitor interval after the death, since the agent keeps no finer time (its
``ProcessFailure.timestamp`` is whole seconds); and ``failure_detected`` now. Workers'
own, earlier ``failure`` instants win: accounting takes the earliest.

Configuration: ``GOODLENS_URL`` (nothing is recorded without it) and ``GOODLENS_RUN_ID``
(else torchrun's ``--rdzv-id``/``TORCHELASTIC_RUN_ID``), as the workers read them.

How: it wraps ``LocalElasticAgent._monitor_workers`` (torch's own method, a private name of
``torch.distributed.elastic``; checked with torch 2.13) and then runs
``torch.distributed.run.main``. torchrun's elastic events (``events.record``) are not
used: the worker-level ``FAILED`` event is recorded only when the agent's run returns,
after the last restart, so it cannot date the failures it restarted from.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from typing import Any

log = logging.getLogger("goodlens.exporter.launch")


class AgentRecorder:
    """Records the failures an elastic agent's monitor loop finds (one exporter per job)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        self.exporter: Any = None
        self.seen: set[tuple[int, int]] = set()  # (attempt, global rank) recorded
        self.host = socket.gethostname()

    def _exporter(self, run_id: str | None) -> Any:
        if self.exporter is None:
            from goodlens.exporter.recorder import RankExporter
            url = self.env.get("GOODLENS_URL")
            run = self.env.get("GOODLENS_RUN_ID") or run_id
            if not url or not run:
                return None
            self.exporter = RankExporter(run_id=run, url=url, rank=0, spill_dir=None,
                                         hooks=False, flush_interval_s=0.5)
        return self.exporter

    def failed(self, attempt: int, failures: dict[int, Any], run_id: str | None,
               now: float | None = None) -> None:
        """Record a failed group check: ``failures`` maps global ranks to torchelastic's
        ``ProcessFailure`` (``exitcode``: negative for a signal)."""
        exp = self._exporter(run_id)
        if exp is None:
            return
        t = time.time() if now is None else now
        exp.new_attempt(attempt)
        new = False
        for rank, failure in sorted(failures.items()):
            if (attempt, rank) in self.seen:
                continue
            self.seen.add((attempt, rank))
            new = True
            exp.event("failure", time_s=t, cause=_cause(failure), rank=int(rank),
                      host=self.host, detail='{"seen_by": "launcher"}')
        if new or not failures:
            exp.event("failure_detected", time_s=t, cause="launcher", rank=None,
                      host=self.host)
        exp.flush(timeout=2.0, spill_ok=True)

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.close(timeout=5.0)


def _cause(failure: Any) -> str:
    code = getattr(failure, "exitcode", None)
    if isinstance(code, int) and code < 0:
        try:
            return f"signal:{signal.Signals(-code).name}"
        except ValueError:
            return f"signal:{-code}"
    return f"exit:{code}"


def patch_agent(recorder: AgentRecorder) -> None:
    """Wrap the local elastic agent's monitor so each failed check reaches ``recorder``."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    original = LocalElasticAgent._monitor_workers
    if getattr(original, "_goodlens", False):
        return

    def monitor(self: Any, worker_group: Any) -> Any:
        result = original(self, worker_group)
        if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            try:
                spec = worker_group.spec
                attempt = spec.max_restarts - self._remaining_restarts
                recorder.failed(attempt, dict(result.failures or {}),
                                spec.rdzv_handler.get_run_id())
            except Exception:
                log.warning("goodlens: could not record the failure", exc_info=True)
        return result

    monitor._goodlens = True  # type: ignore[attr-defined]
    LocalElasticAgent._monitor_workers = monitor  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv`` (default: this process's arguments)."""
    from torch.distributed import run as torchrun

    recorder = AgentRecorder()
    patch_agent(recorder)
    try:
        torchrun.main(sys.argv[1:] if argv is None else argv)  # raises if the job failed
    finally:
        recorder.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
