"""torchft integration: per-step fault tolerance recorded for goodlens's accounting.

Under torchft (``pip install goodlens[torchft]``) a job is R replica groups that form a
quorum every step; a failed group drops out, the others commit the step without it, and
the restarted group heals from a peer's memory and rejoins at a later quorum. There is no
job-wide restart, so goodlens records what changes every step instead:

- step rows for the steps a group **committed** (``samples`` 0 when the group ran the step
  without participating, e.g. while it healed), timed with the collective wait from the
  last gradient all-reduce handed to the manager to the step's end;
- ``step_discarded`` for a step ``should_commit`` refused (every group that ran it);
- ``quorum`` when the quorum's membership (id, participants, whether this group is in it)
  changed, or when waiting for it blocked the training thread at least
  ``quorum_event_min_s`` (``detail.blocked_s``);
- ``heal_start`` / ``heal_end`` around each receive of a peer's live state (bytes, source
  replica, transport); every rank of the healing group reports its heal's progress
  (``ckpt_restore_progress``, :mod:`goodlens.exporter.restore`): ``read`` while it
  receives, ``barrier`` once received (its bytes) until the training thread loads it,
  ``load`` while it does (``_apply_pending_state_dict``), then a last event saying it
  ended (no ``ckpt_restore_end`` follows a heal);
- ``group_start`` (at the process's start, with ``group_attempt``: each restart of a group
  is an attempt of that group, not of the job) and ``group_end``;
- ``rank_joined`` at a group's first step taking part again after it was out (cause
  ``spare``, ``healed`` after a restart, or ``started`` at the job's start).

The job's attempt stays 0 (``attempt_start`` at the first incarnation's start,
``attempt_end`` when a group completes), and a group's crash is a ``group_end`` with cause
``failed``, not a job failure. Group-level events come from the group's rank 0; every rank
records its steps. Wrapping is per manager instance (its ``start_quorum``,
``wait_quorum``, ``allreduce``, ``should_commit`` and ``_apply_pending_state_dict``, and
its checkpoint transport's ``recv_checkpoint``); the quorum id comes from the
``torchft_quorums`` logger's structured records. Nothing here raises into training: a
failure to record is logged and dropped.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from goodlens.exporter import lifecycle
from goodlens.exporter.restore import RestoreProgress
from goodlens.model.schema import EventKind

log = logging.getLogger("goodlens.exporter.torchft")

__all__ = ["FTTracker", "exporter_for", "instrument"]


def exporter_for(group: int, groups: int, *, group_rank: int | None = None,
                 group_world_size: int | None = None, samples_per_step: int | None = None,
                 spare_groups: int = 0, **overrides: Any) -> Any:
    """A :class:`~goodlens.exporter.recorder.RankExporter` for one rank of replica group
    ``group`` (0-based) of ``groups``: global rank ``group * group_world_size +
    group_rank`` (torchrun's ``RANK``/``WORLD_SIZE`` are the group's), attempt 0 for the
    whole job, and the run's tags saying it is a torchft job of ``groups`` groups
    (``samples_per_step``: what this rank trains in a step; every rank of a group alike)."""
    from goodlens.exporter.recorder import RankExporter

    g_rank = int(os.environ.get("RANK", 0)) if group_rank is None else group_rank
    g_world = int(os.environ.get("WORLD_SIZE", 1)) if group_world_size is None \
        else group_world_size
    tags = {"fault_tolerance": "torchft", "replica_groups": groups,
            "group_world_size": g_world, "spare_groups": spare_groups}
    if samples_per_step is not None:   # this rank's; the group's ranks train alike
        tags["samples_per_group_step"] = samples_per_step * g_world
    meta = dict(overrides.pop("run_meta", {}) or {})
    meta.setdefault("world_size", groups * g_world)
    meta["tags"] = json.dumps({**json.loads(meta.get("tags") or "{}"), **tags})
    return RankExporter.from_env(rank=group * g_world + g_rank, attempt=0, run_meta=meta,
                                 world_size=groups * g_world, **overrides)


class FTTracker:
    """Records one rank's torchft steps; made by :func:`instrument`.

    ``with tracker.step(): ...`` around each training step (``zero_grad`` to
    ``optimizer.step``). The step number is torchft's (``manager.current_step()`` before
    the commit), so a discarded step is retried under the same number.
    """

    def __init__(self, manager: Any, exporter: Any, group: str, group_rank: int,
                 samples_per_step: int | None, spare: bool, group_attempt: int,
                 quorum_event_min_s: float) -> None:
        self.manager = manager
        self.exporter = exporter
        self.group = group
        self.lead = group_rank == 0
        self.samples = samples_per_step
        self.spare = spare
        self.group_attempt = group_attempt
        self.quorum_event_min_s = quorum_event_min_s
        self._blocked = 0.0          # quorum wait on the training thread, this step
        self._blocked_end = 0.0
        self._last_reduce: float | None = None
        self._commit: tuple[int, bool, bool, int] | None = None  # step, ok, in, participants
        self._quorum_id: int | None = None
        self._membership: tuple[Any, ...] | None = None
        self._lock = threading.Lock()
        self.committed = 0
        self.discarded = 0
        self._counted = False   # whether its last committed step counted (took part)
        self.healed = False     # whether this incarnation received a peer's state
        self._progress: Any = None   # the heal in progress (a RestoreProgress)
        self._applies = False   # whether the manager's load of a healed state is watched

    # -- the training loop ------------------------------------------------------
    def step(self) -> _StepContext:
        """Context manager around one training step."""
        return _StepContext(self)

    def finish(self, cause: str = "completed") -> None:
        """The group is done (``completed``) or leaves (``evicted``): ``group_end`` and, on
        completion, the job's ``attempt_end``; then flush."""
        if self.lead:
            last = self.manager.current_step() - 1
            self._event(EventKind.GROUP_END, cause=cause, step=max(last, 0))
            if cause == "completed":
                self._event(EventKind.ATTEMPT_END, cause="completed", label=None)
        self.exporter.flush()

    # -- internals --------------------------------------------------------------
    def _event(self, kind: str, time_s: float | None = None, **fields: Any) -> None:
        try:
            fields.setdefault("label", self.group)
            if fields.get("label") is None:
                fields.pop("label")
            detail = fields.pop("detail", None)
            if detail is not None:
                fields["detail"] = json.dumps(detail, sort_keys=True)
            self.exporter.event(kind, time_s=time_s, **fields)
        except Exception:
            log.debug("goodlens: could not record a torchft event", exc_info=True)

    def _end_step(self, t0: float, t1: float, wall0: float) -> None:
        commit, self._commit = self._commit, None
        blocked, self._blocked = self._blocked, 0.0
        blocked_end, self._blocked_end = self._blocked_end, 0.0
        reduced, self._last_reduce = self._last_reduce, None
        if commit is None:  # no should_commit in this step: nothing torchft decided
            return
        step, ok, participating, participants = commit
        if self.lead:
            self._quorum_event(step, participants, participating, blocked, blocked_end)
        duration = t1 - t0
        if not ok:
            self.discarded += 1
            if self.lead:
                self._event(EventKind.STEP_DISCARDED, time_s=wall0 + duration, step=step,
                            detail={"start_time": wall0, "duration_s": duration,
                                    "quorum_id": self._quorum_id})
            return
        self.committed += 1
        if participating and not self._counted and self.lead:
            # its first step counted: a spare, a restarted group or a late starter joined
            cause = "spare" if self.spare else ("healed" if self.healed else "started")
            self._event(EventKind.RANK_JOINED, time_s=wall0, step=step, cause=cause)
        self._counted = participating
        wait = None if reduced is None else max(0.0, t1 - reduced)
        samples = self.samples if participating else 0  # None: not told, and it counted
        self.exporter.record_step(step, wall0, duration, collective_wait_s=wait,
                                  samples=samples)

    def _quorum_event(self, step: int, participants: int, participating: bool,
                      blocked: float, blocked_end: float) -> None:
        membership = (self._quorum_id, participants, participating)
        if membership == self._membership and blocked < self.quorum_event_min_s:
            return
        self._membership = membership
        self._event(EventKind.QUORUM, time_s=blocked_end or time.time(), step=step,
                    world_size=participants,
                    detail={"quorum_id": self._quorum_id, "participating": participating,
                            "blocked_s": round(blocked, 6)})

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (start_quorum, wait_quorum) with its blocking time added to the step's."""
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                if dt > 1e-4 and threading.current_thread() is threading.main_thread():
                    self._blocked += dt
                    self._blocked_end = time.time()
        return call

    def _allreduce(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._last_reduce = time.perf_counter()
            return fn(*args, **kwargs)
        return call

    def _should_commit(self, fn: Callable[..., bool]) -> Callable[..., bool]:
        def call(*args: Any, **kwargs: Any) -> bool:
            m = self.manager
            try:
                step = int(m.current_step())
                participating = bool(m.is_participating())
                participants = int(m.num_participants())
            except Exception:
                step, participating, participants = -1, False, 0
            ok = fn(*args, **kwargs)
            if step >= 0:
                self._commit = (step, bool(ok), participating, participants)
            return ok
        return call

    def _recv(self, transport: Any) -> None:
        """Time ``transport.recv_checkpoint`` (a heal) on this instance; every rank reports
        its heal's progress (phase ``read`` while it receives)."""
        original = transport.recv_checkpoint
        name = type(transport).__name__

        def recv_checkpoint(src_rank: int, metadata: str, step: int, timeout: Any) -> Any:
            self._heal_progress(step)
            if self.lead:
                self._event(EventKind.HEAL_START, step=step,
                            detail={"source": src_rank, "transport": name,
                                    "address": str(metadata)[:200]})
            try:
                state = original(src_rank=src_rank, metadata=metadata, step=step,
                                 timeout=timeout)
            except BaseException:
                self._heal_over()
                if self.lead:
                    self._event(EventKind.HEAL_END, step=step, cause="failed")
                raise
            size = _state_bytes(state)
            self._heal_received(size)
            if self.lead:
                self._event(EventKind.HEAL_END, step=step, bytes=size)
                self.healed = self.healed or self.group_attempt > 0 or self.spare
            return state

        transport.recv_checkpoint = recv_checkpoint

    # -- a heal's restore progress (goodlens.exporter.restore) ---------------------
    def _apply(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``manager._apply_pending_state_dict``: the received state loaded into the model
        (on the training thread: at once with a synchronous quorum, else at the step's
        ``should_commit``); the heal's progress ends with it."""
        def call() -> Any:
            if self._progress is not None:
                try:   # its first act: wait for the quorum (and the receive) to be done
                    self.manager._quorum_future.result()
                except Exception:
                    pass   # the call below raises it
                if self._progress is not None:
                    self._safe(self._progress.phase, "load")
            try:
                return fn()
            finally:
                self._heal_over()
        return call

    def _heal_progress(self, step: int) -> None:
        self._heal_over()   # a heal before it that was never loaded is over
        try:
            self._progress = RestoreProgress(self.exporter, live_bytes=False,
                                             step=step).start()
        except Exception:
            log.debug("goodlens: no heal progress", exc_info=True)

    def _heal_received(self, size: int) -> None:
        """Received (``size`` bytes): it waits for the training thread to load it
        (``barrier``); without a load to watch, the heal's progress ends here."""
        p = self._progress
        if p is None:
            return
        p.add(size)
        if self._applies:
            self._safe(p.phase, "barrier")
        else:
            self._heal_over()

    def _heal_over(self) -> None:
        p, self._progress = self._progress, None
        if p is not None:
            self._safe(p.stop, ended=True)   # no ckpt_restore_end follows a heal

    @staticmethod
    def _safe(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:
            log.debug("goodlens: could not record a heal's progress", exc_info=True)


class _StepContext:
    __slots__ = ("t0", "tracker", "wall0")

    def __init__(self, tracker: FTTracker) -> None:
        self.tracker = tracker

    def __enter__(self) -> _StepContext:
        self.wall0 = time.time()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        t1 = time.perf_counter()
        if exc_type is not None:
            return
        try:
            self.tracker._end_step(self.t0, t1, self.wall0)
        except Exception:
            log.debug("goodlens: could not record a torchft step", exc_info=True)


class _QuorumIds(logging.Handler):
    """Reads the quorum id from torchft's structured ``torchft_quorums`` records."""

    def __init__(self, tracker: FTTracker) -> None:
        super().__init__(logging.INFO)
        self.tracker = tracker

    def emit(self, record: logging.LogRecord) -> None:
        qid = getattr(record, "quorum_id", None)
        if qid is not None:
            try:
                self.tracker._quorum_id = int(qid)
            except (TypeError, ValueError):
                self.tracker._quorum_id = None


def _state_bytes(state: Any) -> int:
    """Bytes of the tensors in a received state (nested dicts, lists, tuples)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torchft needs torch
        return 0
    stack, total = [state], 0
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size()
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return total


def instrument(manager: Any, exporter: Any, *, group: str | int,
               group_rank: int | None = None, samples_per_step: int | None = None,
               spare: bool = False, group_attempt: int | None = None,
               quorum_event_min_s: float = 0.01) -> FTTracker:
    """Record a torchft ``Manager``'s steps, quorums, commits and heals with ``exporter``.

    ``group``: this replica group's name (``replica_id`` without torchft's uuid);
    ``group_rank``: this process's rank in the group (torchrun's ``RANK``);
    ``samples_per_step``: samples this rank trains per committed step (for the sample
    view); ``spare``: a group started to stand in for a failed or evicted one;
    ``group_attempt``: this incarnation of the group (torchrun's
    ``TORCHELASTIC_RESTART_COUNT``). Returns the tracker whose ``step()`` times each step.
    """
    g_rank = int(os.environ.get("RANK", 0)) if group_rank is None else group_rank
    if group_attempt is None:
        env = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        group_attempt = int(env) if env.isdigit() else 0
    t = FTTracker(manager, exporter, str(group), g_rank, samples_per_step, spare,
                  group_attempt, quorum_event_min_s)
    if not getattr(exporter, "enabled", False):
        return t
    manager.start_quorum = t._timed(manager.start_quorum)
    manager.wait_quorum = t._timed(manager.wait_quorum)
    manager.allreduce = t._allreduce(manager.allreduce)
    manager.should_commit = t._should_commit(manager.should_commit)
    transport = getattr(manager, "_checkpoint_transport", None)  # torchft's own attribute
    if transport is not None and hasattr(transport, "recv_checkpoint"):
        t._recv(transport)
        if callable(getattr(manager, "_apply_pending_state_dict", None)):  # torchft's own
            manager._apply_pending_state_dict = t._apply(manager._apply_pending_state_dict)
            t._applies = True
    else:
        log.warning("goodlens: this torchft Manager has no checkpoint transport to time; "
                    "heals will not be recorded")
    logging.getLogger("torchft_quorums").addHandler(_QuorumIds(t))
    if logging.getLogger("torchft_quorums").getEffectiveLevel() > logging.INFO:
        logging.getLogger("torchft_quorums").setLevel(logging.INFO)
    exporter.record_failure = _group_failure(t)  # a group's crash is not the job's
    if t.lead:
        started = lifecycle.process_start_time()
        g_world = getattr(exporter.config, "world_size", None)
        if group_attempt == 0 and not spare:
            world = {"world_size": g_world} if g_world else {}
            t._event(EventKind.ATTEMPT_START, time_s=started, label=None, **world)
        t._event(EventKind.GROUP_START, time_s=started,
                 detail={"group_attempt": group_attempt, "spare": spare,
                         "group_world_size": int(os.environ.get("WORLD_SIZE", 1))})
    return t


def _group_failure(t: FTTracker) -> Callable[..., None]:
    def record_failure(exc_type: Any, exc: Any, cause: str | None = None,
                       instant_known: bool | None = None) -> None:
        if t.lead:
            c, _ = lifecycle.classify(exc_type, exc) if exc_type is not None else ("", False)
            t._event(EventKind.GROUP_END, cause="failed", detail={"error": cause or c})
    return record_failure
