"""The Hugging Face ``Trainer`` integration's bookkeeping, in one process (no torchrun): what
``goodlens.exporter.hf.instrument`` records for a real ``Trainer`` with gradient
accumulation, saves, evaluation and a resume, through a stand-in exporter.

Why: the recorded job (tests/integration/test_recorded_hf.py) checks the accounting against
the job's clock, but a wrong step number, a save recorded with the wrong step, a restore
outside the loads or an exception from goodlens reaching training are cheaper to pin here.
"""

from __future__ import annotations

import os
from time import perf_counter

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch.utils.data import Dataset
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
)

from goodlens.exporter import hf


class FakeExporter:
    """Records what the integration calls: steps (n, t0, t1), waits, events by kind."""

    enabled = True
    attempt = 0
    config = None

    def __init__(self, fail: bool = False) -> None:
        self.steps: list[tuple[int, float, float]] = []
        self.waits: list[tuple[str, float, float]] = []
        self.events: list[tuple[str, dict]] = []
        self.fail = fail
        self.closed = False
        self._n = 0
        self._t0 = 0.0

    def step(self, n: int) -> FakeExporter:
        self._n, self._t0 = n, perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.steps.append((self._n, self._t0, perf_counter()))

    def add_wait(self, kind: str, seconds: float) -> None:
        self.waits.append((kind, perf_counter(), seconds))

    def count(self, **kw: int) -> None:
        pass

    def event(self, kind: str, time_s: float | None = None, **fields: object) -> None:
        if self.fail:
            raise RuntimeError("collector exploded")
        self.events.append((str(kind), fields))

    def kinds(self, kind: str) -> list[dict]:
        return [f for k, f in self.events if k == kind]

    def flush(self, timeout: float = 10.0) -> bool:
        return True

    def close(self, timeout: float = 10.0) -> bool:
        self.closed = True
        return True


class Tokens(Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 32, (n, 8), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def trainer(out: str, steps: int) -> Trainer:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2, max_position_embeddings=8))
    args = TrainingArguments(output_dir=out, max_steps=steps, save_strategy="steps",
                             save_steps=2, eval_strategy="steps", eval_steps=3,
                             per_device_train_batch_size=2, gradient_accumulation_steps=2,
                             use_cpu=True, report_to=[], logging_steps=10**6,
                             disable_tqdm=True, save_only_model=False)
    return Trainer(model=model, args=args, train_dataset=Tokens(64), eval_dataset=Tokens(4))


def test_steps_saves_eval_and_resume_are_recorded_with_the_trainers_numbers(tmp_path):
    exp = FakeExporter()
    t = trainer(str(tmp_path), 4)
    cb = hf.instrument(t, exporter=exp)
    assert hf.instrument(t) is cb  # the trainer's callback is reused, nothing wrapped twice
    t.train()
    # one step per optimizer step (2 micro-batches each), numbered by global_step from 0
    assert [s[0] for s in exp.steps] == [0, 1, 2, 3]
    # each step's data wait is inside it (the fetch runs before on_step_begin)
    data = [w for w in exp.waits if w[0] == "data"]
    assert len(data) == 4
    for (_, t0, t1), (_, at, _) in zip(exp.steps, data, strict=True):
        assert t0 <= at <= t1
    # checkpoint-2 and checkpoint-4 hold steps 0-1 and 0-3: the last step saved, per save
    saves = exp.kinds("ckpt_save_start")
    assert [s["step"] for s in saves] == [1, 3] and saves[0]["tier"] == "durable"
    assert [s["step"] for s in exp.kinds("ckpt_save_blocking_end")] == [1, 3]
    durable = exp.kinds("ckpt_save_durable_end")
    assert all(d["bytes"] > 0 for d in durable)  # one process: it writes every file
    # eval_steps=3: after global step 3, and at the end (4 is no multiple of 3)
    assert [e["label"] for e in exp.kinds("custom_begin")] == ["eval", "eval"]
    assert len(exp.kinds("custom_end")) == 2
    assert exp.kinds("attempt_end")[-1]["step"] == 3 and not exp.closed  # not its exporter
    assert exp.kinds("attempt_start")
    assert not exp.kinds("ckpt_restore_start")

    # a new process resuming from checkpoint-2 redoes steps 2-3
    again = FakeExporter()
    t2 = trainer(str(tmp_path), 4)
    hf.instrument(t2, exporter=again)
    t2.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert [s[0] for s in again.steps] == [2, 3]
    restores = again.kinds("ckpt_restore_start")
    assert len(restores) == 3 and {r["step"] for r in restores} == {1}  # weights, optim, RNG
    assert len(again.kinds("ckpt_restore_end")) == 3


def test_an_exporter_failing_never_reaches_training(tmp_path):
    t = trainer(str(tmp_path), 2)
    hf.instrument(t, exporter=FakeExporter(fail=True))
    assert t.train().global_step == 2


def test_restored_step_and_rank_bytes(tmp_path):
    assert hf._restored_step(str(tmp_path / "checkpoint-30")) == 29
    assert hf._restored_step(str(tmp_path / "checkpoint-30") + "/") == 29
    assert hf._restored_step(str(tmp_path / "checkpoint-0")) is None
    assert hf._restored_step(None) is None
    for name, size in (("model.safetensors", 100), ("rng_state_0.pth", 10),
                       ("rng_state_1.pth", 11), ("rank1-of-2-optimizer.pt", 7)):
        (tmp_path / name).write_bytes(b"x" * size)
    assert hf.rank_bytes(str(tmp_path), 0, main=True) == 110
    assert hf.rank_bytes(str(tmp_path), 1, main=False) == 18
