"""The batch arithmetic of an elastic resize: micro-batch and gradient accumulation that keep
the global batch when the number of data-parallel replicas changes.

Why it lives in the model: two layers need the same answer. ``goodlens plan elastic``
(:func:`goodlens.analysis.planner.elastic_plan`) tells an operator what a shrink would do,
and the training job itself (:func:`goodlens.exporter.elastic.batch_for_world`, inside each
rank, which may import the model only) computes what to run after a real resize. One
implementation means the plan an operator reads is exactly what the job does. Pure Python:
the exporter runs inside training and imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchChoice", "choose_batch", "split_batch"]


@dataclass(frozen=True)
class BatchChoice:
    """How ``replicas`` data-parallel replicas run a global batch."""

    replicas: int
    """Replicas available (the world's data-parallel size)."""
    replicas_used: int
    """Replicas that train (fewer when that keeps the batch exact: the rest idle)."""
    micro_batch: int
    """Samples per replica per forward/backward."""
    accumulation: int
    """Micro-batches per replica per optimizer step."""
    global_batch: int
    """Samples per optimizer step with this choice (== the target when ``exact``)."""
    exact: bool
    """The target global batch is kept exactly."""
    reason: str
    """What was chosen and why, starting ``same micro-batch``, ``changed micro-batch``,
    ``idle replicas`` or ``indivisible`` (see :func:`choose_batch`)."""
    closest_batch: int
    """The closest global batch achievable on all ``replicas``."""


def split_batch(batch: int, replicas: int, max_micro: int) -> tuple[int, int] | None:
    """(micro, accumulation) with replicas x micro x accumulation == batch and the largest
    micro <= ``max_micro``; None when ``replicas`` does not divide ``batch``."""
    if replicas < 1 or batch % replicas:
        return None
    per = batch // replicas
    for m in range(min(max_micro, per), 0, -1):
        if per % m == 0:
            return m, per // m
    return None


def choose_batch(global_batch: int, replicas: int, micro_batch: int,
                 max_micro: int | None = None, allow_inexact: bool = False) -> BatchChoice:
    """Micro-batch and accumulation for ``replicas`` replicas keeping ``global_batch``.

    In order of preference: every replica with ``micro_batch`` (``same micro-batch``); every
    replica with the largest micro-batch <= ``max_micro`` (default ``micro_batch``) dividing
    the per-replica share (``changed micro-batch``); when ``replicas`` does not divide the
    batch, the most replicas that do, the others idle (``idle replicas``), or with
    ``allow_inexact`` every replica and the closest achievable batch (``indivisible``).
    ValueError on non-positive sizes or ``max_micro < micro_batch``."""
    mmax = micro_batch if max_micro is None else max_micro
    for name, v in (("global_batch", global_batch), ("replicas", replicas),
                    ("micro_batch", micro_batch), ("max_micro", mmax)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"choose_batch: {name} must be an integer >= 1, got {v!r}")
    if mmax < micro_batch:
        raise ValueError(f"choose_batch: max_micro must be >= micro_batch ({mmax} < "
                         f"{micro_batch})")
    closest = min((replicas * mi * max(1, round(global_batch / (replicas * mi)))
                   for mi in range(1, mmax + 1)), key=lambda b: (abs(b - global_batch), -b))
    opt = split_batch(global_batch, replicas, mmax)
    if opt is not None:
        m, acc = opt
        used, exact = replicas, True
        reason = ("same micro-batch" if m == micro_batch else
                  f"changed micro-batch: {global_batch // replicas} samples per replica is "
                  f"not a multiple of {micro_batch}; largest divisor <= {mmax} used")
    elif allow_inexact:
        m = next(mi for mi in range(mmax, 0, -1) if closest % (replicas * mi) == 0)
        acc = closest // (replicas * m)
        used, exact = replicas, False
        reason = (f"indivisible: {global_batch} is not a multiple of {replicas} replicas; "
                  f"closest achievable batch {replicas * m * acc} with micro-batch {m}")
    else:
        used = next(d for d in range(replicas, 0, -1) if global_batch % d == 0)
        m, acc = split_batch(global_batch, used, mmax)  # type: ignore[misc]
        exact = True
        reason = (f"idle replicas: {global_batch} is not a multiple of {replicas} replicas; "
                  f"{replicas - used} left idle to keep it exact (closest on all: {closest})")
    return BatchChoice(replicas, used, m, acc, used * m * acc, exact, reason, closest)
