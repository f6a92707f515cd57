"""The exporter at the edges of a process's life: when it started, how it dies, and getting
its rows out before it does.

Why it exists: the accounting of a restart needs to know when the failure happened, when it
was noticed and when the restarted processes really started, and the rows of the last
seconds before a death are exactly the ones a failure analysis needs. A flush only at a
normal exit loses them: torchrun stops the surviving workers of a failed attempt with
SIGTERM, whose default action ends the process without running ``atexit``.

- :func:`process_start_time`: the process's start from the OS (Linux: ``/proc/self/stat``
  field 22, clock ticks since boot, against ``CLOCK_BOOTTIME``), so start-up before
  ``import goodlens`` (interpreter, ``import torch``, process group) is measured. Elsewhere:
  when this module was imported.
- :func:`install` (the first enabled exporter calls it, from the main thread):

  - ``sys.excepthook``: an unhandled exception records ``failure`` and
    ``failure_detected`` (this process is dying, and knows it) on every live exporter,
    then the previous hook prints the traceback, then every exporter flushes, bounded by
    ``exit_flush_timeout_s``. ``KeyboardInterrupt`` is an operator's stop, not a failure.
  - ``threading.excepthook``: flushes (bounded) and chains, but records no ``failure``: an
    exception that ends a thread (a background save, a data-loader thread) does not end
    the process, and a ``failure`` instant in the middle of an attempt would misplace its
    step in flight.
  - SIGTERM and SIGINT: a collective's error being handled when the signal arrives is
    recorded first, as a detection of unknown instant (:func:`_record_in_flight`:
    torchrun's SIGTERM races it), then flush (bounded), then the previous handler: a
    Python handler is called, an ignored signal stays ignored, and the default action is
    re-raised with the default disposition, so a SIGTERM still terminates the process (and
    its exit status still says SIGTERM). A signal that arrives while this process is
    already flushing (inside an exporter's ``flush``/``close``, or the exception hook) is
    held until that flush ends, then delivered.

  Fatal signals that Python cannot run code for (SIGKILL, SIGSEGV, SIGABRT, ``os._exit``)
  are recorded by others: a surviving rank's collective raises (:func:`classify`), and the
  ``goodlens.exporter.launch`` wrapper around torchrun records what the elastic agent
  saw.
- :func:`classify`: what an exception escaping a step says. A distributed error about a
  lost peer (connection closed or reset) is a ``failure`` now (a peer just died) and its
  detection; a collective timeout is only a detection (the failure happened earlier, at a
  time nobody knows).

A Python signal handler runs only when the main thread is back in the interpreter: a main
thread stuck inside a C++ collective runs it when the collective returns or times out. Rows
are not lost meanwhile: a stuck training thread records none, and the background thread
keeps sending what was recorded.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("goodlens.exporter")

_IMPORTED = time.time()

#: Signals whose arrival flushes every live exporter before the previous handler runs.
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def process_start_time(stat: str | None = None, boot_s: float | None = None,
                       now: float | None = None) -> float:
    """When this process started, in epoch seconds, from the OS.

    Linux: ``/proc/self/stat`` field 22 (``starttime``, clock ticks after boot, on the
    kernel's boot-time clock) over ``SC_CLK_TCK``; the epoch instant is now minus the time
    elapsed since then on the same clock (``CLOCK_BOOTTIME``), so it is exact to a clock
    tick (10 ms). Not ``btime`` from ``/proc/stat`` plus ticks: ``btime`` is whole seconds
    and drifts from the wall clock with every adjustment since boot (in one run here it
    dated a restarted attempt about 0.25 s before its processes existed). Where that cannot
    be read, the time this module was imported. ``stat``, ``boot_s``, ``now``: the file's
    text and the clocks, for tests.
    """
    try:
        if stat is None:
            with open("/proc/self/stat") as f:
                stat = f.read()
        if boot_s is None:
            boot_s = time.clock_gettime(time.CLOCK_BOOTTIME)  # type: ignore[attr-defined]
        if now is None:
            now = time.time()
        # field 2 (comm) is in parentheses and may hold spaces: count from the last ')'
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = int(fields[22 - 3])
        hz = os.sysconf("SC_CLK_TCK")
        started = now - (boot_s - ticks / hz)
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED
    return min(started, now)


_PEER_LOST = ("connection closed", "connection reset", "broken pipe", "connection refused",
              "peer", "socket closed", "unreachable", "nccl communicator was aborted")
_TIMEOUT = ("timed out", "timeout", "deadline")


def classify(exc_type: type[BaseException], exc: BaseException | None) -> tuple[str, bool]:
    """What an exception says about a failure: ``(cause, instant_known)``.

    ``collective_error`` (a distributed error about a lost peer: it just died, so now is
    its failure instant), ``collective_timeout`` (a collective waited out its timeout: the
    failure happened earlier, when is unknown), else ``exception:<Type>`` (this process
    failed now). Decided from the type's name and message: no torch import.
    """
    name = exc_type.__name__
    msg = str(exc).lower()[:2000] if exc is not None else ""
    dist = name.startswith("Dist") or "gloo" in msg or "nccl" in msg or "c10d" in msg
    if dist and any(s in msg for s in _TIMEOUT):
        return "collective_timeout", False
    if dist or any(s in msg for s in _PEER_LOST):
        return "collective_error", True
    return f"exception:{name}", True


def is_distributed_error(exc_type: type[BaseException], exc: BaseException | None) -> bool:
    """Whether an exception escaping a step is a collective's (recorded there, at once);
    other exceptions may be control flow the loop catches, and are recorded only if
    unhandled (:func:`install`'s exception hook)."""
    return classify(exc_type, exc)[0].startswith("collective_")


def failure_events(cause: str, instant_known: bool, rank: int | None, exc: Any,
                   now: float | None = None) -> list[tuple[str, float, dict[str, Any]]]:
    """The events one observation of a failure gives: ``failure`` (only when its instant is
    known) and ``failure_detected``, both at ``now``. ``rank``: the rank that failed, or
    None when the observer only knows a peer failed."""
    t = time.time() if now is None else now
    detail = json.dumps({"error": str(exc)[:300]}) if exc is not None else None
    fields: dict[str, Any] = {"cause": cause, "rank": rank, "detail": detail}
    out = [("failure_detected", t, fields)]
    if instant_known:
        out.insert(0, ("failure", t, fields))
    return out


# ----------------------------------------------------------------------------- hooks


class _State:
    """The process-wide hooks (installed once) and the flush-in-progress bookkeeping."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.installed = False
        self.live: Callable[[], Iterable[Any]] = list
        self.timeout_s = 5.0
        self.busy = 0  # flushes in progress on the main thread
        self.pending: int | None = None  # a signal held until they end
        self.previous: dict[int, Any] = {}
        self.prev_excepthook: Callable[..., Any] = sys.excepthook
        self.prev_thread_hook: Callable[..., Any] = threading.excepthook


_S = _State()


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class flushing:
    """Context of a flush on this thread: a signal arriving meanwhile is held (a handler
    would interrupt the flush it needs) and delivered when the outermost flush ends."""

    __slots__ = ("main",)

    def __enter__(self) -> flushing:
        self.main = _on_main_thread()
        if self.main:
            _S.busy += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.main:
            return
        _S.busy -= 1
        if _S.busy == 0 and _S.pending is not None:
            signum, _S.pending = _S.pending, None
            _chain(signum, None)


def flush_all(timeout: float | None = None, close: bool = False) -> None:
    """Flush (or close) every live exporter within one shared deadline; never raises."""
    deadline = time.monotonic() + (_S.timeout_s if timeout is None else timeout)
    for exp in list(_S.live()):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            if close:
                exp.close(timeout=left)
            else:
                exp.flush(timeout=left, spill_ok=True)
        except Exception:
            log.debug("goodlens: flush at exit failed", exc_info=True)


def _chain(signum: int, frame: Any) -> None:
    """Run what the signal did before goodlens: its Python handler, nothing if ignored, or
    the default action (re-raised with the default disposition: SIGTERM terminates)."""
    prev = _S.previous.get(signum, signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)
    elif prev != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _on_signal(signum: int, frame: Any) -> None:
    if _S.busy:  # interrupted a flush: let it finish, then deliver
        _S.pending = signum
        return
    _record_in_flight()
    prev = _S.previous.get(signum, signal.SIG_DFL)
    # the default action ends the process: close (spills what cannot be sent); a handler
    # of the user's may go on training: flush only
    with flushing():
        flush_all(close=prev == signal.SIG_DFL)
        _S.pending = None  # this very signal is delivered below
    _chain(signum, frame)


def _record_failure(exc_type: type[BaseException], exc: BaseException | None,
                    instant_known: bool = True) -> None:
    cause, known = classify(exc_type, exc)
    known = known and instant_known
    for exp in list(_S.live()):
        try:
            exp.record_failure(exc_type, exc, cause=cause, instant_known=known)
        except Exception:
            log.debug("goodlens: could not record the failure", exc_info=True)


def _record_in_flight() -> None:
    """A signal that interrupts the handling of a collective's error records that error
    first, as a detection (``failure_detected``) whose instant is unknown. torchrun's
    SIGTERM to the survivors of a crash races their collective's "connection closed": the
    signal, held while the collective ran in C++, is handled at the first call in the
    frames the error unwinds through (torch's own ``except`` logging it, the step scope's
    ``__exit__``), before the step scope could record anything, and its default action then
    ends the process. The error is then the exception being handled (``sys.exc_info``).
    Not a ``failure`` at this instant: the signal may have waited seconds in that C++ call,
    so when the peer died is not known here; the accounting then estimates the step in
    flight.
    Only a distributed error: another exception being handled may be control flow, and a
    SIGTERM by itself is no failure."""
    exc = sys.exc_info()[1]
    if exc is not None and is_distributed_error(type(exc), exc):
        _record_failure(type(exc), exc, instant_known=False)


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    try:
        if not issubclass(exc_type, KeyboardInterrupt):
            _record_failure(exc_type, exc)
    finally:
        _S.prev_excepthook(exc_type, exc, tb)
        with flushing():
            flush_all()


def _thread_excepthook(args: Any) -> None:
    try:
        _S.prev_thread_hook(args)
    finally:
        flush_all()


def install(live: Callable[[], Iterable[Any]], timeout_s: float = 5.0) -> bool:
    """Install the exception hooks and signal handlers once per process (the signal handlers
    only from the main thread; a later call from it adds them). ``live`` returns the
    exporters to flush. Returns whether the signal handlers are in place."""
    with _S.lock:
        _S.live = live
        _S.timeout_s = timeout_s
        if not _S.installed:
            _S.installed = True
            _S.prev_excepthook, sys.excepthook = sys.excepthook, _excepthook
            _S.prev_thread_hook, threading.excepthook = threading.excepthook, _thread_excepthook
        if _S.previous or not _on_main_thread():
            return bool(_S.previous)
        for signum in SIGNALS:
            try:
                prev = signal.getsignal(signum)
                signal.signal(signum, _on_signal)
            except (ValueError, OSError):
                continue
            _S.previous[signum] = signal.SIG_DFL if prev is None else prev
        return bool(_S.previous)


def uninstall() -> None:
    """Put back the hooks and handlers :func:`install` replaced (tests)."""
    with _S.lock:
        if _S.installed:
            sys.excepthook, threading.excepthook = _S.prev_excepthook, _S.prev_thread_hook
            _S.installed = False
        if _on_main_thread():
            for signum, prev in _S.previous.items():
                if signal.getsignal(signum) is _on_signal:
                    signal.signal(signum, prev)
            _S.previous.clear()
        _S.pending = None


def guarded(fn: Callable[..., Any], logger: logging.Logger) -> Callable[..., Any]:
    """``fn`` that never raises into training: a failure is logged on ``logger``, once per
    wrapped function, and the call returns None (the framework integrations' hooks)."""
    warned: list[bool] = []

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception:
            if not warned:
                warned.append(True)
                logger.warning("goodlens: %s failed; training goes on without it",
                               fn.__name__, exc_info=True)
            return None

    return call
