"""Detectors: pure statistics over step records (straggler ranks, slow hosts, hangs).

Arrays and frames in, typed findings out; no I/O and no SQL. Filled in by the detectors
issue; the package exists now so the layout shows where they go.
"""
