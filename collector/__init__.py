"""The collector service (installed as ``goodlens.collector``): the HTTP app (ingest, reads,
auth), ``/metrics``, live detection, the host relay server and trace replay.

It reads and writes through ``goodlens.storage`` and computes through ``goodlens.analysis``;
it never imports the dashboard or the CLI (``goodlens serve`` mounts the dashboard into it).
"""
