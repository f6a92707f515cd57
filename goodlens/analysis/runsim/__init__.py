"""The run simulator: one training run on N GPUs with failures, stragglers, checkpoints and
restarts, timed into the accounting's buckets.

``config`` holds its inputs (:class:`SimConfig`), ``prepared`` what every trial of one config
shares (cause tables, straggler noise, block random draws), ``steps`` the checkpoint and
step arithmetic, ``episodes`` the straggler episodes, ``trial`` one trial (:class:`Trial`,
run by :func:`run_trial`), ``montecarlo`` many trials, sweeps and the closed forms,
``presets`` the named configurations and ``tracegen`` a trial written out as a per-rank trace.
"""
