"""The Lightning callback's bookkeeping on its own, with a fake exporter and a fake clock: which
optimizer step a batch belongs to, its data wait (summed over the micro-batches of gradient
accumulation), a fetch that found the end of the data, a failed step, and the save and
restore wrappers' events (with ``AsyncCheckpointIO``, the durable end from its thread).

Why: the recorded job (tests/integration/test_recorded_lightning.py) checks the sums against the
job's clock; these check the hook-order logic those sums rest on, in milliseconds."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("lightning")

from lightning.pytorch.plugins.io import AsyncCheckpointIO

from goodlens.exporter.lightning import GoodlensCallback, _StepTracker


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeExporter:
    """Records what the callback asks for: step scopes (opened/closed on the fake clock),
    waits, events."""

    enabled = True

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.rows: list[tuple[int, float, float, Any]] = []
        self.waits: list[tuple[str, float, float]] = []
        self.events: list[tuple[str, dict]] = []
        self.failures: list[BaseException | None] = []

    def step(self, n: int) -> Any:
        t0, rows, clock = self.clock(), self.rows, self.clock

        class Scope:
            def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
                rows.append((n, t0, clock(), exc_type))

        return Scope()

    def add_wait(self, kind: str, seconds: float) -> None:
        self.waits.append((kind, self.clock(), seconds))

    def event(self, kind: Any, time_s: float | None = None, **fields: Any) -> None:
        self.events.append((getattr(kind, "value", kind), fields))


def fetch(tr: _StepTracker, clock: Clock, step: int, seconds: float) -> None:
    tr.before_fetch(step)
    clock.t += seconds
    tr.after_fetch()


def test_a_step_spans_its_fetch_and_the_fetch_is_its_data_wait() -> None:
    clock = Clock()
    exp = FakeExporter(clock)
    tr = _StepTracker(exp, clock)
    for step in (0, 1):
        fetch(tr, clock, step, 0.2 if step == 1 else 0.01)
        tr.batch_start(step)
        clock.t += 0.05  # forward, backward, optimizer
        assert tr.batch_end(stepped=True) == step
        clock.t += 0.03  # a save or validation between steps: not in either step
    (s0, a0, b0, _), (s1, a1, b1, _) = exp.rows
    assert (s0, s1) == (0, 1)
    assert b0 - a0 == pytest.approx(0.06) and b1 - a1 == pytest.approx(0.25)
    assert a1 - b0 == pytest.approx(0.03)
    assert [w[2] for w in exp.waits] == pytest.approx([0.01, 0.2])
    assert all(a <= t <= b for (_, t, _), (_, a, b, _) in zip(exp.waits, exp.rows))


def test_gradient_accumulation_is_one_step_with_its_micro_batches_data_wait() -> None:
    clock = Clock()
    exp = FakeExporter(clock)
    tr = _StepTracker(exp, clock)
    for k in range(3):  # accumulate_grad_batches=3: the optimizer steps on the third
        fetch(tr, clock, 7, 0.1)
        tr.batch_start(7)
        clock.t += 0.05
        assert tr.batch_end(stepped=k == 2) == (7 if k == 2 else None)
    assert len(exp.rows) == 1
    n, a, b, _ = exp.rows[0]
    assert n == 7 and b - a == pytest.approx(0.45)
    assert sum(w[2] for w in exp.waits) == pytest.approx(0.3)


def test_a_fetch_that_found_the_end_of_the_data_records_no_step() -> None:
    clock = Clock()
    exp = FakeExporter(clock)
    tr = _StepTracker(exp, clock)
    fetch(tr, clock, 5, 0.01)  # StopIteration: no batch started
    clock.t += 1.0  # epoch end, validation
    fetch(tr, clock, 5, 0.02)  # next epoch's first batch: the step starts here
    tr.batch_start(5)
    tr.batch_end(stepped=True)
    assert [(n, round(b - a, 6)) for n, a, b, _ in exp.rows] == [(5, 0.02)]
    fetch(tr, clock, 6, 0.01)
    tr.finish()  # fit ended after a dry fetch: nothing recorded
    assert len(exp.rows) == 1


def test_a_step_that_raised_is_closed_with_its_error() -> None:
    clock = Clock()
    exp = FakeExporter(clock)
    tr = _StepTracker(exp, clock)
    fetch(tr, clock, 3, 0.01)
    tr.batch_start(3)
    tr.abort(RuntimeError("Connection closed by peer"))
    assert exp.rows[0][0] == 3 and exp.rows[0][3] is RuntimeError
    assert tr.scope is None


def fake_trainer(step: int, zero: bool, io: Any = None) -> SimpleNamespace:
    strategy = SimpleNamespace(checkpoint_io=io,
                               load_checkpoint=lambda path, weights_only=None:
                               {"global_step": 40, "state_dict": {}})
    return SimpleNamespace(global_step=step, is_global_zero=zero, strategy=strategy,
                           save_checkpoint=lambda filepath, weights_only=None,
                           storage_options=None: open(filepath, "wb").write(b"x" * 123))


def test_saves_and_restores_are_recorded_around_the_real_calls(tmp_path) -> None:
    exp = FakeExporter(Clock())
    for zero in (True, False):
        exp.events.clear()
        cb = GoodlensCallback(exporter=exp, tier="local")
        trainer = fake_trainer(20, zero)
        own_save = trainer.save_checkpoint
        cb._wrap_save(trainer)
        cb._wrap_load(trainer)
        trainer.save_checkpoint(tmp_path / "a.ckpt")
        trainer.strategy.load_checkpoint(tmp_path / "a.ckpt")
        kinds = [k for k, _ in exp.events]
        # the read's progress is sent live, before the step it restores is known
        assert kinds == ["ckpt_save_start", "ckpt_save_blocking_end", "ckpt_save_durable_end",
                         "ckpt_restore_progress", "ckpt_restore_start", "ckpt_restore_end"]
        assert all(f["tier"] == "local" for _, f in exp.events)
        assert [f.get("step") for _, f in exp.events] == [19, 19, 19, None, 39, 39]
        # the writing rank reports the file's bytes; the others wrote nothing
        assert exp.events[2][1].get("bytes") == (123 if zero else None)
        assert exp.events[3][1]["label"] == "read" and exp.events[3][1]["bytes"] == 0
        assert json.loads(exp.events[3][1]["detail"]) == {"live_bytes": False,
                                                          "bytes_total": 123}
        assert exp.events[5][1]["bytes"] == 123  # every rank reads the whole file
        while cb._undo:
            cb._undo.pop()()
        assert trainer.save_checkpoint is own_save  # put back at teardown


def test_an_async_save_is_durable_when_its_thread_wrote_the_file(tmp_path) -> None:
    written: list[str] = []
    # the background write waits until the blocking part was checked: unheld, the thread
    # may write (and record durable) before the caller's blocking end
    blocking_checked = threading.Event()

    class Inner:
        def save_checkpoint(self, checkpoint: dict, path: Any, storage_options: Any = None
                            ) -> None:
            assert blocking_checked.wait(10)
            (tmp_path / path).write_bytes(b"y" * 77)
            written.append(path)

    io = AsyncCheckpointIO(Inner())
    exp = FakeExporter(Clock())
    cb = GoodlensCallback(exporter=exp)
    trainer = fake_trainer(60, True, io)
    trainer.save_checkpoint = lambda filepath, weights_only=None, storage_options=None: \
        io.save_checkpoint({"global_step": 60}, filepath)
    cb._wrap_save(trainer)
    trainer.save_checkpoint(str(tmp_path / "b.ckpt"))
    assert [k for k, _ in exp.events] == ["ckpt_save_start", "ckpt_save_blocking_end"]
    blocking_checked.set()
    io.teardown()  # waits for the thread's write
    assert written and exp.events[-1] == ("ckpt_save_durable_end",
                                          {"bytes": 77, "step": 59, "tier": "durable"})
