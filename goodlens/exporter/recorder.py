"""The per-rank exporter: records every step and event of a training loop, never blocking it.

Usage in any training loop::

    from goodlens.exporter import RankExporter
    exp = RankExporter.from_env(run_id="llama-70b-0412", url="http://collector:8470")
    for n, batch in enumerate(loader_iter):
        with exp.step(n):
            with exp.phase("data"):
                batch = next(loader_iter)
            loss = model(batch).backward()          # compute: everything not in a phase
            with exp.phase("collective"):
                all_reduce(grads)
    exp.event("ckpt_save_start", step=n, tier="durable")

Recording on the training thread is O(1): two clock reads, a tuple, a ``deque.append``
(atomic under the GIL, so no lock is taken). A background thread drains the deques into
columnar batches and hands them to :class:`~goodlens.exporter.transport.Transport` (HTTP,
backoff, spill file, dead-letter file). Memory is bounded: past ``max_buffer_rows`` rows
waiting, new rows are dropped and counted, and the count is reported to the collector.
Nothing raises into the training loop; with ``enabled=False`` (or ``GOODLENS_DISABLED=1``)
every call is a no-op.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import socket
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field, fields
from time import perf_counter as _perf
from typing import Any

from goodlens.exporter import lifecycle
from goodlens.exporter.assembler import Assembler, compact, popleft
from goodlens.exporter.private import spill_dir as resolve_spill_dir
from goodlens.exporter.scopes import NULL_SCOPE, NullScope, Phases, PhaseScope, StepScope
from goodlens.exporter.transport import ARROW, JSON, Transport, claim_spill
from goodlens.model.jsonable import plain
from goodlens.model.schema import EVENT_COLUMNS, EVENT_KINDS, SCHEMA_VERSION, EventKind
from goodlens.model.wire import encode_arrow_batch, encode_batch

log = logging.getLogger("goodlens.exporter")

_EVENT_FIELDS = {c.name for c in EVENT_COLUMNS} - {"source", "seq", "kind", "time", "attempt"}


@dataclass
class ExporterConfig:
    """Everything an exporter needs; :meth:`from_env` fills it from torchrun's environment."""

    run_id: str
    """Identifies the job across attempts (``GOODLENS_RUN_ID`` or ``TORCHELASTIC_RUN_ID``)."""
    url: str | None = None
    """Collector base URL, e.g. ``http://127.0.0.1:8470``; None disables sending."""
    rank: int = 0
    """Global rank (``RANK``)."""
    world_size: int | None = None
    """Ranks in the job (``WORLD_SIZE``)."""
    local_rank: int | None = None
    """Rank on this host (``LOCAL_RANK``)."""
    host: str = field(default_factory=socket.gethostname)
    """Host name recorded with every step."""
    attempt: int = 0
    """Attempt number (``TORCHELASTIC_RESTART_COUNT`` under torchrun)."""
    token: str | None = None
    """Bearer token for a collector started with ``--token``."""
    enabled: bool = True
    """False makes every call a no-op (``GOODLENS_DISABLED=1``)."""
    flush_interval_s: float = 1.0
    """How often the background thread sends what was recorded."""
    batch_rows: int = 10_000
    """Most step rows in one push."""
    max_buffer_rows: int = 1_000_000
    """Rows kept in memory waiting to be sent; beyond this new rows are dropped and counted."""
    spill_dir: str | None = "auto"
    """Where undeliverable batches wait for the collector (and failing ones are set aside);
    None drops them instead. ``auto``: ``GOODLENS_SPILL_DIR`` when set, else this user's
    private directory (:mod:`goodlens.exporter.private`; mode 0700, never through a
    symlink). If the directory is unusable, that is logged and batches that cannot be sent
    are dropped and counted."""
    max_spill_bytes: int = 1 << 30
    """Largest spill file (and dead-letter file); beyond it batches are dropped and counted."""
    retry_attempts: int = 8
    """Tries of a batch the collector answers with a 5xx (other than 502/503/504: it is up
    but could not store this batch) before it is set aside in the dead-letter file."""
    retry_max_age_s: float = 86_400.0
    """Longest a batch waits for an absent collector before it is set aside (0: forever)."""
    heartbeat_interval_s: float = 10.0
    """After this long without a step, a heartbeat event proves the process alive (0: never)."""
    timeout_s: float = 5.0
    """HTTP timeout of one push."""
    restore_progress_s: float = 1.0
    """Shortest interval between two ``ckpt_restore_progress`` events of one restore (phase
    changes aside; it grows to 10 s as a restore lasts, see
    :mod:`goodlens.exporter.restore`); 0: no progress events."""
    wire: str = "arrow"
    """Wire format: ``arrow`` (Arrow IPC, cheapest for the collector) or ``json``."""
    run_meta: dict[str, Any] = field(default_factory=dict)
    """Run metadata sent once: name, world_size, gpus_per_rank, global_batch, model_params, tags."""
    host_relay: bool = False
    """Send through a per-host relay (``GOODLENS_RELAY=1``, :mod:`goodlens.exporter.relay_client`):
    local
    rank 0 starts it (on this user's Unix socket for ``relay_port``) when none runs, and
    every local rank pushes to it,
    so the collector sees one connection per host instead of one per rank. While no relay
    for ``url`` answers there, batches go to ``url`` directly, as without this option."""
    relay_port: int = 8472
    """Names the host relay (``GOODLENS_RELAY_PORT``): its socket is ``relay-PORT.sock``
    in this user's private directory."""
    hooks: bool = True
    """Install the process hooks of :mod:`goodlens.exporter.lifecycle` (``GOODLENS_HOOKS=0``
    to leave them out): an unhandled exception records ``failure``, and SIGTERM, SIGINT,
    an unhandled exception and interpreter exit flush what was recorded."""
    exit_flush_timeout_s: float = 5.0
    """Longest a signal or a dying process waits for the flush before it goes on."""

    def __post_init__(self) -> None:
        if not self.run_id:
            raise ValueError("run_id is required (set GOODLENS_RUN_ID or pass run_id=...)")
        if self.rank < 0 or self.attempt < 0:
            raise ValueError("rank and attempt must not be negative")
        if self.flush_interval_s <= 0 or self.batch_rows <= 0 or self.max_buffer_rows <= 0:
            raise ValueError("flush_interval_s, batch_rows and max_buffer_rows must be positive")
        if not self.restore_progress_s >= 0:
            raise ValueError("restore_progress_s must be >= 0 (0: no progress events)")
        if self.wire not in ("arrow", "json"):
            raise ValueError(f"wire must be 'arrow' or 'json', not {self.wire!r}")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> ExporterConfig:
        """Read torchrun's and goodlens's variables once; keyword arguments win over them."""
        env = dict(os.environ if env is None else env)
        found: dict[str, Any] = {}
        run_id = env.get("GOODLENS_RUN_ID") or env.get("TORCHELASTIC_RUN_ID")
        if run_id:
            found["run_id"] = run_id
        if env.get("GOODLENS_URL"):
            found["url"] = env["GOODLENS_URL"]
        if env.get("GOODLENS_TOKEN"):
            found["token"] = env["GOODLENS_TOKEN"]
        for key, var in (("rank", "RANK"), ("world_size", "WORLD_SIZE"),
                         ("local_rank", "LOCAL_RANK"), ("attempt", "TORCHELASTIC_RESTART_COUNT")):
            if env.get(var, "").strip().isdigit():
                found[key] = int(env[var])
        if env.get("GOODLENS_ATTEMPT", "").isdigit():
            found["attempt"] = int(env["GOODLENS_ATTEMPT"])
        if env.get("GOODLENS_SPILL_DIR"):
            found["spill_dir"] = env["GOODLENS_SPILL_DIR"]
        if env.get("GOODLENS_WIRE"):
            found["wire"] = env["GOODLENS_WIRE"]
        if env.get("GOODLENS_DISABLED", "").lower() in ("1", "true", "yes"):
            found["enabled"] = False
        if env.get("GOODLENS_RELAY", "").lower() in ("1", "true", "yes"):
            found["host_relay"] = True
        if env.get("GOODLENS_RELAY_PORT", "").strip().isdigit():
            found["relay_port"] = int(env["GOODLENS_RELAY_PORT"])
        if env.get("GOODLENS_HOOKS", "").lower() in ("0", "false", "no"):
            found["hooks"] = False
        found.update(overrides)
        found.setdefault("run_id", "default")
        names = {f.name for f in fields(cls)}
        unknown = set(found) - names
        if unknown:
            raise TypeError(f"unknown exporter option(s) {sorted(unknown)}")
        return cls(**found)


_LIVE: weakref.WeakSet[RankExporter] = weakref.WeakSet()


class RankExporter:
    """Records one rank's steps and events and ships them to a goodlens collector."""

    def __init__(self, config: ExporterConfig | None = None, **options: Any) -> None:
        self.config = config if config is not None else ExporterConfig(**options)
        cfg = self.config
        self.enabled = cfg.enabled
        self.attempt = cfg.attempt
        self.rank = cfg.rank
        self.host = cfg.host
        self.source = f"{cfg.host}/{os.getpid()}/{cfg.rank}/{time.time_ns():x}"
        self._offset = time.time() - _perf()
        # Bounded buffers: appends past maxlen evict the oldest row, and the flusher counts
        # the evictions from gaps in the step index (no check on the training thread).
        self._steps: deque = deque(maxlen=cfg.max_buffer_rows)
        self._marks: deque = deque(maxlen=cfg.max_buffer_rows)
        self._events: deque = deque(maxlen=cfg.max_buffer_rows)
        self._index = itertools.count()
        self._seq = itertools.count()
        self._scope = StepScope(self._steps.append, self._index, self._step_error)
        self._phases = Phases((k, PhaseScope(self._marks.append, k))
                               for k in ("collective", "data"))
        self._asm = Assembler(cfg.attempt)
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._failure_seen: tuple[int, int] | None = None
        self._meta_sent = False
        self._json_fallback = False
        self._last_batch_rows = 0
        self._last_taken = (0, 0)
        self._last_heartbeat = time.monotonic()
        self._transport: Transport | None = None
        self._thread: threading.Thread | None = None
        self._spill_lock: int | None = None
        if not self.enabled or not cfg.url:
            self.enabled = False  # nowhere to send: record nothing, cost nothing
            return
        spill = self._claim_spill()
        policy = {"max_attempts": cfg.retry_attempts, "max_age_s": cfg.retry_max_age_s}
        if cfg.host_relay:  # starts the relay on local rank 0; falls back to cfg.url
            from goodlens.exporter.relay_client import host_relay_transport
            self._transport = host_relay_transport(cfg.url, cfg.relay_port, cfg.local_rank,
                                                   cfg.token, cfg.timeout_s, spill,
                                                   cfg.max_spill_bytes, **policy)
        else:
            self._transport = Transport(cfg.url, cfg.token, cfg.timeout_s, spill,
                                        cfg.max_spill_bytes, **policy,
                                        source=f"{cfg.run_id}/rank-{cfg.rank}")
        self._thread = threading.Thread(target=self._run, name=f"goodlens-exporter-{cfg.rank}",
                                        daemon=True)
        self._thread.start()
        _LIVE.add(self)
        if cfg.hooks:
            lifecycle.install(lambda: list(_LIVE), cfg.exit_flush_timeout_s)
        # enabled: `exp.step(n)` is the scope's `arm` and `exp.phase(name)` a dict lookup,
        # with no method frame in between
        self.step = self._scope.arm  # type: ignore[method-assign]
        self.phase = self._phases.__getitem__  # type: ignore[method-assign]

    def _claim_spill(self) -> str | None:
        """This process's spill file in the spill directory, or None (logged) without one."""
        cfg = self.config
        if not cfg.spill_dir:
            return None
        try:
            folder = resolve_spill_dir(cfg.spill_dir)
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in cfg.run_id)
            # one file per live process (two processes of one rank never share one);
            # a restarted rank takes over the file, and its predecessors' leftovers
            spill, self._spill_lock = claim_spill(folder, f"{safe}-rank{cfg.rank}")
            return spill
        except OSError as exc:
            log.warning("goodlens: spill directory unusable (%s); batches that cannot be "
                        "sent now will be dropped and counted in dropped_rows", exc)
            return None

    @classmethod
    def from_env(cls, **overrides: Any) -> RankExporter:
        """An exporter configured from the environment (see :meth:`ExporterConfig.from_env`).

        With ``GOODLENS_RELAY=1`` (or ``host_relay=True``) it pushes through the host's relay
        on ``GOODLENS_RELAY_PORT`` (default 8472), started by ``LOCAL_RANK`` 0 when none
        listens; if the relay is unreachable it sends to the collector URL directly.
        """
        return cls(ExporterConfig.from_env(**overrides))

    # -- recording (training thread) ------------------------------------------
    def step(self, n: int) -> StepScope | NullScope:
        """Context manager timing step ``n``: ``with exp.step(n): ...``.

        An enabled exporter replaces this method by its scope's ``arm`` (see ``__init__``).
        """
        if not self.enabled:
            return NULL_SCOPE
        return self._scope.arm(n)

    def phase(self, name: str) -> PhaseScope | NullScope:
        """Time part of the current step as ``collective`` or ``data`` wait; the rest of the
        step is compute. Once any phase is timed, every step reports the split.

        An enabled exporter replaces this method by its phase table's ``__getitem__``.
        """
        if not self.enabled:
            return NULL_SCOPE
        return self._phases[name]

    def add_wait(self, kind: str, seconds: float) -> None:
        """Add wait measured elsewhere (e.g. a DDP communication hook) to the step running
        now; ``kind`` is ``collective`` or ``data``."""
        if self.enabled and kind in self._phases:
            self._marks.append((kind, _perf(), float(seconds)))

    def count(self, tokens: int | None = None, samples: int | None = None) -> None:
        """Tokens and samples processed by the step running now."""
        if self.enabled:
            t = _perf()
            if tokens is not None:
                self._marks.append(("tokens", t, tokens))
            if samples is not None:
                self._marks.append(("samples", t, samples))

    def record_step(self, step: int, start_time: float, duration_s: float,
                    compute_s: float | None = None, collective_wait_s: float | None = None,
                    data_wait_s: float | None = None, tokens: int | None = None,
                    samples: int | None = None) -> None:
        """Record a step measured elsewhere (``start_time`` in epoch seconds)."""
        if self.enabled:
            self._steps.append((next(self._index), step, start_time, duration_s, compute_s,
                                collective_wait_s, data_wait_s, tokens, samples))

    def event(self, kind: str, time_s: float | None = None, **fields: Any) -> None:
        """Record an event (see :mod:`goodlens.model.schema` for kinds and fields)."""
        if not self.enabled:
            return
        kind = getattr(kind, "value", kind)
        if kind not in EVENT_KINDS or not fields.keys() <= _EVENT_FIELDS:
            log.warning("goodlens: ignoring event %r with fields %s (kinds: %s; fields: %s)",
                        kind, sorted(fields), sorted(EVENT_KINDS), sorted(_EVENT_FIELDS))
            return
        fields = {k: plain(v) for k, v in fields.items()}  # numpy scalars, NaN: plain values
        fields.setdefault("rank", self.rank)
        fields.setdefault("host", self.host)
        self._events.append((next(self._seq), kind, time.time() if time_s is None else time_s,
                             self.attempt, fields))

    def record_failure(self, exc_type: type[BaseException], exc: BaseException | None,
                       cause: str | None = None, instant_known: bool | None = None) -> None:
        """Record what an exception says about a failure (see
        :func:`~goodlens.exporter.lifecycle.classify`): ``failure`` at its instant when known
        and ``failure_detected``, once per exception, and wake the flusher. Called by the
        step scope for a collective's error and by the unhandled-exception hook."""
        if not self.enabled:
            return
        key = (id(exc), self.attempt)
        if self._failure_seen == key:
            return
        self._failure_seen = key
        if cause is None or instant_known is None:
            cause, instant_known = lifecycle.classify(exc_type, exc)
        rank = self.rank if cause.startswith("exception:") else None
        for kind, t, extra in lifecycle.failure_events(cause, instant_known, rank, exc):
            self.event(kind, time_s=t, **extra)
        self._wake.set()

    def _step_error(self, exc_type: type[BaseException], exc: BaseException | None) -> None:
        """An exception escaped a step: a collective's error is recorded now (others may be
        control flow the loop catches: the exception hook records them if unhandled)."""
        try:
            if lifecycle.is_distributed_error(exc_type, exc):
                self.record_failure(exc_type, exc)
        except Exception:
            log.debug("goodlens: could not record a step's failure", exc_info=True)

    def new_attempt(self, attempt: int | None = None) -> None:
        """Start a new attempt in the same process (in-process recovery, elastic resize)."""
        self.attempt = self.attempt + 1 if attempt is None else attempt
        self._steps.append((next(self._index), self.attempt))

    @property
    def last_step(self) -> int | None:
        """The last step recorded (the heartbeat reports it)."""
        try:
            for row in reversed(self._steps):
                if len(row) != 2:  # not a new_attempt marker
                    return row[1]
        except (IndexError, RuntimeError):  # emptied or changed concurrently
            pass
        return self._asm.last_step

    # -- delivery (background thread) -----------------------------------------
    @property
    def stats(self) -> dict[str, Any]:
        """What happened so far: rows waiting, dropped, and batches sent/spilled/rejected."""
        out: dict[str, Any] = {"pending_rows": len(self._steps) + len(self._events),
                               "enabled": self.enabled}
        if self._transport is not None:
            out.update(self._transport.stats.__dict__)
            out["rejected_by_status"] = dict(self._transport.stats.rejected_by_status)
            out["spill_waiting"] = self._transport.has_spill()
        out["dropped_rows"] = self._dropped()
        return out

    def _rejected(self) -> int:
        return self._transport.stats.rejected_batches if self._transport is not None else 0

    def _dropped(self) -> int:
        """Rows not delivered: evicted or unencodable here, refused, set aside or not kept."""
        lost = self._transport.stats.lost_rows if self._transport is not None else 0
        return self._asm.dropped + lost

    def flush(self, timeout: float = 10.0, spill_ok: bool = False) -> bool:
        """Send everything recorded so far; True when nothing is left to send: all of it
        reached the collector, or was refused or set aside and counted (with ``spill_ok``,
        also when it waits in the spill file: what a dying process can do). Never waits
        past ``timeout``, also not for the background thread's send in progress."""
        if self._transport is None:
            return True
        deadline = time.monotonic() + timeout
        with lifecycle.flushing():
            while True:
                if self._send_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    try:
                        self._send_all_locked(final=True)
                    except Exception:
                        log.exception("goodlens: flush failed")
                    finally:
                        self._send_lock.release()
                if not self._steps and not self._events and (
                        spill_ok or not self._transport.has_spill()):
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)

    def close(self, timeout: float = 10.0) -> bool:
        """Flush (up to ``timeout``; the rest stays in the spill file) and stop the thread."""
        if self._transport is None:
            return True
        deadline = time.monotonic() + timeout
        with lifecycle.flushing():
            self._stop.set()
            self._wake.set()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join(timeout=max(timeout, 1.0))
            ok = self.flush(max(0.0, deadline - time.monotonic()))
            if not ok and self._send_lock.acquire(timeout=max(0.5, deadline - time.monotonic())):
                try:  # collector still away: park what is left in the spill file
                    self._transport._next_try = float("inf")
                    self._send_all_locked(final=True)
                except Exception:
                    log.exception("goodlens: final spill failed")
                finally:
                    self._send_lock.release()
        self._transport.close()
        if self._spill_lock is not None:
            os.close(self._spill_lock)  # releases the flock: the next process may adopt it
            self._spill_lock = None
        _LIVE.discard(self)
        return ok

    def _run(self) -> None:
        interval = self.config.flush_interval_s
        if self.config.wire == "arrow":
            _warm_up_arrow()
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self._offset = time.time() - _perf()
                # steps prove the process alive: a heartbeat only when none came for a while
                # (a hang, a long checkpoint, eval), so 16k idle-free ranks send none
                # (the step deque holds what was recorded since the last tick's drain)
                hb = self.config.heartbeat_interval_s
                if self._steps:
                    self._last_heartbeat = time.monotonic()
                elif hb and time.monotonic() - self._last_heartbeat >= hb:
                    self._last_heartbeat = time.monotonic()
                    self.event(EventKind.HEARTBEAT, step=self.last_step)
                self._send_all()
            except Exception:
                log.exception("goodlens: exporter thread error")

    def _send_all(self, final: bool = False) -> None:
        with self._send_lock:
            self._send_all_locked(final)

    def _send_all_locked(self, final: bool) -> None:
        assert self._transport is not None
        self._transport.drain_spill()
        arrow = self.config.wire == "arrow"
        # send what is buffered now, not what the training thread adds meanwhile: when a
        # push takes longer than a step, chasing the deque would send one tiny batch per step
        left_steps, left_events = len(self._steps), len(self._events)
        while left_steps > 0 or left_events > 0 or not self._meta_sent:
            if self._meta_sent and not self._steps and not self._events:
                break  # the bounded buffer evicted what was counted
            try:
                body, rows = self._next_batch(final, max(left_steps, 1), max(left_events, 1))
                left_steps -= self._last_taken[0]
                left_events -= self._last_taken[1]
            except Exception:  # rows were taken off the buffer: count them
                log.exception("goodlens: could not encode a batch; its rows are dropped")
                self._asm.dropped += self._last_batch_rows
                left_steps -= self._last_taken[0]
                left_events -= self._last_taken[1]
                self._meta_sent = True
                continue
            ctype = ARROW if arrow and not self._json_fallback else JSON
            self._json_fallback = False
            self._transport.deliver(body, rows, ctype)  # losses: in its stats.lost_rows
            self._meta_sent = True

    def _next_batch(self, final: bool, max_steps: int | None = None,
                    max_events: int | None = None) -> tuple[bytes, int]:
        cfg = self.config
        self._last_taken = (0, 0)
        raw = popleft(self._steps, min(cfg.batch_rows, max_steps or cfg.batch_rows))
        marks = popleft(self._marks, len(self._marks))
        events = popleft(self._events, min(cfg.batch_rows, max_events or cfg.batch_rows))
        self._last_batch_rows = len(raw) + len(events)
        self._last_taken = (len(raw), len(events))
        steps = self._asm.assemble(raw, marks, self._offset, self.attempt)
        doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "run_id": cfg.run_id,
                               "exporter": {"source": self.source,
                                            "dropped_rows": self._dropped(),
                                            "rejected_batches": self._rejected()}}
        if not self._meta_sent:
            meta = dict(cfg.run_meta)
            if cfg.world_size is not None:
                meta.setdefault("world_size", cfg.world_size)
            doc["run"] = meta
        if steps:
            cols = list(zip(*steps))
            doc["steps"] = {
                "attempt": compact(cols[0]), "rank": self.rank, "host": self.host,
                "step": list(cols[1]), "start_time": list(cols[2]), "duration_s": list(cols[3]),
                "compute_s": compact(cols[4]), "collective_wait_s": compact(cols[5]),
                "data_wait_s": compact(cols[6]), "tokens": compact(cols[7]),
                "samples": compact(cols[8])}
        if events:
            ev: dict[str, Any] = {"source": self.source, "seq": [e[0] for e in events],
                                  "kind": [e[1] for e in events], "time": [e[2] for e in events],
                                  "attempt": compact([e[3] for e in events])}
            used = set().union(*(e[4].keys() for e in events))
            for name in sorted(used):
                ev[name] = compact([e[4].get(name) for e in events])
            doc["events"] = ev
        if cfg.wire == "arrow":
            try:
                return encode_arrow_batch(doc), len(steps) + len(events)
            except Exception:  # e.g. pyarrow's lazy pandas import failing at shutdown
                log.debug("goodlens: Arrow encoding failed; sending JSON", exc_info=True)
                self._json_fallback = True
        return encode_batch(doc), len(steps) + len(events)


def _warm_up_arrow() -> None:
    """Encode a one-row batch once, so whatever pyarrow imports lazily (pandas, on the first
    ``pa.array`` of a list) is imported now, on the background thread, and not at interpreter
    exit, where an import that registers an ``atexit`` function fails."""
    try:
        encode_arrow_batch({"schema_version": SCHEMA_VERSION, "run_id": "warm-up",
                            "steps": {"attempt": 0, "rank": 0, "step": [0],
                                      "start_time": [0.0], "duration_s": [0.0]}})
    except Exception:
        log.debug("goodlens: Arrow warm-up failed", exc_info=True)


@atexit.register
def _flush_all_at_exit() -> None:
    for exp in list(_LIVE):
        try:
            exp.close(timeout=5.0)
        except Exception:
            pass
