"""The exporter's hot path and its background assembly on their own: the rows a step scope
records (none for a step that raised: its failure is an event, and no index is taken, so no
gap reads as an eviction), and how marks become a step's waits, tokens and attempt."""

from __future__ import annotations

import itertools
import time
from collections import deque

import pytest

from goodlens.exporter.assembler import Assembler
from goodlens.exporter.scopes import NULL_SCOPE, Phases, PhaseScope, StepScope


@pytest.mark.parametrize("index", ["iterator", "function"])
def test_the_step_scope_records_index_step_and_its_clock(index: str) -> None:
    buf: deque = deque()
    count = itertools.count()
    scope = StepScope(buf.append, count if index == "iterator" else count.__next__)
    before = time.perf_counter()
    for n in (5, 6, 7):
        with scope.arm(n):
            pass
    with pytest.raises(KeyError), scope.arm(8):
        raise KeyError("boom")
    with scope.arm(9):
        pass
    after = time.perf_counter()
    assert [(i, s) for i, s, _, _ in buf] == [(0, 5), (1, 6), (2, 7), (3, 9)]
    assert all(before <= t0 <= t1 <= after for _, _, t0, t1 in buf)  # perf_counter's clock


def test_two_scopes_keep_their_own_state() -> None:
    a: deque = deque()
    b: deque = deque()
    sa, sb = StepScope(a.append, itertools.count()), StepScope(b.append, itertools.count(10))
    with sa.arm(1), sb.arm(2):
        pass
    assert [r[:2] for r in a] == [(0, 1)] and [r[:2] for r in b] == [(10, 2)]


def test_phase_scopes_and_unknown_phases() -> None:
    marks: deque = deque()
    phases = Phases(collective=PhaseScope(marks.append, "collective"))
    with phases["collective"]:
        time.sleep(0.002)
    ((kind, end, seconds),) = marks
    assert kind == "collective" and seconds >= 0.002 and end <= time.perf_counter()
    assert phases["compute"] is NULL_SCOPE and phases["nonsense"] is NULL_SCOPE


def test_assembler_attributes_phases_tokens_and_attempts():
    a = Assembler()
    raw = [(0, 7, 10.0, 11.0), (1, 8, 11.0, 12.5), (2, 3), (3, 9, 13.0, 14.0),
           (4, 10, 2000.0, 1.0, None, None, None, 5, None)]
    marks = [("data", 10.1, 0.1), ("collective", 10.9, 0.3), ("tokens", 10.5, 64),
             ("collective", 12.4, 0.5), ("collective", 99.0, 1.0)]
    rows = a.assemble(raw, marks, offset=1000.0, attempt=2)
    assert rows[0] == (2, 7, 1010.0, 1.0, pytest.approx(0.6), 0.3, 0.1, 64, None)
    assert rows[1] == (2, 8, 1011.0, 1.5, pytest.approx(1.0), 0.5, 0.0, None, None)
    assert rows[2][:2] == (3, 9)  # the new_attempt marker switched the attempt
    assert rows[3] == (3, 10, 2000.0, 1.0, None, None, None, 5, None)
    assert a._pending == [("collective", 99.0, 1.0)]  # belongs to a step not finished yet
    assert a.dropped == 0 and a.last_step == 10


def test_steps_without_phases_report_no_split():
    a = Assembler()
    rows = a.assemble([(0, 1, 0.0, 1.0)], [], 0.0, 0)
    assert rows[0][4:7] == (None, None, None)
