"""The cluster simulator: many jobs sharing a cluster under a scheduling policy (gang or
partial allocation, placement, preemption, fair share, spares), with the run simulator's
failure model.
"""
