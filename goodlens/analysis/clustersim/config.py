"""What a simulated cluster is: its topology, its job stream, scheduler settings and policies.

Why it exists: users who operate a training cluster ask what gang scheduling, topology-aware
placement, checkpoint-on-preempt, fair share and a shared hot-spare pool buy them, in goodput
and in wait time. The event loop (:mod:`goodlens.analysis.clustersim.sim`) answers; this module
holds what
it is asked about, validated: :class:`ClusterConfig` (nodes in racks in pods, the topology
penalty model, the job stream, the scheduler's knobs), :class:`Policy` (the five levers, each
switchable, with a string form for the CLI and the dashboard), :func:`workload` (the seeded
job stream) and the named :data:`CLUSTER_PRESETS`.

Failures and restart costs are the run simulator's
(:class:`goodlens.analysis.runsim.config.SimConfig`,
the ``failure`` field: node MTBF, exponential or Weibull, the Llama 3 cause table with hang
probabilities, detection, init, warm-up, repair and spare-swap times); checkpoint costs come
from :mod:`goodlens.analysis.ckptcost`. Nothing of either is copied here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from goodlens.analysis.runsim.config import DAY, SimConfig
from goodlens.analysis.runsim.presets import KOKOLIS_1K

H = 3600.0
PREEMPT_MODES = ("none", "kill", "ckpt")
_PREEMPT_TOKENS = {"no-preempt": "none", "kill-preempt": "kill", "ckpt-preempt": "ckpt"}

#: The failure and restart model of the cluster presets: Kokolis et al. (HPCA 2025) measured
#: it on Meta's research clusters (a node MTBF of ~42 days; detection 1-10 min, 5 min init, 2
#: min warm-up); repairs take 4 h and a spare swaps in within 2 min (the run simulator's
#: defaults). Its checkpoint fields are unused: each job's checkpoint comes from ckptcost.
CLUSTER_FAILURES = replace(KOKOLIS_1K, nodes=1, elastic="restart", spares=0)


@dataclass(frozen=True)
class Owner:
    """A team that submits jobs and is entitled to a share of the cluster."""

    name: str
    share: float
    """Configured fair share (normalised over the owners)."""
    submit_weight: float | None = None
    """Share of the generated jobs this owner submits; None: its ``share``."""


@dataclass(frozen=True)
class JobSpec:
    """One job of the stream: who submits it, when, how big, how much work."""

    name: str
    owner: str
    nodes: int
    submit_s: float
    work_s: float
    """Productive seconds it needs at an ideal placement (its steps times ``step_s``)."""
    priority: int = 1
    """Higher runs first; preemption (when on) takes nodes only from strictly lower ones."""
    step_s: float = 2.0
    params: float = 4e9
    """Model parameters: the checkpoint's size (ckptcost), hence its stall and restore."""
    ckpt_mode: str = "async"
    """``sync`` (the stall is the whole write) or ``async`` (only the snapshot blocks)."""
    interval_s: float | None = None
    """Checkpoint interval; None: Young's sqrt(2 C M) for this job's size, clipped to
    [max(``min_interval_s``, the durable write), ``max_interval_s``]."""

    def __post_init__(self) -> None:
        bad = _checker("JobSpec", self)
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int | np.integer) \
                or self.nodes < 1:
            raise bad("nodes", "an integer >= 1")
        for name in ("submit_s", "work_s", "step_s", "params"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise bad(name, "a finite number >= 0")
        for name in ("work_s", "step_s", "params"):
            if not getattr(self, name) > 0:
                raise bad(name, "> 0")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int | np.integer):
            raise bad("priority", "an integer")
        if self.ckpt_mode not in ("sync", "async"):
            raise bad("ckpt_mode", "'sync' or 'async'")
        if self.interval_s is not None and not (isinstance(self.interval_s, int | float)
                                                and 0 < self.interval_s < math.inf):
            raise bad("interval_s", "None or > 0")


def _checker(owner: str, obj: Any):
    def bad(name: str, what: str) -> ValueError:
        return ValueError(f"{owner}.{name} must be {what} (got {getattr(obj, name)!r})")
    return bad


@dataclass(frozen=True)
class ClusterConfig:
    """A cluster (nodes in racks in pods), its job stream and its scheduler's settings."""

    nodes: int = 64
    """Nodes in the cluster (spares included: a hot-spare pool is carved out of them)."""
    gpus_per_node: int = 8
    nodes_per_rack: int = 8
    """Nodes behind one leaf (rack) switch; racks are contiguous runs of node ids."""
    racks_per_pod: int = 4
    """Racks behind one pod (spine) block; pods are joined by the core."""
    duration_s: float = 2 * DAY
    """Simulated wall-clock."""
    rack_cost: float = 0.25
    """Topology model: extra collective time per unit of traffic crossing rack uplinks
    (assumed: a 4:3-ish oversubscribed leaf uplink)."""
    pod_cost: float = 0.75
    """Topology model: the same for traffic crossing pod (spine) uplinks (assumed: more
    oversubscribed than a rack's)."""
    n_jobs: int = 60
    """Jobs generated (ignored when ``jobs`` is given)."""
    arrival_s: float | None = None
    """Jobs arrive as a Poisson process over [0, arrival_s]; None: 2/3 of ``duration_s``."""
    sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    """Job sizes in nodes, drawn with ``size_weights``."""
    size_weights: tuple[float, ...] = (0.3, 0.25, 0.2, 0.15, 0.1)
    work_median_s: float = 6 * H
    """Median productive work of a job (lognormal, sigma ``work_sigma``)."""
    work_sigma: float = 1.0
    work_max_s: float = 7 * DAY
    priority_weights: tuple[float, ...] = (0.3, 0.6, 0.1)
    """Weights of priorities 0, 1, 2, ... (0: preemptible best effort)."""
    owners: tuple[Owner, ...] = (Owner("research", 0.5), Owner("product", 0.3),
                                 Owner("eval", 0.2))
    step_s: float = 2.0
    params_per_gpu: float = 0.5e9
    """A generated job's model has this many parameters per GPU (bigger jobs, bigger models)."""
    ckpt_mode: str = "async"
    bytes_per_param: float = 16.0
    """Saved bytes per parameter (ckptcost's ``mixed-adam``)."""
    writer_bw: float = 1e9
    """Write bandwidth per GPU rank to storage, bytes/s (ckptcost ``writer_bw``)."""
    storage_bw: float = 200e9
    """The shared storage's aggregate write bandwidth, bytes/s (no contention between jobs)."""
    min_interval_s: float = 300.0
    max_interval_s: float = 4 * H
    jobs: tuple[JobSpec, ...] | None = None
    """An explicit job stream instead of a generated one."""
    failure: SimConfig = CLUSTER_FAILURES
    """Failures and restart costs: the run simulator's model (node_mtbf_s, failure_dist,
    weibull_shape, hang_prob, wide_failure_fraction, detect_crash_s, detect_hang_s, init_s,
    warmup_s, repair_s, spare_swap_s, compute_fraction, compute_noise_sigma). A wide failure
    (a switch) takes the node's whole rack down."""
    reserve_after_s: float = 0.0
    """Gang scheduling backfills (EASY): the first job in queue order that does not fit and
    has waited at least this long gets a reservation at the earliest time running jobs free
    enough nodes (by their estimates); jobs behind it start only if they fit now and either
    end before then (by their estimates) or leave the reserved nodes alone. 0: classic EASY."""
    estimate_factor: float = 1.5
    """Users' walltime estimates: this factor times the ideal remaining run time (start-up,
    steps at the ideal step time, checkpoint stalls); >= 1."""
    preempt_after_s: float = 600.0
    """Preemption: a job takes nodes from lower-priority ones only after waiting this long
    (a grace in which nodes about to free up may serve it)."""
    preempt_exempt_s: float = 1800.0
    """Preemption: an attempt is exempt for this long after it starts (Slurm's
    PreemptExemptTime), so a job is not preempted again while it is still restarting."""
    partial_timeout_s: float = 1800.0
    """Partial allocation: a job holding an incomplete allocation this long gives it back and
    backs off (exponential, this mean) before grabbing nodes again."""
    fair_half_life_s: float = DAY
    """Fair share: half-life of the owners' decayed usage."""
    aging_s: float = DAY
    """Fair share: a job's score rises by 1 (one full share) per ``aging_s`` since submit."""
    priority_weight: float = 1.0
    """Fair share: score per priority level (FIFO orders by priority strictly). The score is
    priority_weight x priority - usage/share of its owner + age/aging_s, so a long wait
    eventually beats a higher priority: aging bounds starvation."""
    sample_every_s: float = H
    """Timeline sampling period."""

    def __post_init__(self) -> None:
        bad = _checker("ClusterConfig", self)
        for name in ("nodes", "gpus_per_node", "nodes_per_rack", "racks_per_pod", "n_jobs"):
            v = getattr(self, name)
            low = 0 if name == "n_jobs" else 1
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < low:
                raise bad(name, f"an integer >= {low}")
        for name in ("duration_s", "rack_cost", "pod_cost", "work_median_s", "work_sigma",
                     "work_max_s", "step_s", "params_per_gpu", "bytes_per_param", "writer_bw",
                     "storage_bw", "min_interval_s", "max_interval_s", "reserve_after_s",
                     "estimate_factor", "preempt_after_s", "preempt_exempt_s",
                     "partial_timeout_s",
                     "fair_half_life_s", "aging_s",
                     "priority_weight", "sample_every_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise bad(name, "a finite number >= 0")
        for name in ("duration_s", "work_median_s", "work_max_s", "step_s", "params_per_gpu",
                     "bytes_per_param", "writer_bw", "storage_bw", "max_interval_s",
                     "partial_timeout_s", "fair_half_life_s", "aging_s", "sample_every_s"):
            if not getattr(self, name) > 0:
                raise bad(name, "> 0")
        if self.arrival_s is not None and not (isinstance(self.arrival_s, int | float)
                                               and 0 <= self.arrival_s < math.inf):
            raise bad("arrival_s", "None or a finite number >= 0")
        if (not self.sizes or len(self.sizes) != len(self.size_weights)
                or any(isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 1
                       for s in self.sizes)):
            raise bad("sizes", "integers >= 1, one per size weight")
        for name in ("size_weights", "priority_weights"):
            w = getattr(self, name)
            if not w or any(not x >= 0 for x in w) or not sum(w) > 0:
                raise bad(name, "weights >= 0 with a positive sum")
        if (not self.owners or any(not isinstance(o, Owner) or not o.share > 0
                                   for o in self.owners)
                or len({o.name for o in self.owners}) != len(self.owners)):
            raise bad("owners", "Owner(name, share > 0) with distinct names")
        if self.ckpt_mode not in ("sync", "async"):
            raise bad("ckpt_mode", "'sync' or 'async'")
        if self.estimate_factor < 1:
            raise bad("estimate_factor", ">= 1")
        if self.min_interval_s > self.max_interval_s:
            raise bad("min_interval_s", "<= max_interval_s")
        if not isinstance(self.failure, SimConfig):
            raise bad("failure", "a goodlens.analysis.runsim.config.SimConfig")
        if self.jobs is not None:
            if not all(isinstance(j, JobSpec) for j in self.jobs):
                raise bad("jobs", "None or a tuple of JobSpec")
            names = {o.name for o in self.owners}
            for j in self.jobs:
                if j.owner not in names:
                    raise ValueError(f"ClusterConfig.jobs: job {j.name!r} has owner "
                                     f"{j.owner!r}, not one of {sorted(names)}")

    @property
    def racks(self) -> int:
        return -(-self.nodes // self.nodes_per_rack)

    @property
    def pods(self) -> int:
        return -(-self.racks // self.racks_per_pod)

    @property
    def comm_fraction(self) -> float:
        """Share of a step spent in collectives: 1 - the failure model's compute_fraction."""
        return 1.0 - self.failure.compute_fraction

    def penalty(self, racks: int, pods: int) -> float:
        """Topology model: the step-time slowdown of a job spanning ``racks`` racks in
        ``pods`` pods. A hierarchical all-reduce sends a (g-1)/g share of its traffic over
        the uplinks of a level split g ways; each level adds that share times its cost to the
        collective part of the step: comm x (rack_cost (r-1)/r + pod_cost (p-1)/p).
        Monotone in both counts, 0 inside one rack."""
        r, p = max(1, racks), max(1, pods)
        return self.comm_fraction * (self.rack_cost * (r - 1) / r + self.pod_cost * (p - 1) / p)

    def describe(self) -> str:
        """One line: the cluster and its workload."""
        n = len(self.jobs) if self.jobs is not None else self.n_jobs
        return (f"{self.nodes:,} nodes x {self.gpus_per_node} GPUs in {self.racks} racks, "
                f"{self.pods} pods; {n:,} jobs over {self.duration_s / DAY:g} days")


@dataclass(frozen=True)
class Policy:
    """The scheduler's levers; ``Policy.parse("gang,topo,ckpt-preempt,fair,spares=8")``."""

    gang: bool = True
    """All or nothing; False: partial allocation (nodes handed out one by one, held idle)."""
    topo: bool = False
    """Topology-aware placement (least penalty: fewest pods and racks); False: random."""
    preempt: str = "none"
    """Preempt lower-priority jobs: ``none``, ``kill`` (lose work since the last
    checkpoint) or ``ckpt`` (a durable checkpoint on notice, then release)."""
    fair: bool = False
    """Fair share with per-owner shares and aging; False: FIFO (within a priority)."""
    spares: int = 0
    """Hot spares set aside in a shared pool; a job's failed node is swapped for one."""

    def __post_init__(self) -> None:
        bad = _checker("Policy", self)
        for name in ("gang", "topo", "fair"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "True or False")
        if self.preempt not in PREEMPT_MODES:
            raise bad("preempt", " or ".join(map(repr, PREEMPT_MODES)))
        if isinstance(self.spares, bool) or not isinstance(self.spares, int | np.integer) \
                or self.spares < 0:
            raise bad("spares", "an integer >= 0")

    @classmethod
    def parse(cls, spec: str | Policy | None) -> Policy:
        """A policy from comma-separated tokens; unnamed levers keep their defaults
        (gang, random, no-preempt, fifo, spares=0). Tokens: ``gang``|``partial``,
        ``topo``|``random``, ``ckpt-preempt``|``kill-preempt``|``no-preempt`` (or
        ``preempt=ckpt|kill|none``), ``fair``|``fifo``, ``spares=N``; ``baseline`` names the
        defaults. A wrong or contradictory token raises ValueError naming it."""
        if isinstance(spec, Policy):
            return spec
        kw: dict[str, Any] = {}

        def put(key: str, value: Any, tok: str) -> None:
            if key in kw and kw[key] != value:
                raise ValueError(f"policy token {tok!r} contradicts an earlier one")
            kw[key] = value
        for raw in (spec or "").split(","):
            tok = raw.strip().lower()
            if not tok or tok in ("baseline", "default"):
                continue
            if tok in ("gang", "partial"):
                put("gang", tok == "gang", tok)
            elif tok in ("topo", "random"):
                put("topo", tok == "topo", tok)
            elif tok in ("fair", "fifo"):
                put("fair", tok == "fair", tok)
            elif tok in _PREEMPT_TOKENS:
                put("preempt", _PREEMPT_TOKENS[tok], tok)
            elif tok.startswith("preempt="):
                mode = tok.partition("=")[2]
                if mode not in PREEMPT_MODES:
                    raise ValueError(f"policy token {tok!r}: preempt= takes "
                                     f"{', '.join(PREEMPT_MODES)}")
                put("preempt", mode, tok)
            elif tok.startswith("spares="):
                try:
                    n = int(tok.partition("=")[2])
                except ValueError:
                    n = -1
                if n < 0:
                    raise ValueError(f"policy token {tok!r}: spares= takes an integer >= 0")
                put("spares", n, tok)
            else:
                raise ValueError(
                    f"unknown policy token {tok!r}; use gang|partial, topo|random, "
                    f"ckpt-preempt|kill-preempt|no-preempt, fair|fifo, spares=N")
        return cls(**kw)

    def describe(self) -> str:
        """The canonical string form (every lever named); ``parse`` reads it back."""
        pre = {"none": "no-preempt", "kill": "kill-preempt", "ckpt": "ckpt-preempt"}
        return ",".join(["gang" if self.gang else "partial", "topo" if self.topo else "random",
                         pre[self.preempt], "fair" if self.fair else "fifo",
                         f"spares={self.spares}"])

    def __str__(self) -> str:
        return self.describe()


def workload(config: ClusterConfig, seed: int = 0) -> list[JobSpec]:
    """The job stream ``config`` describes, for ``seed`` (``config.jobs`` when given): arrivals
    uniform over [0, arrival_s] (a Poisson process given the count), sizes, lognormal work,
    priorities and owners drawn independently. The stream depends on the seed only, never on
    the policy, so policies are compared on the same jobs."""
    if config.jobs is not None:
        return list(config.jobs)
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
    n = config.n_jobs
    window = (2 / 3 * config.duration_s) if config.arrival_s is None else config.arrival_s
    submit = np.sort(rng.uniform(0, window, n))
    sw = np.asarray(config.size_weights, float)
    sizes = np.minimum(np.asarray(config.sizes)[rng.choice(len(sw), n, p=sw / sw.sum())],
                       config.nodes)
    work = np.clip(config.work_median_s * np.exp(config.work_sigma * rng.standard_normal(n)),
                   10 * config.step_s, config.work_max_s)
    pw = np.asarray(config.priority_weights, float)
    prio = rng.choice(len(pw), n, p=pw / pw.sum())
    ow = np.array([o.share if o.submit_weight is None else o.submit_weight
                   for o in config.owners], float)
    owner = rng.choice(len(ow), n, p=ow / ow.sum())
    width = len(str(n))
    return [JobSpec(name=f"j{i:0{width}d}", owner=config.owners[int(owner[i])].name,
                    nodes=int(sizes[i]), submit_s=float(submit[i]), work_s=float(work[i]),
                    priority=int(prio[i]), step_s=config.step_s,
                    params=config.params_per_gpu * int(sizes[i]) * config.gpus_per_node,
                    ckpt_mode=config.ckpt_mode)
            for i in range(n)]


# A small cluster for tests and demos: 64 nodes (8 racks of 8, 2 pods), 60 jobs of 1-16 nodes
# and ~6 h median work over two days; load ~1.2x the capacity while jobs arrive. All assumed.
TEST_64 = ClusterConfig()

# Demo: 256 nodes (16 racks of 16, 4 pods), 150 jobs of 1-64 nodes over a week.
DEMO_256 = ClusterConfig(
    nodes=256, nodes_per_rack=16, racks_per_pod=4, duration_s=7 * DAY, n_jobs=150,
    sizes=(1, 2, 4, 8, 16, 32, 64), size_weights=(0.2, 0.15, 0.2, 0.15, 0.12, 0.1, 0.08),
    work_median_s=12 * H)

# The benchmark: 1,000 nodes (32 per rack, 8 racks per pod: 32 racks, 4 pods), 500
# jobs arriving over 20 of 30 days, 1-256 nodes (mean ~22), median work a day (lognormal,
# sigma 1: mean ~40 h), so demand is ~90% of capacity while jobs arrive. Failures as Kokolis
# et al. (~24 node failures a day on 1,000 nodes). Sizes and work assumed.
BENCH_1K = ClusterConfig(
    nodes=1000, nodes_per_rack=32, racks_per_pod=8, duration_s=30 * DAY, n_jobs=500,
    arrival_s=20 * DAY, sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    size_weights=(0.2, 0.15, 0.15, 0.15, 0.12, 0.1, 0.07, 0.04, 0.02),
    work_median_s=DAY, work_max_s=10 * DAY,
    owners=(Owner("llm", 0.4), Owner("vision", 0.25), Owner("speech", 0.15),
            Owner("eval", 0.1), Owner("infra", 0.1)))

CLUSTER_PRESETS: dict[str, ClusterConfig] = {"test-64": TEST_64, "demo-256": DEMO_256,
                                             "bench-1k": BENCH_1K}


def get_cluster_preset(name: str) -> ClusterConfig:
    """The named cluster (``CLUSTER_PRESETS``); a KeyError lists the names."""
    try:
        return CLUSTER_PRESETS[name]
    except KeyError:
        raise KeyError(f"no cluster preset {name!r}; presets: "
                       f"{', '.join(CLUSTER_PRESETS)}") from None


__all__ = ["CLUSTER_FAILURES", "CLUSTER_PRESETS", "DAY", "ClusterConfig", "JobSpec", "Owner",
           "Policy", "get_cluster_preset", "workload"]
