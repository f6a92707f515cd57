"""The torchtitan integration (``goodlens.exporter.torchtitan``) over a stand-in for
torchtitan 0.3.0's trainer, without torchtitan installed.

Why a stand-in: CI does not install torchtitan (it needs triton, and on torch 2.13 CPU it
trains only through a shim; docs/torchtitan-cpu.md). The stand-in below copies the
parts of torchtitan 0.3.0 the integration relies on, as its source has them:
``Configurable`` (a class declaring a nested ``Config`` becomes what ``Config.build()``
constructs), ``Trainer.train()``'s call order (``checkpointer.load``, ``batch_generator``
once, then per iteration ``step += 1``, ``train_step``, ``checkpointer.save(step,
last_step=...)``, ``validator.validate`` when due, a ``DataloaderExhaustedError`` ending the
loop), and a checkpoint manager with ``save``/``load``/``save_future``/
``maybe_wait_for_saving`` writing DCP-named files through ``dcp_save``/``dcp_load``, in
``disabled`` (synchronous) and ``async`` modes. A real :class:`RankExporter` records into an
in-memory sink (its transport), so what is checked is what would reach a collector.

Every wait is a planted sleep; the expected values are those sleeps and the planted file
sizes, written here by hand, never computed by goodlens. Sleeps only make a measured time
longer, so lower bounds are exact and upper bounds get ``SLACK``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import time
import types
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest

torch = pytest.importorskip("torch")

import goodlens.exporter  # noqa: E402
from goodlens.exporter import torchtitan as gtt  # noqa: E402
from goodlens.exporter.recorder import RankExporter  # noqa: E402
from goodlens.exporter.transport import Transport  # noqa: E402

DATA = 0.04  # each batch's load
COMPUTE = 0.08  # each train_step besides its data
SAVE = 0.10  # a synchronous DCP save
STAGE = 0.05  # an async save's blocking part (staging)
DURABLE = 0.60  # an async save's background write, after staging
EVAL = 0.07  # one validation run
RESTORE = 0.09  # a DCP load
SLACK = 0.08  # scheduling noise allowed above a planted time
SHARD, OTHER_SHARD, META = 1000, 500, 24  # rank 0's shard, rank 1's, .metadata (bytes)
TOKENS = 2 * 8  # a batch's labels: 2 x 8


# --------------------------------------------------------------- the torchtitan stand-in
class DataloaderExhaustedError(Exception):
    """torchtitan.components.dataloader.DataloaderExhaustedError."""


class Configurable:
    """torchtitan.config.configurable.Configurable (0.3.0, lines 162-180 and build())."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        _owner: ClassVar[type | None] = None

        def build(self, **kwargs: Any) -> Any:
            if self._owner is None:
                raise NotImplementedError("no owner class")
            return self._owner(config=dataclasses.replace(self), **kwargs)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "Config" in cls.__dict__:
            config_cls = cls.__dict__["Config"]
            if issubclass(config_cls, Configurable.Config):
                if "__slots__" not in config_cls.__dict__:
                    raise TypeError(f"{cls.__name__}.Config must use "
                                    "@dataclass(kw_only=True, slots=True)")
                config_cls._owner = cls


@dataclass(kw_only=True, slots=True)
class TrainingConfig:
    steps: int = 5


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    enable: bool = True
    folder: str = "checkpoint"
    interval: int = 2
    async_mode: str = "disabled"
    load_step: int = -1


@dataclass(kw_only=True, slots=True)
class ValidatorConfig:
    enable: bool = True
    freq: int = 3


@dataclass(kw_only=True, slots=True)
class CommConfig:
    init_timeout_seconds: int = 300
    init_process_group: bool = False  # the stand-in calls torch's only when asked to


class CheckpointManager:
    """components/checkpointer: ``save`` (base.py:171 -> dcp.py:381), ``load`` (dcp.py:476),
    ``save_future``, ``maybe_wait_for_saving``; files named as DCP names them."""

    def __init__(self, config: CheckpointConfig, states: dict[str, Any], base_folder: str
                 ) -> None:
        self.enable = config.enable
        self.interval = config.interval
        self.async_mode = config.async_mode
        self.folder = os.path.join(base_folder, config.folder)
        self.states = states
        self.staging_future: Future | None = None
        self.save_future: Future | None = None
        self._pool = ThreadPoolExecutor(1)

    def _create_checkpoint_id(self, step: int) -> str:
        return os.path.join(self.folder, f"step-{step}")

    def save(self, curr_step: int, last_step: bool = False) -> bool:
        if not self.enable or not (last_step or curr_step % self.interval == 0):
            return False
        self.maybe_wait_for_saving()
        checkpoint_id = self._create_checkpoint_id(curr_step)
        state = {"step": self.states["train_state"].step}
        if last_step:  # _save_last_step: always synchronous
            self.dcp_save(state, checkpoint_id=checkpoint_id, async_mode="disabled")
            return True
        result = self.dcp_save(state, checkpoint_id=checkpoint_id, async_mode=self.async_mode)
        if self.async_mode == "async":
            self.save_future = result
        return True

    def dcp_save(self, state_dict: dict[str, Any], checkpoint_id: str,
                 async_mode: str = "disabled") -> Future | None:
        if async_mode == "disabled":
            time.sleep(SAVE)
            _write_checkpoint(checkpoint_id, state_dict)
            return None
        time.sleep(STAGE)  # staged in the call
        return self._pool.submit(_write_later, checkpoint_id, dict(state_dict))

    def maybe_wait_for_saving(self) -> None:
        if not self.enable or self.save_future is None:
            return
        self.save_future.result()
        self.save_future = None

    def maybe_wait_for_staging(self) -> None:
        pass

    def load(self, step: int = -1) -> bool:
        if not self.enable or not os.path.isdir(self.folder):
            return False
        found = [int(n.split("-")[1]) for n in os.listdir(self.folder) if n.startswith("step-")]
        if not found:
            return False
        step = max(found) if step == -1 else step
        self.dcp_load({}, checkpoint_id=self._create_checkpoint_id(step))
        return True

    def dcp_load(self, state_dict: dict[str, Any], checkpoint_id: str,
                 from_hf: bool = False, from_quantized: bool = False) -> None:
        time.sleep(RESTORE)
        saved = json.loads(Path(checkpoint_id, "train_state.json").read_text())
        self.states["train_state"].load_state_dict({"step": saved["step"], "ntokens_seen": 0})

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _write_checkpoint(path: str, state: dict[str, Any]) -> None:
    os.makedirs(path, exist_ok=True)
    Path(path, "__0_0.distcp").write_bytes(b"\0" * SHARD)
    Path(path, "__1_0.distcp").write_bytes(b"\0" * OTHER_SHARD)  # another rank's: not ours
    Path(path, ".metadata").write_bytes(b"\0" * META)
    Path(path, "train_state.json").write_text(json.dumps(state))


def _write_later(path: str, state: dict[str, Any]) -> None:
    time.sleep(DURABLE)
    _write_checkpoint(path, state)


class Validator:
    def __init__(self, config: ValidatorConfig) -> None:
        self.config = config
        self.validated: list[int] = []

    def should_validate(self, step: int) -> bool:
        return step == 1 or step % self.config.freq == 0

    def validate(self, model_parts: list[Any], step: int) -> None:
        time.sleep(EVAL)
        self.validated.append(step)


class Loader:
    """A data loader whose every batch takes ``DATA`` to load."""

    def __init__(self, batches: int) -> None:
        self.batches = batches

    def __iter__(self) -> Any:
        for i in range(self.batches):
            time.sleep(DATA)
            yield {"input": torch.full((2, 8), i)}, torch.zeros(2, 8, dtype=torch.long)


class Trainer(Configurable):
    """torchtitan.trainer.Trainer (0.3.0), the parts the integration relies on."""

    @dataclass(kw_only=True, slots=True)
    class Config(Configurable.Config):
        dump_folder: str = "./outputs"
        training: TrainingConfig = field(default_factory=TrainingConfig)
        checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
        validator: ValidatorConfig = field(default_factory=ValidatorConfig)
        comm: CommConfig = field(default_factory=CommConfig)
        batches: int = 100  # the stand-in's data set size

    def __init__(self, config: Config) -> None:
        self.config = config
        self.world_size = self.init_distributed()
        self.model_parts = [torch.nn.Linear(2, 2)]
        self.step = 0
        self.ntokens_seen = 0
        self.dataloader = Loader(config.batches)
        self.checkpointer = CheckpointManager(config.checkpoint, {"train_state": self},
                                              config.dump_folder)
        if config.validator.enable:
            self.validator = Validator(config.validator)
        self.trained: list[int] = []
        self.closed = False

    def init_distributed(self) -> int:
        if self.config.comm.init_process_group:  # distributed/utils.py:561
            torch.distributed.init_process_group(
                backend="gloo", timeout=timedelta(seconds=self.config.comm.init_timeout_seconds),
                _ranks=[], device_id=None)
        return 1

    def batch_generator(self, data_iterable: Any) -> Any:
        data_iterator = iter(data_iterable)
        while True:
            try:
                batch = next(data_iterator)
            except StopIteration as ex:
                raise DataloaderExhaustedError() from ex
            yield batch

    def train_step(self, data_iterator: Any) -> None:
        next(data_iterator)  # (input_dict, labels)
        time.sleep(COMPUTE)
        self.checkpointer.maybe_wait_for_staging()
        self.trained.append(self.step)

    def train(self) -> None:
        config = self.config
        self.checkpointer.load(step=config.checkpoint.load_step)
        data_iterator = self.batch_generator(self.dataloader)
        while self.should_continue_training():
            self.step += 1
            try:
                self.train_step(data_iterator)
            except DataloaderExhaustedError:
                break
            self.checkpointer.save(self.step, last_step=(self.step == config.training.steps))
            if config.validator.enable and self.validator.should_validate(self.step):
                self.validator.validate(self.model_parts, self.step)
        # (rank 0 then sleeps 2 s in torchtitan: left out)

    def should_continue_training(self) -> bool:
        return self.step < self.config.training.steps

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = state_dict["step"]
        self.ntokens_seen = state_dict["ntokens_seen"]

    def close(self) -> None:
        self.checkpointer.close()
        self.closed = True


@pytest.fixture
def titan(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The stand-in installed as ``torchtitan.trainer``."""
    package = types.ModuleType("torchtitan")
    trainer = types.ModuleType("torchtitan.trainer")
    trainer.Trainer = Trainer  # type: ignore[attr-defined]
    package.trainer = trainer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchtitan", package)
    monkeypatch.setitem(sys.modules, "torchtitan.trainer", trainer)
    return trainer


# --------------------------------------------------------------------- the exporter sink
class SinkTransport(Transport):
    """Keeps every batch the exporter sends, decoded; sends nothing."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9")
        self.docs: list[dict[str, Any]] = []

    def deliver(self, body: bytes, rows: int = 0, content_type: str = "") -> int:
        self.docs.append(json.loads(body))
        return 0

    def drain_spill(self) -> bool:
        return True

    def has_spill(self) -> bool:
        return False


def _columns(table: dict[str, Any]) -> list[dict[str, Any]]:
    """A wire table's rows (a column given as one value holds it in every row)."""
    n = max(len(v) for v in table.values() if isinstance(v, list))
    return [{k: (v[i] if isinstance(v, list) else v) for k, v in table.items()}
            for i in range(n)]


class Recorded:
    """What a real exporter sent through a :class:`SinkTransport`."""

    def __init__(self, sink: SinkTransport) -> None:
        self.steps = [r for d in sink.docs if "steps" in d for r in _columns(d["steps"])]
        self.events = sorted((r for d in sink.docs if "events" in d
                              for r in _columns(d["events"])), key=lambda e: e["seq"])

    def kinds(self) -> list[tuple]:
        """(kind, step, label) of the events after start-up, in order."""
        return [(e["kind"], e.get("step"), e.get("label")) for e in self.events
                if e["kind"] not in ("attempt_start", "init_start", "init_end")]

    def event(self, kind: str, step: int | None = None) -> dict[str, Any]:
        (found,) = [e for e in self.events if e["kind"] == kind and e.get("step") == step]
        return found


def make_exporter(**options: Any) -> tuple[RankExporter, SinkTransport]:
    exp = RankExporter(run_id="tt", url="http://127.0.0.1:9", wire="json", hooks=False,
                       flush_interval_s=3600, spill_dir=None, host="h0", **options)
    sink = SinkTransport()
    exp._transport = sink  # the background thread sleeps; close() sends all to the sink
    return exp, sink


def run(config: Trainer.Config, monkeypatch: pytest.MonkeyPatch, **options: Any
        ) -> tuple[Any, Recorded]:
    """Build the goodlens trainer from a stand-in config, train, close; what it recorded
    (``options``: the exporter's)."""
    exp, sink = make_exporter(**options)
    monkeypatch.setattr(gtt.GoodlensTrainerMixin, "make_exporter", lambda self: exp)
    trainer = gtt.goodlens_config(config).build()
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer, Recorded(sink)


def within(measured: float, planted: float) -> bool:
    return planted - 0.002 <= measured < planted + SLACK


def assert_steps(rec: Recorded, steps: list[int]) -> None:
    assert [s["step"] for s in rec.steps] == steps
    for s in rec.steps:
        assert within(s["duration_s"], DATA + COMPUTE), s
        assert within(s["data_wait_s"], DATA), s
        assert within(s["compute_s"], COMPUTE), s
        assert s["tokens"] == TOKENS and s["attempt"] == 0 and s["rank"] == 0


def gap(a: dict[str, Any], b: dict[str, Any]) -> float:
    return b["time"] - a["time"]


# ---------------------------------------------------------------------------------- tests
def test_synchronous_saves_validation_and_a_resume(titan, tmp_path, monkeypatch):
    config = Trainer.Config(dump_folder=str(tmp_path), training=TrainingConfig(steps=5))
    trainer, rec = run(config, monkeypatch)
    assert type(trainer).__name__ == "GoodlensTrainer" and trainer.trained == [1, 2, 3, 4, 5]
    assert trainer.closed and trainer.goodlens_exporter is None
    assert_steps(rec, [1, 2, 3, 4, 5])
    save = ["ckpt_save_start", "ckpt_save_blocking_end", "ckpt_save_durable_end"]
    assert rec.kinds() == [
        ("custom_begin", 1, "eval"), ("custom_end", 1, "eval"),
        *[(k, 2, None) for k in save],
        ("custom_begin", 3, "eval"), ("custom_end", 3, "eval"),
        *[(k, 4, None) for k in save],
        *[(k, 5, None) for k in save],  # the last step: always synchronous
        ("attempt_end", 5, None)]
    assert {e["kind"] for e in rec.events} >= {"attempt_start", "init_start", "init_end"}
    for step in (2, 4, 5):
        start = rec.event("ckpt_save_start", step)
        blocked = rec.event("ckpt_save_blocking_end", step)
        durable = rec.event("ckpt_save_durable_end", step)
        assert within(gap(start, blocked), SAVE) and gap(blocked, durable) < 0.01
        assert durable["bytes"] == SHARD + META and start["bytes"] is None
        assert start["tier"] == durable["tier"] == "durable"
    for step in (1, 3):
        assert within(gap(rec.event("custom_begin", step), rec.event("custom_end", step)),
                      EVAL)
    assert rec.event("attempt_end", 5)["cause"] == "completed"

    # relaunch with the same folder and more steps: restore step 5, train 6 and 7
    config = Trainer.Config(dump_folder=str(tmp_path), training=TrainingConfig(steps=7))
    trainer, rec = run(config, monkeypatch)
    assert trainer.trained == [6, 7]
    assert_steps(rec, [6, 7])
    assert rec.kinds() == [
        ("ckpt_restore_start", 5, None), ("ckpt_restore_end", 5, None),
        *[(k, 6, None) for k in save], ("custom_begin", 6, "eval"), ("custom_end", 6, "eval"),
        *[(k, 7, None) for k in save], ("attempt_end", 7, None)]
    start, end = rec.event("ckpt_restore_start", 5), rec.event("ckpt_restore_end", 5)
    assert within(gap(start, end), RESTORE)
    assert end["bytes"] == SHARD + META and end["tier"] == "durable"
    assert end["time"] <= rec.steps[0]["start_time"] + 0.01  # restored before step 6 began


class DcpCheckpointManager(CheckpointManager):
    """``dcp_save``/``dcp_load`` as torchtitan's (components/checkpoint.py): a real DCP
    checkpoint of a small model, read back with ``dcp.load(state_dict, checkpoint_id=...)``."""

    loaded: dict[str, Any] | None = None

    def dcp_save(self, state_dict: dict[str, Any], checkpoint_id: str,
                 async_mode: str = "disabled") -> None:
        import torch.distributed.checkpoint as dcp
        dcp.save({"model": {"w": torch.arange(256, dtype=torch.float32),
                            "b": torch.ones(64)}}, checkpoint_id=checkpoint_id)
        Path(checkpoint_id, "train_state.json").write_text(json.dumps(state_dict))

    def dcp_load(self, state_dict: dict[str, Any], checkpoint_id: str,
                 from_hf: bool = False, from_quantized: bool = False) -> None:
        import torch.distributed.checkpoint as dcp
        model = {"w": torch.zeros(256), "b": torch.zeros(64)}
        dcp.load({"model": model}, checkpoint_id=checkpoint_id)
        self.loaded = model
        saved = json.loads(Path(checkpoint_id, "train_state.json").read_text())
        self.states["train_state"].load_state_dict({"step": saved["step"], "ntokens_seen": 0})


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_resume_reports_its_dcp_reads_as_restore_progress(titan, tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp
    monkeypatch.setattr(sys.modules[__name__], "CheckpointManager", DcpCheckpointManager)
    own_load = dcp.load
    quiet = {"restore_progress_s": 3600.0}  # phase changes only: no timed samples
    config = Trainer.Config(dump_folder=str(tmp_path), training=TrainingConfig(steps=2),
                            validator=ValidatorConfig(enable=False))
    _, rec = run(config, monkeypatch, **quiet)
    assert "ckpt_restore_progress" not in {e["kind"] for e in rec.events}  # nothing to load

    config = Trainer.Config(dump_folder=str(tmp_path), training=TrainingConfig(steps=3),
                            validator=ValidatorConfig(enable=False))
    trainer, rec = run(config, monkeypatch, **quiet)
    assert trainer.trained == [3] and dcp.load is own_load  # torch's load put back
    assert torch.equal(trainer.checkpointer.loaded["w"], torch.arange(256.0))
    # sent live while it read, before the step it restores is known
    assert rec.kinds()[:4] == [("ckpt_restore_progress", None, "read"),
                               ("ckpt_restore_progress", None, "barrier"),
                               ("ckpt_restore_start", 2, None), ("ckpt_restore_end", 2, None)]
    read, barrier = (e for e in rec.events if e["kind"] == "ckpt_restore_progress")
    # what DCP reads on one rank: the .metadata, then every chunk of the one shard file
    folder = tmp_path / "checkpoint" / "step-2"
    files = (folder / ".metadata").stat().st_size + (folder / "__0_0.distcp").stat().st_size
    assert read["bytes"] == 0 and barrier["bytes"] == files
    assert json.loads(barrier["detail"]) == {"live_bytes": True, "bytes_total": files}
    assert read["tier"] == barrier["tier"] == "durable"
    end = rec.event("ckpt_restore_end", 2)
    assert read["time"] <= barrier["time"] <= end["time"] and end["bytes"] == files


def test_async_saves_are_durable_later_and_the_last_one_is_waited_for(titan, tmp_path,
                                                                      monkeypatch):
    # 5 batches for 10 steps: step 6 finds no data, so the step-4 save is still being
    # written when train() returns
    config = Trainer.Config(dump_folder=str(tmp_path), training=TrainingConfig(steps=10),
                            checkpoint=CheckpointConfig(async_mode="async"),
                            validator=ValidatorConfig(enable=False), batches=5)
    trainer, rec = run(config, monkeypatch)
    assert trainer.trained == [1, 2, 3, 4, 5] and trainer.step == 6
    assert_steps(rec, [1, 2, 3, 4, 5])  # step 6 raised: no row
    assert rec.kinds() == [
        ("ckpt_save_start", 2, None), ("ckpt_save_blocking_end", 2, None),
        ("ckpt_save_durable_end", 2, None),  # while the step-4 save waited for it
        ("ckpt_save_start", 4, None), ("ckpt_save_blocking_end", 4, None),
        ("ckpt_save_durable_end", 4, None),  # waited for at the end of train()
        ("attempt_end", 5, None)]  # the last step done: 5
    s2, b2, d2 = (rec.event(k, 2) for k in ("ckpt_save_start", "ckpt_save_blocking_end",
                                            "ckpt_save_durable_end"))
    s4, b4, d4 = (rec.event(k, 4) for k in ("ckpt_save_start", "ckpt_save_blocking_end",
                                            "ckpt_save_durable_end"))
    # (at a failure, every instant relative to the step-2 save's start: which part ran long)
    t0 = s2["time"]
    said = {k: round(e["time"] - t0, 4) for k, e in (("b2", b2), ("d2", d2), ("s4", s4),
                                                     ("b4", b4), ("d4", d4))}
    assert within(gap(s2, b2), STAGE), said  # only staging blocks training
    assert within(gap(b2, d2), DURABLE), said  # written in the background
    # steps 3 and 4 (2 x 0.12 s) are shorter than the write: the step-4 save first waits
    # for the step-2 one, inside its blocking part
    assert s4["time"] < d2["time"] <= b4["time"] - STAGE + 0.01, said
    assert within(gap(b4, d4), DURABLE), said
    assert d2["bytes"] == d4["bytes"] == SHARD + META and b4["bytes"] is None
    assert rec.event("attempt_end", 5)["time"] >= d4["time"]
    step5 = rec.steps[-1]
    assert step5["start_time"] + step5["duration_s"] < d4["time"]  # durable after training


def test_init_distributed_goes_through_goodlens_and_puts_torch_back(titan, tmp_path,
                                                                    monkeypatch):
    import torch.distributed as dist

    from goodlens.exporter import torch as gl
    torch_calls: list[tuple] = []
    goodlens_calls: list[tuple] = []
    monkeypatch.setattr(dist, "init_process_group",
                        lambda *a, **k: torch_calls.append((a, k)))
    monkeypatch.setattr(gl, "init_process_group",
                        lambda *a, **k: goodlens_calls.append((a, k)))
    torch_init = dist.init_process_group
    config = Trainer.Config(dump_folder=str(tmp_path), training=TrainingConfig(steps=1),
                            comm=CommConfig(init_process_group=True, init_timeout_seconds=42))
    trainer, _ = run(config, monkeypatch)
    assert goodlens_calls == [(("gloo",), {"timeout": timedelta(seconds=42), "_ranks": [],
                                           "device_id": None})]
    assert torch_calls == [] and dist.init_process_group is torch_init
    assert trainer.trained == [1]


def test_a_broken_exporter_never_stops_training(titan, tmp_path, monkeypatch):
    class Broken(RankExporter):
        def event(self, kind: str, time_s: float | None = None, **fields: Any) -> None:
            raise RuntimeError("broken exporter")

    exp = Broken(run_id="tt", url=None, hooks=False)
    monkeypatch.setattr(gtt.GoodlensTrainerMixin, "make_exporter", lambda self: exp)
    config = Trainer.Config(dump_folder=str(tmp_path), training=TrainingConfig(steps=4),
                            checkpoint=CheckpointConfig(async_mode="async"))
    trainer = gtt.goodlens_config(config).build()
    trainer.train()
    trainer.close()
    assert trainer.trained == [1, 2, 3, 4] and trainer.validator.validated == [1, 3]
    assert sorted(os.listdir(tmp_path / "checkpoint")) == ["step-2", "step-4"]

    def no_exporter(self: Any) -> Any:
        raise OSError("no collector configuration")

    monkeypatch.setattr(gtt.GoodlensTrainerMixin, "make_exporter", no_exporter)
    config = Trainer.Config(dump_folder=str(tmp_path / "again"),
                            training=TrainingConfig(steps=2))
    trainer = gtt.goodlens_config(config).build()
    trainer.train()
    trainer.close()
    assert trainer.trained == [1, 2] and trainer.goodlens_exporter is None


def test_the_trainer_class_and_configs(titan):
    cls = gtt.GoodlensTrainer
    assert issubclass(cls, gtt.GoodlensTrainerMixin) and issubclass(cls, Trainer)
    assert cls.__mro__.index(gtt.GoodlensTrainerMixin) < cls.__mro__.index(Trainer)
    assert cls.Config._owner is cls and issubclass(cls.Config, Trainer.Config)
    assert gtt.GoodlensTrainer is cls  # made once
    base = Trainer.Config(dump_folder="/x", training=TrainingConfig(steps=9), batches=3)
    config = gtt.goodlens_config(base)
    assert type(config) is cls.Config and gtt.goodlens_config(config) is config
    assert (config.dump_folder, config.training.steps, config.batches) == ("/x", 9, 3)
    with pytest.raises(TypeError):
        gtt.goodlens_config(object())

    # a model's own Trainer subclass with its own Config keeps both
    class FluxLikeTrainer(Trainer):
        @dataclass(kw_only=True, slots=True)
        class Config(Trainer.Config):
            guidance: float = 3.5

    flux = gtt.goodlens_config(FluxLikeTrainer.Config(guidance=1.0))
    assert issubclass(type(flux), FluxLikeTrainer.Config) and flux.guidance == 1.0
    assert issubclass(type(flux)._owner, FluxLikeTrainer)

    # --module goodlens.exporter.torchtitan --config <registry>:<function>
    registry = types.ModuleType("my_registry")
    registry.small = lambda: Trainer.Config(batches=7)  # type: ignore[attr-defined]
    sys.modules["my_registry"] = registry
    try:
        fn = getattr(gtt, "my_registry:small")
        assert callable(fn) and type(fn()) is cls.Config and fn().batches == 7
    finally:
        del sys.modules["my_registry"]
    assert getattr(gtt, "llama3_8b", None) is None  # other names: AttributeError


class _NoTorchtitan:
    """A meta-path finder that refuses torchtitan and remembers being asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] == "torchtitan":
            self.asked.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_importing_the_module_does_not_import_torchtitan(monkeypatch):
    for name in [n for n in sys.modules if n.split(".")[0] == "torchtitan"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "goodlens.exporter.torchtitan")
    monkeypatch.delattr(goodlens.exporter, "torchtitan")
    finder = _NoTorchtitan()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    module = importlib.import_module("goodlens.exporter.torchtitan")
    assert finder.asked == [] and "torchtitan" not in sys.modules
    assert callable(module.goodlens_config) and "GoodlensTrainer" not in module.__all__
    with pytest.raises(ImportError, match="needs torchtitan"):
        module.GoodlensTrainer  # noqa: B018 - the access is the test
    assert finder.asked == ["torchtitan"]
