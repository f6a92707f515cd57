"""Hand-built runs in a real store, for the accounting tests: ranks x steps written as the
collector would store them, plus events, and the invariants every breakdown must keep."""

from __future__ import annotations

import pytest

from goodlens.analysis.accounting import account_run
from goodlens.model.batch import validate_batch
from goodlens.storage.store import Store

T0 = 10_000.0


class Run:
    """Writes a synthetic run into a real store: ranks x steps plus events."""

    def __init__(self, store: Store, run_id: str = "r", ranks: int = 4, **meta) -> None:
        self.store, self.run_id, self.ranks = store, run_id, ranks
        self.seq = 0
        if meta:
            store.write_group([validate_batch({"schema_version": 1, "run_id": run_id,
                                               "run": meta})])

    def steps(self, attempt: int, first: int, starts: list[float], dur: float = 1.0,
              compute: dict[int, float] | None = None, split: bool = True,
              skip: dict[int, list[int]] | None = None, offsets: dict[int, float] | None = None,
              durs: list[float] | None = None, data: dict[int, float] | None = None,
              report: tuple[str, ...] = ("compute_s", "collective_wait_s")) -> None:
        """Steps first.. at ``starts``; rank r computes ``compute.get(r, 0.6)`` per step,
        waits ``data[r]`` for its data loader (ranks not in ``data`` report no data wait)
        and for the collective what is left of the step; ``split`` False reports none of
        these, and only the columns in ``report`` (with data_wait_s) are sent."""
        compute = compute or {}
        data = data or {}
        batches = []  # one group commit for every rank's rows
        for r in range(self.ranks):
            n = [first + i for i in range(len(starts)) if first + i not in (skip or {}).get(r, [])]
            if not n:
                continue
            idx = [k - first for k in n]
            d = [(durs[i] if durs else dur) for i in idx]
            cols = {"attempt": attempt, "rank": r, "host": f"h{r}", "step": n,
                    "start_time": [starts[i] + (offsets or {}).get(r, 0.0) for i in idx],
                    "duration_s": d}
            if split:
                c, w = compute.get(r, 0.6), data.get(r, 0.0)
                split_cols = {"compute_s": [c] * len(n),
                              "collective_wait_s": [max(0.0, x - c - w) for x in d]}
                cols.update({k: v for k, v in split_cols.items() if k in report})
                if r in data:
                    cols["data_wait_s"] = [w] * len(n)
            batches.append(validate_batch({"schema_version": 1, "run_id": self.run_id,
                                           "steps": cols}))
        if batches:
            self.store.write_group(batches)

    def event(self, kind: str, t: float, attempt: int, **fields) -> None:
        self.store.write_group([validate_batch({
            "schema_version": 1, "run_id": self.run_id,
            "events": {"source": "test", "seq": [self.seq], "kind": [kind], "time": [t],
                       "attempt": attempt, **{k: [v] for k, v in fields.items()}}})])
        self.seq += 1

    def account(self, now: float | None = None):
        self.store.summarize_dirty()
        return account_run(self.store, self.run_id, now=now)


def check_invariants(b) -> None:
    values = [v for v in b.buckets.values() if v is not None]
    assert all(v >= -1e-9 for v in values)
    assert sum(values) == pytest.approx(b.wall_clock_s, rel=1e-12, abs=1e-9)
    assert sum(b.restart_parts.values()) == pytest.approx(b.buckets["restart"], abs=1e-9)
    assert sum(b.startup_parts.values()) == pytest.approx(b.buckets["startup"], abs=1e-9)
    assert sum(b.other_parts.values()) == pytest.approx(b.buckets["other"], abs=1e-9)
