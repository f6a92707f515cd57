"""The step and phase scopes of the exporter's hot path: what ``with exp.step(n):`` and
``with exp.phase("collective"):`` run on the training thread.

Kept apart from the recorder so the few lines that cost something per step can be read, and
measured (``bench/exporter_hot_path.py``), on their own: two clock reads, one tuple and one
``deque.append`` per step, in two small Python frames.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from time import perf_counter as _perf
from typing import Any

log = logging.getLogger("goodlens.exporter")


class StepScope:
    """The context :meth:`RankExporter.step` returns: one object per exporter, reused.

    ``StepScope(append, index)`` makes an exporter's scope: ``append`` takes the finished
    rows (the bounded deque's ``append``), ``index`` numbers them (an iterator such as
    ``itertools.count()``, or a function returning the next number). The hot path is two
    clock reads, one tuple and one ``append``, in two Python frames: ``arm(n)`` (what
    ``exp.step`` is bound to) keeps the step number and start and returns the scope;
    ``__enter__`` is the builtin ``int`` (no Python frame); ``__exit__`` appends
    ``(index, step, start, end)``, taking the index only then, so a step that raised leaves
    no gap; ``on_error(exc_type, exc)``, if given, hears of it (the exporter records a
    collective's error as a failure there). Gaps in ``index`` count rows the bounded buffer
    evicted. Phases, waits and token
    counts go to a second deque and are matched to steps by time in the background thread.

    Why a class per scope: ``arm`` and ``__exit__`` are static functions over closure cells,
    so ``with`` calls a plain function (no bound method is made, no attribute is read),
    which measured about a quarter cheaper than methods on a ``__slots__`` instance; a
    static ``__exit__`` can only reach its scope's state through a class of its own.
    """

    __slots__ = ()
    __enter__ = int  # a builtin: `with` calls it with no arguments and no Python frame

    def __new__(cls, append: Callable[[tuple], Any], index: Any,
                on_error: Callable[[Any, Any], Any] | None = None) -> StepScope:
        counter: Iterator[int] = index if isinstance(index, Iterator) else iter(index, None)
        step = 0
        t0 = 0.0

        def arm(n: int) -> StepScope:
            """Set the step number and start time; returns the scope for ``with``."""
            nonlocal step, t0
            step = n
            t0 = _perf()
            return scope

        def __exit__(exc_type: Any, exc: Any, tb: Any) -> None:
            if exc_type is None:  # a step that raised did not complete; its failure is an event
                append((next(counter), step, t0, _perf()))
            elif on_error is not None:
                on_error(exc_type, exc)

        scope = object.__new__(type(cls.__name__, (cls,), {
            "__slots__": (), "arm": staticmethod(arm), "__exit__": staticmethod(__exit__)}))
        return scope

    arm: Callable[[int], StepScope]  # set per scope by __new__


class PhaseScope:
    """Times part of the current step as collective or data wait (a mark for the flusher).

    ``PhaseScope(append, kind)``: one per phase kind and exporter, reused; each exit appends
    ``(kind, end, seconds)``. Like :class:`StepScope`, each scope has a class of its own
    whose ``__enter__`` and ``__exit__`` are static functions over closure cells.
    """

    __slots__ = ()

    def __new__(cls, append: Callable[[tuple], Any], kind: str) -> PhaseScope:
        t0 = 0.0

        def __enter__() -> PhaseScope:
            nonlocal t0
            t0 = _perf()
            return scope

        def __exit__(exc_type: Any, exc: Any, tb: Any) -> None:
            t1 = _perf()
            append((kind, t1, t1 - t0))

        scope = object.__new__(type(cls.__name__, (cls,), {
            "__slots__": (), "__enter__": staticmethod(__enter__),
            "__exit__": staticmethod(__exit__)}))
        return scope


class NullScope:
    """What a disabled exporter returns: does nothing, as cheaply as possible."""

    __slots__ = ()
    __enter__ = int

    @staticmethod
    def __exit__(exc_type: Any, exc: Any, tb: Any) -> None:
        return None


class Phases(dict):
    """Phase kind -> its scope; an unknown name gives the null scope (``compute``: silently).

    An enabled exporter binds ``phase`` to this dict's ``__getitem__``, so timing a known
    phase runs no Python frame to find its scope.
    """

    def __missing__(self, name: str) -> NullScope:
        if name != "compute":
            log.warning("goodlens: unknown phase %r (use collective or data)", name)
        return NULL_SCOPE


NULL_SCOPE = NullScope()
