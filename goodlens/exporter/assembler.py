"""The exporter's background side: raw step tuples and phase marks become full step rows.

Runs on the flusher thread, never on the training thread: the scopes
(:mod:`goodlens.exporter.scopes`) record only indices and clock readings, and this module
attributes waits and token counts to steps, counts evicted rows and turns columns into the
wire format's compact form.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class Assembler:
    """Background-thread side: turns raw step tuples and marks into full step rows.

    Marks (phase waits, token counts) carry the time they were taken and belong to the step
    whose interval contains that time; marks newer than the last finished step wait for the
    next call. Gaps in the step index are rows the bounded buffer evicted.
    """

    def __init__(self, attempt: int | None = None) -> None:
        self.split = False
        self.dropped = 0
        self.last_step: int | None = None
        self._next_index = 0
        self._pending: list[tuple] = []
        # the attempt the exporter started in: rows recorded before a new_attempt marker
        # belong to it even when the marker comes before the first send
        self._attempt: int | None = attempt

    def assemble(self, raw: list[tuple], marks: list[tuple], offset: float,
                 attempt: int) -> list[tuple]:
        if self._attempt is None:
            self._attempt = attempt
        if marks:
            self.split = self.split or any(m[0] in ("collective", "data") for m in marks)
            self._pending.extend(marks)
            self._pending.sort(key=lambda m: m[1])
        pend, j, out = self._pending, 0, []
        for row in raw:
            idx = row[0]
            if idx > self._next_index:
                self.dropped += idx - self._next_index
            self._next_index = idx + 1
            if len(row) == 2:  # new_attempt marker
                self._attempt = row[1]
                continue
            if len(row) == 9:  # record_step(): already complete, times in epoch seconds
                out.append((self._attempt, *row[1:]))
                self.last_step = row[1]
                continue
            _, step, t0, t1 = row
            coll = data = 0.0
            tokens = samples = None
            while j < len(pend) and pend[j][1] <= t1:
                kind, t, value = pend[j]
                if t >= t0:
                    if kind == "collective":
                        coll += value
                    elif kind == "data":
                        data += value
                    elif kind == "tokens":
                        tokens = (tokens or 0) + value
                    else:
                        samples = (samples or 0) + value
                j += 1
            dur = t1 - t0
            if self.split:
                comp = dur - coll - data
                out.append((self._attempt, step, t0 + offset, dur, comp if comp > 0 else 0.0,
                            coll, data, tokens, samples))
            else:
                out.append((self._attempt, step, t0 + offset, dur, None, None, None, tokens,
                            samples))
            self.last_step = step
        del pend[:j]
        return out


def popleft(buf: deque, n: int) -> list:
    out = []
    pop = buf.popleft
    for _ in range(min(n, len(buf))):
        out.append(pop())
    return out


def compact(values: Any) -> Any:
    """A column as a scalar when every value is the same (the wire format broadcasts it)."""
    first = values[0]
    for v in values:
        if v != first:
            return list(values)
    return first
