"""Analysis: time accounting, checkpoint costs, planners, what-if and the simulators.

Pure computation over frames read through the storage read interface: no SQL, no HTTP, no
plotting. The straggler and hang statistics live beside it in ``goodlens.detectors``.
"""
