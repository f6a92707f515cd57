"""The run simulator: one training run on N GPUs with failures, stragglers, checkpoints and
restarts, timed into the accounting's buckets (``config``: its inputs; ``trial``: one trial;
``montecarlo``: many trials, sweeps and the closed forms; ``presets``; ``tracegen``: a trial
written out as a per-rank trace).
"""
