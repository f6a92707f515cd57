"""What a simulated run is: its configuration (validated), its result, and the trial's
vocabulary for both (:class:`Elastic`, the policy; :class:`Stop`, why an attempt ended).

Kept apart from the trial loop (:mod:`goodlens.analysis.runsim.trial`) and the public entry points
(:mod:`goodlens.analysis.runsim.montecarlo`) so each stays readable; the presets
(:mod:`goodlens.analysis.runsim.presets`) and
the CLI build :class:`SimConfig` objects from here.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

DAY = 86400.0
INF = math.inf

#: Llama 3 (2024, sec. 3.3): 419 unexpected interruptions in 54 days, by cause (count), with
#: our hang probability (the job stalls until a watchdog fires rather than exiting) and whether
#: the failure spans more than one node (only the durable checkpoint survives it).
FAILURE_CAUSES: tuple[tuple[str, int, float, bool], ...] = (
    ("faulty GPU", 148, 0.3, False), ("GPU HBM3 memory", 72, 0.1, False),
    ("software bug", 54, 0.2, False), ("network switch/cable", 35, 0.9, True),
    ("host maintenance", 32, 0.0, False), ("GPU SRAM memory", 19, 0.1, False),
    ("GPU system processor", 17, 0.3, False), ("NIC", 7, 0.9, False),
    ("NCCL watchdog timeout", 7, 1.0, False), ("silent data corruption", 6, 0.0, False),
    ("GPU thermal interface/sensor", 6, 0.1, False), ("SSD", 3, 0.0, False),
    ("power supply", 3, 0.0, False), ("server chassis", 2, 0.0, False),
    ("IO expansion board", 2, 0.2, False), ("dependency", 2, 0.5, False),
    ("CPU", 2, 0.2, False), ("system memory", 2, 0.1, False),
)
CAUSE_NAMES = tuple(c[0] for c in FAILURE_CAUSES)
#: Straggler root causes: "link" (a degraded link) slows every node behind one switch, a noisy
#: neighbour one node, thermal and ECC faults one GPU (an eviction takes its node). FALCON
#: (2024): communication fail-slows are the most frequent.
STRAGGLER_CAUSES: dict[str, float] = {"thermal": 0.25, "link": 0.4, "ecc": 0.1,
                                      "noisy_neighbour": 0.25}
#: The subject each straggler cause slows: one GPU's rank, one node's ranks or every rank
#: behind one switch (nested: rank inside node inside switch).
STRAGGLER_LEVELS: dict[str, str] = {"thermal": "rank", "link": "switch", "ecc": "rank",
                                    "noisy_neighbour": "node"}
_ENUMS = {"failure_dist": ("exponential", "weibull"), "ckpt_mode": ("sync", "async", "tiered"),
          "queue_dist": ("exponential", "lognormal"),
          "elastic": ("restart", "shrink", "spares", "per_step")}


@dataclass(frozen=True)
class SimConfig:
    """One simulated run: the cluster, its failures, restart and checkpoint costs, policies."""

    nodes: int = 8
    """Nodes in the job's world (each ``gpus_per_node`` GPUs, one rank per GPU)."""
    gpus_per_node: int = 8
    """GPUs (ranks) per node."""
    duration_s: float = DAY
    """Simulated wall-clock: the run is stopped after this long."""
    step_s: float = 1.0
    """Healthy step time on the full world (the median rank's compute plus communication)."""
    compute_fraction: float = 0.7
    """Share of ``step_s`` the median rank computes (the rest is collectives)."""
    node_mtbf_s: float = 30 * DAY
    """Mean time between failures of one node (the job's MTBF is this over ``nodes``)."""
    failure_dist: str = "exponential"
    """Per-node time to failure: ``exponential`` or ``weibull`` (with the same mean)."""
    weibull_shape: float = 0.8
    """Weibull shape k (k < 1: infant mortality; fresh nodes fail sooner)."""
    hang_prob: Mapping[str, float] | None = None
    """Per-cause probability that a failure hangs rather than crashes (overrides the table)."""
    wide_failure_fraction: float | None = None
    """Share of failures spanning several nodes (need the durable copy); None: by cause."""
    detect_crash_s: float = 60.0
    """A crash's time from failure to detection."""
    detect_hang_s: float = 600.0
    """A hang's time from failure to detection (the watchdog timeout)."""
    planned_per_day: float = 0.0
    """Planned interruptions per day (a save on notice; no lost work)."""
    queue_s: float = 300.0
    """Mean wait from detection to the next attempt's start (rescheduling)."""
    queue_dist: str = "lognormal"
    """Queue wait distribution: ``lognormal`` (sigma ``queue_sigma``) or ``exponential``."""
    queue_sigma: float = 1.0
    """Log-space sigma of a lognormal queue wait."""
    init_s: float = 120.0
    """Attempt start to the first step (process start, rendezvous, model build)."""
    warmup_s: float = 60.0
    """Extra time of an attempt's first step (compile, cache fill)."""
    interval_s: float = 1800.0
    """Checkpoint interval (the durable tier's), rounded to whole steps."""
    ckpt_mode: str = "sync"
    """``sync`` (stall = whole write), ``async`` (stall = snapshot) or ``tiered``."""
    write_s: float = 60.0
    """Durable write time (the stall when sync; a background write otherwise)."""
    snapshot_s: float = 5.0
    """Blocking device-to-host snapshot of an async (or tiered durable) save."""
    restore_s: float = 60.0
    """Restore from the durable copy."""
    memory_interval_s: float = 300.0
    """Tiered: interval of the in-memory peer copy (durable interval rounded to a multiple)."""
    memory_stall_s: float = 1.0
    """Tiered: blocking time of a memory save (the copy is usable when it ends)."""
    memory_restore_s: float = 10.0
    """Tiered: restore from a peer's memory copy (single-node failures only)."""
    compute_noise_sigma: float = 0.01
    """Per-rank, per-step compute noise: lognormal sigma (heavy right tail)."""
    diurnal_amplitude: float = 0.0
    """Trace mode: slow diurnal drift of every rank's compute time, as a fraction (Llama 3
    saw 1-2% throughput variation over a day). All ranks drift together, so it is never
    straggler wait; it shows as compute against collective wait within the same step time."""
    straggler_per_node_day: float = 0.0
    """Onset rate of persistent slowdown episodes, per node per day."""
    straggler_slowdown_median: float = 0.1
    """Median compute slowdown of an episode (0.1 = 10% slower; lognormal)."""
    straggler_slowdown_sigma: float = 0.5
    """Log-space sigma of the slowdown."""
    straggler_duration_median_s: float = 3600.0
    """Median episode duration (lognormal; FALCON: tens of seconds to ~10 h)."""
    straggler_duration_sigma: float = 1.5
    """Log-space sigma of the episode duration."""
    straggler_causes: Mapping[str, float] = field(default_factory=lambda: dict(STRAGGLER_CAUSES))
    """Weights of the root causes (``thermal``, ``link``, ``ecc``, ``noisy_neighbour``)."""
    nodes_per_switch: int = 16
    """Nodes behind one switch (all slowed by a degraded link)."""
    elastic: str = "restart"
    """``restart`` (queue for a full world), ``shrink`` (go on with fewer nodes), ``spares``
    or ``per_step`` (per-step fault tolerance: only the failed replica group restarts)."""
    spares: int = 0
    """Hot spare nodes (``spares`` policy), or hot spare replica groups of
    ``nodes / replica_groups`` nodes each (``per_step``); allocated, so they cost GPU-time."""
    spare_swap_s: float = 120.0
    """Time to swap a spare in, instead of the queue wait."""
    repair_s: float = 4 * 3600.0
    """Time until a failed or evicted node is back (a spare again, or grown back)."""
    reconfig_s: float = 60.0
    """Shrink/grow reconfiguration (restart.init of the new world)."""
    shrink_max_nodes: int = 1
    """Most nodes the world may be short before a full restart is needed."""
    replica_groups: int = 1
    """``per_step``: replica groups the world is split into (``nodes`` a multiple of it); each
    keeps its own local batch, so a step without a group commits fewer samples, not slower."""
    min_replicas: int = 1
    """``per_step``: fewest healthy groups that go on training; a failure that leaves fewer
    restarts the whole job (the ``restart`` path)."""
    quorum_s: float = 5.0
    """``per_step``: time the training thread is blocked by one quorum membership change (a
    group dropped, or admitted)."""
    group_restart_s: float = 300.0
    """``per_step``: a failed group's detection to its processes ready to heal (rescheduling
    on a replacement node, process start, init)."""
    heal_bytes: float = 2e9
    """``per_step``: state each rank of a healing group receives from its peer (its shard of
    weights and optimizer state)."""
    heal_bandwidth_Bps: float = 1e9
    """``per_step``: per-rank bandwidth of a heal (bytes/s); heal time is
    ``heal_bytes / heal_bandwidth_Bps``."""
    evict_stragglers: bool = False
    """Evict a detected straggler (like a planned interruption, replaced by spare or queue)."""
    evict_delay_steps: int = 100
    """Steps of a slowdown before the detector flags it."""
    evict_min_slowdown: float = 0.05
    """Smallest slowdown the detector sees."""

    def __post_init__(self) -> None:
        def bad(name: str, what: str) -> ValueError:
            return ValueError(f"SimConfig.{name} must be {what} (got {getattr(self, name)!r})")
        if not isinstance(self.evict_stragglers, bool):
            raise bad("evict_stragglers", "True or False")
        for name in ("nodes", "gpus_per_node", "nodes_per_switch", "evict_delay_steps",
                     "spares", "shrink_max_nodes", "replica_groups", "min_replicas"):
            v = getattr(self, name)
            low = 0 if name in ("spares", "shrink_max_nodes") else 1
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < low:
                raise bad(name, f"an integer >= {low}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _ENUMS and v not in _ENUMS[f.name]:
                raise bad(f.name, " or ".join(map(repr, _ENUMS[f.name])))
            if f.type == "float" and (isinstance(v, bool) or not isinstance(v, int | float)
                                      or not 0 <= v < INF):
                raise bad(f.name, "a finite number >= 0")
        for name in ("duration_s", "step_s", "node_mtbf_s", "interval_s", "memory_interval_s",
                     "weibull_shape", "compute_fraction", "heal_bandwidth_Bps"):
            if not getattr(self, name) > 0:
                raise bad(name, "> 0")
        if self.compute_fraction > 1:
            raise bad("compute_fraction", "in (0, 1]")
        if not 0 <= self.diurnal_amplitude < 0.5:
            raise bad("diurnal_amplitude", "in [0, 0.5)")
        w = self.wide_failure_fraction
        if w is not None and (isinstance(w, bool) or not isinstance(w, int | float)
                              or not 0 <= w <= 1):
            raise bad("wide_failure_fraction", "None or in [0, 1]")
        if self.hang_prob is not None and (
                not isinstance(self.hang_prob, Mapping)
                or any(k not in CAUSE_NAMES or not 0 <= v <= 1
                       for k, v in self.hang_prob.items())):
            raise bad("hang_prob", f"a mapping of causes {CAUSE_NAMES} to [0, 1]")
        sc = self.straggler_causes
        if (not isinstance(sc, Mapping) or any(k not in STRAGGLER_CAUSES or not v >= 0
                                                for k, v in sc.items())
                or not sum(sc.values()) > 0):
            raise bad("straggler_causes", f"weights >= 0 of {tuple(STRAGGLER_CAUSES)}")
        if self.shrink_max_nodes >= self.nodes and self.elastic == "shrink":
            raise bad("shrink_max_nodes", "< nodes")
        if self.ckpt_mode == "tiered" and self.memory_interval_s > self.interval_s:
            raise bad("memory_interval_s", "<= interval_s")
        if self.elastic == "per_step":
            # two groups at least, whole nodes per group, and room for one group to fail
            if self.replica_groups < 2 or self.nodes % self.replica_groups:
                raise bad("replica_groups", f">= 2 and divide nodes ({self.nodes}) for "
                                            "elastic='per_step'")
            if self.min_replicas >= self.replica_groups:
                raise bad("min_replicas", f"< replica_groups ({self.replica_groups})")

    @property
    def heal_s(self) -> float:
        """``per_step``: one heal's time, ``heal_bytes / heal_bandwidth_Bps``."""
        return self.heal_bytes / self.heal_bandwidth_Bps


@dataclass
class SimResult:
    """One trial's ground truth, in ``goodlens report``'s terms."""

    wall_clock_s: float
    goodput: float
    """Productive share of wall-clock."""
    gpu_time_goodput: float
    """Productive GPU-seconds over allocated (largest world plus spares) GPU-seconds."""
    buckets: dict[str, float]
    """Seconds per bucket (``accounting.BUCKETS``), summing to ``wall_clock_s``."""
    restart_parts: dict[str, float]
    """``restart`` split as ``accounting.RESTART_PARTS``."""
    counts: dict[str, int]
    """failures, hangs, wide_failures, startup_failures, planned, evictions, evicted_nodes,
    checkpoints (durable saves), memory_checkpoints, memory_restores, attempts, shrinks,
    grows, spare_swaps, straggler_episodes, group_failures (``per_step``: failures the job
    went on through), rejoins (groups admitted back), quorum_changes."""
    failures_by_cause: dict[str, int]
    startup_parts: dict[str, float] = field(default_factory=dict)
    """``startup`` (the first attempt's start-up) split as ``accounting.STARTUP_PARTS``."""
    other_parts: dict[str, float] = field(default_factory=lambda: {"quorum": 0.0})
    """Named parts of ``other``: ``quorum``, the training thread blocked by quorum membership
    changes (``per_step``); the rest of ``other`` is the step in flight at the run's end."""
    sample_goodput: float | None = None
    """Samples committed over what the full world commits in the same wall-clock at its
    healthy rate (one global batch per ``step_s``): below ``goodput`` when steps ran short
    (``per_step``) or slower than the full world's (``shrink``)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


class Stop(enum.Enum):
    """Why an attempt ended; the value is the timeline's ``kind``."""

    FAILURE = "failed"
    """A failure (:meth:`~goodlens.analysis.runsim.trial.Trial.run_steps` also says so when
    the run's end comes first)."""
    RUN_END = "end"
    """The run's end (``duration_s``)."""
    PLANNED = "planned"
    """A planned interruption, at the end of the step in flight."""
    EVICTION = "evict"
    """The eviction of detected stragglers, at the end of the step in flight."""
    GROW = "grow"
    """A repaired node rejoins a shrunk world (or a healed group a short one), at the end of
    the step in flight."""
    DROP = "drop"
    """``per_step``: a group failed and the others went on (a timeline kind only)."""


class Elastic(enum.Enum):
    """What a failure does to the world (``SimConfig.elastic``)."""

    RESTART = "restart"
    """Queue for a full world."""
    SHRINK = "shrink"
    """Go on with fewer nodes; grow back when the node is repaired."""
    SPARES = "spares"
    """Swap a free hot spare in."""
    PER_STEP = "per_step"
    """Only the failed replica group restarts; the others go on short."""
