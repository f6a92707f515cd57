"""goodlens: goodput observability for large distributed training runs.

One import name, laid out as the data flows (``docs/architecture.md``):

- ``goodlens.exporter``: what runs inside training (recorder, transport, spill, relay client,
  PyTorch integration); depends on ``goodlens.model`` alone and installs without the server.
- ``goodlens.model``: schema, units, event kinds, wire and trace formats.
- ``goodlens.storage``: the DuckDB and Parquet stores, their DDL, the single writer.
- ``goodlens.detectors`` and ``goodlens.analysis``: statistics, accounting, planners,
  simulators; no I/O.
- ``goodlens.collector``: the HTTP service (ingest, reads, ``/metrics``, live detection, relay).
- ``goodlens.dashboard``: the Dash app.
- ``goodlens.cli``: the ``goodlens`` command, the one place that wires the parts together.

The folders ``collector/``, ``dashboard/`` and ``detectors/`` at the top of the repository are
``goodlens.collector``, ``goodlens.dashboard`` and ``goodlens.detectors`` (``goodlens/collector``
and its siblings are symbolic links to them).
"""

__version__ = "0.2.0"
