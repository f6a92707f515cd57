"""Named simulator configurations, each tied to published figures (../shared/REFERENCE.md).

Why it exists: a what-if is only as good as its inputs, and users (and tests, demos, the
benchmark) need a few runs whose parameters are traceable to a source rather than typed in
ad hoc. Figures not in a source are marked "assumed" where they are set.
"""

from __future__ import annotations

from goodlens.analysis.runsim.config import DAY, SimConfig

H = 3600.0

# Llama 3 ("The Llama 3 Herd of Models", 2024, sec. 3.3): 16,384 H100s (2,048 nodes x 8), a
# 54-day snapshot with 419 unexpected and 47 planned interruptions, "higher than 90% effective
# training time". Failures strike only while an attempt runs (~97% of the 54 days here), so the
# per-node MTBF is 2,048 x (0.97 x 54 days) / 419 (~253 days; the Monte Carlo mean is ~420).
# Planned interruptions falling in downtime are absorbed, hence 47/54 a day gives ~46.
# Checkpoint costs: ByteCheckpoint (NSDI 2025), 405B on 8,960 GPUs: 0.59 s blocking, 51 s save,
# 129 s load. Step time ~6 s: 6 x 405e9 params x 16M tokens / (16,384 x ~400 TFLOP/s) (a
# derived estimate). Restart cost ~9 min, inside Kokolis et al.'s 5-20 min. Stragglers:
# MegaScale (NSDI 2024) found machines ~10% slower (median slowdown 0.1); onset rate and the
# per-rank noise are assumed, sized so that goodput lands near the reported ">90%".
LLAMA3_16K = SimConfig(
    nodes=2048, gpus_per_node=8, duration_s=54 * DAY, step_s=6.0, compute_fraction=0.7,
    node_mtbf_s=2048 * 0.97 * 54 * DAY / 419, planned_per_day=47 / 54,
    detect_crash_s=30.0, detect_hang_s=300.0,  # assumed (a shortened NCCL timeout)
    queue_s=120.0, init_s=120.0, warmup_s=60.0,  # assumed
    ckpt_mode="async", interval_s=300.0, snapshot_s=0.59, write_s=51.0, restore_s=129.0,
    compute_noise_sigma=0.005, straggler_per_node_day=1 / 2000,
    straggler_slowdown_median=0.1, straggler_duration_median_s=H, nodes_per_switch=16)

# Kokolis et al. (HPCA 2025): measured MTTF 7.9 h at 1,024 GPUs (128 nodes x 8), so a node's
# MTBF is 128 x 7.9 h (~42 days; their 47.7 days at 8 GPUs agrees). Restart overhead u0 5-20
# min: here detection + 5 min queue + 5 min init + restore + warm-up (~14 min). Synchronous
# checkpoints every hour, 2-minute writes (assumed); two weeks of wall-clock.
KOKOLIS_1K = SimConfig(
    nodes=128, gpus_per_node=8, duration_s=14 * DAY, step_s=2.0, node_mtbf_s=128 * 7.9 * H,
    detect_crash_s=60.0, detect_hang_s=600.0, queue_s=300.0, init_s=300.0, warmup_s=120.0,
    ckpt_mode="sync", interval_s=H, write_s=120.0, restore_s=120.0,
    compute_noise_sigma=0.01, straggler_per_node_day=1 / 500, nodes_per_switch=16)

# Small and hours long, for demos and tests: 64 GPUs, 12 h, a run MTBF of 4 h (~3 failures),
# async checkpoints (PyTorch DCP async save: blocking 6.3 s for a 7B model; here a smaller
# one), a couple of straggler episodes and planned interruptions. All assumed.
DEMO_64 = SimConfig(
    nodes=8, gpus_per_node=8, duration_s=12 * H, step_s=1.0, node_mtbf_s=8 * 4 * H,
    detect_crash_s=30.0, detect_hang_s=120.0, planned_per_day=2.0,
    queue_s=120.0, init_s=60.0, warmup_s=20.0,
    ckpt_mode="async", interval_s=600.0, snapshot_s=2.0, write_s=30.0, restore_s=30.0,
    compute_noise_sigma=0.02, straggler_per_node_day=0.5, straggler_duration_median_s=H,
    nodes_per_switch=4)

# Tiny: 16 GPUs for 2 h, one failure expected. All assumed.
TEST_16 = SimConfig(
    nodes=2, gpus_per_node=8, duration_s=2 * H, step_s=0.5, node_mtbf_s=2 * 2 * H,
    detect_crash_s=10.0, detect_hang_s=60.0, queue_s=30.0, init_s=20.0, warmup_s=5.0,
    ckpt_mode="sync", interval_s=300.0, write_s=5.0, restore_s=5.0,
    compute_noise_sigma=0.02, straggler_per_node_day=1.0, straggler_duration_median_s=600.0,
    nodes_per_switch=2)

PRESETS: dict[str, SimConfig] = {"llama3-16k": LLAMA3_16K, "kokolis-1k": KOKOLIS_1K,
                                 "demo-64": DEMO_64, "test-16": TEST_16}


def get_preset(name: str) -> SimConfig:
    """The named configuration (``PRESETS``); a KeyError lists the names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"no preset {name!r}; presets: {', '.join(PRESETS)}") from None
