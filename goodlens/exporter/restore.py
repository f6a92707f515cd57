"""Restore progress: bytes read so far and the phase of one rank's checkpoint restore, sent
as ``ckpt_restore_progress`` events from a sampling thread.

Why it exists: between ``ckpt_restore_start`` and ``ckpt_restore_end`` a rank reading its
checkpoint slowly and a dead one look the same, and both look fine until a timeout. With
progress the collector tells them apart (``slow_restore`` against ``stuck_restore``,
:mod:`goodlens.detectors.restore`) and never evicts a rank whose restore still moves.

The training thread only adds to a counter (:meth:`RestoreProgress.add`, one attribute
update per read item) and notes phase changes with their instant (:meth:`RestoreProgress.
phase`, a tuple appended and an event set). A daemon thread turns them into events: each
phase change at once, with the instant and the bytes of the change, and the bytes read at
most once per interval while they move (``ExporterConfig.restore_progress_s``, 1 s by
default, growing to 10 s as a restore lasts: a 4-hour restore sends about 1,500 events per
rank, not 15,000). Nothing is sent while the bytes stand still: the collector reads the
last move from the last event. Phases (:data:`~goodlens.model.schema.RESTORE_PHASES`):
``read`` the checkpoint, ``load`` what was read into the model, ``barrier`` waiting for the
other ranks. A restore with no ``ckpt_restore_end`` of its own (a torchft heal) ends with a
progress event whose ``detail`` says ``ended``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from typing import Any

from goodlens.model.schema import RESTORE_PHASES, EventKind

__all__ = ["RestoreProgress"]

log = logging.getLogger("goodlens.exporter.restore")

#: The longest interval between two progress events while bytes move (s).
MAX_INTERVAL_S = 10.0
#: A restore that has lasted T seconds sends progress at most every T / this (s).
EVENTS_PER_ELAPSED = 60.0


class RestoreProgress:
    """One rank's restore: ``with RestoreProgress(exporter, bytes_total=N) as p: ...
    p.add(n) ... p.phase("barrier")``. The ``ckpt_restore_start``/``_end`` events stay the
    caller's; this sends the ``ckpt_restore_progress`` events between them. ``live_bytes``:
    whether :meth:`add` is called as bytes arrive (False when a phase reads in one call that
    cannot be watched: the collector then never calls the rank stuck, only slow).
    ``fields``: sent with every event (``step``, ``tier``)."""

    def __init__(self, exporter: Any, *, bytes_total: int | None = None,
                 live_bytes: bool = True, **fields: Any) -> None:
        config = getattr(exporter, "config", None)
        self.interval_s = float(getattr(config, "restore_progress_s", 1.0))
        self.enabled = bool(getattr(exporter, "enabled", True)) and self.interval_s > 0
        self.exporter = exporter
        self.bytes = 0
        """Bytes read so far (the training thread's counter; the sampler only reads it)."""
        self.bytes_total = bytes_total
        self.live_bytes = live_bytes
        self.fields = fields
        self._changes: deque[tuple[str, float, int, int | None]] = deque()
        self._phase = RESTORE_PHASES[0]
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._sent_bytes = -1
        self._sent_at = 0.0
        self._t0 = 0.0

    def __enter__(self) -> RestoreProgress:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- the training thread ---------------------------------------------------------
    def start(self, phase: str = "read") -> RestoreProgress:
        """The restore began (its first phase now); starts the sampler."""
        if not self.enabled:
            return self
        self._t0 = time.monotonic()
        self.phase(phase)
        self._thread = threading.Thread(target=self._run, name="goodlens-restore-progress",
                                        daemon=True)
        self._thread.start()
        return self

    def add(self, n: int) -> None:
        """``n`` more bytes were read."""
        self.bytes += n

    def phase(self, name: str, bytes_total: int | None = None) -> None:
        """The restore entered phase ``name`` now (``bytes_total`` when it became known)."""
        if not self.enabled or name not in RESTORE_PHASES:
            return
        self._changes.append((name, time.time(), self.bytes, bytes_total))
        self._wake.set()

    def stop(self, ended: bool = False) -> None:
        """The restore ended: send what is pending and stop the sampler (call before
        ``ckpt_restore_end``, so every progress event comes before it). ``ended``: no
        ``ckpt_restore_end`` follows (a torchft heal has ``heal_start``/``_end`` instead):
        a last event, in the last phase, says the restore is over (``detail.ended``)."""
        if self._thread is None:
            return
        self._stop = True
        self._wake.set()
        self._thread.join(5.0)
        self._thread = None
        self._send_changes()
        if ended:
            self._send(self._phase, time.time(), self.bytes, ended=True)

    # -- the sampler thread ----------------------------------------------------------
    def _interval(self) -> float:
        elapsed = time.monotonic() - self._t0
        return max(self.interval_s, min(MAX_INTERVAL_S, elapsed / EVENTS_PER_ELAPSED))

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(self._interval())
                self._wake.clear()
                if self._stop:
                    return
                self._send_changes()
                now = time.monotonic()
                if self.bytes != self._sent_bytes and now - self._sent_at >= self._interval():
                    self._send(self._phase, time.time(), self.bytes)
        except Exception:   # never into training; the restore goes on unwatched
            log.warning("goodlens: restore progress stopped", exc_info=True)

    def _send_changes(self) -> None:
        while self._changes:
            name, t, seen, total = self._changes.popleft()
            if total is not None:
                self.bytes_total = total
            self._phase = name
            self._send(name, t, seen)

    def _send(self, phase: str, t: float, seen: int, ended: bool = False) -> None:
        detail: dict[str, Any] = {"live_bytes": self.live_bytes}
        if self.bytes_total is not None:
            detail["bytes_total"] = int(self.bytes_total)
        if ended:
            detail["ended"] = True
        self.exporter.event(EventKind.CKPT_RESTORE_PROGRESS, time_s=t, bytes=int(seen),
                            label=phase, detail=json.dumps(detail), **self.fields)
        self._sent_bytes, self._sent_at = seen, time.monotonic()
