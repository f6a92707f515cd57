"""What one checkpoint costs: its size, the stall of each way to take it, storage and GPU-hours.

Why it exists: the interval planner (:mod:`goodlens.analysis.planner`) needs a checkpoint's stall C
as an
input, and users rarely know it before the run; they know the model size, the optimiser, the
storage and the network. This module turns those into C for a synchronous write, an
asynchronous save (only the device-to-host snapshot blocks) and an in-memory copy to a peer
node, plus what the storage must hold and sustain, and the GPU-hours (and money) the stalls
burn. Pure arithmetic, no I/O; bytes and seconds throughout (bandwidths in bytes/s). A
checkpoint a stored run measured goes through the same arithmetic (:func:`measured_spec`,
:func:`run_checkpoint_cost`: the dashboard's checkpoint costs), so the page and ``goodlens
plan checkpoint`` agree on the same inputs.

Model (first order, every writer rank holds an equal shard):

- size = params x bytes_per_param + dataloader_bytes; shard = size / writer_ranks;
- sync stall = size / min(writer_ranks x writer_bw, storage_bw) (the slower of the writers'
  sum and the storage's aggregate limit); this is also the background write time of an
  asynchronous save;
- async stall = shard / d2h_bw (ranks snapshot in parallel);
- peer-copy stall = shard / peer_bw (each rank sends its shard to a peer node's memory);
- storage = retained x size; sustained bandwidth = size / interval (start to start);
- GPU-hours per checkpoint = stall x gpus / 3600, per day x 86400 / interval.

Mixed-precision Adam state is ~16 B/param (REFERENCE.md, "Checkpoint cost": bf16 weights and
grads, fp32 master weights and two moments), so 70B params is 1.12 TB.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pandas as pd

from goodlens.model.units import require_number

DAY = 86400.0

#: Bytes of saved training state per parameter, by optimiser and precision.
#: ``mixed-adam``: bf16 weights + bf16 grads + fp32 master + 2 fp32 moments = 2+2+4+4+4 = 16
#: (REFERENCE.md: "~16 B/param"; BLOOM-176B was ~13 B/param on disk without grads).
#: ``fp32-adam``: fp32 weights + 2 fp32 moments = 12. ``sgd``: fp32 weights + momentum = 8.
#: ``weights-bf16``: bf16 weights only (an inference export) = 2.
BYTES_PER_PARAM: dict[str, float] = {"mixed-adam": 16.0, "fp32-adam": 12.0, "sgd": 8.0,
                                     "weights-bf16": 2.0}


def _pos(owner: str, name: str, v: object, *, zero_ok: bool = False,
         integer: bool = False) -> None:
    require_number(f"{owner}.{name}", v, zero_ok=zero_ok, integer=integer)


@dataclass(frozen=True)
class CheckpointSpec:
    """A training job's checkpoint: what is saved, who writes it, and to where."""

    params: float
    """Model parameters (count, e.g. 70e9)."""
    gpus: int
    """GPUs whose time a stall burns (the whole job)."""
    writer_ranks: int
    """Ranks writing shards in parallel (each an equal share)."""
    writer_bw: float
    """Write bandwidth one writer gets to storage, bytes/s (e.g. a node's share of the NIC)."""
    storage_bw: float
    """The storage's aggregate write bandwidth, bytes/s."""
    bytes_per_param: float = BYTES_PER_PARAM["mixed-adam"]
    """Saved bytes per parameter (weights, master weights, optimiser moments)."""
    dataloader_bytes: float = 0.0
    """Data-loader and RNG state, bytes in total."""
    d2h_bw: float = 25e9
    """Device-to-host snapshot bandwidth per rank, bytes/s (assumed: ~PCIe Gen5 x16 share)."""
    peer_bw: float = 12.5e9
    """Network bandwidth per rank to a peer node's memory, bytes/s (assumed: 100 Gb/s)."""
    retained: int = 2
    """Checkpoints kept on storage (K)."""
    price_per_gpu_hour: float | None = None
    """Price of one GPU-hour (any currency); None: no money figures."""

    def __post_init__(self) -> None:
        o = "CheckpointSpec"
        for name in ("params", "writer_bw", "storage_bw", "bytes_per_param", "d2h_bw",
                     "peer_bw"):
            _pos(o, name, getattr(self, name))
        for name in ("gpus", "writer_ranks", "retained"):
            _pos(o, name, getattr(self, name), integer=True)
        _pos(o, "dataloader_bytes", self.dataloader_bytes, zero_ok=True)
        if self.price_per_gpu_hour is not None:
            _pos(o, "price_per_gpu_hour", self.price_per_gpu_hour, zero_ok=True)

    @classmethod
    def for_optimizer(cls, optimizer: str, **kwargs: object) -> CheckpointSpec:
        """A spec whose ``bytes_per_param`` is ``BYTES_PER_PARAM[optimizer]``."""
        if optimizer not in BYTES_PER_PARAM:
            raise ValueError(f"optimizer must be one of {', '.join(BYTES_PER_PARAM)} "
                             f"(got {optimizer!r})")
        return cls(bytes_per_param=BYTES_PER_PARAM[optimizer], **kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True)
class CheckpointCost:
    """The cost of one checkpoint of a :class:`CheckpointSpec` (seconds, bytes, GPU-hours)."""

    size_bytes: float
    shard_bytes: float
    """Per writer rank."""
    write_bw: float
    """Effective write bandwidth: min(writer_ranks x writer_bw, storage_bw)."""
    sync_stall_s: float
    """A synchronous write blocks the job for the whole write."""
    async_stall_s: float
    """An asynchronous save blocks only for the device-to-host snapshot."""
    peer_copy_stall_s: float
    """An in-memory copy to a peer node blocks for the network transfer."""
    background_write_s: float
    """The durable write of an async save, in the background (= ``sync_stall_s``)."""
    storage_bytes: float
    """Capacity for ``retained`` checkpoints."""
    gpu_hours_per_checkpoint: dict[str, float]
    """Stall x GPUs, by mode: ``sync``, ``async``, ``peer``."""
    interval_s: float | None = None
    sustained_bw: float | None = None
    """Average bandwidth storage must sustain at the interval (size / interval), bytes/s."""
    write_fits_interval: bool | None = None
    """Whether an async save's background write finishes before the next save is due."""
    checkpoints_per_day: float | None = None
    gpu_hours_per_day: dict[str, float] | None = None
    money_per_checkpoint: dict[str, float] | None = None
    money_per_day: dict[str, float] | None = None


def gpu_hours(stall_s: float, gpus: float) -> float:
    """GPU-hours a stall of ``stall_s`` burns across ``gpus`` GPUs (all of them stand still)."""
    return stall_s * gpus / 3600.0


def checkpoint_cost(spec: CheckpointSpec, interval_s: float | None = None) -> CheckpointCost:
    """The cost of one checkpoint of ``spec`` and, given ``interval_s`` (save start to save
    start, seconds), of a day of them and the bandwidth storage must sustain."""
    if interval_s is not None:
        _pos("checkpoint_cost", "interval_s", interval_s)
    size = spec.params * spec.bytes_per_param + spec.dataloader_bytes
    shard = size / spec.writer_ranks
    bw = min(spec.writer_ranks * spec.writer_bw, spec.storage_bw)
    stalls = {"sync": size / bw, "async": shard / spec.d2h_bw, "peer": shard / spec.peer_bw}
    gph = {k: gpu_hours(v, spec.gpus) for k, v in stalls.items()}
    price = spec.price_per_gpu_hour
    money = None if price is None else {k: v * price for k, v in gph.items()}
    per_day = sustained = fits = day = money_day = None
    if interval_s is not None:
        per_day = DAY / interval_s
        sustained = size / interval_s
        fits = stalls["sync"] <= interval_s
        day = {k: v * per_day for k, v in gph.items()}
        money_day = None if price is None else {k: v * price for k, v in day.items()}
    return CheckpointCost(
        size_bytes=size, shard_bytes=shard, write_bw=bw, sync_stall_s=stalls["sync"],
        async_stall_s=stalls["async"], peer_copy_stall_s=stalls["peer"],
        background_write_s=stalls["sync"], storage_bytes=spec.retained * size,
        gpu_hours_per_checkpoint=gph, interval_s=interval_s, sustained_bw=sustained,
        write_fits_interval=fits, checkpoints_per_day=per_day, gpu_hours_per_day=day,
        money_per_checkpoint=money, money_per_day=money_day)


def measured_spec(stall_s: float, size_bytes: float, gpus: int, retained: int = 2,
                  price_per_gpu_hour: float | None = None) -> CheckpointSpec:
    """The :class:`CheckpointSpec` of a checkpoint a run measured: ``size_bytes`` written by
    one writer whose bandwidth makes the synchronous stall exactly ``stall_s`` (what the job
    stood still). ``goodlens plan checkpoint`` takes the same inputs as ``--params SIZE/2
    --optimizer weights-bf16 --writers 1 --writer-bw SIZE/STALL --storage-bw SIZE/STALL``,
    so a measured checkpoint and a planned one go through the same arithmetic."""
    _pos("measured_spec", "stall_s", stall_s)
    _pos("measured_spec", "size_bytes", size_bytes)
    bw = size_bytes / stall_s
    return CheckpointSpec(params=size_bytes, bytes_per_param=1.0, gpus=int(gpus),
                          writer_ranks=1, writer_bw=bw, storage_bw=bw, retained=int(retained),
                          price_per_gpu_hour=price_per_gpu_hour)


def run_checkpoint_cost(table: pd.DataFrame, gpus: float, interval_s: float | None,
                        retained: int = 2, price_per_gpu_hour: float | None = None,
                        measured: dict | None = None) -> dict:
    """What a run's checkpoints cost, for the dashboard and anyone else reading a stored run.

    ``table`` is :func:`goodlens.analysis.checkpoints.checkpoint_table`'s; ``measured`` is
    :class:`goodlens.analysis.measured.Measured` as a dict (best interval and the goodput
    expected at it and at the run's interval). Returns ``rows`` (per checkpoint: stall
    GPU-hours, money, the write bandwidth its durable copy needed) and ``typical``: the
    :class:`CheckpointCost` of the median checkpoint (median stall and size) at the run's
    interval, as :func:`checkpoint_cost` computes it for ``goodlens plan checkpoint``, plus
    ``write_bw_needed`` (median size over median write time) and what the current interval
    loses against the best one per day (GPU-hours and money)."""
    price = price_per_gpu_hour
    rows = []
    for r in table.itertuples():
        stall, write, size = (float(x) if x == x and x is not None else math.nan
                              for x in (r.stall_s, r.write_s, r.bytes))
        gh = gpu_hours(stall, gpus) if stall == stall else None
        rows.append({"gpu_hours": gh, "money": None if gh is None or price is None
                     else gh * price,
                     "write_bw": size / write if size == size and write == write and write > 0
                     else None})
    out: dict = {"rows": rows, "typical": None, "gpus": gpus, "retained": retained,
                 "price_per_gpu_hour": price, "interval_s": interval_s}
    stall, size, write = (_median(table, c) for c in ("stall_s", "bytes", "write_s"))
    if stall and size and gpus >= 1:
        spec = measured_spec(stall, size, round(gpus), retained, price)
        out["typical"] = dataclasses.asdict(checkpoint_cost(spec, interval_s or None))
        out["typical"].update(stall_s=stall, median_size_bytes=size)
    out["write_bw_needed"] = size / write if size and write else None
    m = measured or {}
    best, at_best, at_run = (m.get("best_interval_s"), m.get("goodput_at_best"),
                             m.get("goodput_at_measured"))
    if best and at_best is not None and at_run is not None:
        lost = (at_best - at_run) * gpus * DAY / 3600.0
        out["best_interval_s"] = best
        out["loss_gpu_hours_per_day"] = lost
        out["loss_money_per_day"] = None if price is None else lost * price
    return out


def _median(table: pd.DataFrame, column: str) -> float | None:
    """The median of a column over the rows that have it (None: no row has it)."""
    if not len(table) or not table[column].notna().any():
        return None
    return float(table[column].median())
