"""Detectors: pure statistics over step records (straggler ranks, slow hosts and switches,
hangs).

Arrays and frames in, typed findings out; no I/O and no SQL, so the CLI (`goodlens detect`),
the collector and the dashboard can all call them. ``stragglers`` holds the CUSUM detector,
its host/switch roll-up and the NVIDIA-rule baseline; ``hangs`` the adaptive-timeout hang
detector.
"""
