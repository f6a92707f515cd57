"""Put on the ``PYTHONPATH`` of the torchrun jobs the heavy tests start (their agents and
ranks, ``tests.harness.job_env``): a process that imported torch then exits without its
final cyclic garbage collection over torch's objects.

Why: that collection is 0.4-1.1 s of CPU per process here (0.11-0.13 s without it), and a
heavy test's job exits 4 to 10 of them at once on 2 cores, after its last step: time the
tests wait and nothing in them measures. ``gc.freeze`` runs as the last exit handler (this
one is registered first), after the exporter's own; objects still reachable are not
collected either way, and none of the jobs' resources is left to a collection (their
process groups, files and sockets are closed explicitly or by the kernel at exit).
"""

import atexit
import gc

atexit.register(gc.freeze)
